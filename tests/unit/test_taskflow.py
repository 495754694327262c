"""A @task.mpi function as job files: source and arguments checked and packed before anything is
created, the spec's ``files`` rules, and the runner every rank starts, run here as a rank would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.decorators.taskflow import (
    CALL_FILE,
    RUNNER_BOOTSTRAP,
    RUNNER_FILE,
    FunctionCall,
    FunctionSource,
    build_taskflow_files,
    function_source,
    runner_command,
)
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.apivalidation import validate_object

DAG_LINES = [
    "    @task.mpi(\n",
    "        workers={'replicas': 2},\n",
    "    )\n",
    "    def train(data, epochs=1):\n",
    "        import os\n",
    "        if os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n",
    "            raise ValueError('bad batch')\n",
    "        return {'data': data, 'epochs': epochs}\n",
]


def source(lines: list[str] = DAG_LINES, name: str = "train") -> FunctionSource:
    return function_source(name, lines, 40, "/dags/pipeline.py")


def test_source_leaves_the_decorator_out_and_keeps_the_dag_files_line_numbers() -> None:
    found = source()
    assert found.text.startswith("def train(data, epochs=1):\n") and "@task" not in found.text
    assert found.first_line == 43 and found.filename == "/dags/pipeline.py"


def test_files_carry_the_runner_and_the_call_as_json() -> None:
    files = build_taskflow_files(FunctionCall(source(), args=["/data"], kwargs={"epochs": 3}, parameters=["data"]))
    assert set(files) == {RUNNER_FILE, CALL_FILE}
    call = json.loads(files[CALL_FILE])
    assert call["args"] == ["/data"] and call["kwargs"] == {"epochs": 3} and call["function"] == "train"
    assert call["result_max_bytes"] == contract.RESULT_MAX_BYTES and call["result_prefix"] == contract.RESULT_PREFIX
    assert runner_command("python3") == ["python3", "-c", RUNNER_BOOTSTRAP] and RUNNER_FILE in RUNNER_BOOTSTRAP


def test_arguments_json_cannot_hold_are_named_with_their_type() -> None:
    call = FunctionCall(source(), args=[{1, 2}], kwargs={"epochs": {"when": Path("/x")}, "n": float("nan")})
    with pytest.raises(SpecError) as caught:
        build_taskflow_files(dataclass_replace(call, parameters=["data"]))
    text = str(caught.value)
    assert "@task.mpi argument data: data is a set, which JSON cannot hold" in text
    assert "@task.mpi argument epochs: epochs['when'] is a pathlib" in text
    assert "@task.mpi argument n: n is nan, which JSON has no number for" in text
    assert "pass plain values" in text


def dataclass_replace(call: FunctionCall, **changes: Any) -> FunctionCall:
    import dataclasses

    return dataclasses.replace(call, **changes)


def test_arguments_over_the_configmap_room_are_refused_naming_each_size() -> None:
    call = FunctionCall(source(), args=["x" * 700_000], kwargs={"more": "y" * 400_000, "small": 1}, parameters=["data"])
    with pytest.raises(SpecError) as caught:
        build_taskflow_files(call)
    text = str(caught.value)
    assert f"over the {contract.CONFIG_FILES_MAX_BYTES} bytes" in text
    assert "argument data 700002 bytes, argument more 400002 bytes" in text  # largest first
    assert "argument small 1 bytes" in text and "pass large inputs as a path or URI" in text


def test_spec_files_rules() -> None:
    base = {"name": "tf", "command": ["python", "/etc/mpi/x.py"]}
    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict({**base, "files": {"launch.sh": "x", "../x": "y", "ok.json": "{}"}})
    text = str(caught.value)
    assert "files.launch.sh: is one of the product's own files" in text
    assert "files.../x: '../x' is not a file name a ConfigMap accepts" in text
    assert "ok.json" not in text
    with pytest.raises(SpecError, match=r"files: hold 1000000 bytes \(big 1000000 bytes\), over the 983040"):
        MPIJobSpec.from_dict({**base, "files": {"big": "b" * 1_000_000}})


def test_spec_files_go_into_the_configmap_and_pass_the_apiservers_validation() -> None:
    files = build_taskflow_files(FunctionCall(source(), args=["/data"], kwargs={}))
    spec = MPIJobSpec.from_dict({"name": "tf", "image": "i:1", "command": runner_command("python"), "files": files})
    plan = render_plan(spec, RunIdentity("d", "t", "r"))
    assert plan.config_files[CALL_FILE] == files[CALL_FILE] and contract.CONFIG_LAUNCH in plan.config_files
    config_map = next(m for m in render_manifests(plan, "default") if m["kind"] == "ConfigMap")
    assert config_map["data"][RUNNER_FILE] == files[RUNNER_FILE]
    assert validate_object("configmaps", config_map) == []


def test_the_whole_config_directory_must_fit_one_configmap() -> None:
    spec = MPIJobSpec.from_dict(
        {
            "name": "tf",
            "command": ["python", "x"],
            "hosts_mode": "hostfile",
            "workers": {"replicas": 1000},
            "files": {"big": "b" * (contract.CONFIG_FILES_MAX_BYTES - 10)},
        }
    )
    with pytest.raises(SpecError, match=r"config directory would hold \d+ bytes .*hostfile \d+"):
        render_plan(spec, RunIdentity("d", "t", "r"))


# --- the runner, as a rank runs it --------------------------------------------------------------


def run_rank(tmp_path: Path, rank: int, lines: list[str], args: list[Any], **extra: Any) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    name = extra.pop("name", "train")
    files = build_taskflow_files(FunctionCall(function_source(name, lines, 40, "/dags/pipeline.py"), args, extra))
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": str(rank)}
    return subprocess.run(
        [sys.executable, str(tmp_path / RUNNER_FILE)], capture_output=True, text=True, env=env, timeout=60
    )


def test_rank_0_prints_the_return_value_and_other_ranks_nothing(tmp_path: Path) -> None:
    done = run_rank(tmp_path, 0, DAG_LINES, ["/data"], epochs=4)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [contract.RESULT_PREFIX + json.dumps({"data": "/data", "epochs": 4})]
    other = run_rank(tmp_path, 2, DAG_LINES, ["/data"])
    assert other.returncode == 0 and contract.RESULT_PREFIX not in other.stdout


def test_a_raising_rank_prints_its_traceback_at_the_dag_files_lines_and_exits_nonzero(tmp_path: Path) -> None:
    done = run_rank(tmp_path, 1, DAG_LINES, ["/data"])
    assert done.returncode == 1
    assert 'File "/dags/pipeline.py", line 46, in train' in done.stderr
    assert "raise ValueError('bad batch')" in done.stderr and "ValueError: bad batch" in done.stderr
    assert RUNNER_FILE not in done.stderr  # the runner's own frames are left out


def test_a_return_value_json_cannot_hold_fails_naming_its_type(tmp_path: Path) -> None:
    lines = ["def f():\n", "    import decimal\n", "    return {'acc': decimal.Decimal('0.9')}\n"]
    done = run_rank(tmp_path, 0, lines, [], name="f")
    assert done.returncode == 1 and contract.RESULT_PREFIX not in done.stdout
    assert "return value['acc'] is a decimal.Decimal, which JSON cannot hold" in done.stderr
    # The same rule as the arguments' (one function at both ends): no NaN, string keys only.
    for body, said in (("float('nan')", "return value is nan, which JSON has no number for"),
                       ("{1: 'a'}", "return value has the key 1 (int); JSON keys are strings")):  # fmt: skip
        done = run_rank(tmp_path, 0, ["def f():\n", f"    return {body}\n"], [], name="f")
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert contract.RESULT_PREFIX not in done.stdout
    big = ["def f():\n", "    return 'x' * 40000\n"]
    done = run_rank(tmp_path, 0, big, [], name="f")
    assert done.returncode == 1 and "40002 bytes of JSON, over the 32768 bytes" in done.stderr


def test_a_missing_global_gets_a_hint(tmp_path: Path) -> None:
    done = run_rank(tmp_path, 0, ["def f():\n", "    return LIMIT\n"], [], name="f")
    assert done.returncode == 1 and "NameError: name 'LIMIT' is not defined" in done.stderr
    assert "without the DAG file's globals" in done.stderr
