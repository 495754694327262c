"""The browser tier: Debian's Chromium, driven by Selenium through Debian's chromedriver (no
browser download), against Airflow's real processes (api-server, dag-processor, scheduler,
triggerer; LocalExecutor; the simple auth manager) on a fresh home. Each step keeps a screenshot
in ``.artifacts/browser`` (AIRFLOW_MPI_ARTIFACTS overrides it)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_processes import Airflow, airflow_processes, wait_for
from tests.doubles.kube_double import KubeDouble, ScriptedKubelet
from tests.k8s.conftest import Scripts

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("AIRFLOW_MPI_ARTIFACTS", REPO / ".artifacts" / "browser"))
JOB_URL = "https://dash.example/{namespace}/{job}?dag={dag_id}&task={task_id}&try={try_number}"


def _required() -> bool:
    return os.environ.get("AIRFLOW_MPI_REQUIRE_INTEGRATION") == "1"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium")
    if missing:
        if _required():
            pytest.fail(f"the browser tier needs {', '.join(missing)} (make setup installs them)")
        pytest.skip(f"needs {', '.join(missing)}")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # the network's answers
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def scripts() -> Scripts:
    return Scripts()


@pytest.fixture(scope="module")
def kube(scripts: Scripts) -> Iterator[KubeDouble]:
    double = KubeDouble(ScriptedKubelet(scripts))
    double.start()
    yield double
    double.stop()


@pytest.fixture(scope="module")
def ui(kube: KubeDouble) -> Iterator[Airflow]:
    """Airflow with the example DAG (local backend), the tier's own DAGs, and connections: the
    local backend (``mpi_default``), the API double (``mpi_k8s``, for the deferred task), and a
    Kubernetes API nobody serves (``kube_unreachable``, for the connection test's failure). The
    home is not under /tmp: a local pod gets a /tmp of its own, and the example's ranks run its
    training script."""
    home = Path(tempfile.mkdtemp(prefix="airflow-mpi-ui-", dir="/var/tmp")) / "home"
    dags = {"ui_dags.py": (Path(__file__).parent / "ui_dags.py").read_text()}
    for path in (REPO / "dags").rglob("*.py"):
        if path.name.startswith("mpi_training_pipeline") or "scripts" in path.parts:
            dags[str(path.relative_to(REPO / "dags"))] = path.read_text()
    unreachable = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                   "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                   "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                   "users": [{"name": "u", "user": {"token": "t"}}]}  # fmt: skip
    env = {
        "AIRFLOW_CONN_MPI_DEFAULT": json.dumps(
            {"conn_type": "mpi", "extra": {"backend": "local", "job_url_template": JOB_URL}}
        ),
        "AIRFLOW_CONN_KUBE_UNREACHABLE": json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(unreachable)}}
        ),
        "AIRFLOW_CONN_KUBE_DOUBLE": json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kube.kubeconfig())}}
        ),
        "AIRFLOW_CONN_MPI_K8S": json.dumps(
            {
                "conn_type": "mpi",
                "extra": {"backend": "kubernetes", "kubernetes_conn_id": "kube_double", "namespace": "default"},
            }
        ),
    }
    with airflow_processes(home, dags, env=env, AIRFLOW__CORE__TEST_CONNECTION="Enabled") as processes:
        yield processes
    shutil.rmtree(home.parent, ignore_errors=True)


def until(what: str, check: Callable[[], Any], timeout: float, ui: Airflow, driver: Any = None) -> Any:
    """``wait_for``, keeping a screenshot of the page when it times out."""

    def screenshot(what: str) -> None:
        if driver is not None:
            driver.save_screenshot(str(ARTIFACTS / f"timeout-{what.replace(' ', '-')[:40]}.png"))

    return wait_for(what, check, timeout, ui, screenshot)
