"""The MPIJob backend's objects: one kubeflow.org/v2beta1 MPIJob whose launcher is our master and
whose workers are ours, defaults that leave retries to Airflow, our Secret and ConfigMap under
names and paths the controller never uses, host names as the controller makes them, and the CRD."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.mpirun import build_mpiexec_argv
from airflow_mpi.job.naming import LABEL_INDEX, LABEL_JOB, build_job_name
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.job.ssh import KeyPair, SshMaterial
from airflow_mpi.kinds.controller import without_cleanup_kills
from airflow_mpi.kinds.gang import KUEUE_QUEUE_LABEL
from airflow_mpi.kinds.mpijob import (
    CONTROLLER_HOSTFILE,
    OPERATOR_SSH_MOUNT,
    check_mpijob_plan,
    describe_mpijob_wait,
    launcher_name,
    mpijob_config_map_name,
    mpijob_secret_name,
    render_mpijob_manifests,
    render_mpijob_plan,
)
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.scripts import launch_script_text
from airflow_mpi.spec import Role
from tests.crds import assert_valid_custom_object
from tests.helpers import IDENTITY, spec_from
from tests.unit.test_launch_script import dry_run, exact_argv

GPU2 = {"cpu": 8, "memory": "64Gi", "gpus": 2}
SPECS = {
    "cpu": {"workers": {"replicas": 2, "cpu": 2}, "master": {"cpu": 2}},
    "gpu on both": {"workers": {"replicas": 3, **GPU2}, "master": GPU2},
    "gpu on workers": {"workers": {"replicas": 2, **GPU2}, "hosts_mode": "hostfile"},
    "master only": {"master": {"cpu": 4}},
    "volcano gang": {"workers": {"replicas": 2}, "scheduling": {"gang": "volcano", "queue": "training"}},
    "kueue": {"workers": {"replicas": 2}, "scheduling": {"gang": "kueue", "queue": "training"}},
    "without root": {"workers": {"replicas": 1}, "pod": {"run_as_user": 1000, "run_as_group": 1000}, "ssh_port": 2222},
}


def _ssh(pods: list[str]) -> SshMaterial:
    return SshMaterial(
        client=KeyPair("CLIENT-PRIVATE-KEY\n", "ssh-ed25519 AAAAclient airflow-mpi@job"),
        host_keys={pod: KeyPair(f"HOST-PRIVATE-KEY-{pod}\n", f"ssh-ed25519 AAAA{pod} root@{pod}") for pod in pods},
    )


def _plan(**fields: Any) -> JobPlan:
    spec = spec_from(**fields)
    job = build_job_name(spec.name, IDENTITY)
    pods = [launcher_name(job), *(f"{job}-worker-{i}" for i in range(spec.workers.replicas))]
    return render_mpijob_plan(spec, IDENTITY, ssh=_ssh(pods))


def _render(**fields: Any) -> tuple[JobPlan, list[dict[str, Any]]]:
    plan = _plan(**fields)
    return plan, render_mpijob_manifests(plan, "ml", owner_uid="uid-1")


def _container(mpijob: dict[str, Any], role: str) -> dict[str, Any]:
    return dict(mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


@pytest.mark.parametrize("fields", list(SPECS.values()), ids=list(SPECS))
def test_every_mpijob_passes_the_crd_schema(fields: dict[str, Any]) -> None:
    _, (mpijob, _, _) = _render(**fields)
    assert_valid_custom_object(mpijob)


def test_launcher_is_the_master_and_workers_are_ours_with_defaults_that_leave_retries_to_airflow() -> None:
    plan, (mpijob, _, _) = _render(workers={"replicas": 3, **GPU2}, master=GPU2, timeout=600, startup_timeout=120)
    assert (mpijob["apiVersion"], mpijob["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert mpijob["metadata"]["name"] == plan.job_name
    spec = mpijob["spec"]
    replicas = spec["mpiReplicaSpecs"]
    assert (replicas["Launcher"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    assert replicas["Launcher"]["restartPolicy"] == replicas["Worker"]["restartPolicy"] == "Never"
    assert spec["slotsPerWorker"] == 2 and spec["runLauncherAsWorker"] is True  # the master runs ranks
    assert spec["launcherCreationPolicy"] == "AtStartup" and spec["mpiImplementation"] == "OpenMPI"
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 0,
        "activeDeadlineSeconds": 120 + 600 + 60,
    }
    # The launch script as the explicit command of both (a worker without one gets the controller's sshd).
    for role in ("Launcher", "Worker"):
        assert _container(mpijob, role)["command"] == ["bash", "/etc/airflow-mpi/config/launch.sh"]
    assert "readinessProbe" in _container(mpijob, "Worker") and "readinessProbe" not in _container(mpijob, "Launcher")


def test_master_without_ranks_is_no_launcher_worker_and_no_workers_means_no_worker_replicas() -> None:
    _, (mpijob, _, _) = _render(workers={"replicas": 2, **GPU2})
    assert mpijob["spec"]["runLauncherAsWorker"] is False and mpijob["spec"]["slotsPerWorker"] == 2
    _, (alone, _, _) = _render(master={"cpu": 4})
    assert list(alone["spec"]["mpiReplicaSpecs"]) == ["Launcher"]
    assert alone["spec"]["slotsPerWorker"] == 4 and alone["spec"]["runLauncherAsWorker"] is True


def test_our_secret_and_config_map_have_names_and_paths_the_controller_never_uses() -> None:
    plan, (mpijob, secret, config_map) = _render(workers={"replicas": 2})
    job = plan.job_name
    assert secret["metadata"]["name"] == mpijob_secret_name(job) not in (f"{job}-ssh", job)
    assert config_map["metadata"]["name"] == mpijob_config_map_name(job) not in (f"{job}-config", job)
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": job, "uid": "uid-1", "controller": True}
    assert secret["metadata"]["ownerReferences"] == config_map["metadata"]["ownerReferences"] == [owner]
    assert contract.CONFIG_HOSTFILE not in config_map["data"]  # the controller's is read instead
    for role in ("Launcher", "Worker"):
        pod_spec = mpijob["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        mounts = [m["mountPath"] for m in pod_spec["containers"][0]["volumeMounts"]]
        # The controller adds /etc/mpi (launcher) and sshAuthMountPath: neither may be ours.
        assert not [m for m in mounts if m == "/etc/mpi" or m.startswith("/etc/mpi/") or m == OPERATOR_SSH_MOUNT]
        assert len(mounts) == len(set(mounts))
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        assert volumes["mpi-config"]["configMap"]["name"] == mpijob_config_map_name(job)
        assert volumes["mpi-ssh"]["secret"]["secretName"] == mpijob_secret_name(job)
        assert not {"hostname", "subdomain", "restartPolicy"} & set(pod_spec)  # the controller sets them
    assert mpijob["spec"]["sshAuthMountPath"] == OPERATOR_SSH_MOUNT


def test_platform_variables_keep_their_meaning_with_the_controllers_host_names() -> None:
    plan, (mpijob, _, _) = _render(workers={"replicas": 2}, hosts_mode="hostfile")
    job = plan.job_name
    launcher, worker = _env(_container(mpijob, "Launcher")), _env(_container(mpijob, "Worker"))
    assert launcher[contract.ENV_POD_NAME] == f"{job}-launcher"  # its pod name has a random suffix
    assert worker[contract.ENV_POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert launcher[contract.ENV_ROLE] == "master" and worker[contract.ENV_ROLE] == "worker"
    assert launcher[contract.ENV_JOB_NAME] == worker[contract.ENV_JOB_NAME] == job
    assert launcher[contract.ENV_MPI_HOST] == f"{job}-worker-0.{job},{job}-worker-1.{job}"
    assert launcher[contract.ENV_CONFIG_DIR] == worker[contract.ENV_CONFIG_DIR] == "/etc/airflow-mpi/config"
    assert launcher[contract.ENV_HOSTFILE] == CONTROLLER_HOSTFILE and contract.ENV_HOSTFILE not in worker
    labels = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    assert labels[LABEL_JOB] == job and LABEL_INDEX not in labels


def test_known_hosts_pins_the_names_of_the_controllers_hostfile() -> None:
    plan, (_, secret, _) = _render(workers={"replicas": 2})
    known = base64.b64decode(secret["data"][contract.SSH_KNOWN_HOSTS]).decode()
    job = plan.job_name
    shared = "ssh-ed25519 AAAA" + f"{job}-worker-0"  # one template: the workers share a host key
    assert f"{job}-worker-1.{job},{job}-worker-1,{job}-worker-1.{job}.ml.svc," in known
    assert f"{job}-worker-1.{job}.ml.svc.cluster.local {shared}\n" in known
    assert f"{job}-launcher.{job}.ml.svc.cluster.local ssh-ed25519 AAAA{job}-launcher\n" in known


def test_hostfile_mode_the_controller_cannot_write_is_refused_before_submit() -> None:
    with pytest.raises(SpecError) as caught:
        _plan(workers={"replicas": 2, "cpu": 4}, master={"cpu": 2}, hosts_mode="hostfile")
    assert caught.value.fields == ("hosts_mode",)
    assert "one slot count" in str(caught.value) and "hosts_mode 'host'" in str(caught.value)
    # The same slots everywhere, or a master without ranks: the controller's hostfile is right.
    assert _plan(workers={"replicas": 2, "cpu": 2}, master={"cpu": 2}, hosts_mode="hostfile").topology.np == 6


def test_a_plan_not_made_for_mpijob_is_a_programming_error() -> None:
    from tests.helpers import plan_for

    with pytest.raises(ValueError, match="render_mpijob_plan"):
        check_mpijob_plan(plan_for(spec_from(workers={"replicas": 1})))


def test_queue_is_a_kueue_label_and_a_gang_is_the_scheduling_policy() -> None:
    _, (kueue, _, _) = _render(workers={"replicas": 2}, scheduling={"gang": "kueue", "queue": "training"})
    assert kueue["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "training"
    assert "schedulingPolicy" not in kueue["spec"]["runPolicy"]
    _, (gang, _, _) = _render(
        workers={"replicas": 2, "cpu": 2}, master={"cpu": 1}, pod={"priority_class": "high"},
        scheduling={"gang": "volcano", "queue": "training"},
    )  # fmt: skip
    policy = gang["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy["minAvailable"] == 3 and policy["queue"] == "training" and policy["priorityClass"] == "high"
    assert policy["minResources"]["cpu"] == "5"
    assert KUEUE_QUEUE_LABEL not in gang["metadata"]["labels"]


def test_status_reading_queued_failed_and_refused() -> None:
    def mpijob(*conditions: tuple[str, str, str]) -> dict[str, Any]:
        items = [{"type": t, "status": s, "reason": r, "message": f"{r} happened"} for t, s, r in conditions]
        return {"metadata": {"name": "j", "labels": {KUEUE_QUEUE_LABEL: "q"}}, "status": {"conditions": items}}

    assert describe_mpijob_wait(mpijob(("Suspended", "True", "MPIJobSuspended")), False) == (
        "queued: MPIJob suspended in queue 'q' until it is admitted"
    )
    assert "not yet seen" in (describe_mpijob_wait(mpijob(), False) or "")
    assert "has not created its pods" in (
        describe_mpijob_wait(mpijob(("Created", "True", "MPIJobCreated")), False) or ""
    )
    assert describe_mpijob_wait(mpijob(("Created", "True", "MPIJobCreated")), True) is None
    failed = mpijob(("Created", "True", "MPIJobCreated"), ("Failed", "True", "DeadlineExceeded"))
    assert describe_mpijob_wait(failed, False) is None
    kind = job_kind("mpijob")
    assert kind.master_gone_failure(failed) == "MPIJob failed: DeadlineExceeded: DeadlineExceeded happened"
    assert kind.master_gone_failure(mpijob(("Failed", "False", "x"))) is None
    events = [{"reason": "Created"}, {"reason": "ValidationError", "message": "spec.mpiReplicaSpecs[Launcher]: ..."}]
    assert kind.refusal("j", events, 1.0) == (
        "mpi-operator refused MPIJob j (ValidationError): spec.mpiReplicaSpecs[Launcher]: ..."
    )


def test_workers_removed_by_the_cleanup_policy_do_not_hide_the_launchers_end() -> None:
    launcher = PodState("j-launcher", Role.MASTER, PodPhase.FAILED, exit_code=3)
    killed = PodState("j-worker-0", Role.WORKER, PodPhase.FAILED, exit_code=143)
    deleted = PodState("j-worker-1", Role.WORKER, PodPhase.FAILED, reason="Deleted")
    evicted = PodState("j-worker-2", Role.WORKER, PodPhase.FAILED, reason="Evicted")
    kept = without_cleanup_kills([launcher, killed, deleted, evicted], {"j-worker-0"})
    assert kept == [launcher, evicted]
    running = PodState("j-launcher", Role.MASTER, PodPhase.RUNNING)
    assert without_cleanup_kills([running, killed], {"j-worker-0"}) == [running, killed]


# --- the platform's worked example: 2 workers x 2 GPUs, -np 4, hostfile mode --------------------

EXAMPLE = (
    "mpirun --hostfile /etc/mpi/hostfile -np 4 -bind-to none -map-by slot -mca pml ob1 -mca btl ^openib "
    "-x NCCL_DEBUG=INFO python cifar10_deepspeed.py --deepspeed --epochs 128 --stage 2 --dtype fp16"
)
EXAMPLE_SPEC = {
    "name": "cifar",
    "command": ["python", "cifar10_deepspeed.py", "--deepspeed", "--epochs", "128", "--stage", "2", "--dtype", "fp16"],
    "hosts_mode": "hostfile",
    "workers": {"replicas": 2, "cpu": 8, "gpus": 2},
    "master": {"cpu": 2},
    "mpi": {
        "np": 4, "bind_to": "none", "map_by": "slot", "pml": "ob1", "btl": "^openib",
        "export_env": ["PATH", "LD_LIBRARY_PATH", "NCCL_DEBUG=INFO"],
    },
}  # fmt: skip
TAKES_VALUE = {"--hostfile", "-np", "--bind-to", "--map-by", "-x", "--timeout", "--npernode"}


def _options(argv: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """(option groups, the user's command): single-dash long options as mpiexec also spells them."""
    groups: list[tuple[str, ...]] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "bash" and argv[i + 2] == "rank":  # our rank wrapper, then the user's command
            return groups, argv[i + 3 :]
        if not arg.startswith("-"):
            return groups, argv[i:]
        name = "--" + arg.lstrip("-") if arg not in ("-np", "-x") else arg
        width = 3 if name == "--mca" else 2 if name in TAKES_VALUE else 1
        groups.append((name, *argv[i + 1 : i + width]))
        i += width
    return groups, []


def test_the_worked_example_renders_as_an_mpijob_whose_launcher_command_line_matches_option_by_option() -> None:
    plan, (mpijob, _, _) = _render(**EXAMPLE_SPEC)
    assert_valid_custom_object(mpijob)
    assert mpijob["spec"]["slotsPerWorker"] == 2 and mpijob["spec"]["runLauncherAsWorker"] is False
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    ours, command = _options(list(plan.mpiexec_argv))
    theirs, their_command = _options(EXAMPLE.split())
    assert command == their_command
    job, rsh = plan.job_name, f"-F {plan.paths.ssh_config}"
    always_added = [
        ("--allow-run-as-root",),
        ("--mca", "orte_abort_on_non_zero_status", "1"),
        ("--mca", "orte_keep_fqdn_hostnames", "1"),
        ("--mca", "plm_rsh_args", rsh),
        ("--mca", "plm_rsh_no_tree_spawn", "1"),
        ("--timeout", str(plan.spec.timeout)),
        ("--report-state-on-timeout",),
        ("--tag-output",),
        ("-x", "PATH"),
        ("-x", "LD_LIBRARY_PATH"),
        ("-x", f"MASTER_ADDR={job}-worker-0.{job}"),
        ("-x", "MASTER_PORT=29500"),
        ("-x", f"AIRFLOW_MPI_RANK_PODS={job}-worker-0,{job}-worker-1"),
    ]
    assert sorted(ours) == sorted(theirs + always_added)


def test_the_launch_script_reads_the_controllers_hostfile(tmp_path: Path) -> None:
    """The launcher's env and the hostfile mpi-operator writes (``<pod>.<job>.<ns>.svc slots=N``):
    the script's dry run execs exactly the rendered command line, with -np from the hostfile."""
    plan, (mpijob, _, config_map) = _render(**EXAMPLE_SPEC)
    job = plan.job_name
    config, hostfile, script, env = _launcher_files(tmp_path, mpijob, config_map, "{} slots=2")
    env.update(
        {
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": "/opt/lib",
            contract.ENV_CONFIG_DIR: str(config),
            contract.ENV_HOSTFILE: str(hostfile),
            contract.ENV_DRY_RUN: "1",
            "OMPI_MCA_orte_default_hostfile": CONTROLLER_HOSTFILE,  # what the controller injects
        }
    )
    done = dry_run(script, env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == f"MPI_HOSTS={job}-worker-0.{job}.ml.svc:2,{job}-worker-1.{job}.ml.svc:2"
    expected = build_mpiexec_argv(plan.spec, plan.topology, plan.paths)
    expected[expected.index(CONTROLLER_HOSTFILE)] = str(hostfile)
    argv = exact_argv(lines[-1])
    argv[argv.index("bash") + 1] = plan.paths.launch_script  # the script's own path in this test
    expected[expected.index("bash") + 1] = plan.paths.launch_script
    assert argv == expected


def _launcher_files(
    tmp_path: Path, mpijob: dict[str, Any], config_map: dict[str, Any], line: str
) -> tuple[Path, Path, Path, dict[str, str]]:
    """The launcher's config directory, mpi-operator's hostfile of both workers (each ``line``
    with ``{}`` the worker's name), the launch script, and the launcher's env."""
    job = mpijob["metadata"]["name"]
    config = tmp_path / "config"
    config.mkdir()
    for name, text in config_map["data"].items():
        (config / name).write_text(text)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(line.format(f"{job}-worker-{i}.{job}.ml.svc") + "\n" for i in range(2)))
    script = tmp_path / "launch.sh"
    script.write_text(launch_script_text())
    env = {k: v for k, v in _env(_container(mpijob, "Launcher")).items() if isinstance(v, str)}
    return config, hostfile, script, env


def _compute_hosts(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The launch script's compute_hosts alone (its functions, as a library: no ``main``)."""
    functions = tmp_path / "functions.sh"
    functions.write_text(launch_script_text())
    probe = (
        f'AIRFLOW_MPI_LAUNCH_LIBRARY=1; source "{functions}"; compute_hosts; '
        'echo "default_hostfile=${OMPI_MCA_orte_default_hostfile-unset}"; echo "rank_hosts=${RANK_HOSTS[*]-}"; echo "self_hosts=${SELF_HOSTS[*]-}"'
    )
    return subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=20, check=False)


def test_host_mode_drops_the_injected_default_hostfile_and_skips_the_launcher_itself(tmp_path: Path) -> None:
    plan, (mpijob, _, _) = _render(workers={"replicas": 2, **GPU2}, master=GPU2)
    env = {k: v for k, v in _env(_container(mpijob, "Launcher")).items() if isinstance(v, str)}
    env.update({"PATH": "/usr/bin:/bin", "OMPI_MCA_orte_default_hostfile": CONTROLLER_HOSTFILE})
    done = _compute_hosts(tmp_path, env)
    assert done.returncode == 0, done.stderr
    job = plan.job_name
    assert "default_hostfile=unset" in done.stdout
    assert f"rank_hosts={job}-worker-0.{job} {job}-worker-1.{job}" in done.stdout
    # hostfile mode with the launcher as a worker: its own FQDN line is not an ssh target.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{job}-launcher.{job}.ml.svc slots=2\n{job}-worker-0.{job}.ml.svc slots=2\n")
    env.update({contract.ENV_HOSTS_MODE: "hostfile", contract.ENV_HOSTFILE: str(hostfile)})
    done = _compute_hosts(tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert f"rank_hosts={job}-worker-0.{job}.ml.svc\n" in done.stdout
    assert f"self_hosts={job}-launcher.{job}.ml.svc\n" in done.stdout


def _wait_for_own_names(tmp_path: Path, resolves_after: int | None, timeout: int) -> subprocess.CompletedProcess[str]:
    """wait_for_own_names with a ``getent`` that answers on its Nth call (never when None)."""
    functions = tmp_path / "functions.sh"
    functions.write_text(launch_script_text())
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    answer = "exit 2" if resolves_after is None else f'(( $(wc -l <"{calls}") >= {resolves_after} )) || exit 2'
    (fake / "getent").write_text(f'#!/bin/bash\necho "$*" >>"{calls}"\n{answer}\necho "10.0.0.5 $2"\n')
    (fake / "getent").chmod(0o755)
    probe = (
        f'AIRFLOW_MPI_LAUNCH_LIBRARY=1; source "{functions}"; wait_for_own_names job-launcher.job.ml.svc; echo waited'
    )
    env = {"PATH": f"{fake}:/usr/bin:/bin", contract.ENV_STARTUP_TIMEOUT: str(timeout)}
    return subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=20, check=False)


def test_the_master_waits_until_its_own_name_resolves_before_mpiexec(tmp_path: Path) -> None:
    """mpiexec takes a host name it cannot resolve for a remote host and ssh-es to itself; the
    cluster DNS serves a headless Service's record a moment after the pod is Ready."""
    done = _wait_for_own_names(tmp_path, resolves_after=3, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "waited"
    assert (tmp_path / "calls").read_text().splitlines() == ["hosts job-launcher.job.ml.svc"] * 3


def test_an_own_name_that_never_resolves_fails_naming_it_within_the_startup_timeout(tmp_path: Path) -> None:
    done = _wait_for_own_names(tmp_path, resolves_after=None, timeout=1)
    assert done.returncode == 1
    assert "waited" not in done.stdout
    assert "job-launcher.job.ml.svc did not resolve within 1s" in done.stderr


def test_an_mpich_mpijob_names_its_mpi_and_the_script_reads_the_hydra_hostfile(tmp_path: Path) -> None:
    """``mpiImplementation: MPICH``: mpi-operator writes ``host:N`` lines; the script reads the
    same hosts (for Hydra's machine file), with -np from the hostfile."""
    fields = {**EXAMPLE_SPEC, "mpi": {"implementation": "mpich"}}
    plan, (mpijob, _, config_map) = _render(**fields)
    assert mpijob["spec"]["mpiImplementation"] == "MPICH"
    job = plan.job_name
    config, hostfile, script, env = _launcher_files(tmp_path, mpijob, config_map, "{}:2")
    env.update({"PATH": "/usr/bin:/bin", contract.ENV_CONFIG_DIR: str(config), contract.ENV_HOSTFILE: str(hostfile),
                contract.ENV_DRY_RUN: "1"})  # fmt: skip
    done = dry_run(script, env)
    assert done.returncode == 0, done.stderr
    hosts = f"{job}-worker-0.{job}.ml.svc:2,{job}-worker-1.{job}.ml.svc:2"
    assert done.stdout.splitlines()[1:3] == [f"MPI_HOSTS={hosts}", "MPI_NP=4"]
    argv = exact_argv(done.stdout.splitlines()[-1])
    assert argv[argv.index("-machinefile") + 2 : argv.index("-machinefile") + 4] == ["-np", "4"]
    assert argv[0] == "env" and "--allow-run-as-root" not in argv
