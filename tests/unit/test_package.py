"""The pure core (spec, job, observe, kinds, ...) imports no I/O or frameworks, and the package's
shape stays what docs/architecture.md says.

The list of pure modules lives once, in pyproject.toml's import-linter contract; the layers
contract must agree with it (everything below the backends is pure), and these tests say so when
they drift. mypy is strict on the whole package.
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
    """``airflow_mpi.spec`` -> ``spec``; ``airflow_mpi.doctor.checks`` -> ``doctor.checks``."""
    return module.removeprefix("airflow_mpi.")


def pure_modules() -> list[str]:
    """The one list: the import-linter contract that forbids I/O in the core."""
    return [_short(m) for m in _contract(PURE_CONTRACT)["source_modules"]]


def _files(name: str) -> list[Path]:
    """The files of a pure package (every module in it) or module."""
    path = ROOT.joinpath(*name.split("."))
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def _is_pure(module: str) -> bool:
    short = _short(module)
    return any(short == name or short.startswith(f"{name}.") for name in pure_modules())


def test_mypy_is_strict_on_the_whole_package_without_exceptions() -> None:
    mypy = _pyproject()["tool"]["mypy"]
    assert mypy["strict"] is True
    assert not [o for o in mypy.get("overrides", []) if any(m.startswith("airflow_mpi") for m in o["module"])]


def test_layers_below_the_backends_are_pure() -> None:
    layers = _contract("layers")["layers"]
    below = layers[layers.index("backends") + 1 :]
    core = {name.strip() for layer in below for name in re.split(r"[|:]", layer)}
    assert {name for name in core - CORE_BUT_READS_FILES if not _is_pure(f"airflow_mpi.{name}")} == set()


def test_every_pure_module_exists() -> None:
    for name in pure_modules():
        path = ROOT.joinpath(*name.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name


def test_pure_core_imports_no_io_or_frameworks() -> None:
    for name in pure_modules():
        for file in _files(name):
            for module in _imported_modules(ast.parse(file.read_text())):
                assert module.split(".")[0] not in FORBIDDEN, f"{file.name} of airflow_mpi.{name} imports {module}"
                if module.startswith("airflow_mpi."):
                    ok = _is_pure(module) or _short(module).split(".")[0] in CORE_BUT_READS_FILES
                    assert ok, f"{file.name} of airflow_mpi.{name} imports {module}"


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
        for file in _files(name):
            assert len(file.read_text().splitlines()) <= 400, f"{file} has grown past 400 lines: split it"


def test_no_production_module_is_over_500_lines() -> None:
    long = {
        str(file.relative_to(ROOT)): lines
        for file in ROOT.rglob("*.py")
        if (lines := len(file.read_text().splitlines())) > 500
    }
    assert long == {}, "split these where their concerns part"


def test_the_package_root_holds_only_the_leaves_the_airflow_compat_module_and_the_provider_entry_point() -> None:
    modules = sorted(p.stem for p in ROOT.glob("*.py"))
    assert modules == ["__init__", "compat", "contract", "events", "exceptions", "get_provider_info"]
