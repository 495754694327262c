"""dags/specs/ reproduces the platforms' worked examples: each spec renders (Kubernetes backend)
to objects the apiserver accepts, and the master's mpiexec command line (what the launch script
really execs, from a dry run fed the rendered env and ConfigMap) holds the document's command
line option by option. The options this product always adds are listed below, each with why.

1. The platform launch: master + workers, the platform variables in every pod, the master running
   ``mpiexec --allow-run-as-root --host "$MPI_HOSTS" -np "$MPI_NP" --map-by slot <entry file>``
   with MPI_HOSTS and MPI_NP computed from those variables (the rule is restated below, apart
   from the product's own code).
2. The job-submission guide's worked example: 2 workers x 2 GPUs, hostfile mode,
   ``mpirun --hostfile /etc/mpi/hostfile --allow-run-as-root -np 4 -bind-to none -map-by slot
   -mca pml ob1 -mca btl ^openib -x NCCL_DEBUG=INFO python cifar10_deepspeed.py --deepspeed
   --epochs 128 --stage 2 --dtype fp16 --log-interval 100`` (the hostfile and root flag are from
   the guide's basic command, which the example extends).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from airflow_mpi import contract
from airflow_mpi.cli.main import load_spec
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.kinds.volcano import render_volcano_manifests
from tests.crds import assert_valid_custom_object
from tests.doubles.apivalidation import KINDS, decode_error, validate_object
from tests.helpers import IDENTITY, fixed_ssh
from tests.unit.test_launch_script import dry_run, exact_argv

SPECS = Path(__file__).resolve().parents[2] / "dags" / "specs"
OWNER_UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
SCHEMA_VERSIONS = ["1.30.0", "1.37.0"]
PLURAL = {kind: plural for plural, kind in KINDS.items()}
SSH_CONFIG = f"{contract.DEFAULT_PATHS.ssh_dir}/ssh_config"

# How many values each mpiexec option of either command line takes. Open MPI's mpirun takes its
# long options with one dash or two (``-map-by`` is ``--map-by``), and ``mpirun`` is ``mpiexec``.
ARITY = {
    "allow-run-as-root": 0,
    "host": 1,
    "hostfile": 1,
    "np": 1,
    "map-by": 1,
    "bind-to": 1,
    "mca": 2,
    "x": 1,
    "timeout": 1,
    "report-state-on-timeout": 0,
    "tag-output": 0,
}
Option = tuple[str, ...]


def parse(argv: list[str]) -> tuple[str, Counter[Option], list[str]]:
    """(program, the options with their values, the command after them)."""
    program = {"mpirun": "mpiexec"}.get(argv[0], argv[0])
    options: Counter[Option] = Counter()
    at = 1
    while at < len(argv) and argv[at].startswith("-"):
        name = argv[at].lstrip("-")
        assert name in ARITY, f"option {argv[at]} is new: say here how many values it takes"
        options[(name, *argv[at + 1 : at + 1 + ARITY[name]])] += 1
        at += 1 + ARITY[name]
    return program, options, argv[at:]


def always_added(plan: JobPlan) -> dict[Option, str]:
    """What this product adds to every job's mpiexec command line, and why."""
    rank0 = plan.topology.rank_hosts[0]
    return {
        ("mca", "orte_abort_on_non_zero_status", "1"): "a rank that exits non-zero ends the whole job (without it "
        "mpiexec returned 0 although a rank exited 3)",
        ("mca", "orte_keep_fqdn_hostnames", "1"): "hosts stay <pod>.<job>: Open MPI would strip the domain, and "
        "known_hosts pins the full names",
        ("mca", "plm_rsh_args", f"-F {SSH_CONFIG}"): "ssh uses the job's own key, pinned host keys, port and timeouts",
        ("mca", "plm_rsh_no_tree_spawn", "1"): "the master starts every daemon: workers never ssh to each other",
        ("timeout", str(plan.spec.timeout)): "the job's timeout ends mpiexec even with no Airflow around",
        ("report-state-on-timeout",): "a timeout shows which ranks were still running",
        ("tag-output",): "every line names its rank, so the task log and failure messages can",
        ("x", "PATH"): "ranks on remote nodes find the same programs (the guide's advice)",
        ("x", "LD_LIBRARY_PATH"): "ranks on remote nodes find the same libraries (the guide's advice)",
        ("x", f"MASTER_ADDR={rank0.host}"): "torch.distributed's rendezvous: the host of rank 0",
        ("x", f"MASTER_PORT={plan.spec.mpi.master_port}"): "torch.distributed's rendezvous port",
        ("x", f"AIRFLOW_MPI_RANK_PODS={','.join(h.pod for h in plan.topology.rank_hosts)}"): "the rank wrapper's "
        "NODE_RANK: which pods hold ranks, in order",
    }


