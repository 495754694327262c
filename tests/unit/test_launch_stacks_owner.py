"""``launch.sh stacks`` asked as root (the local backend enters a pod as root) in a runtime
directory the job's user owns acts there as that user: a link the user planted leads root nowhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "airflow_mpi" / "scripts" / "launch.sh"
NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_stacks_as_root_follows_no_link_the_jobs_user_planted() -> None:
    # World-traversable (the user must reach its runtime dir), removed after.
    root = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="stacks-"))
    try:
        root.chmod(0o755)
        victim = root / "root-only"
        victim.mkdir(mode=0o755)
        (victim / "rank-0.999999999").write_text("root's file")  # a dead PID: stacks would remove it
        runtime = root / "runtime"
        runtime.mkdir(mode=0o700)
        os.chown(runtime, NOBODY, NOBODY)
        (runtime / "stacks").symlink_to(victim)
        os.lchown(runtime / "stacks", NOBODY, NOBODY)
        env = {"PATH": os.environ["PATH"], "AIRFLOW_MPI_RUNTIME_DIR": str(runtime)}
        done = subprocess.run(
            ["bash", str(LAUNCH), "stacks", "1"], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr
        assert (victim / "rank-0.999999999").read_text() == "root's file"
        # It ran as the user: as root the same call removes the file (the link is followed).
        os.chown(runtime, 0, 0)
        os.lchown(runtime / "stacks", 0, 0)
        subprocess.run(["bash", str(LAUNCH), "stacks", "1"], env=env, capture_output=True, timeout=30, check=False)
        assert not (victim / "rank-0.999999999").exists()
    finally:
        shutil.rmtree(root)
