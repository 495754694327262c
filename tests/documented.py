"""What the docs tell users to apply, read from the page itself, so the tests and the docs agree:
each Role of the RBAC guide is what its component checks for, what the double grants and what
the real control plane binds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RBAC_GUIDE = REPO / "docs" / "guides" / "rbac.md"


def documented_manifests(kind: str, page: Path = RBAC_GUIDE) -> list[dict[str, Any]]:
    """Every manifest of ``kind`` (``Role``, ``RoleBinding``) on ``page``, as a user copies it."""
    found = []
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
        try:
            doc = yaml.safe_load(block)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and doc.get("kind") == kind:
            found.append(doc)
    return found


def documented_role_rules(component: str = "worker", page: Path = RBAC_GUIDE) -> list[dict[str, Any]]:
    """The rules of the Role ``airflow-mpi-<component>`` (``worker``, ``triggerer``) on ``page``."""
    for doc in documented_manifests("Role", page):
        if doc["metadata"]["name"] == f"airflow-mpi-{component}":
            return list(doc["rules"])
    raise LookupError(f"{page.relative_to(REPO)} has no Role airflow-mpi-{component}")


def documented_added_rules(component: str = "worker", page: Path = RBAC_GUIDE) -> dict[str, list[dict[str, Any]]]:
    """What the guide says each backend, gang setting and spec field adds to ``component``'s Role:
    ``backend: X`` / ``gang: Y`` / ``progress_timeout`` (the first comment of each YAML list of
    rules, after the component: ``# worker, backend: mpijob``) -> its rules."""
    found: dict[str, list[dict[str, Any]]] = {}
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
        first = block.splitlines()[0]
        named = re.match(r"# (worker|triggerer), ((?:backend|gang): [a-z]+|progress_timeout)\b", first)
        if named and named.group(1) == component:
            found[named.group(2)] = list(yaml.safe_load(block))
    return found
