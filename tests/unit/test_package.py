"""The pure core (spec, naming, topology, mpirun, ssh, plan, ...) imports no I/O or frameworks.

The list of pure modules lives once, in pyproject.toml's import-linter contract; mypy's strict
overrides and the layers contract must agree with it, and these tests say so when they drift.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import airflow_mpi

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(airflow_mpi.__file__).parent
PYPROJECT = ROOT.parent / "pyproject.toml"
PURE_CONTRACT = "The pure core does no I/O and knows no Airflow or Kubernetes"
FORBIDDEN = {"airflow", "kubernetes", "kubernetes_asyncio", "subprocess", "asyncio", "socket", "threading", "os"}
# Below the backends but not pure: reads the launch script from the installed package.
CORE_BUT_READS_FILES = {"scripts"}


def _pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def _contract(name_or_type: str) -> dict[str, Any]:
    contracts = _pyproject()["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if name_or_type in (c["name"], c["type"]))


def _short(module: str) -> str:
    """``airflow_mpi.spec.*`` or ``airflow_mpi.spec`` -> ``spec``."""
    return module.removeprefix("airflow_mpi.").removesuffix(".*")


def pure_modules() -> list[str]:
    """The one list: the import-linter contract that forbids I/O in the core."""
    return [_short(m) for m in _contract(PURE_CONTRACT)["source_modules"]]


def test_mypy_strict_overrides_name_exactly_the_pure_modules() -> None:
    overrides = _pyproject()["tool"]["mypy"]["overrides"]
    strict = [_short(m) for o in overrides if o.get("strict") for m in o["module"]]
    assert sorted(strict) == sorted(pure_modules())


def test_layers_below_the_backends_hold_exactly_the_pure_modules() -> None:
    layers = _contract("layers")["layers"]
    below = layers[layers.index("backends") + 1 :]
    core = {name.strip() for layer in below for name in re.split(r"[|:]", layer)}
    assert core - CORE_BUT_READS_FILES == set(pure_modules())


def test_every_pure_module_exists() -> None:
    for name in pure_modules():
        assert (ROOT / f"{name}.py").is_file() or (ROOT / name / "__init__.py").is_file(), name


def test_pure_core_imports_no_io_or_frameworks() -> None:
    allowed = {*pure_modules(), *CORE_BUT_READS_FILES}
    for name in pure_modules():
        files = sorted((ROOT / name).glob("*.py")) if (ROOT / name).is_dir() else [ROOT / f"{name}.py"]
        for file in files:
            for module in _imported_modules(ast.parse(file.read_text())):
                assert module.split(".")[0] not in FORBIDDEN, f"{file.name} of airflow_mpi.{name} imports {module}"
                if module.startswith("airflow_mpi."):
                    assert module.split(".")[1] in allowed, f"{file.name} of airflow_mpi.{name} imports {module}"


def _imported_modules(tree: ast.Module) -> list[str]:
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
    return modules


def test_no_core_module_is_over_400_lines() -> None:
    for name in pure_modules():
        files = sorted((ROOT / name).glob("*.py")) if (ROOT / name).is_dir() else [ROOT / f"{name}.py"]
        for file in files:
            assert len(file.read_text().splitlines()) <= 400, f"{file} has grown past 400 lines: split it"
