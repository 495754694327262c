"""The wheel users install holds the runtime package only: no test doubles, no tests, no bench,
and no module importing what the runtime dependencies (and theirs) do not provide."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # With the environment's setuptools when it has one (torch brings it): no download.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("airflow_mpi-*.whl")
    return zipfile.ZipFile(built)


def runtime_distributions() -> set[str]:
    """The project's runtime requirements and everything they require in turn, as installed."""
    wanted = [Requirement(r) for r in importlib.metadata.requires("airflow-mpi") or []]
    found: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement (the test tools) or another platform's
        name = requirement.name.lower().replace("_", "-")
        if name in found:
            continue
        found.add(name)
        try:
            wanted += [Requirement(r) for r in importlib.metadata.requires(name) or []]
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def test_the_wheel_holds_the_runtime_package_only(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    outside = [n for n in names if not n.startswith(("airflow_mpi/", "airflow_mpi-"))]
    assert outside == [], outside
    assert not [n for n in names if "/testing/" in n or "/tests/" in n or n.startswith("airflow_mpi/bench")]
    assert "airflow_mpi/scripts/launch.sh" in names and "airflow_mpi/py.typed" in names


# Imported only by the connection form's widgets on Airflow 3.0 and 3.1 (hooks/connection_form.py),
# which Airflow's ProvidersManager calls inside a try that takes their absence (the FAB provider
# brings them): never a dependency of the package.
FORM_WIDGET_MODULES = {"wtforms", "flask_appbuilder", "flask_babel"}


def other_pythons_distributions(wheel: zipfile.ZipFile) -> set[str]:
    """What the wheel requires on another Python it declares only (``; python_version < "3.11"``):
    not installed on this one, imported under a version check (``airflow_mpi/triggers/timeouts.py``)."""
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    found = set()
    for line in wheel.read(metadata).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist: "))
        marker = requirement.marker
        if marker is None or "extra" in str(marker) or marker.evaluate({"extra": ""}):
            continue
        if any(marker.evaluate({"extra": "", "python_version": v, "python_full_version": f"{v}.0"})
               for v in ("3.10", "3.11", "3.12", "3.13")):  # fmt: skip
            found.add(requirement.name.lower().replace("_", "-"))
    return found


def test_every_module_in_the_wheel_imports_what_the_runtime_dependencies_provide(wheel: zipfile.ZipFile) -> None:
    providers = importlib.metadata.packages_distributions()
    allowed = runtime_distributions()
    elsewhere = other_pythons_distributions(wheel)
    assert elsewhere == {"async-timeout"}, elsewhere
    unprovided: dict[str, str] = {}
    for name in wheel.namelist():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(wheel.read(name))):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "airflow_mpi":
                    continue
                if top in FORM_WIDGET_MODULES and name == "airflow_mpi/hooks/connection_form.py":
                    continue
                if top.replace("_", "-") in elsewhere and name == "airflow_mpi/triggers/timeouts.py":
                    continue
                if top == "mpi4py" and name == "airflow_mpi/scripts/python_rank.py":
                    continue  # runs in the job's image, beside its MPI, never in Airflow
                distributions = {d.lower().replace("_", "-") for d in providers.get(top, [])}
                if not distributions & allowed:
                    unprovided[f"{name}: {module}"] = ", ".join(sorted(distributions)) or "not installed"
    assert unprovided == {}, unprovided
