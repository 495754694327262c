"""Any spec at all: either it is valid and every object rendered from it is one Kubernetes accepts,
or it is refused with a SpecError naming each field and fix. Never another exception."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import MPIJobSpec
from tests.api_checks import object_problems
from tests.helpers import fixed_ssh

WORDS = [
    "", " ", "x", "train", "500m", "2Gi", "0.5", "1e400", "nan", "-1", "8", "nvidia.com/gpu", "A100",
    "/data", "data", "../x", "$(id)", "`id`", "; rm -rf /", "a\nb", "\x00", "host", "hostfile", "slot", "node",
    "none", "core", "tcp,self", "^openib", "eth0", "Exists", "Equal", "NoExecute", "NoSchedule", "IfNotPresent",
    "PATH", "MPI_NP", "GJ_TRAINING_ROLE", "NCCL_DEBUG", "NCCL_DEBUG=INFO", "AIRFLOW_MPI_X", "--report-bindings",
    "--host", "-np", "python", "deepspeed", "run.sh", "bash", "-c", "Ä", "x" * 70, "team.example.com/owner",
    "airflow-mpi.io/job", "kubernetes.io/hostname", "default", "ml-team", "my-claim",
]  # fmt: skip
text = st.sampled_from(WORDS) | st.text(max_size=10)
scalar = st.none() | st.booleans() | st.integers(-3, 70_000) | st.integers() | st.floats() | text
anything = st.recursive(
    scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(scalar, inner, max_size=3), max_leaves=8
)


def maybe(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes anything at all."""
    return st.one_of(plausible, plausible, plausible, anything)


