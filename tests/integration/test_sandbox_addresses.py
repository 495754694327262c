"""A long-lived sandbox (the test cluster's node agent keeps one for a whole session) creates
more pods over its life than its /24 has addresses: a removed pod's address and veth are
handed out again, so 300 pods one after another all get one; 254 at once do not fit. And a
sandbox whose bridge is in a namespace of its own (a local job's) shows the host nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_mpi.backends.local import check_prerequisites
from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.exceptions import LaunchError

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("host_on_bridge", [True, False], ids=["bridge on the host", "bridge in its namespace"])
def test_removed_pods_addresses_are_handed_out_again(tmp_path: Path, host_on_bridge: bool) -> None:
    if check_prerequisites():
        pytest.skip("needs " + "; ".join(check_prerequisites()))
    sandbox = Sandbox.create(tmp_path / "state", f"addr-{uuid.uuid4().hex[:6]}", host_on_bridge=host_on_bridge)
    try:
        addresses = set()
        for i in range(300):
            (pod,) = sandbox.add_pods([f"p{i}"])
            addresses.add(pod.ip)
            if i >= 2:  # two live at a time
                sandbox.remove_pod(f"p{i - 2}")
        assert len(addresses) == 253 and len(sandbox.pods) == 2, len(addresses)
        live = {pod.ip for pod in sandbox.pods.values()}
        assert len(live) == 2
        with pytest.raises(LaunchError, match="at once"):
            sandbox.add_pods([f"q{i}" for i in range(252)])
    finally:
        sandbox.destroy()


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_a_job_sandbox_shows_the_host_no_link_and_its_pods_acknowledge_at_once(tmp_path: Path) -> None:
    if check_prerequisites():
        pytest.skip("needs " + "; ".join(check_prerequisites()))
    sandbox = Sandbox.create(tmp_path / "state", f"net-{uuid.uuid4().hex[:6]}", host_on_bridge=False)
    try:
        pods = sandbox.add_pods(["a", "b"])
        # Its bridge and veths live elsewhere. Only its own names are compared: a kubelet running
        # beside this test (the real-Node tier) adds and removes host links of its own meanwhile.
        own_links = {sandbox.bridge, *(pod.veth for pod in pods)}
        assert own_links.isdisjoint(os.listdir("/sys/class/net"))
        assert sandbox.bridge_netns is not None
        assert sandbox.bridge in _ip("-n", sandbox.bridge_netns, "link", "show", "type", "bridge")
        # Delayed ACKs cost every ssh login two 40 ms stalls: the pods' route acknowledges at once.
        assert "quickack 1" in _ip("-n", pods[0].netns, "route", "show", sandbox.subnet)
        # and they reach each other through it: a TCP connection from pod a to a listener in pod b
        listen = "import socket; s = socket.create_server(('', 7000)); print('up', flush=True); s.accept()"
        with subprocess.Popen(
            ["ip", "netns", "exec", pods[1].netns, sys.executable, "-c", listen], stdout=subprocess.PIPE, text=True
        ) as server:
            assert server.stdout is not None and server.stdout.readline() == "up\n"
            connect = f"import socket; socket.create_connection(({pods[1].ip!r}, 7000), timeout=5).close()"
            subprocess.run(["ip", "netns", "exec", pods[0].netns, sys.executable, "-c", connect], check=True)
            assert server.wait(timeout=10) == 0
    finally:
        sandbox.destroy()
    assert sandbox.leftovers() == []
    assert own_links.isdisjoint(os.listdir("/sys/class/net"))
    assert not [n for n in _ip("netns", "list").split() if n in sandbox.names()]
