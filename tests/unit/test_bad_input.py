"""Bad input, from every door (spec dicts, spec files, CLI arguments, operator arguments): each is
refused before anything is created, with every problem listed, each naming the field and the fix,
and never a traceback or an internal exception's text.

Injection attempts (``; rm -rf /``, ``$(...)``, backticks, newlines) are refused where they could
change a name, a path, an option or an environment variable's name; in a command's arguments they
are plain text and reach the rank as exact argv (tests/integration/test_key_hygiene.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.cli.main import main
from airflow_mpi.exceptions import SpecError

VALID: dict[str, Any] = {"name": "job", "image": "registry.example/train:1", "command": ["python", "/app/train.py"]}
# What must never reach a user: a traceback, or the text of an exception they did not cause.
INTERNAL = re.compile(
    r"Traceback|__init__|positional argument|has no attribute|unhashable|NoneType|\b(Type|Key|Value|Attribute|Index)Error\b"
)


@dataclass(frozen=True)
class Bad:
    case: str
    fields: tuple[str, ...]  # every field the refusal must name
    words: str  # a phrase of the problem or the fix
    changes: dict[str, Any] = field(default_factory=dict)


SPECS: list[Bad] = [
    # types
    Bad("command as one string", ("command", "workers.replicas"), '["python", "train.py"]',
        {"command": "python train.py", "workers": {"replicas": -1}}),
    Bad("name a number", ("name",), "quote it: '42'", {"name": 42}),
    Bad("workers a string", ("workers",), "must be a mapping", {"workers": "2"}),
    Bad("timeout a word", ("timeout",), "not an integer", {"timeout": "soon"}),
    Bad("cpu a list", ("master.cpu",), "is not", {"master": {"cpu": [1]}}),
    Bad("env a list", ("env",), "must be a mapping", {"env": ["A=1"]}),
    Bad("extra_args one string", ("mpi.extra_args",), '["--bind-to", "core"]', {"mpi": {"extra_args": "--bind-to core"}}),
    Bad("ssh_port a float", ("ssh_port",), "an integer", {"ssh_port": 22.5}),
    Bad("oversubscribe a word", ("mpi.oversubscribe",), "a boolean", {"mpi": {"oversubscribe": "yes"}}),
    Bad("volumes a mapping", ("pod.volumes",), "must be a list", {"pod": {"volumes": {"name": "x"}}}),
    Bad("required fields null", ("name", "command"), "null is not a string", {"name": None, "command": None}),
    Bad("unknown field", ("workrs",), "did you mean 'workers'", {"workrs": {"replicas": 1}}),
    # ranges
    Bad("too many workers", ("workers.replicas",), "at most 1000 workers", {"workers": {"replicas": 5000}}),
    Bad("too many gpus", ("master.gpus",), "at most 64", {"master": {"gpus": 1000}}),
    Bad("timeout of 30000 years", ("timeout",), "1 to", {"timeout": 10**12}),
    Bad("ssh port 0", ("ssh_port",), "1-65535", {"ssh_port": 0}),
    Bad("np a billion", ("mpi.np",), "at most 65536", {"mpi": {"np": 10**9, "oversubscribe": True}}),
    Bad("cpu beyond any node", ("master.cpu",), "at most 4096", {"master": {"cpu": "100000"}}),
    Bad("negative startup timeout", ("startup_timeout",), "seconds", {"startup_timeout": -1}),
    Bad("negative termination grace", ("termination_grace",), "seconds a rank has to save", {"termination_grace": -1}),
    Bad("a termination grace over an hour", ("termination_grace",), "0 to 3600", {"termination_grace": 7200}),
    # names
    Bad("name starts with a dash", ("name",), "DNS-1123", {"name": "-train"}),
    Bad("name too long", ("name",), "at most", {"name": "n" * 60, "workers": {"replicas": 2}}),
    Bad("namespace with a space", ("pod.namespace",), "DNS-1123", {"pod": {"namespace": "Team A"}}),
    Bad("volume name uppercase", ("pod.volumes[0].name",), "DNS-1123",
        {"pod": {"volumes": [{"name": "Data", "mount_path": "/data", "empty_dir": True}]}}),
    Bad("claim name invalid", ("pod.volumes[0].persistent_volume_claim",), "object name",
        {"pod": {"volumes": [{"name": "d", "mount_path": "/d", "persistent_volume_claim": "My Claim"}]}}),
    # reserved env
    Bad("owned MCA through env", ("env.OMPI_MCA_plm_rsh_agent",), "owned MCA parameter",
        {"env": {"OMPI_MCA_plm_rsh_agent": "rsh"}}),
    Bad("our own variable", ("env.AIRFLOW_MPI_SSHD",), "users must not set it", {"env": {"AIRFLOW_MPI_SSHD": "/x"}}),
    Bad("platform variable exported", ("mpi.export_env[0]",), "owned by the platform",
        {"mpi": {"export_env": ["GJ_TRAINING_ROLE=worker"]}}),
    # GPUs
    Bad("different GPU counts", ("workers.gpus",), "same number of GPUs",
        {"master": {"gpus": 4}, "workers": {"replicas": 1, "gpus": 8}}),
    Bad("GPU master, CPU workers", ("workers.gpus",), "would get no rank",
        {"master": {"gpus": 2}, "workers": {"replicas": 2}}),
    Bad("GPU model not a label value", ("master.gpu_type",), "node label value",
        {"master": {"gpus": 1, "gpu_type": "A100 80GB"}}),
    # conflicting MPI options
    Bad("hostfile twice", ("mpi.extra_args[0]",), "never both",
        {"hosts_mode": "hostfile", "mpi": {"extra_args": ["--hostfile", "/etc/mpi/hostfile"]}}),
    Bad("include and exclude", ("mpi.btl_tcp_if_exclude",), "only one",
        {"mpi": {"btl_tcp_if_include": "eth0", "btl_tcp_if_exclude": "lo"}}),
    Bad("npernode too small for np", ("mpi.npernode",), "raise mpi.npernode",
        {"master": {"cpu": 2}, "workers": {"replicas": 1, "cpu": 2}, "mpi": {"npernode": 1, "np": 4}}),
    Bad("abort turned off", ("mpi.mca.orte_abort_on_non_zero_status",), "set by airflow-mpi",
        {"mpi": {"mca": {"orte_abort_on_non_zero_status": "0"}}}),
    Bad("rendezvous on the sshd port", ("mpi.master_port",), "sshd port", {"ssh_port": 2222, "mpi": {"master_port": 2222}}),
    Bad("timeout as an option", ("mpi.extra_args[0]",), "use timeout instead", {"mpi": {"extra_args": ["--timeout=5"]}}),
    # injection attempts
    Bad("name with ; rm -rf /", ("name",), "DNS-1123", {"name": "x; rm -rf /"}),
    Bad("name with $(...)", ("name",), "DNS-1123", {"name": "$(reboot)"}),
    Bad("name with backticks", ("name",), "DNS-1123", {"name": "`id`"}),
    Bad("name with a newline", ("name",), "DNS-1123", {"name": "train\nrm -rf /"}),
    Bad("env name with ;", ("env.A;rm -rf /",), "environment variable name", {"env": {"A;rm -rf /": "x"}}),
    Bad("env name with $(...)", ("env.$(id)",), "environment variable name", {"env": {"$(id)": "x"}}),
    Bad("image with ; rm -rf /", ("image",), "whitespace", {"image": "train:1; rm -rf /"}),
    Bad("image with a newline", ("image",), "whitespace", {"image": "train:1\n"}),
    Bad("option with a newline", ("mpi.extra_args[0]",), "newline",
        {"mpi": {"extra_args": ["--report-bindings\n--host evil:8"]}}),
    Bad("MCA value with a newline", ("mpi.mca.btl",), "may hold only", {"mpi": {"mca": {"btl": "tcp\n--host evil"}}}),
    Bad("MCA value with a command", ("mpi.mca.x",), "may hold only", {"mpi": {"mca": {"x": "0;id>/tmp/p"}}}),
    Bad("btl with $(...)", ("mpi.btl",), "may hold only", {"mpi": {"btl": "tcp,self$(id)"}}),
    Bad("abort turned off in extra_args", ("mpi.extra_args[1]",), "set by airflow-mpi",
        {"mpi": {"extra_args": ["--mca", "orte_abort_on_non_zero_status", "0"]}}),
    Bad("reserved variable in extra_args", ("mpi.extra_args[1]",), "owned by the platform",
        {"mpi": {"extra_args": ["-x", "MPI_NP=99"]}}),
    Bad("MCA through env with $(...)", ("env.OMPI_MCA_btl",), "may hold only", {"env": {"OMPI_MCA_btl": "tcp$(id)"}}),
    Bad("export with a newline", ("mpi.export_env[0]",), "on one line", {"mpi": {"export_env": ["A=1\nB=2"]}}),
    Bad("cpu with a huge exponent", ("master.cpu",), "exponent", {"master": {"cpu": "1e999999999"}}),
    Bad("gang memory past any node", ("workers.memory",), "more than any node",
        {"workers": {"replicas": 2, "memory": "99999Ei"}, "scheduling": {"gang": "volcano"}}),
    Bad("env value over 128 KiB", ("env.BIG",), "128 KiB", {"env": {"BIG": "x" * (128 * 1024)}}),
    Bad("lone surrogate", ("env.A",), "lone surrogate", {"env": {"A": "x\udc80"}}),
    Bad("NUL in an argument", ("command[1]",), "NUL byte", {"command": ["python", "/a.py\x00-c"]}),
    Bad("file name starting with ..", ("files...data",), "starts with '..'", {"files": {"..data": "x"}}),
    Bad("annotation value a number", ("pod.annotations.a",), "quote it", {"pod": {"annotations": {"a": 1.10}}}),
    Bad("our annotation", ("pod.annotations.airflow-mpi.io/log-shown",), "airflow-mpi.io/",
        {"pod": {"annotations": {"airflow-mpi.io/log-shown": "999"}}}),
    Bad("label value with backticks", ("pod.labels.team",), "label value", {"pod": {"labels": {"team": "`id`"}}}),
    Bad("node selector with $(...)", ("pod.node_selector.gpu",), "label value", {"pod": {"node_selector": {"gpu": "$(id)"}}}),
    Bad("program with a newline", ("command[0]",), "program alone", {"command": ["python\n", "t.py"]}),
    Bad("hosts mode with ;", ("hosts_mode",), "'host'", {"hosts_mode": "host; rm -rf /"}),
    Bad("sub path climbing out", ("pod.volumes[0].sub_path",), "without '..'",
        {"pod": {"volumes": [{"name": "d", "mount_path": "/d", "host_path": "/srv", "sub_path": "../../etc"}]}}),
    Bad("mount path with a newline", ("pod.volumes[0].mount_path",), "control character",
        {"pod": {"volumes": [{"name": "d", "mount_path": "/data\n/etc", "empty_dir": True}]}}),
    Bad("our label", ("pod.labels.airflow-mpi.io/job",), "set by airflow-mpi", {"pod": {"labels": {"airflow-mpi.io/job": "x"}}}),
    Bad("toleration seconds without NoExecute", ("pod.tolerations[0].toleration_seconds",), "NoExecute",
        {"pod": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "toleration_seconds": 5}]}}),
    # a second launcher, however it is hidden
    Bad("launcher behind env", ("command",), "DeepSpeed's launcher", {"command": ["env", "X=1", "deepspeed", "t.py"]}),
    Bad("launcher in bash -c", ("command",), "torchrun", {"command": ["bash", "-c", "torchrun --nproc_per_node 8 t.py"]}),
    Bad("launcher behind nohup", ("command",), "horovodrun", {"command": ["nohup", "horovodrun", "-np", "2", "python", "t.py"]}),
    # everything at once: every problem is listed
    Bad("five problems at once", ("name", "command", "workers.replicas", "env.MPI_NP", "master.gpu_resource"), "problems",
        {"name": "Bad Name", "command": "python train.py", "workers": {"replicas": -1}, "env": {"MPI_NP": "3"},
         "master": {"gpu_resource": "gpu"}}),
]  # fmt: skip


def refusal_text(error: SpecError) -> str:
    text = str(error)
    assert not INTERNAL.search(text), text
    for issue in error.issues:
        assert issue.field and issue.problem and issue.fix, issue  # each names the field and the fix
    return text


@pytest.mark.parametrize("bad", SPECS, ids=[b.case for b in SPECS])
def test_bad_spec_is_refused_with_every_field_and_fix(bad: Bad) -> None:
    from airflow_mpi.spec import MPIJobSpec

    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict({**VALID, **bad.changes})
    text = refusal_text(caught.value)
    assert set(bad.fields) <= set(caught.value.fields), text
    assert bad.words in text, text


@pytest.mark.parametrize("bad", SPECS, ids=[b.case for b in SPECS])
def test_bad_spec_file_fails_airflow_mpi_run_before_anything_is_created(
    bad: Bad, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({**VALID, **bad.changes}))
    state = tmp_path / "state"
    assert main(["run", str(spec), "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert not INTERNAL.search(err), err
    assert all(f"  - {name}:" in err for name in bad.fields), err
    assert not state.exists()  # not even the local backend's state directory


# Spec files: (case, file content or None for "does not exist", words the message must contain)
FILES: list[tuple[str, bytes | None, str]] = [
    ("missing file", None, "does not exist; give the path of a YAML or JSON spec file"),
    ("empty file", b"", "is empty; write the job's fields"),
    ("only blanks", b"  \n\n", "is empty"),
    ("a list", b"- name: x\n- command: [a]\n", "holds a list, not a mapping of fields"),
    ("a scalar", b"42\n", "holds a single value (int), not a mapping"),
    ("a string", b"python train.py\n", "holds a single value (str), not a mapping"),
    ("broken YAML", b"name: x\ncommand: [python, t.py\n", "is not valid YAML or JSON"),
    ("broken JSON", b'{"name": "x", "command": ["a"]', "is not valid YAML or JSON"),
    ("tab indentation", b"name: x\nworkers:\n\treplicas: 2\n", "is not valid YAML or JSON"),
    ("two documents", b"name: a\n---\nname: b\n", "is not valid YAML or JSON"),
    ("not UTF-8", b"name: \xff\xfe\n", "is not UTF-8 text"),
    ("required fields missing", b"image: x\n", "name: is required; add it (a string)"),
]


@pytest.mark.parametrize(("case", "content", "words"), FILES, ids=[f[0] for f in FILES])
def test_bad_spec_file_is_a_message_not_a_traceback(
    case: str, content: bytes | None, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    if content is not None:
        path.write_bytes(content)
    for command in ("validate", "render", "run"):
        extra = ["--state-dir", str(tmp_path / "state")] if command == "run" else []
        assert main([command, str(path), *extra]) == 2, command
        err = capsys.readouterr().err
        assert words in err and str(path) in err, err
        assert not INTERNAL.search(err), err
    assert not (tmp_path / "state").exists()


def test_a_directory_and_an_unreadable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["validate", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    locked = tmp_path / "locked.yaml"
    locked.write_text("name: x\n")
    real_read = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == locked:  # root reads any file: refuse this one the way a 0600 file of another user is
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert main(["validate", str(locked)]) == 2
    err = capsys.readouterr().err
    assert "cannot be read (permission denied); make it readable" in err and not INTERNAL.search(err)


# CLI arguments: (case, argv with {spec} for a valid spec file, the argument named, words)
ARGS: list[tuple[str, list[str], str, str]] = [
    ("namespace with ; rm -rf /", ["render", "{spec}", "--namespace", "x; rm -rf /"], "--namespace", "not a namespace name"),
    ("namespace uppercase", ["render", "{spec}", "--namespace", "Team_A"], "--namespace", "lowercase letters"),
    ("run id with a newline", ["render", "{spec}", "--run-id", "r1\nrm -rf /"], "--run-id", "on one line"),
    ("empty task id", ["run", "{spec}", "--task-id", ""], "--task-id", "1 to 250 characters"),
    ("try number 0", ["run", "{spec}", "--try-number", "0"], "--try-number", "at least 1"),
    ("try number a word", ["render", "{spec}", "--try-number", "two"], "--try-number", "whole number"),
    ("relative state dir", ["run", "{spec}", "--state-dir", "state"], "--state-dir", "absolute path"),
    ("image with a space", ["doctor", "--image", "train 1"], "--image", "not an image reference"),
    ("image with $(...)", ["doctor", "--image", "$(id)\n"], "--image", "not an image reference"),
    ("doctor timeout 0", ["doctor", "--image", "train:1", "--timeout", "0"], "--timeout", "at least 1"),
    ("local and image", ["doctor", "--local", "--image", "train:1"], "--image", "not allowed with argument --local"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "argument", "words"), ARGS, ids=[a[0] for a in ARGS])
def test_bad_cli_argument_exits_2_naming_it(
    case: str, argv: list[str], argument: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: job\ncommand: [python, t.py]\n")
    with pytest.raises(SystemExit) as caught:
        main([arg.replace("{spec}", str(spec)) for arg in argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argument}" in err and words in err, err
    assert not INTERNAL.search(err), err


# Operator arguments: (case, keyword arguments, fields named)
OPERATOR: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("job a number", {"job": 42}, ("job",)),
    ("job a YAML string", {"job": "name: x\ncommand: [a]"}, ("job",)),
    ("job a list", {"job": [VALID]}, ("job",)),
    ("job without command", {"job": {"name": "x"}}, ("command",)),
    ("empty connection id", {"job": VALID, "mpi_conn_id": ""}, ("mpi_conn_id",)),
    ("connection id None", {"job": VALID, "mpi_conn_id": None}, ("mpi_conn_id",)),
    ("deferrable a word", {"job": VALID, "deferrable": "yes"}, ("deferrable",)),
    ("reattach a number", {"job": VALID, "reattach": 1}, ("reattach",)),
    ("bad job and bad flag", {"job": {**VALID, "name": "Bad"}, "deferrable": "no"}, ("name", "deferrable")),
]


@pytest.mark.parametrize(("case", "kwargs", "fields"), OPERATOR, ids=[o[0] for o in OPERATOR])
def test_bad_operator_argument_fails_the_dag_import_naming_it(
    case: str, kwargs: dict[str, Any], fields: tuple[str, ...]
) -> None:
    from airflow_mpi.operators.mpi import MPIJobOperator

    with pytest.raises(SpecError) as caught:
        MPIJobOperator(task_id="train", **kwargs)
    refusal_text(caught.value)
    assert set(fields) <= set(caught.value.fields), str(caught.value)


def test_a_spec_object_built_in_python_gets_the_same_messages() -> None:
    from airflow_mpi.operators.mpi import MPIJobOperator
    from airflow_mpi.spec import MPIJobSpec, WorkerSpec

    spec = MPIJobSpec(name=3, command="train.py", workers=WorkerSpec(replicas="x"))  # type: ignore[arg-type]
    with pytest.raises(SpecError) as caught:
        MPIJobOperator(task_id="train", job=spec)
    refusal_text(caught.value)
    assert set(caught.value.fields) == {"name", "command", "workers.replicas"}


def test_a_templated_job_that_renders_bad_fails_before_any_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_mpi.hooks.mpi import MPIJobHook
    from airflow_mpi.operators.mpi import MPIJobOperator

    def no_backend(self: Any) -> Any:
        raise AssertionError("a backend was asked for before the spec was checked")

    monkeypatch.setattr(MPIJobHook, "get_backend", no_backend)
    operator = MPIJobOperator(task_id="train", job={**VALID, "workers": {"replicas": "{{ params.n }}"}})
    operator.job["workers"] = {"replicas": "-3"}  # what the template rendered to
    ti = SimpleNamespace(dag_id="d", task_id="train", run_id="r", map_index=-1, try_number=1)
    with pytest.raises(AirflowFailException) as caught:
        operator.execute({"ti": ti})  # type: ignore[arg-type]
    assert "workers.replicas: is -3; use 0 or more workers" in str(caught.value)


def test_at_least_40_bad_inputs() -> None:
    total = len(SPECS) + len(FILES) + 2 + len(ARGS) + len(OPERATOR) + 2
    assert total >= 40
