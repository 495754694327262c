"""The user's command reaches mpiexec untouched by the launch script: its own "-x NAME" (an
argument of the user's program) is not taken for an export of an unset variable and dropped,
and a name bash cannot expand does not stop the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_mpi.job.mpirun import build_mpiexec_argv
from airflow_mpi.job.plan import render_plan
from airflow_mpi.scripts import launch_script_text
from tests.helpers import IDENTITY, fixed_ssh, spec_from
from tests.unit.test_launch_script import dry_run, exact_argv, materialize


@pytest.mark.parametrize(
    "command",
    [
        ["python", "t.py", "-x", "UNSET_VARIABLE"],
        ["python", "t.py", "-x", "ünïcødé", "-x"],
        ["python", "t.py", "bash", "/etc/mpi/launch.sh", "rank", "-x", "PATH"],
    ],
)
def test_the_users_own_dash_x_is_passed_on(command: list[str], tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(launch_script_text())
    spec = spec_from(command=command, mpi={"export_env": ["PATH", "NOT_SET_HERE"]})
    probe = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    paths, env = materialize(probe, tmp_path)
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec), paths=paths)
    (Path(paths.config_dir) / "mpiexec.args").write_text(plan.config_files["mpiexec.args"])
    done = dry_run(script, env)
    assert done.returncode == 0, done.stderr
    argv = exact_argv(done.stdout.splitlines()[-1])
    expected = build_mpiexec_argv(spec, plan.topology, paths)
    at = expected.index("NOT_SET_HERE")
    assert argv == expected[: at - 1] + expected[at + 1 :]  # only the option's unset export is dropped
    assert argv[-len(command) :] == command
