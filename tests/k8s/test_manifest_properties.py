"""Property: for any run identity Airflow can produce and any spec the product accepts, every object
``render_plan``/``render_manifests`` produce passes the apiserver's validation (the same functions
the API double answers with) and the strict OpenAPI schema (kubernetes-validate)."""

from __future__ import annotations

import string
from datetime import datetime, timedelta, timezone
from typing import Any

import kubernetes_validate
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from airflow_mpi.contract import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import LABEL_MAP_INDEX, RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import MPIJobSpec, max_name_length
from tests.doubles.apivalidation import KINDS, decode_error, validate_object
from tests.helpers import fixed_ssh

PLURAL = {kind: plural for plural, kind in KINDS.items()}
OWNER_UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
SCHEMA_VERSIONS = ["1.30.0", "1.37.0"]

# --- run identities as Airflow writes them --------------------------------------------------------

# Airflow's dag and task ids: word characters (Unicode letters too), '.' and '-', at most 250.
AIRFLOW_ID = st.text(alphabet=string.ascii_letters + string.digits + "_.-" + "äöüé训练", min_size=1, max_size=250)
ZONES = [timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
STAMPS = st.datetimes(datetime(2000, 1, 1), datetime(2099, 12, 31), timezones=st.sampled_from(ZONES))
GENERATED_RUN_ID = st.builds(
    lambda kind, stamp: f"{kind}__{stamp.isoformat()}",
    st.sampled_from(["manual", "scheduled", "backfill", "asset_triggered"]),
    STAMPS,
)
# A run id given by hand: Airflow's default allowed_run_id_pattern.
GIVEN_RUN_ID = st.text(alphabet=string.ascii_letters + string.digits + "_.~:+-", min_size=1, max_size=250)
IDENTITIES = st.builds(
    RunIdentity,
    dag_id=AIRFLOW_ID,
    task_id=AIRFLOW_ID,
    run_id=st.one_of(GENERATED_RUN_ID, GIVEN_RUN_ID),
    map_index=st.one_of(st.just(-1), st.integers(0, 10_000)),
    try_number=st.integers(1, 100),
)

# --- specs: mostly valid, with the edge values a user can write ------------------------------------


def mostly(valid: st.SearchStrategy[Any], *edges: Any, one_in: int = 12) -> st.SearchStrategy[Any]:
    """``valid``, and one time in ``one_in`` an edge value (which the spec must refuse, or render well)."""
    # sampled_from picks evenly (integers() favours its bounds) and shrinks towards the valid side
    edge = st.sampled_from(edges)
    return st.sampled_from(range(one_in)).flatmap(lambda n: edge if n == one_in - 1 else valid)


DNS_LABEL = st.from_regex(r"\A[a-z]([-a-z0-9]{0,20}[a-z0-9])?\Z")
LABEL_KEY = mostly(
    st.one_of(
        st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?\Z"),
        st.sampled_from(
            ["example.com/team", "nvidia.com/gpu.product", "app.kubernetes.io/part-of", "kubernetes.io/os"]
        ),
    ),
    "key\n",
    "Example.com/x",
    "a/b/c",
)
LABEL_VALUE = mostly(st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?\Z"), "-1", "v\n", "v" * 64)
ENV_NAME = mostly(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,30}\Z"), "NAME\n").filter(
    lambda name: name not in RESERVED_ENV_NAMES and not name.startswith(RESERVED_ENV_PREFIXES)
)
GPUS = st.sampled_from([1, 2, 4, 8])
CPU_ANY = st.sampled_from([1, 2, 16, 64, "500m", 0.5, "3500m", "2", 1.25])
MEMORY = mostly(st.sampled_from([None, "512Mi", "2Gi", "64Gi", "1.5Gi", "1000M", "8G", "1e9", "128974848"]), "\uff11Gi")
TOLERATION = st.one_of(
    st.fixed_dictionaries(
        {"key": LABEL_KEY, "operator": st.just("Exists")}, optional={"effect": st.just("NoSchedule")}
    ),
    st.fixed_dictionaries(
        {"key": LABEL_KEY, "operator": st.just("Equal"), "value": LABEL_VALUE},
        optional={"effect": st.sampled_from(["NoSchedule", "PreferNoSchedule"])},
    ),
    st.fixed_dictionaries(
        {"key": LABEL_KEY, "effect": st.just("NoExecute")}, optional={"toleration_seconds": st.integers(0, 600)}
    ),
    mostly(
        st.just({"operator": "Exists"}),
        {"key": "a b", "operator": "Exists"},
        {"key": "", "value": "x"},
        {"key": "a", "effect": "NoSchedule", "toleration_seconds": 5},
        one_in=4,
    ),
)
SUB_PATH = mostly(
    st.sampled_from([None, "data", "a/b", "..hidden", "./x"]), "../up", "/abs", "a/../b", "x/..", one_in=4
)
HOST_PATH = mostly(st.sampled_from(["/mnt/data", "/srv/ckpt", "/data/./x"]), "/mnt/../etc", one_in=4)
OBJECT_NAME = mostly(st.sampled_from(["trainer", "ml.trainer", "high-priority"]), "a" * 254, "Trainer", one_in=4)


# Built once: a strategy made inside a draw is validated again on every example (slow).
VOLUME_NAMES = st.lists(DNS_LABEL.filter(lambda n: n != "dshm" and not n.startswith("mpi-")), max_size=3, unique=True)
VOLUME_SOURCE = st.sampled_from(["host_path", "persistent_volume_claim", "config_map", "secret", "empty_dir"])
LABEL_MAP = st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=2)
# Free text (annotation and env values, arguments): ASCII with some multi-byte characters. An
# explicit alphabet spares hypothesis its Unicode table (seconds to build, a cache on disk).
TEXT = st.text(alphabet=string.printable + "äéø训练€\u00a0\u2028\U0001f600", max_size=40)
ANNOTATIONS = st.dictionaries(LABEL_KEY, TEXT, max_size=2)
TOLERATIONS = st.lists(TOLERATION, max_size=2)
NAMES = st.lists(DNS_LABEL, max_size=2)
NAMESPACE = st.one_of(st.none(), DNS_LABEL)
PULL_POLICY = st.sampled_from([None, "Always", "IfNotPresent", "Never"])
SHM_SIZE = st.sampled_from([None, "1Gi", "64Mi", "16Gi", "0.5Gi"])
ENV = st.dictionaries(ENV_NAME, TEXT, max_size=3)
ARGS = st.lists(TEXT, max_size=2)
CPU_WHOLE = st.integers(1, 64)
GPU_TYPE = st.sampled_from([None, "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"])
GPU_RESOURCE = st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"])
MODES = st.sampled_from(["cpu", "both", "workers", "master"])
MODES_NO_WORKERS = st.sampled_from(["cpu", "master"])
TIMEOUT = mostly(st.integers(1, 10**6), 2**31 - 3661, 2**31 - 3660, 2**31 - 1, one_in=8)
STARTUP_TIMEOUT = st.integers(1, 3600)
SSH_PORT = st.integers(1, 65535).filter(lambda port: port != 29500)
HOSTS_MODE = st.sampled_from(["host", "hostfile"])


