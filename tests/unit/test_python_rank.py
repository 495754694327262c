"""python_rank.py, the way a Python rank runs under Hydra, against the real interpreter (mpi4py
installed, MPI not started): it runs a script, ``-m`` and ``-c`` as ``python -m mpi4py`` does,
with the same ``sys.path[0]``, and turns every failure into the exit code Python would give,
never 0, after printing what Python prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_mpi.scripts import python_rank_text


@pytest.fixture
def runner(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    path = config / "python_rank.py"
    path.write_text(python_rank_text())
    return path


def run(runner: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(runner), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("code", "exit_code", "stderr"),
    [
        ("print('ok')", 0, ""),
        ("import sys; sys.exit(0)", 0, ""),
        ("import sys; sys.exit(None)", 0, ""),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit(256)", 1, ""),  # exit(256) would read as success
        ("import sys; sys.exit(-1)", 255, ""),
        ("import sys; sys.exit('no data in /data/train')", 1, "no data in /data/train"),
        ("raise ValueError('bad batch')", 1, "ValueError: bad batch"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
    ],
)
def test_a_failure_exits_with_pythons_code_after_pythons_message(
    runner: Path, tmp_path: Path, code: str, exit_code: int, stderr: str
) -> None:
    done = run(runner, "-c", f"print('before', flush=False)\n{code}", cwd=tmp_path)
    assert done.returncode == exit_code, done.stderr
    assert done.stdout.startswith("before\n"), done.stdout  # flushed before os._exit
    assert stderr in done.stderr
    if "Error" in stderr:
        assert done.stderr.startswith("Traceback (most recent call last):"), done.stderr


def test_a_script_module_and_code_see_the_path_and_argv_python_m_mpi4py_gives(runner: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    show = "import sys; print(sys.path[0]); print(sys.argv)\n"
    (work / "pkg" / "train.py").write_text(show)
    (work / "job.py").write_text(show)

    script = run(runner, str(work / "job.py"), "--lr", "0.1", cwd=tmp_path).stdout.splitlines()
    assert script == [str(work), repr([str(work / "job.py"), "--lr", "0.1"])]
    module = run(runner, "-m", "pkg.train", "--lr", "0.1", cwd=work).stdout.splitlines()
    assert module == [str(work), repr([str(work / "pkg" / "train.py"), "--lr", "0.1"])]
    code = run(runner, "-c", show, "a", cwd=work).stdout.splitlines()
    assert code == [str(work), repr(["-c", "a"])]
    assert str(runner.parent) not in run(runner, "-c", "import sys; print(sys.path)", cwd=work).stdout
