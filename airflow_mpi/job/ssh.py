"""Per-job SSH material: a client key pair, one host key per pod, and the files built from them.

known_hosts pins every pod's host key under its ``<pod>.<job>`` name, so ``StrictHostKeyChecking
yes`` holds. Apart from ``generate_keypair`` (randomness), everything here is a pure renderer.
The private keys are kept out of ``repr`` so they never reach a log by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from airflow_mpi import contract
from airflow_mpi.contract import DEFAULT_PATHS, PodPaths
from airflow_mpi.job.naming import build_host_name

KEY_FILE_MODE = 0o600
KEY_DIR_MODE = 0o700
# curve25519 first: the post-quantum default (sntrup761) costs ~150 ms per login on small CPUs,
# paid by every worker mpiexec starts; the keys are per job and the traffic stays in the cluster.
KEX_ALGORITHMS = "curve25519-sha256,curve25519-sha256@libssh.org,sntrup761x25519-sha512@openssh.com"


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str = field(repr=False)
    public_openssh: str  # "ssh-ed25519 AAAA..."


def generate_keypair(comment: str = "") -> KeyPair:
    """A fresh ed25519 key pair in OpenSSH formats."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private, f"{public} {comment}".strip())


@dataclass(frozen=True)
class SshMaterial:
    """Everything ssh and sshd need in the job's pods."""

    client: KeyPair
    host_keys: Mapping[str, KeyPair] = field(repr=False)  # pod name -> host key

    @property
    def authorized_keys(self) -> str:
        return render_authorized_keys(self.client)


def build_ssh_material(job_name: str, pod_names: tuple[str, ...]) -> SshMaterial:
    """New keys for one job: nothing is shared between jobs."""
    return SshMaterial(
        client=generate_keypair(f"airflow-mpi@{job_name}"),
        host_keys={pod: generate_keypair(f"root@{pod}") for pod in pod_names},
    )


def render_authorized_keys(client: KeyPair) -> str:
    # The key opens no forwarding: mpiexec needs a command channel only.
    return f"restrict {client.public_openssh}\n"


def render_known_hosts(job_name: str, host_keys: Mapping[str, KeyPair]) -> str:
    """One line per pod, under its full and short names (Open MPI may use either)."""
    lines = []
    for pod, key in host_keys.items():
        algo_and_key = " ".join(key.public_openssh.split()[:2])
        lines.append(f"{build_host_name(job_name, pod)},{pod} {algo_and_key}\n")
    return "".join(lines)


def render_ssh_config(
    port: int, paths: PodPaths = DEFAULT_PATHS, connect_timeout: int = 5, *, as_root: bool = True
) -> str:
    """Client config for mpiexec (``plm_rsh_args -F``) and the launch script's host checks.

    Without root there is no ``User`` line: ssh then logs in as the user it runs as, which is the
    user every pod's sshd runs as (one uid for the whole job), and a non-root sshd can let in no
    other user."""
    user = "  User root\n" if as_root else ""
    return (
        "Host *\n"
        f"{user}"
        f"  Port {port}\n"
        f"  IdentityFile {paths.client_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {paths.known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  HostKeyAlgorithms ssh-ed25519\n"
        f"  KexAlgorithms {KEX_ALGORITHMS}\n"
        "  BatchMode yes\n"
        "  PasswordAuthentication no\n"
        f"  ConnectTimeout {connect_timeout}\n"
        "  ServerAliveInterval 15\n"
        "  ServerAliveCountMax 4\n"
        "  LogLevel ERROR\n"
    )


def render_sshd_config(port: int, paths: PodPaths = DEFAULT_PATHS, *, as_root: bool = True) -> str:
    """Key-only login with the job key; StrictModes stays on (our files are 0600 under 0700).

    As root: root logs in. Without root, sshd runs as the job's user and lets in only that user;
    it needs no privilege separation directory (only a root sshd chroots its pre-auth child), and
    its host key, pid file and authorized_keys all live in that user's own runtime directory."""
    return (
        f"Port {port}\n"
        f"HostKey {paths.host_key}\n"
        f"PidFile {paths.sshd_pid_file}\n"
        f"AuthorizedKeysFile {paths.authorized_keys}\n"
        f"PermitRootLogin {'prohibit-password' if as_root else 'no'}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes yes\n"
        "PermitUserEnvironment no\n"
        "X11Forwarding no\n"
        "AllowTcpForwarding no\n"
        "PrintMotd no\n"
        # In-process sftp: readiness probes open an authenticated session without starting a shell
        # (root's shell rc files can cost more than the whole ssh handshake).
        "Subsystem sftp internal-sftp\n"
        "MaxStartups 200:30:400\n"
        "MaxSessions 50\n"
        "LogLevel INFO\n"
    )


def render_ssh_files(
    job_name: str, material: SshMaterial, port: int, paths: PodPaths = DEFAULT_PATHS, *, as_root: bool = True
) -> dict[str, str]:
    """The files every pod gets (without host keys), by file name."""
    return {
        contract.SSH_CLIENT_KEY: material.client.private_openssh,
        contract.SSH_CLIENT_PUB: material.client.public_openssh + "\n",
        contract.SSH_AUTHORIZED_KEYS: material.authorized_keys,
        contract.SSH_KNOWN_HOSTS: render_known_hosts(job_name, material.host_keys),
        contract.SSH_CONFIG: render_ssh_config(port, paths, as_root=as_root),
        contract.SSH_SSHD_CONFIG: render_sshd_config(port, paths, as_root=as_root),
    }


def build_ssh_probe_argv(
    host: str, port: int, client_key: str, known_hosts: str, connect_timeout: int = 3, user: str = "root"
) -> list[str]:
    """An ssh login as ``user`` with the job key and pinned host keys, configured on the command
    line (no config file), for probing from outside a pod. Run it with stdin closed: the sftp
    session ends at once."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "HostKeyAlgorithms=ssh-ed25519",
        "-o",
        f"KexAlgorithms={KEX_ALGORITHMS}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        "-i",
        client_key,
        "-p",
        str(port),
        "-l",
        user,
        "-s",
        host,
        "sftp",  # an authenticated session, no shell: see render_sshd_config
    ]
