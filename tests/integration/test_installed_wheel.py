"""The distribution as a user gets it: ``python -m build`` makes an sdist and a wheel that
``twine check`` accepts, and the wheel, installed (not editable) into a fresh virtualenv with the
runtime dependencies only, is a provider Airflow lists, a working ``airflow-mpi`` command and the
example DAG training to its accuracy bar on the local backend. Nothing of this checkout is on that
interpreter's path: it runs from another directory, with the dags folder as its only link here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_mpi import __version__
from tests.distribution import build_distribution

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel, built from a copy of the tracked files (what a release builds from)."""
    return build_distribution(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel and the runtime dependencies only (pinned as CI pins
    them; uv links the packages from its cache: seconds, not a 5 GB copy). Not under /tmp: every
    local pod gets a /tmp of its own, and the ranks run this interpreter."""
    if not UV.exists():
        pytest.skip("needs uv in the test environment (make setup installs it)")
    root = Path(tempfile.mkdtemp(prefix="airflow-mpi-wheel-", dir="/var/tmp")) / "venv"
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(root)], check=True, timeout=120)
    (wheel,) = dist.glob("airflow_mpi-*.whl")
    python = root / "bin" / "python"
    install = [str(UV), "pip", "install", "-q", "--python", str(python), "--link-mode", "hardlink"]
    install += ["-c", str(REPO / "constraints.txt"), str(wheel), "-r", str(REPO / "docker/requirements-runtime.txt")]
    subprocess.run(install, check=True, timeout=900, env={**os.environ, "UV_NO_PROGRESS": "1"})
    yield root
    shutil.rmtree(root.parent, ignore_errors=True)


def run(venv: Path, *argv: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A command of the virtualenv, from a directory outside this checkout, with its own Airflow home."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    }
    return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_build_makes_an_sdist_and_a_wheel_that_twine_accepts(dist: Path) -> None:
    (sdist,) = dist.glob("airflow_mpi-*.tar.gz")
    (wheel,) = dist.glob("airflow_mpi-*.whl")
    assert f"airflow_mpi-{__version__}" in wheel.name
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("tests/", "bench/")) or "/doubles/" in n]
    with tarfile.open(sdist) as archive:  # the sdist carries the source a wheel is built from
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "airflow_mpi/scripts/launch.sh", "CHANGELOG.md"} <= members


def test_the_installed_wheel_is_a_provider_a_command_and_trains_the_example(venv: Path) -> None:
    home = venv.parent / "home"  # beside the virtualenv, outside /tmp and outside this checkout
    home.mkdir()
    where = run(venv, "python", "-c", "import airflow_mpi; print(airflow_mpi.__file__)", home=home)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the installed copy, not this checkout

    version = run(venv, "airflow-mpi", "--version", home=home)
    assert version.returncode == 0 and __version__ in version.stdout, version.stdout + version.stderr
    spec = home / "job.json"
    spec.write_text('{"name": "wheel-check", "image": "registry.example/train:1", "command": ["python", "t.py"]}')
    rendered = run(venv, "airflow-mpi", "render", str(spec), home=home)
    assert rendered.returncode == 0 and "kind: Pod" in rendered.stdout, rendered.stdout[-2000:] + rendered.stderr

    assert run(venv, "airflow", "db", "migrate", home=home, timeout=300).returncode == 0
    providers = run(venv, "airflow", "providers", "list", "-o", "plain", home=home)
    assert "airflow-mpi" in providers.stdout, providers.stdout + providers.stderr

    trained = run(venv, "airflow", "dags", "test", "mpi_training_pipeline", home=home, timeout=900)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-4000:]
    accuracy = re.search(r"test accuracy (\d\.\d+)", output)
    assert accuracy is not None and float(accuracy[1]) >= 0.85, output[-4000:]  # the DAG's own bar
