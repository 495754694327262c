"""The compatibility tier: the provider's wheel on every Airflow minor it declares
(``pyproject.toml``: ``apache-airflow>=3.0,<3.4``), the newest patch of each, and the newest on every
other Python it declares (``requires-python``: 3.10 to 3.13, from pyenv), in a fresh virtualenv with its
dependencies resolved as they stood a month after that release (uv's ``--exclude-newer``, as
Airflow's constraint files pinned them; those files are not reachable here), against the real
control plane:

- the DAG imports; ``MPIJobOperator`` waiting and deferrable, the deferred one's lines shown live
  by its trigger; ``@task.mpi`` unmapped and as a mapped sweep; the "MPI job" link stored for each;
- a retry after the first try was SIGKILLed reattaches and its log goes on where it stopped;
- the connection form's fields as that release's ProvidersManager reads them; the trigger
  runner's log socket found behind that release's logging setup;
- the ``airflow-mpi`` command line.

Nothing of this checkout is on those interpreters' path (``release_check.py`` runs from the
virtualenv's own folder). The uv cache makes a warm run install in seconds.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi import __version__
from tests.cluster.cluster import REPO, Cluster
from tests.cluster.conftest import job_objects
from tests.distribution import build_distribution

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

# Every minor the package declares (its newest patch), and the day its dependencies are resolved
# as of (about a month after the release: what its constraint files pinned).
RELEASES = {"3.0.6": "2025-10-01", "3.1.8": "2026-04-01", "3.2.2": "2026-06-01", "3.3.2": "2026-10-01"}
# Every other Python the package declares (``requires-python``: 3.10 to 3.13), from pyenv, with the
# newest Airflow: the releases above run on this interpreter's (3.11).
PYTHONS = ("3.10", "3.12", "3.13")
NEWEST = "3.3.2"
# What runs: an Airflow release on a Python (None: this interpreter's).
TARGETS: dict[str, tuple[str, str | None]] = {
    **{version: (version, None) for version in RELEASES},
    **{f"{NEWEST}-py{python}": (NEWEST, python) for python in PYTHONS},
}
# Airflow 3.0 and 3.1 build a provider's connection form from WTForms fields, which come with
# the FAB provider (the usual auth manager there); 3.2 and later read the provider info.
FORM_FROM_WIDGETS = {"3.0.6", "3.1.8"}
UV = Path(sys.executable).parent / "uv"
URL_TEMPLATE = "https://dash.example/{namespace}/{job}?try={try_number}"
FORM_FIELDS = [
    "api_timeout",
    "backend",
    "job_url_template",
    "kubernetes_conn_id",
    "namespace",
    "nccl_ib_env",
    "state_dir",
]

DAG = """
import os, sys
import pendulum
from airflow.sdk import DAG, task
from airflow_mpi.operators.mpi import MPIJobOperator

PY = sys.executable
SPEAK = (
    "import json, os, time\\n"
    "rank, size = int(os.environ['OMPI_COMM_WORLD_RANK']), int(os.environ['OMPI_COMM_WORLD_SIZE'])\\n"
    "for i in range(int(os.environ.get('LINES', '3'))):\\n"
    "    print(f'rank {rank} line {i:02d}', flush=True); time.sleep(float(os.environ.get('EVERY', '0')))\\n"
    "if rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'size': size}))\\n"
)
JOB = {"name": "speak", "image": "registry.example/compat:1", "command": [PY, "-c", SPEAK],
       "workers": {"replicas": 2}, "startup_timeout": 90, "timeout": 180}