def key(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A mapping key: mostly plausible, sometimes any scalar YAML allows as a key."""
    return st.one_of(plausible, plausible, plausible, scalar)


names = maybe(st.sampled_from(["train", "digits-1", "a", "Train", "x" * 50, "-x", "$(id)"]))
commands = maybe(
    st.lists(maybe(st.sampled_from(["python", "/app/train.py", "--lr", "a b", "$HOME", "deepspeed"])), max_size=4)
)
cpu = maybe(st.sampled_from([1, 2, 0.5, "500m", "2", 0, -1, "x", 1.5, 5000]))


def role(max_replicas: int) -> st.SearchStrategy[Any]:
    return maybe(
        st.fixed_dictionaries(
            {},
            optional={
                "replicas": maybe(st.integers(-1, max_replicas)),
                "cpu": cpu,
                "memory": maybe(st.sampled_from(["1Gi", "512Mi", "4GB", "x"])),
                "gpus": maybe(st.integers(-1, 9)),
                "gpu_resource": maybe(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "gpu"])),
                "gpu_type": maybe(st.sampled_from(["A100", "NVIDIA-A100-SXM4-80GB", "A100 80GB"])),
            },
        )
    )


mpi = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "np": maybe(st.integers(-1, 10)),
            "npernode": maybe(st.integers(-1, 4)),
            "oversubscribe": maybe(st.booleans()),
            "btl": maybe(st.sampled_from(["tcp,self", "^openib", "tcp, self"])),
            "btl_tcp_if_include": maybe(st.sampled_from(["eth0", "lo"])),
            "btl_tcp_if_exclude": maybe(st.sampled_from(["lo", "docker0"])),
            "bind_to": maybe(st.sampled_from(["none", "core", "cores"])),
            "map_by": maybe(st.sampled_from(["slot", "node", "ppr:1:node", "diagonal"])),
            "export_env": maybe(st.lists(maybe(st.sampled_from(["PATH", "X=a b", "NCCL DEBUG"])), max_size=3)),
            "env_file": maybe(st.sampled_from(["/app/env", "env"])),
            "wdir": maybe(st.sampled_from(["/app", "app dir"])),
            "mca": maybe(st.dictionaries(key(st.sampled_from(["btl_tcp_eager_limit", "Bad-Name"])), text, max_size=2)),
            "extra_args": maybe(st.lists(maybe(st.sampled_from(["--report-bindings", "--host", "-v"])), max_size=2)),
            "master_port": maybe(st.integers(0, 70_000)),
            "tag_output": maybe(st.booleans()),
        },
    )
)
volume = maybe(
    st.fixed_dictionaries(
        {
            "name": maybe(st.sampled_from(["data", "Data", "mpi-config", "d2"])),
            "mount_path": maybe(st.sampled_from(["/data", "/etc/mpi", "data", "/d"])),
        },
        optional={
            "host_path": maybe(st.sampled_from(["/srv/data", "srv"])),
            "empty_dir": maybe(st.booleans()),
            "persistent_volume_claim": maybe(st.sampled_from(["my-claim", "My Claim"])),
            "config_map": maybe(st.sampled_from(["conf", "Conf"])),
            "secret": maybe(st.sampled_from(["creds"])),
            "sub_path": maybe(st.sampled_from(["a/b", "../x", "/abs"])),
            "read_only": maybe(st.booleans()),
        },
    )
)
toleration = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "key": maybe(st.sampled_from(["gpu", "nvidia.com/gpu", "a b"])),
            "operator": maybe(st.sampled_from(["Equal", "Exists", "Like"])),
            "value": maybe(st.sampled_from(["true", "a b"])),
            "effect": maybe(st.sampled_from(["NoSchedule", "NoExecute", "Sometimes"])),
            "toleration_seconds": maybe(st.integers(-5, 100)),
        },
    )
)
label_map = maybe(
    st.dictionaries(key(st.sampled_from(["team", "a/b", "airflow-mpi.io/x", "bad key"])), text, max_size=2)
)
pod = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "namespace": maybe(st.sampled_from(["ml", "Team A", "default"])),
            "node_selector": label_map,
            "tolerations": maybe(st.lists(toleration, max_size=2)),
            "volumes": maybe(st.lists(volume, max_size=2)),
            "service_account": maybe(st.sampled_from(["trainer", "Trainer"])),
            "image_pull_secrets": maybe(st.lists(st.sampled_from(["regcred", "Reg Cred"]), max_size=2)),
            "image_pull_policy": maybe(st.sampled_from(["Always", "Sometimes"])),
            "priority_class": maybe(st.sampled_from(["high", "High"])),
            "labels": label_map,
            "annotations": maybe(st.dictionaries(key(st.sampled_from(["note", "a b", "x/y"])), text, max_size=2)),
            "shm_size": maybe(st.sampled_from(["2Gi", "lots"])),
        },
    )
)
wild_specs = st.fixed_dictionaries(
    {"name": names, "command": commands},
    optional={
        "image": maybe(st.sampled_from(["registry.example/train:1", "", "my image", "img\n"])),
        "master": role(1),
        "workers": role(3),
        "env": maybe(st.dictionaries(key(st.sampled_from(["NCCL_DEBUG", "MPI_NP", "1X", "A;B"])), text, max_size=2)),
        "mpi": mpi,
        "hosts_mode": maybe(st.sampled_from(["host", "hostfile", "both"])),
        "timeout": maybe(st.integers(-1, 10**6)),
        "startup_timeout": maybe(st.integers(-1, 1000)),
        "ssh_port": maybe(st.integers(-1, 70_000)),
        "pod": pod,
        "unknown": anything,
    },
)

# Specs that are valid by construction (or nearly: cross-field rules may still refuse a few) ...
valid_names = st.sampled_from(["train", "digits-1", "a", "x" * 40])
valid_command = st.lists(text, max_size=4).map(lambda args: ["python", "/app/train.py", *args])
valid_resources = st.fixed_dictionaries(
    {}, optional={"cpu": st.sampled_from([1, 2, "2", "1000m"]), "memory": st.sampled_from(["1Gi", "512Mi", "64G"])}
)
cpu_roles = st.tuples(valid_resources, valid_resources, st.integers(0, 3)).map(
    lambda t: {"master": t[0], "workers": {**t[1], "replicas": t[2]}}
)
gpu_roles = st.tuples(st.integers(1, 2), st.integers(1, 3), st.sampled_from([None, "NVIDIA-A100-SXM4-80GB"])).map(
    lambda t: {
        "master": {"gpus": t[0], **({"gpu_type": t[2]} if t[2] else {})},
        "workers": {"replicas": t[1], "gpus": t[0], **({"gpu_type": t[2]} if t[2] else {})},
    }
)
valid_mpi = st.fixed_dictionaries(
    {},
    optional={
        "btl": st.sampled_from(["tcp,self", "^openib"]),
        "bind_to": st.sampled_from(["none", "core"]),
        "map_by": st.sampled_from(["slot", "node"]),
        "export_env": st.lists(st.sampled_from(["PATH", "LD_LIBRARY_PATH", "X=a b", "Y=$(id)"]), max_size=3),
        "mca": st.dictionaries(
            st.sampled_from(["btl_tcp_eager_limit", "pml_ob1_priority"]), st.sampled_from(["1", "65536"])
        ),
        "extra_args": st.lists(st.sampled_from(["--report-bindings", "-v", "--display-map"]), max_size=2),
        "tag_output": st.booleans(),
        "wdir": st.sampled_from(["/app", "/app dir"]),
    },
)
valid_volume = st.sampled_from(
    [
        {"name": "data", "mount_path": "/data", "empty_dir": True},
        {"name": "data", "mount_path": "/data", "persistent_volume_claim": "my-claim", "read_only": True},
        {"name": "data", "mount_path": "/data", "host_path": "/srv/data", "sub_path": "set/a"},
        {"name": "data", "mount_path": "/data", "config_map": "conf"},
    ]
)
valid_pod = st.fixed_dictionaries(
    {},
    optional={
        "namespace": st.sampled_from(["ml", "default"]),
        "node_selector": st.dictionaries(
            st.sampled_from(["gpu", "team.example.com/pool"]), st.sampled_from(["true", "a"])
        ),
        "tolerations": st.lists(
            st.sampled_from(
                [
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "toleration_seconds": 30,
                    },
                ]
            ),
            max_size=2,
            unique_by=lambda t: t["key"],
        ),
        "volumes": st.lists(valid_volume, max_size=1),
        "labels": st.dictionaries(
            st.sampled_from(["team", "team.example.com/owner"]), st.sampled_from(["ml", "a.b-c"])
        ),
        "annotations": st.dictionaries(st.sampled_from(["note", "x/y"]), text),
        "shm_size": st.sampled_from(["2Gi", "512Mi"]),
        "image_pull_policy": st.sampled_from(["Always", "IfNotPresent", "Never"]),
        "service_account": st.sampled_from(["trainer"]),
        "image_pull_secrets": st.lists(st.sampled_from(["regcred", "other"]), max_size=2, unique=True),
        "priority_class": st.sampled_from(["high"]),
    },
)
valid_specs = st.tuples(
    valid_names,
    valid_command,
    st.one_of(cpu_roles, gpu_roles),
    st.dictionaries(st.sampled_from(["NCCL_DEBUG", "OMP_NUM_THREADS", "MY_VAR"]), text.filter(lambda t: "\x00" not in t)),
    valid_mpi,
    st.sampled_from(["host", "hostfile"]),
    valid_pod,
).map(
    lambda t: {
        "name": t[0], "image": "registry.example/train:1", "command": t[1], **t[2], "env": t[3], "mpi": t[4],
        "hosts_mode": t[5], "pod": t[6],
    }
)  # fmt: skip

# ... the same with one field, anywhere, replaced by a plausible or a wild value ...
PATHS = [
    "name", "command", "image", "master", "master.cpu", "master.gpus", "workers", "workers.replicas", "workers.gpus",
    "env", "mpi", "mpi.np", "mpi.extra_args", "mpi.mca", "mpi.btl", "hosts_mode", "timeout", "startup_timeout",
    "ssh_port", "pod", "pod.volumes", "pod.labels", "pod.tolerations", "pod.namespace", "pod.shm_size",
]  # fmt: skip


def replaced(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    if not rest:
        return {**spec, head: value}
    inner = spec.get(head)
    return {**spec, head: replaced(inner if isinstance(inner, dict) else {}, rest, value)}


mutated_specs = st.tuples(valid_specs, st.sampled_from(PATHS), st.one_of(st.sampled_from(WORDS), anything)).map(
    lambda t: replaced(*t)
)

specs = st.one_of(valid_specs, mutated_specs, wild_specs)


def refusal(data: Any) -> SpecError | None:
    try:
        MPIJobSpec.from_dict(data)
    except SpecError as error:
        return error
    return None


def check_any_spec(data: Any) -> str:
    """'invalid' or 'valid' (after checking every rendered object); anything else raises."""
    error = refusal(data)
    if error is not None:
        assert error.issues and all(issue.field.strip() and issue.fix for issue in error.issues), error
        return "invalid"
    spec = MPIJobSpec.from_dict(data)
    identity = RunIdentity("dag", "task", "run")
    plan = render_plan(spec, identity, ssh=fixed_ssh(spec, identity))
    if not spec.image:  # valid locally; Kubernetes needs an image
        assert refusal_to_render(plan) == ("image",)
        return "invalid"
    for obj in render_manifests(plan, spec.pod.namespace or "default"):
        assert object_problems(obj) == [], (obj["kind"], object_problems(obj))
    assert MPIJobSpec.from_dict(spec.to_dict()) == spec  # what is valid round-trips
    return "valid"


def refusal_to_render(plan: Any) -> tuple[str, ...]:
    try:
        render_manifests(plan, "default")
    except SpecError as error:
        return error.fields
    return ()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_any_spec_is_valid_and_renders_accepted_objects_or_is_a_spec_error(data: dict[str, Any]) -> None:
    check_any_spec(data)


@settings(max_examples=60, deadline=None)
@given(anything)
def test_any_value_at_all_is_a_spec_error_or_a_spec(data: Any) -> None:
    error = refusal(data)
    assert error is None or all(issue.field.strip() and issue.fix for issue in error.issues)


def test_the_generators_reach_both_outcomes() -> None:
    settings_ = settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate])  # no shrinking
    assert check_any_spec(find(valid_specs, lambda d: check_any_spec(d) == "valid", settings=settings_)) == "valid"
    found = find(mutated_specs, lambda d: check_any_spec(d) == "invalid", settings=settings_)
    assert check_any_spec(found) == "invalid"
