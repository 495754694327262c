"""MPIJobSpec: loading, round trips, and every validation rule naming its field and fix."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from airflow_mpi.exceptions import SpecError
from airflow_mpi.spec import HostsMode, MasterSpec, MPIJobSpec, WorkerSpec, max_name_length, parse_cpu
from tests.helpers import plan_for, spec_from

BASE: dict[str, Any] = {"name": "job", "image": "img:1", "command": ["python", "/app/train.py"]}


def with_fields(**changes: Any) -> dict[str, Any]:
    data = {**BASE}
    for key, value in changes.items():
        parent, _, child = key.partition("__")
        if child:
            data[parent] = {**data.get(parent, {}), child: value}
        else:
            data[parent] = value
    return data


def test_minimal_spec_has_contract_defaults() -> None:
    spec = MPIJobSpec.from_dict(BASE)
    assert spec.master == MasterSpec(replicas=1)
    assert spec.workers.replicas == 0
    assert spec.hosts_mode is HostsMode.HOST
    assert spec.mpi.map_by == "slot" and spec.mpi.bind_to == "none" and spec.mpi.tag_output
    assert spec.mpi.export_env == ("PATH", "LD_LIBRARY_PATH")
    assert spec.ssh_port == 22


def test_round_trip_through_yaml_keeps_every_field() -> None:
    data = with_fields(
        master={"cpu": "500m", "memory": "1Gi", "gpus": 2, "gpu_type": "A100"},
        workers={"replicas": 3, "cpu": 8, "memory": "32Gi", "gpus": 2, "gpu_type": "A100"},
        env={"NCCL_DEBUG": "INFO"},
        mpi={"pml": "ob1", "btl": "^openib", "mca": {"btl_tcp_eager_limit": "65536"}, "export_env": ["PATH"]},
        hosts_mode="hostfile",
        pod={"tolerations": [{"key": "gpu", "operator": "Exists"}], "shm_size": "2Gi"},
    )
    spec = MPIJobSpec.from_dict(data)
    again = MPIJobSpec.from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict())))
    assert again == spec
    assert again.workers == WorkerSpec(replicas=3, cpu=8, memory="32Gi", gpus=2, gpu_type="A100")


def test_templated_integers_are_accepted_as_text() -> None:
    spec = MPIJobSpec.from_dict(with_fields(workers={"replicas": "2"}, timeout=" 60 "))
    assert spec.workers.replicas == 2 and spec.timeout == 60


@pytest.mark.parametrize(
    ("value", "cores"), [(2, "2"), (0.5, "0.5"), ("500m", "0.5"), ("3", "3"), ("1.5", "1.5"), ("x", None), (True, None)]
)
def test_parse_cpu(value: object, cores: str | None) -> None:
    parsed = parse_cpu(value)
    assert (str(parsed.normalize()) if parsed is not None else None) == cores


# (changes, field that must be named, a word the fix or problem must contain)
BAD_SPECS: list[tuple[dict[str, Any], str, str]] = [
    ({"master": {"replicas": 2}}, "master.replicas", "exactly one master"),
    ({"master": {"replicas": 0}}, "master.replicas", "exactly one master"),
    ({"workers": {"replicas": -1}}, "workers.replicas", "0 or more"),
    ({"master": {"gpus": 2}, "workers": {"replicas": 2, "gpus": 4}}, "workers.gpus", "same number of GPUs"),
    (
        {"master": {"gpus": 2}, "workers": {"replicas": 2, "gpus": 4}},
        "workers.gpus",
        "when both roles use GPUs they must have the same GPU count",
    ),
    (
        {"master": {"gpus": 1, "gpu_resource": "amd.com/gpu"}, "workers": {"replicas": 1, "gpus": 1}},
        "workers.gpu_resource",
        "same GPU resource",
    ),
    (
        {"master": {"gpus": 1, "gpu_type": "A100"}, "workers": {"replicas": 1, "gpus": 1, "gpu_type": "H100"}},
        "workers.gpu_type",
        "same GPU model",
    ),
    ({"master": {"gpus": 0}, "workers": {"replicas": 0, "gpus": 8}}, "workers.replicas", "MPI_NP=0"),
    ({"master": {"gpus": 2}, "workers": {"replicas": 2, "gpus": 0}}, "workers.gpus", "no rank"),
    ({"master": {"gpus": 2}, "workers": {"replicas": 2, "gpus": 0}}, "workers.gpus", "only the master runs ranks"),
    ({"env": {"GJ_TRAINING_ROLE": "worker"}}, "env.GJ_TRAINING_ROLE", "platform"),
    ({"env": {"MPI_HOST": "x"}}, "env.MPI_HOST", "platform"),
    ({"env": {"MPI_NP": "4"}}, "env.MPI_NP", "platform"),
    ({"env": {"MPI_HOSTS": "a:1"}}, "env.MPI_HOSTS", "platform"),
    ({"env": {"NCCL_IB_HCA": "mlx5"}}, "env.NCCL_IB_HCA", "NCCL_IB_"),
    ({"env": {"OMPI_MCA_orte_abort_on_non_zero_status": "0"}}, "env.OMPI_MCA_orte_abort_on_non_zero_status", "exits"),
    ({"env": {"1BAD": "x"}}, "env.1BAD", "environment variable name"),
    ({"name": "Train_Job"}, "name", "DNS-1123"),
    ({"name": "a" * 50}, "name", "at most"),
    ({"name": ""}, "name", "empty"),
    ({"mpi": {"extra_args": ["--hostfile", "/tmp/h"]}}, "mpi.extra_args[0]", "never both"),
    ({"hosts_mode": "hostfile", "mpi": {"extra_args": ["--host", "a"]}}, "mpi.extra_args[0]", "never both"),
    ({"mpi": {"extra_args": ["-np", "4"]}}, "mpi.extra_args[0]", "mpi.np"),
    ({"command": ["deepspeed", "train.py"]}, "command", "library"),
    ({"command": ["deepspeed", "train.py"]}, "command", "clash with mpiexec's"),
    ({"command": ["/usr/bin/torchrun", "train.py"]}, "command", "mpiexec already starts"),
    ({"command": ["horovodrun", "-np", "4", "python", "t.py"]}, "command", "second launcher"),
    ({"command": ["python", "-m", "torch.distributed.run", "t.py"]}, "command", "launcher module"),
    ({"command": ["run.sh"]}, "command", "['bash', 'run.sh'"),
    ({"command": ["run.sh"]}, "command", "mode bits and #! line"),
    ({"command": ["/app/train.py"]}, "command", "['python', '/app/train.py'"),
    ({"command": []}, "command", "argv list"),
    ({"master": {"cpu": "lots"}}, "master.cpu", "CPU quantity"),
    ({"master": {"cpu": 0}}, "master.cpu", "at least 1 core"),
    ({"workers": {"replicas": 1, "cpu": 1.5}}, "workers.cpu", "whole number"),
    ({"master": {"memory": "4GB"}}, "master.memory", "8Gi"),
    ({"workers": {"gpus": -1}}, "workers.gpus", "0 (CPU only)"),
    ({"master": {"gpu_resource": "gpu"}}, "master.gpu_resource", "nvidia.com/gpu"),
    ({"timeout": 0}, "timeout", "seconds"),
    ({"startup_timeout": -5}, "startup_timeout", "seconds"),
    ({"ssh_port": 70000}, "ssh_port", "1-65535"),
    ({"mpi": {"np": 0}}, "mpi.np", "at least 1"),
    ({"mpi": {"np": 9}}, "mpi.np", "slots"),
    ({"workers": {"replicas": 2}, "mpi": {"npernode": 0}}, "mpi.npernode", "at least 1"),
    (
        {"workers": {"replicas": 1, "cpu": 4}, "master": {"cpu": 4}, "mpi": {"npernode": 1, "np": 8}},
        "mpi.npernode",
        "raise",
    ),
    ({"mpi": {"bind_to": "cores"}}, "mpi.bind_to", "binding"),
    ({"mpi": {"map_by": "diagonal"}}, "mpi.map_by", "slot"),
    ({"mpi": {"btl": "tcp, self"}}, "mpi.btl", "may hold only"),
    ({"mpi": {"btl_tcp_if_include": "eth0", "btl_tcp_if_exclude": "lo"}}, "mpi.btl_tcp_if_exclude", "only one"),
    ({"mpi": {"export_env": ["NCCL DEBUG"]}}, "mpi.export_env[0]", "VAR=value"),
    ({"mpi": {"env_file": "env.txt"}}, "mpi.env_file", "absolute"),
    ({"mpi": {"wdir": "app"}}, "mpi.wdir", "absolute"),
    ({"mpi": {"mca": {"plm_rsh_agent": "rsh"}}}, "mpi.mca.plm_rsh_agent", "set by airflow-mpi"),
    ({"mpi": {"mca": {"Bad-Name": "1"}}}, "mpi.mca.Bad-Name", "MCA parameter"),
    ({"mpi": {"master_port": 22}}, "mpi.master_port", "sshd port"),
    ({"hosts_mode": "both"}, "hosts_mode", "'host'"),
    ({"image": "my image"}, "image", "whitespace"),
    ({"workrs": {"replicas": 2}}, "workrs", "did you mean 'workers'"),
    ({"workers": {"replicas": "two"}}, "workers.replicas", "an integer"),
    ({"workers": "2"}, "workers", "mapping"),
    ({"env": {"A": ["x"]}}, "env.A", "string"),
    ({"pod": {"volumes": [{"name": "data", "mount_path": "/data"}]}}, "pod.volumes[0]", "exactly one"),
    (
        {"pod": {"volumes": [{"name": "d", "mount_path": "data", "host_path": "/d"}]}},
        "pod.volumes[0].mount_path",
        "absolute",
    ),
    (
        {"pod": {"volumes": [{"name": "d", "mount_path": "/etc/mpi/x", "empty_dir": True}]}},
        "pod.volumes[0].mount_path",
        "overlaps",
    ),
    ({"pod": {"tolerations": [{"key": "a", "operator": "Like"}]}}, "pod.tolerations[0].operator", "Exists"),
    ({"pod": {"node_selector": {"gpu": "a b"}}}, "pod.node_selector.gpu", "label value"),
    ({"pod": {"image_pull_policy": "Sometimes"}}, "pod.image_pull_policy", "IfNotPresent"),
    ({"pod": {"shm_size": "lots"}}, "pod.shm_size", "2Gi"),
    ({"pod": {"namespace": "Team_A"}}, "pod.namespace", "DNS-1123"),
    # What a real apiserver would refuse at create, said before any object exists:
    (
        {"pod": {"volumes": [{"name": "d", "mount_path": "/d", "empty_dir": True, "sub_path": "../up"}]}},
        "pod.volumes[0].sub_path",
        "without '..'",
    ),
    (
        {"pod": {"volumes": [{"name": "d", "mount_path": "/d", "empty_dir": True, "sub_path": "/etc"}]}},
        "pod.volumes[0].sub_path",
        "relative path",
    ),
    (
        {"pod": {"volumes": [{"name": "d", "mount_path": "/d", "host_path": "/mnt/../etc"}]}},
        "pod.volumes[0].host_path",
        "'..'",
    ),
    ({"pod": {"tolerations": [{"key": "a b", "operator": "Exists"}]}}, "pod.tolerations[0].key", "taint key"),
    ({"pod": {"tolerations": [{"key": "", "value": "x"}]}}, "pod.tolerations[0].key", "operator Exists"),
    ({"pod": {"tolerations": [{"key": "a", "value": "-1"}]}}, "pod.tolerations[0].value", "taint value"),
    (
        {"pod": {"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule", "toleration_seconds": 5}]}},
        "pod.tolerations[0].toleration_seconds",
        "NoExecute",
    ),
    ({"timeout": 2**31}, "timeout", "1 to 31622400"),
    ({"pod": {"annotations": {"big": "x" * 256 * 1024}}}, "pod.annotations", "262144"),
    ({"pod": {"service_account": "a" * 254}}, "pod.service_account", "DNS-1123"),
    ({"pod": {"labels": {"team": "ml\n"}}}, "pod.labels.team", "label value"),
    ({"env": {"A\n": "x"}}, "env.A\n", "environment variable name"),
    ({"master": {"memory": "\uff11Gi"}}, "master.memory", "8Gi"),  # a fullwidth digit
    ({"mpi": {"implementation": "mvapich"}}, "mpi.implementation", "'openmpi', 'mpich', 'intel'"),
    ({"mpi": {"mpiexec": "mpiexec; rm -rf /"}}, "mpi.mpiexec", "/usr/bin/mpiexec.mpich"),
    ({"mpi": {"mpiexec": "bin/mpiexec"}}, "mpi.mpiexec", "absolute path"),
    ({"mpi": {"implementation": "mpich", "mca": {"btl": "tcp"}}}, "mpi.mca", "Hydra has no MCA"),
    ({"mpi": {"implementation": "mpich", "btl_tcp_if_include": "eth0"}}, "mpi.btl_tcp_if_include", "-iface"),
    ({"mpi": {"implementation": "intel", "oversubscribe": True}}, "mpi.oversubscribe", "is Open MPI's"),
    ({"mpi": {"implementation": "mpich", "extra_args": ["-launcher", "rsh"]}}, "mpi.extra_args[0]", "remove it"),
    ({"mpi": {"implementation": "mpich", "extra_args": ["-genvall"]}}, "mpi.extra_args[0]", "mpi.export_env"),
    ({"mpi": {"implementation": "mpich", "extra_args": ["--mca", "x", "1"]}}, "mpi.extra_args[0]", "Open MPI's"),
    (
        {"mpi": {"implementation": "mpich", "extra_args": ["-genv", "GJ_TRAINING_ROLE", "x"]}},
        "mpi.extra_args[1]",
        "owned by the platform",
    ),
    ({"mpi": {"implementation": "mpich", "extra_args": ["-iface", "eth0;id"]}}, "mpi.extra_args[1]", "command"),
    ({"env": {"HYDRA_LAUNCHER_EXEC": "/bin/x"}}, "env.HYDRA_LAUNCHER_EXEC", "the launcher's"),
    ({"env": {"MPIEXEC_TIMEOUT": "5"}}, "env.MPIEXEC_TIMEOUT", "timeout"),
]


@pytest.mark.parametrize(("changes", "field", "words"), BAD_SPECS, ids=[b[1] + ":" + b[2] for b in BAD_SPECS])
def test_bad_spec_names_field_and_fix(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict({**BASE, **changes})
    assert field in caught.value.fields, str(caught.value)
    message = next(str(issue) for issue in caught.value.issues if issue.field == field)
    assert words in message, message


def test_at_least_25_bad_specs_are_covered() -> None:
    assert len(BAD_SPECS) >= 25


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict(
            {
                **BASE,
                "name": "Bad_Name",
                "command": ["deepspeed", "t.py"],
                "master": {"replicas": 3},
                "env": {"MPI_NP": "2"},
                "timeout": "soon",
            }
        )
    fields = set(caught.value.fields)
    assert {"name", "command", "master.replicas", "env.MPI_NP", "timeout"} <= fields
    assert "5 problems" in str(caught.value) or len(caught.value.issues) >= 5


def test_required_fields() -> None:
    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict({"image": "x"})
    assert "name" in caught.value.fields


def test_max_name_length_keeps_longest_host_name_a_dns_label() -> None:
    for replicas in (0, 1, 10, 1000):
        limit = max_name_length(replicas)
        spec = spec_from(name="a" * limit, workers={"replicas": replicas})
        longest = max(len(pod.name) for pod in plan_for(spec).pods)
        assert longest <= 63
        with pytest.raises(SpecError):
            spec_from(name="a" * (limit + 1), workers={"replicas": replicas})


def test_python_constructed_spec_validates() -> None:
    spec = MPIJobSpec(name="x", command=["python", "t.py"], workers=WorkerSpec(replicas=2))
    assert spec.command == ("python", "t.py")
    assert spec.validated() is spec
    with pytest.raises(SpecError):
        MPIJobSpec(name="x", command=("deepspeed", "t.py")).validated()


def test_the_longest_timeouts_fit_the_pods_deadline() -> None:
    """activeDeadlineSeconds (startup + timeout + grace) is a 32-bit integer in Kubernetes."""
    from airflow_mpi.contract import DEADLINE_GRACE_SECONDS
    from airflow_mpi.spec.validation import MAX_TIMEOUT

    assert 2 * MAX_TIMEOUT + DEADLINE_GRACE_SECONDS < 2**31


def test_hydra_takes_the_options_it_shares_and_its_own_flags() -> None:
    spec = spec_from(
        mpi={"implementation": "mpich", "npernode": 2, "bind_to": "core", "map_by": "node", "verbose": True,
             "wdir": "/data", "extra_args": ["-iface", "eth0", "-genv", "NCCL_DEBUG", "INFO"]},
    )  # fmt: skip
    assert spec.mpi.implementation == "mpich"


@pytest.mark.parametrize(
    ("mpi", "env", "field", "said"),
    [
        # Open MPI 5's names for the ssh launch and the host names are the product's, as 4's are.
        (
            {"mca": {"plm_ssh_args": "-oConnectTimeout=9"}},
            {},
            "mpi.mca.plm_ssh_args",
            "plm_ssh_args is set by airflow-mpi",
        ),
        (
            {"mca": {"prte_keep_fqdn_hostnames": "0"}},
            {},
            "mpi.mca.prte_keep_fqdn_hostnames",
            "prte_keep_fqdn_hostnames is set by",
        ),
        ({"extra_args": ["--prtemca", "plm_ssh_args", "-oBatchMode=no"]}, {}, "mpi.extra_args[1]", "plm_ssh_args"),
        ({}, {"PRTE_MCA_plm_ssh_agent": "rsh"}, "env.PRTE_MCA_plm_ssh_agent", "owned MCA parameter plm_ssh_agent"),
        # Hydra reads launcher options from HYDRA_CONFIG_FILE, past extra_args' rules.
        ({"implementation": "mpich"}, {"HYDRA_CONFIG_FILE": "/etc/mpi/o"}, "env.HYDRA_CONFIG_FILE", "from no file"),
        ({"implementation": "intel", "extra_args": ["-bootstrap-exec-args", "-v"]}, {}, "mpi.extra_args[0]", "set by"),
    ],
)
def test_what_the_launch_owns_is_refused_in_every_implementations_spelling(
    mpi: dict[str, Any], env: dict[str, str], field: str, said: str
) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from(mpi=mpi, env=env)
    assert field in caught.value.fields, str(caught.value)
    assert said in str(caught.value)