with DAG("compat", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    MPIJobOperator(task_id="waiting", job=JOB, mpi_conn_id="mpi_compat", retries=0)
    MPIJobOperator(task_id="deferred", job={**JOB, "env": {"LINES": "12", "EVERY": "0.4"}},
                   mpi_conn_id="mpi_compat", deferrable=True, retries=0)

    @task.mpi(name="grow", image="registry.example/compat:1", workers={"replicas": 1}, python=PY,
              mpi_conn_id="mpi_compat", startup_timeout=90, timeout=180, retries=0)
    def grow(x: int) -> int:
        import os
        return x + int(os.environ["OMPI_COMM_WORLD_SIZE"])

    grow.override(task_id="grow_one")(1)
    grow.override(task_id="grow_sweep").expand(x=[10, 20])
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = build_distribution(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source"))
    (found,) = out.glob("airflow_mpi-*.whl")
    return found


# The releases run two at a time: each mostly waits (its jobs, its Airflow processes), and four at
# once on two cores would make the live-log checks a race with the machine.
AT_ONCE = 2


@pytest.fixture(scope="module")
def releases_checked(wheel: Path, cluster: Cluster) -> Iterator[dict[str, BaseException | None]]:
    """Every target checked (``check_release``), AT_ONCE at a time, each in a virtualenv and a
    namespace of its own: target -> the failure it met, or None."""
    if not UV.exists():
        pytest.fail("needs uv in the test environment (make setup installs it)")
    roots = {target: Path(tempfile.mkdtemp(prefix=f"airflow-{target}-", dir="/var/tmp")) for target in TARGETS}
    namespaces = {target: "r" + re.sub(r"[^0-9a-z]", "", target) + f"-{uuid.uuid4().hex[:6]}" for target in TARGETS}

    def one(target: str) -> BaseException | None:
        version, python = TARGETS[target]
        try:
            interpreter = sys.executable if python is None else pyenv_python(python)
            cluster.create_namespace(namespaces[target])
            install_release(version, roots[target], wheel, interpreter)
            check_release(version, roots[target], cluster, namespaces[target], python)
        except BaseException as failure:  # its own test reports it
            return failure
        return None

    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        outcomes = dict(zip(TARGETS, pool.map(one, TARGETS)))
    yield outcomes
    left = {target: job_objects(cluster.api(), namespace) for target, namespace in namespaces.items()}
    for target, namespace in namespaces.items():
        cluster.delete_namespace(namespace, wait=0)
        shutil.rmtree(roots[target], ignore_errors=True)
    assert not any(left.values()), f"left behind: {left}"


def pyenv_python(minor: str) -> str:
    """The newest pyenv interpreter of ``minor`` (e.g. 3.10 -> .../versions/3.10.13/bin/python3.10)."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = sorted(root.glob(f"versions/{minor}.*/bin/python{minor}"),
                   key=lambda p: [int(part) for part in p.parts[-3].split(".") if part.isdigit()])  # fmt: skip
    if not found:
        raise FileNotFoundError(f"Python {minor} is declared but not in pyenv ({root}/versions): install it there")
    return str(found[-1])


def install_release(version: str, root: Path, wheel: Path, interpreter: str) -> None:
    """A virtualenv of that Airflow on ``interpreter`` with the wheel, and an Airflow home beside
    it; not under /tmp (every pod gets a /tmp of its own, and the ranks run its Python)."""
    python = root / "venv" / "bin" / "python"
    started = time.monotonic()
    subprocess.run([str(UV), "venv", "-q", "--python", interpreter, str(root / "venv")], check=True, timeout=120)
    packages = [f"apache-airflow=={version}", str(wheel)]
    if version in FORM_FROM_WIDGETS:
        packages.append("apache-airflow-providers-fab")
    subprocess.run(
        [str(UV), "pip", "install", "-q", "--python", str(python), "--link-mode", "hardlink",
         "--exclude-newer", RELEASES[version], *packages],
        check=True, timeout=900, env={**os.environ, "UV_NO_PROGRESS": "1"},
    )  # fmt: skip
    print(f"\nAirflow {version} on {interpreter}: virtualenv in {time.monotonic() - started:.1f}s")
    (root / "dags").mkdir()
    (root / "dags" / "compat_dag.py").write_text(textwrap.dedent(DAG))
    shutil.copy(REPO / "tests" / "cluster" / "release_check.py", root / "release_check.py")


def release_env(root: Path, cluster: Cluster, namespace: str) -> dict[str, str]:
    extra = {"backend": "kubernetes", "kubernetes_conn_id": "kube_real", "namespace": namespace,
             "job_url_template": URL_TEMPLATE}  # fmt: skip
    kube = {"kube_config_path": str(cluster.kubeconfig), "namespace": namespace}
    return {
        "PATH": f"{root / 'venv' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW_CONN_KUBE_REAL": json.dumps({"conn_type": "kubernetes", "extra": kube}),
        "AIRFLOW_CONN_MPI_COMPAT": json.dumps({"conn_type": "mpi", "extra": extra}),
    }


def run(root: Path, env: dict[str, str], *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def check(root: Path, env: dict[str, str], *args: str) -> tuple[dict[str, Any], str]:
    """``release_check.py ARGS`` in the virtualenv: its result and its output."""
    done = run(root, env, str(root / "venv" / "bin" / "python"), "release_check.py", *args)
    output = done.stdout + done.stderr
    found = [line for line in done.stdout.splitlines() if line.startswith("RELEASE-CHECK ")]
    assert done.returncode == 0 and found, output[-6000:]
    return json.loads(found[-1].split(" ", 1)[1]), output


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_provider_runs_on_every_airflow_and_python_it_declares(
    target: str, releases_checked: dict[str, BaseException | None]
) -> None:
    failure = releases_checked[target]
    if failure is not None:
        raise failure


def test_the_declared_pythons_are_the_ones_run() -> None:
    """``requires-python`` names exactly the Pythons this tier runs: this one and PYTHONS."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    run_here = sorted({f"{sys.version_info[0]}.{sys.version_info[1]}", *PYTHONS}, key=lambda v: int(v.split(".")[1]))
    lowest, highest = run_here[0], run_here[-1]
    assert declared == f">={lowest},<3.{int(highest.split('.')[1]) + 1}", (declared, run_here)
    assert len(run_here) == int(highest.split(".")[1]) - int(lowest.split(".")[1]) + 1, run_here  # none skipped


def check_release(version: str, root: Path, cluster: Cluster, namespace: str, python: str | None = None) -> None:
    env = release_env(root, cluster, namespace)
    laps = Laps()
    migrated = run(root, env, "airflow", "db", "migrate")
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    laps("migrate")

    ran, output = check(root, env, "dags")
    laps("the DAG")
    assert ran["airflow"] == version
    if python is not None:
        assert ran["python"] == python, ran
    assert "import_errors" not in ran, ran
    assert set(ran["states"].values()) == {"success"}, (ran["states"], output[-6000:])
    xcoms = ran["xcoms"]
    for task_id in ("waiting", "deferred"):
        assert xcoms[f"{task_id}[-1]:return_value"]["result"] == {"size": 3}, task_id
    assert xcoms["grow_one[-1]:return_value"] == 3
    assert [xcoms["grow_sweep[0]:return_value"], xcoms["grow_sweep[1]:return_value"]] == [12, 22]
    links = {key: value for key, value in xcoms.items() if key.endswith(":_link_MPIJobLink")}
    assert len(links) == 5, sorted(xcoms)  # waiting, deferred, grow_one, grow_sweep x2
    assert all(str(value).startswith(f"https://dash.example/{namespace}/") for value in links.values()), links
    # The deferred task's lines came from its trigger while the job ran: records whose source is
    # the master's log (``airflow_mpi.master:<n>``), before the task resumed.
    records = re.split(r"\n(?=\[?\d{4}-\d\d-\d\d[ T])", output)
    live = [record for record in records if "[airflow_mpi.master:" in record and "rank 0 line" in record]
    assert len(live) >= 3, output[-6000:]
    assert "the live log's mark" not in output, output[-6000:]  # the real API server took the mark's writes

    reattached, output = check(root, env, "reattach", f"retry-{time.monotonic_ns()}", str(root / "store.json"))
    laps("reattach")
    assert reattached["first_alive_at_kill"] and reattached["reattached"], (reattached, output[-4000:])
    assert reattached["result"] == {"steps": 60}
    second = reattached["second"]
    assert second == [f"{i:03d}" for i in range(int(second[0]), 60)], second  # on from there, none skipped
    assert 0 < int(second[0]) <= int(reattached["first"][-1]) + 1, (reattached["first"][-3:], second[:3])

    plain, _ = check(root, env, "form", "socket", "pycompat")
    laps("form, socket, pycompat")
    form = plain["form"]
    assert form["hook"] == "MPI job backend" and form["testable"]
    assert form["fields"] == FORM_FIELDS, form
    assert form["hidden"] == ["extra", "host", "login", "password", "port", "schema"], form

    channel = plain["socket"]  # the deferred log's non-blocking channel finds its socket
    assert (channel["checked"], channel["found"], plain["airflow"]) == (True, True, version), channel

    compat = plain["pycompat"]  # asyncio.timeout and add_note as on 3.11+
    assert compat["expired"] == ["TimeoutError", True] and compat["in_time"] == ["done", False], compat
    assert compat["notes"] == ["teardown left: pod x"], compat

    cli = run(root, env, "airflow-mpi", "--version")
    assert cli.returncode == 0 and __version__ in cli.stdout, cli.stdout + cli.stderr
    (root / "job.json").write_text(json.dumps({"name": "cli", "image": "registry.example/compat:1",
                                               "command": ["python", "t.py"]}))  # fmt: skip
    rendered = run(root, env, "airflow-mpi", "render", "job.json")
    assert rendered.returncode == 0 and "kind: Pod" in rendered.stdout, rendered.stdout[-2000:] + rendered.stderr
    assert job_objects(cluster.api(), namespace) == []
    laps("the command line")
    print(f"Airflow {version} (Python {python or 'of this run'}): the checks in {laps.total():.1f}s ({laps})")


class Laps:
    """How long each part of a check took, for the tier's output."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.parts: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.parts[name], self.last = now - self.last, now

    def total(self) -> float:
        return sum(self.parts.values())

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.parts.items())
