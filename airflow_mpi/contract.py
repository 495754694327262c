"""The pod contract: the names and paths every pod, the launch script and both backends agree on.

docs/contract.md explains each of them to users. The platform variables (``GJ_TRAINING_*``,
``MPI_HOST``) are what an MPI training platform writes into every pod; airflow-mpi writes them
itself. The ``AIRFLOW_MPI_*`` variables are ours and are read only by the launch script. Nothing
here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    """A pod's role: the values of ``GJ_TRAINING_ROLE`` (docs/contract.md#roles-and-names)."""

    MASTER = "master"
    WORKER = "worker"


class HostsMode(str, Enum):
    """How mpiexec learns the hosts: the values of ``AIRFLOW_MPI_HOSTS_MODE``
    (docs/contract.md#hostfile-mode)."""

    HOST = "host"
    HOSTFILE = "hostfile"


# Pod names (``<job>-<role>-<index>``) are DNS-1123 labels: at most 63 characters. The job name is
# ``<spec.name>-<JOB_HASH_LEN base32>`` so two runs never collide (naming.build_job_name).
MAX_DNS_LABEL = 63
JOB_HASH_LEN = 13  # base32 characters: 65 bits (naming.build_job_name)
# Past startup and the job timeout, kubelet ends the pods itself, even with no Airflow around:
# activeDeadlineSeconds = startup_timeout + timeout + this grace.
DEADLINE_GRACE_SECONDS = 60
# The master's own wait for its hosts' sshd (started with its workers) lasts startup_timeout + this:
# the waits that watch the job (waiting, deferred), whose error says why each host is not ready,
# end it first; the master's bound is the backstop for a job nobody watches.
STARTUP_GRACE_SECONDS = 10
# terminationGracePeriodSeconds of every pod: SIGTERM, then SIGKILL this long after a delete.
POD_TERMINATION_GRACE_SECONDS = 10

# --- platform environment: written into every pod, never by the user ------------------------
# (docs/contract.md#platform-variables)
ENV_ROLE = "GJ_TRAINING_ROLE"
ENV_JOB_NAME = "GJ_TRAINING_VC_JOB_NAME"
ENV_POD_NAME = "GJ_TRAINING_POD_NAME"
ENV_MASTER_CPU = "GJ_TRAINING_MASTER_CPU_LIMIT"
ENV_MASTER_GPU = "GJ_TRAINING_MASTER_GPU_LIMIT"
ENV_MASTER_REPLICAS = "GJ_TRAINING_MASTER_REPLICAS"
ENV_WORKER_CPU = "GJ_TRAINING_WORKER_CPU_LIMIT"
ENV_WORKER_GPU = "GJ_TRAINING_WORKER_GPU_LIMIT"
ENV_WORKER_REPLICAS = "GJ_TRAINING_WORKER_REPLICAS"
ENV_MPI_HOST = "MPI_HOST"

# --- our own launch-script settings ------------------------------------------------------------
ENV_HOSTS_MODE = "AIRFLOW_MPI_HOSTS_MODE"
ENV_SSH_PORT = "AIRFLOW_MPI_SSH_PORT"
ENV_STARTUP_TIMEOUT = "AIRFLOW_MPI_STARTUP_TIMEOUT"
# "stdin" (the local backend): the master starts with the workers, does all it can meanwhile
# and waits for one line on its standard input before mpiexec: START_HOSTS_VERIFIED when the
# backend has just logged in to every worker from the master's own network with the master's own
# key (the master skips its second, identical check), START_CHECK_HOSTS when it has not.
ENV_START_GATE = "AIRFLOW_MPI_START_GATE"
START_HOSTS_VERIFIED = "hosts-verified"
START_CHECK_HOSTS = "check-hosts"
ENV_NP_OVERRIDE = "AIRFLOW_MPI_NP"
ENV_DRY_RUN = "AIRFLOW_MPI_DRY_RUN"
# Overrides for the three directories below; only tests and unusual images set them.
ENV_CONFIG_DIR = "AIRFLOW_MPI_CONFIG_DIR"
ENV_SSH_SECRET_DIR = "AIRFLOW_MPI_SSH_SECRET_DIR"  # noqa: S105 (a variable name)
ENV_RUNTIME_DIR = "AIRFLOW_MPI_RUNTIME_DIR"
# Hostfile mode reads this file instead of ``<config dir>/hostfile`` when set: a controller that
# writes the hostfile itself (mpi-operator's ``/etc/mpi/hostfile``).
ENV_HOSTFILE = "AIRFLOW_MPI_HOSTFILE"

# Names the user may not set in ``env`` (the platform owns them, or the script computes them;
# docs/contract.md#reserved-names).
RESERVED_ENV_NAMES = frozenset(
    {
        ENV_ROLE,
        ENV_JOB_NAME,
        ENV_POD_NAME,
        ENV_MASTER_CPU,
        ENV_MASTER_GPU,
        ENV_MASTER_REPLICAS,
        ENV_WORKER_CPU,
        ENV_WORKER_GPU,
        ENV_WORKER_REPLICAS,
        ENV_MPI_HOST,
        "MPI_NP",
        "MPI_HOSTS",
    }
)
RESERVED_ENV_PREFIXES = ("GJ_TRAINING_", "NCCL_IB_", "AIRFLOW_MPI_")

