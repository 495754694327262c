"""The distribution as a release builds it: sdist and wheel from a copy of the tracked files."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_distribution(out: Path, source: Path) -> Path:
    """``python -m build`` of the tracked files (copied into ``source``) into ``out``."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    # The environment's setuptools (torch brings it): no download in the build.
    isolation = ["--no-isolation"] if importlib.util.find_spec("setuptools") else []
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", *isolation, "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out
