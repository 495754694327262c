"""render_plan(spec, run identity) -> JobPlan: everything a backend needs, as plain data.

A backend turns a plan into objects (Kubernetes) or namespaced processes (local); it never
computes names, env, files or command lines itself, so both backends run the same pod contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from airflow_mpi import contract
from airflow_mpi.contract import DEFAULT_PATHS, PodPaths
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.mpirun import build_mpiexec_argv, build_mpiexec_tail, render_args_file
from airflow_mpi.job.naming import RunIdentity, build_host_name, build_job_labels, build_job_name, build_pod_labels
from airflow_mpi.job.ssh import SshMaterial, build_ssh_material, render_ssh_files
from airflow_mpi.job.topology import Topology, build_job_env, build_pod_env, build_topology, render_hostfile
from airflow_mpi.scripts import launch_script_text, python_rank_text, rank_sitecustomize_text
from airflow_mpi.spec import HostsMode, MPIJobSpec, Role
from airflow_mpi.spec.mpiexec_args import OPEN_MPI


@dataclass(frozen=True)
class PodPlan:
    name: str
    role: Role
    index: int
    host: str  # <pod>.<job>
    env: Mapping[str, str]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class JobPlan:
    spec: MPIJobSpec
    identity: RunIdentity
    job_name: str
    topology: Topology
    labels: Mapping[str, str]
    pods: tuple[PodPlan, ...]  # master first, then workers by index
    config_files: Mapping[str, str]  # the ConfigMap: launch.sh, mpiexec.args[, hostfile]
    ssh: SshMaterial = field(repr=False)
    mpiexec_argv: tuple[str, ...]
    paths: PodPaths = DEFAULT_PATHS

    @property
    def master(self) -> PodPlan:
        return self.pods[0]

    @property
    def workers(self) -> tuple[PodPlan, ...]:
        return self.pods[1:]

    def pod(self, name: str) -> PodPlan:
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def ssh_files(self) -> dict[str, str]:
        """Files shared by every pod's ssh directory (private keys included: keep out of logs)."""
        as_root = self.spec.pod.run_as is None
        return render_ssh_files(self.job_name, self.ssh, self.spec.ssh_port, self.paths, as_root=as_root)

    def ssh_files_for(self, pod_name: str) -> dict[str, str]:
        """One pod's ssh directory: the shared files plus its own host key only."""
        files = self.ssh_files()
        files[contract.SSH_HOST_KEY] = self.ssh.host_keys[pod_name].private_openssh
        return files

    def secret_data(self) -> dict[str, str]:
        """The Secret: shared files plus every pod's host key under ``host-<pod>``."""
        data = self.ssh_files()
        for pod, key in self.ssh.host_keys.items():
            data[contract.host_key_file(pod)] = key.private_openssh
        return data


def render_plan(
    spec: MPIJobSpec,
    identity: RunIdentity,
    *,
    ssh: SshMaterial | None = None,
    paths: PodPaths = DEFAULT_PATHS,
    launch_script: str | None = None,
    master_pod: str | None = None,
    worker_pod: Callable[[int], str] | None = None,
    platform_env: Mapping[str, str] | None = None,
) -> JobPlan:
    """Validate ``spec`` and derive every name, env, file and command line of one job.
    ``master_pod``, ``worker_pod``: the pods' names where a controller fixes them (see ``build_topology``);
    ``platform_env``: what the platform writes into every pod and rank (a cluster's ``NCCL_IB_*``,
    from its ``mpi`` connection), which the spec may not name."""
    spec.validated()
    job_name = build_job_name(spec.name, identity)
    topology = build_topology(spec, job_name, master_pod, worker_pod)
    labels = build_job_labels(job_name, identity, spec.pod.labels)
    platform = dict(platform_env or {})
    job_env = {**build_job_env(spec, topology), **platform}
    pods = [_pod_plan(spec, topology, labels, job_env, Role.MASTER, 0, topology.master_pod)]
    pods += [
        _pod_plan(spec, topology, labels, job_env, Role.WORKER, index, name)
        for index, name in enumerate(topology.worker_pods)
    ]
    # An Open MPI job's launcher says at launch whether it is 4 or 5: the script picks the tail.
    tail = build_mpiexec_tail(spec, topology, paths, list(platform))
    open_mpi = spec.mpi.implementation == OPEN_MPI
    tail_open_mpi_5 = build_mpiexec_tail(spec, topology, paths, list(platform), 5) if open_mpi else []
    config_files = {
        contract.CONFIG_LAUNCH: launch_script if launch_script is not None else launch_script_text(),
        contract.CONFIG_ARGS: render_args_file(spec, tail, paths, tail_open_mpi_5),
        contract.CONFIG_SITECUSTOMIZE: rank_sitecustomize_text(),
        contract.CONFIG_PYTHON_RANK: python_rank_text(),
    }
    if spec.hosts_mode is HostsMode.HOSTFILE and not paths.controller_hostfile:
        config_files[contract.CONFIG_HOSTFILE] = render_hostfile(topology)
    config_files.update(spec.files)  # validated: never one of the product's own names
    _check_config_size(config_files)
    return JobPlan(
        spec=spec,
        identity=identity,
        job_name=job_name,
        topology=topology,
        labels=labels,
        pods=tuple(pods),
        config_files=config_files,
        ssh=ssh if ssh is not None else build_ssh_material(job_name, topology.pods),
        mpiexec_argv=tuple(build_mpiexec_argv(spec, topology, paths, list(platform))),
        paths=paths,
    )


def _check_config_size(config_files: Mapping[str, str]) -> None:
    """The whole config directory fits one ConfigMap (a hostfile of very many workers and large
    ``files`` together may not), on both backends alike: refused before anything is created."""
    total = sum(len(text.encode("utf-8", "surrogatepass")) for text in config_files.values())
    if total > contract.CONFIG_MAX_BYTES:
        sizes = ", ".join(f"{name} {len(text.encode('utf-8', 'surrogatepass'))}" for name, text in config_files.items())
        raise SpecError(
            [
                SpecIssue(
                    "files",
                    f"the job's config directory would hold {total} bytes ({sizes}), over the "
                    f"{contract.CONFIG_MAX_BYTES} bytes of one ConfigMap",
                    "make files smaller (pass large inputs as a path or URI on a volume) or use fewer workers",
                )
            ]
        )


def _pod_plan(
    spec: MPIJobSpec,
    topology: Topology,
    job_labels: Mapping[str, str],
    job_env: dict[str, str],
    role: Role,
    index: int,
    name: str,
) -> PodPlan:
    return PodPlan(
        name=name,
        role=role,
        index=index,
        host=build_host_name(topology.job_name, name),
        env=build_pod_env(spec, topology, role, name, job_env),
        labels=build_pod_labels(job_labels, role, index),
    )