@st.composite
def volumes(draw: Any) -> list[dict[str, Any]]:
    result = []
    for index, name in enumerate(draw(VOLUME_NAMES)):
        source = draw(VOLUME_SOURCE)
        volume: dict[str, Any] = {"name": name, "mount_path": f"/mnt/v{index}", "read_only": draw(st.booleans())}
        volume[source] = True if source == "empty_dir" else draw(HOST_PATH if source == "host_path" else DNS_LABEL)
        sub_path = draw(SUB_PATH)
        if sub_path is not None:
            volume["sub_path"] = sub_path
        result.append(volume)
    return result


VOLUMES = volumes()


@st.composite
def spec_dicts(draw: Any) -> dict[str, Any]:
    replicas = draw(st.integers(0, 8))
    mode = draw(MODES if replicas else MODES_NO_WORKERS)
    gpus, gpu_type, resource = draw(GPUS), draw(GPU_TYPE), draw(GPU_RESOURCE)
    cpu = CPU_WHOLE if mode == "cpu" else CPU_ANY  # without GPUs the cores are the MPI slots
    master: dict[str, Any] = {"cpu": draw(cpu), "memory": draw(MEMORY)}
    workers: dict[str, Any] = {"replicas": replicas, "cpu": draw(cpu), "memory": draw(MEMORY)}
    if mode in ("both", "master"):
        master.update(gpus=gpus, gpu_resource=resource, gpu_type=gpu_type)
    if mode in ("both", "workers"):
        workers.update(gpus=gpus, gpu_resource=resource, gpu_type=gpu_type)
    pod: dict[str, Any] = {
        "namespace": draw(NAMESPACE),
        "node_selector": draw(LABEL_MAP),
        "tolerations": draw(TOLERATIONS),
        "volumes": draw(VOLUMES),
        "image_pull_secrets": draw(NAMES),
        "image_pull_policy": draw(PULL_POLICY),
        "labels": draw(LABEL_MAP),
        "annotations": draw(ANNOTATIONS),
        "shm_size": draw(SHM_SIZE),
    }
    for key in ("service_account", "priority_class"):
        if draw(st.booleans()):
            pod[key] = draw(OBJECT_NAME)
    return {
        "name": draw(DNS_LABEL)[: max_name_length(replicas)].rstrip("-"),
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py", *draw(ARGS)],
        "master": master,
        "workers": workers,
        "env": draw(ENV),
        "hosts_mode": draw(HOSTS_MODE),
        "timeout": draw(TIMEOUT),
        "startup_timeout": draw(STARTUP_TIMEOUT),
        "ssh_port": draw(SSH_PORT),
        "pod": {key: value for key, value in pod.items() if value is not None},
    }


@settings(
    max_examples=150,
    deadline=None,
    database=None,  # examples are not kept between runs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    identity=IDENTITIES,
    data=spec_dicts(),
    version=st.sampled_from(SCHEMA_VERSIONS),
    other=st.sampled_from(["Service", "Secret", "ConfigMap"]),
)
def test_every_rendered_object_passes_the_apiservers_validation(
    identity: RunIdentity, data: dict[str, Any], version: str, other: str
) -> None:
    try:
        spec = MPIJobSpec.from_dict(data)
    except SpecError:
        reject()  # the product refused it with a SpecError: nothing reaches the cluster
    plan = render_plan(spec, identity, ssh=fixed_ssh(spec, identity))
    objects = render_manifests(plan, spec.pod.namespace or "default", owner_uid=OWNER_UID)
    for obj in objects:
        plural = PLURAL[obj["kind"]]
        assert decode_error(plural, obj) is None, obj["metadata"]["name"]
        causes = validate_object(plural, obj)
        assert causes == [], [str(cause) for cause in causes]
        assert (LABEL_MAP_INDEX in obj["metadata"]["labels"]) == (identity.map_index >= 0)
    # The OpenAPI schema costs ~25 ms an object: the pods of both roles every time, and one of the
    # other objects (whose shape varies less), drawn, so all three are checked across examples.
    pods = {id(o): o for o in (objects[3], objects[-1])}.values()
    for obj in [*pods, next(o for o in objects if o["kind"] == other)]:
        kubernetes_validate.validate(obj, version, strict=True)
