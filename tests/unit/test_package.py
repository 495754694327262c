"""The pure core (spec, naming, topology, mpirun, ssh, plan, ...) imports no I/O or frameworks."""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_mpi

PURE = ["spec", "naming", "topology", "mpirun", "ssh", "plan", "status", "contract", "manifests", "exceptions",
        "readiness", "logstream", "events"]  # fmt: skip
FORBIDDEN = {"airflow", "kubernetes", "kubernetes_asyncio", "subprocess", "asyncio", "socket", "threading", "os"}


def test_pure_core_imports_no_io_or_frameworks() -> None:
    root = Path(airflow_mpi.__file__).parent
    for name in PURE:
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                assert module.split(".")[0] not in FORBIDDEN, f"airflow_mpi.{name} imports {module}"
                if module.startswith("airflow_mpi."):
                    assert module.split(".")[1] in [*PURE, "scripts"], f"airflow_mpi.{name} imports {module}"
