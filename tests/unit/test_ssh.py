"""SSH material: real ed25519 keys, pinned known_hosts, key-only configs."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization

from airflow_mpi.contract import DEFAULT_PATHS
from airflow_mpi.job.ssh import (
    build_ssh_material,
    build_ssh_probe_argv,
    generate_keypair,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)


def test_keypair_is_openssh_ed25519() -> None:
    pair = generate_keypair("me@job")
    key = serialization.load_ssh_private_key(pair.private_openssh.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert pair.public_openssh == public.decode() + " me@job"
    assert pair.public_openssh.startswith("ssh-ed25519 ")
    assert "PRIVATE" not in repr(pair)  # never in a log by accident


def test_every_job_and_pod_gets_its_own_keys() -> None:
    one = build_ssh_material("job-a", ("job-a-master-0", "job-a-worker-0"))
    two = build_ssh_material("job-b", ("job-b-master-0", "job-b-worker-0"))
    publics = [one.client.public_openssh, two.client.public_openssh]
    publics += [k.public_openssh for k in (*one.host_keys.values(), *two.host_keys.values())]
    assert len({p.split()[1] for p in publics}) == 6
    assert "PRIVATE" not in repr(one)


def test_known_hosts_pins_each_pod_under_full_and_short_name() -> None:
    material = build_ssh_material("job", ("job-master-0", "job-worker-0"))
    lines = render_known_hosts("job", material.host_keys).splitlines()
    key = material.host_keys["job-worker-0"].public_openssh.split()[1]
    assert f"job-worker-0.job,job-worker-0 ssh-ed25519 {key}" in lines
    assert material.authorized_keys.startswith("restrict ssh-ed25519 ")


def test_configs_are_key_only_and_strict() -> None:
    client = render_ssh_config(2222)
    assert "StrictHostKeyChecking yes" in client and "BatchMode yes" in client and "Port 2222" in client
    assert f"UserKnownHostsFile {DEFAULT_PATHS.known_hosts}" in client and "GlobalKnownHostsFile /dev/null" in client
    server = render_sshd_config(22)
    for line in ("PasswordAuthentication no", "PermitRootLogin prohibit-password", "StrictModes yes", "UsePAM no"):
        assert line in server.splitlines()


def test_probe_argv_needs_no_config_file() -> None:
    argv = build_ssh_probe_argv("w-0.job", 22, "/k/id", "/k/known_hosts")
    assert argv[:3] == ["ssh", "-F", "/dev/null"] and argv[-3:] == ["-s", "w-0.job", "sftp"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/k/known_hosts" in argv