# Lines a rank prints with this prefix carry a JSON result for XCom, of at most RESULT_MAX_BYTES
# (UTF-8): the result goes into Airflow's database, and the whole line must fit the 64 KiB line cap.
RESULT_PREFIX = "AIRFLOW_MPI_RESULT "
RESULT_MAX_BYTES = 32 * 1024
# The rank wrapper's first line on every rank (docs/contract.md#rank-start), and the launch
# script's line just before it execs mpiexec: the runner checks that every rank starts.
RANK_START_PREFIX = "AIRFLOW_MPI_RANK_START "
MPIEXEC_START_LINE = "[airflow-mpi] starting mpiexec"
# Under Hydra (MPICH, Intel MPI) the rank wrapper's line when its rank exits non-zero, before it
# ends the job: Hydra's own report names no rank (docs/contract.md#rank-exit).
RANK_EXIT_PREFIX = "AIRFLOW_MPI_RANK_EXIT "

CONTAINER_NAME = "mpi"
SSH_PORT_NAME = "ssh"


# File names inside the config (ConfigMap) and ssh (Secret) directories.
CONFIG_LAUNCH = "launch.sh"
CONFIG_ARGS = "mpiexec.args"
CONFIG_HOSTFILE = "hostfile"
CONFIG_SITECUSTOMIZE = "sitecustomize.py"  # line-buffered Python ranks (on PYTHONPATH)
CONFIG_PYTHON_RANK = "python_rank.py"  # runs a Python rank under Hydra (docs/contract.md#rank-exit)
# The names above are the product's own; a spec's ``files`` may not take them.
CONFIG_OWN_FILES = frozenset({CONFIG_LAUNCH, CONFIG_ARGS, CONFIG_HOSTFILE, CONFIG_SITECUSTOMIZE, CONFIG_PYTHON_RANK})
# Kubernetes stores a ConfigMap's data in at most 1 MiB. The product's own files take at most
# CONFIG_OWN_RESERVE of it; a spec's ``files`` get the rest, on both backends alike.
CONFIG_MAX_BYTES = 1024 * 1024
CONFIG_OWN_RESERVE = 64 * 1024
CONFIG_FILES_MAX_BYTES = CONFIG_MAX_BYTES - CONFIG_OWN_RESERVE
SSH_CLIENT_KEY = "id_ed25519"
SSH_CLIENT_PUB = "id_ed25519.pub"
SSH_AUTHORIZED_KEYS = "authorized_keys"
SSH_KNOWN_HOSTS = "known_hosts"
SSH_CONFIG = "ssh_config"
SSH_SSHD_CONFIG = "sshd_config"
SSH_HOST_KEY = "ssh_host_ed25519_key"  # this pod's own host key, in its ssh directory
# The files every pod's ssh directory shares (plus its own host key).
SSH_SHARED_FILES = (SSH_CLIENT_KEY, SSH_CLIENT_PUB, SSH_AUTHORIZED_KEYS, SSH_KNOWN_HOSTS, SSH_CONFIG, SSH_SSHD_CONFIG)


@dataclass(frozen=True)
class PodPaths:
    """Where the pod's files live inside the pod, the same on Kubernetes and locally
    (docs/contract.md#pod-paths)."""

    config_dir: str = "/etc/mpi"  # ConfigMap: launch.sh, mpiexec.args, hostfile
    ssh_secret_dir: str = "/etc/airflow-mpi/ssh"  # noqa: S105 (the Secret's mount path)
    runtime_dir: str = "/run/airflow-mpi"  # writable, private: ssh files 0600 under 0700, pid
    # A hostfile written by someone else (mpi-operator's), read instead of ours in config_dir.
    controller_hostfile: str = ""

    @property
    def launch_script(self) -> str:
        return f"{self.config_dir}/launch.sh"

    @property
    def hostfile(self) -> str:
        return self.controller_hostfile or f"{self.config_dir}/hostfile"

    @property
    def ssh_dir(self) -> str:
        """The private copy of the ssh material the launch script installs (0700)."""
        return f"{self.runtime_dir}/ssh"

    @property
    def ssh_config(self) -> str:
        return f"{self.ssh_dir}/{SSH_CONFIG}"

    @property
    def sshd_config(self) -> str:
        return f"{self.ssh_dir}/{SSH_SSHD_CONFIG}"

    @property
    def client_key(self) -> str:
        return f"{self.ssh_dir}/{SSH_CLIENT_KEY}"

    @property
    def host_key(self) -> str:
        return f"{self.ssh_dir}/{SSH_HOST_KEY}"

    @property
    def authorized_keys(self) -> str:
        return f"{self.ssh_dir}/{SSH_AUTHORIZED_KEYS}"

    @property
    def known_hosts(self) -> str:
        return f"{self.ssh_dir}/{SSH_KNOWN_HOSTS}"

    @property
    def sshd_pid_file(self) -> str:
        return f"{self.runtime_dir}/sshd.pid"

    @property
    def hydra_hosts(self) -> str:
        """Hydra's machine file (``host:n`` lines), which the master's launch script writes."""
        return f"{self.runtime_dir}/hosts"


DEFAULT_PATHS = PodPaths()


def host_key_file(pod_name: str) -> str:
    """Secret key under which a pod's private host key is stored."""
    return f"host-{pod_name}"