# Before the user's command: the rank wrapper sets RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK and
# reports each rank's start; ``bash`` explicitly, so no remote node depends on mode bits.
RANK_WRAPPER = ["bash", contract.DEFAULT_PATHS.launch_script, "rank"]


def rendered(spec_file: str) -> tuple[JobPlan, list[dict[str, Any]]]:
    spec = load_spec(str(SPECS / spec_file))
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    return plan, render_manifests(plan, "training", owner_uid=OWNER_UID)


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in pod["spec"]["containers"][0]["env"]}


def master_argv(objects: list[dict[str, Any]], tmp_path: Path) -> tuple[list[str], list[str]]:
    """The master pod's launch script, dry run with its rendered env and ConfigMap files: the
    lines it prints and the exact argv it would exec (the test's directory standing for /etc/mpi)."""
    master = objects[-1]
    assert master["spec"]["containers"][0]["command"] == ["bash", contract.DEFAULT_PATHS.launch_script]
    return dry_run_master(config_files(objects), pod_env(master), tmp_path)


def config_files(objects: list[dict[str, Any]]) -> dict[str, str]:
    return dict(next(o for o in objects if o["kind"] == "ConfigMap")["data"])


def dry_run_master(files: dict[str, str], pod_env: dict[str, str], tmp_path: Path) -> tuple[list[str], list[str]]:
    config = tmp_path / "etc-mpi"
    config.mkdir()
    for name, text in files.items():
        (config / name).write_text(text)
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/usr/local/lib",
        **pod_env,
        contract.ENV_CONFIG_DIR: str(config),
        contract.ENV_SSH_SECRET_DIR: str(tmp_path / "ssh"),
        contract.ENV_RUNTIME_DIR: str(tmp_path / "run"),
        contract.ENV_DRY_RUN: "1",
    }
    done = dry_run(config / "launch.sh", env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    argv = [arg.replace(str(config), contract.DEFAULT_PATHS.config_dir) for arg in exact_argv(lines[-1])]
    return lines, argv


def platform_hosts_and_np(env: dict[str, str]) -> tuple[str, int]:
    """MPI_HOSTS and MPI_NP as the platform's launch script computes them from its variables:
    worker hosts are MPI_HOST split on commas (empty items dropped), each ``:<slots>``; slots are
    CPU limits when neither role has GPUs, else GPU limits; a master without GPUs beside workers
    with GPUs runs no rank, and workers without GPUs beside a master with GPUs run none."""
    master_host = f"{env['GJ_TRAINING_POD_NAME']}.{env['GJ_TRAINING_VC_JOB_NAME']}"
    workers = [host for host in env.get("MPI_HOST", "").split(",") if host]
    master_gpu, worker_gpu = int(env["GJ_TRAINING_MASTER_GPU_LIMIT"]), int(env["GJ_TRAINING_WORKER_GPU_LIMIT"])
    master_n, worker_n = int(env["GJ_TRAINING_MASTER_REPLICAS"]), int(env["GJ_TRAINING_WORKER_REPLICAS"])
    if master_gpu == 0 and worker_gpu == 0:
        master_slots, worker_slots = int(env["GJ_TRAINING_MASTER_CPU_LIMIT"]), int(env["GJ_TRAINING_WORKER_CPU_LIMIT"])
    elif master_gpu > 0 and worker_gpu > 0:
        master_slots, worker_slots = master_gpu, worker_gpu
    elif master_gpu == 0:
        master_slots, worker_slots, master_n = 0, worker_gpu, 0
    else:
        master_slots, worker_slots, worker_n, workers = master_gpu, 0, 0, []
    hosts = ([f"{master_host}:{master_slots}"] if master_n else []) + [f"{w}:{worker_slots}" for w in workers]
    return ",".join(hosts), master_n * master_slots + worker_n * worker_slots


def assert_same_options(document: list[str], product: list[str], added: dict[Option, str]) -> None:
    """Every option of the document's command line is in the product's with the same values, the
    product adds exactly ``added`` (each with a reason), and the command after them is the
    document's behind the rank wrapper."""
    doc_program, doc_options, doc_command = parse(document)
    program, options, command = parse(product)
    assert program == doc_program == "mpiexec"
    missing = doc_options - options
    assert not missing, f"options of the document the product lacks or changes: {sorted(missing)}"
    extra = options - doc_options
    assert sorted(extra) == sorted(added), f"unexplained: {sorted(set(extra) - set(added))}"
    assert all(count == 1 for count in extra.values())
    assert all(why for why in added.values())
    assert command == [*RANK_WRAPPER, *doc_command]


def assert_valid_objects(objects: list[dict[str, Any]]) -> None:
    """What kube-apiserver checks (its validation, ported) and the strict OpenAPI schema."""
    for obj in objects:
        plural = PLURAL[obj["kind"]]
        assert decode_error(plural, obj) is None, obj["metadata"]["name"]
        causes = validate_object(plural, obj)
        assert causes == [], [str(cause) for cause in causes]
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


# --- 1. the platform launch ---------------------------------------------------------------------


def test_platform_launch_spec_renders_valid_objects() -> None:
    _, objects = rendered("gj_launch.yaml")
    assert [o["kind"] for o in objects] == ["Service", "Secret", "ConfigMap", "Pod", "Pod", "Pod"]
    assert_valid_objects(objects)


def test_platform_launch_writes_the_platform_variables_into_every_pod() -> None:
    plan, objects = rendered("gj_launch.yaml")
    job = plan.job_name
    pods = objects[3:]
    for pod in pods:
        env, name = pod_env(pod), pod["metadata"]["name"]
        role = "master" if name.endswith("-master-0") else "worker"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "2" and limits["cpu"] == "8"
        assert {k: v for k, v in env.items() if k.startswith("GJ_TRAINING_") or k == "MPI_HOST"} == {
            "GJ_TRAINING_ROLE": role,
            "GJ_TRAINING_VC_JOB_NAME": job,
            "GJ_TRAINING_POD_NAME": name,
            "GJ_TRAINING_MASTER_CPU_LIMIT": "8",
            "GJ_TRAINING_MASTER_GPU_LIMIT": "2",
            "GJ_TRAINING_MASTER_REPLICAS": "1",
            "GJ_TRAINING_WORKER_CPU_LIMIT": "8",
            "GJ_TRAINING_WORKER_GPU_LIMIT": "2",
            "GJ_TRAINING_WORKER_REPLICAS": "2",
            "MPI_HOST": f"{job}-worker-0.{job},{job}-worker-1.{job}",
        }
        # The same run command on every node; the role decides (a worker only runs sshd).
        assert pod["spec"]["containers"][0]["command"] == ["bash", contract.DEFAULT_PATHS.launch_script]
    assert objects[0]["metadata"]["name"] == job  # the headless Service makes <pod>.<job> resolve


def assert_platform_launch(plan: JobPlan, env: dict[str, str], lines: list[str], argv: list[str]) -> None:
    hosts, np = platform_hosts_and_np(env)
    # The script prints MPI_HOST, MPI_HOSTS and MPI_NP before it execs, as the document's does.
    assert lines[:3] == [f"MPI_HOST={env['MPI_HOST']}", f"MPI_HOSTS={hosts}", f"MPI_NP={np}"]
    assert np == 6
    entry = ["python", "/workspace/train.py"]  # the document's <entry file>
    document = ["mpiexec", "--allow-run-as-root", "--host", hosts, "-np", str(np), "--map-by", "slot", *entry]
    added = always_added(plan)
    # The document binds nothing explicitly; Open MPI would bind ranks to cores, which fights the
    # CPU placement Kubernetes gives the pod (the job-submission guide says -bind-to none too).
    added[("bind-to", "none")] = "leave CPU placement to Kubernetes"
    assert_same_options(document, argv, added)
    assert argv == list(plan.mpiexec_argv)  # the dry run and `airflow-mpi render` show the same line


def test_platform_launch_master_runs_the_documents_mpiexec(tmp_path: Path) -> None:
    plan, objects = rendered("gj_launch.yaml")
    lines, argv = master_argv(objects, tmp_path)
    assert_platform_launch(plan, pod_env(objects[-1]), lines, argv)


def test_platform_launch_as_a_volcano_job_runs_the_same_mpiexec(tmp_path: Path) -> None:
    """The platform runs on Volcano Jobs: rendered for the volcano backend, the spec is one valid
    Volcano Job whose master, given the pod name Volcano gives it, execs the same command line."""
    spec = load_spec(str(SPECS / "gj_launch.yaml"))
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    objects = render_volcano_manifests(plan, "training")
    job = objects[0]
    assert job["kind"] == "Job" and job["metadata"]["name"] == plan.job_name
    assert_valid_custom_object(job)
    assert_valid_objects(objects[1:])
    master = next(task for task in job["spec"]["tasks"] if task["name"] == "master")["template"]
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    # The downward API passes the pod's own name, which Volcano makes <job>-<task>-<index>.
    env["GJ_TRAINING_POD_NAME"] = f"{plan.job_name}-master-0"
    lines, argv = dry_run_master(config_files(objects), env, tmp_path)
    assert_platform_launch(plan, env, lines, argv)


# --- 2. the job-submission guide's 2 workers x 2 GPUs ---------------------------------------------


def test_gpu_2x2_spec_renders_valid_objects() -> None:
    _, objects = rendered("gpu_2x2_hostfile.yaml")
    assert [o["kind"] for o in objects] == ["Service", "Secret", "ConfigMap", "Pod", "Pod", "Pod"]
    assert_valid_objects(objects)
    for worker in objects[3:5]:
        assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in objects[-1]["spec"]["containers"][0]["resources"].get("limits", {})


def test_gpu_2x2_hostfile_lists_the_two_workers_with_two_slots_each() -> None:
    plan, objects = rendered("gpu_2x2_hostfile.yaml")
    job = plan.job_name
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    # The guide's lines are "<host> slots=N" too; its hosts are the operator's Service names,
    # ours <pod>.<job> (the job's headless Service), both resolving inside the namespace.
    assert config_map["data"]["hostfile"].splitlines() == [
        f"{job}-worker-0.{job} slots=2",
        f"{job}-worker-1.{job} slots=2",
    ]


def test_gpu_2x2_master_runs_the_documents_mpirun(tmp_path: Path) -> None:
    plan, objects = rendered("gpu_2x2_hostfile.yaml")
    lines, argv = master_argv(objects, tmp_path)
    assert "MPI_NP=4" in lines  # 2 workers x 2 GPUs; the launcher runs no rank
    document = [
        "mpirun", "--hostfile", "/etc/mpi/hostfile", "--allow-run-as-root",
        "-np", "4", "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-x", "NCCL_DEBUG=INFO",
        "python", "/root/code/training/cifar10_deepspeed.py",
        "--deepspeed", "--epochs", "128", "--stage", "2", "--dtype", "fp16", "--log-interval", "100",
    ]  # fmt: skip
    assert_same_options(document, argv, always_added(plan))
    assert argv == list(plan.mpiexec_argv)


@pytest.mark.parametrize("spec_file", sorted(p.name for p in SPECS.glob("*.yaml")))
def test_every_spec_in_dags_specs_is_covered_here(spec_file: str) -> None:
    assert spec_file in {"gj_launch.yaml", "gpu_2x2_hostfile.yaml"}, f"{spec_file}: add its document's check here"
