"""A local pod's /etc/hosts: every pod under its IPv4 address and, after all of those, under the
same address as IPv4-mapped IPv6, which is how dual-stack sockets (torch's TCPStore) hold peers."""

from __future__ import annotations

from airflow_mpi.backends.sandbox_pod import render_hosts


def test_every_pod_is_named_under_its_address_and_its_mapped_form() -> None:
    text = render_hosts(
        [("10.244.3.2", ("j-master-0.j", "j-master-0")), ("10.244.3.3", ("j-worker-0.j", "j-worker-0"))]
    )
    assert text.splitlines() == [
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        "10.244.3.2 j-master-0.j j-master-0",
        "10.244.3.3 j-worker-0.j j-worker-0",
        "::ffff:10.244.3.2 j-master-0.j j-master-0",
        "::ffff:10.244.3.3 j-worker-0.j j-worker-0",
    ]
