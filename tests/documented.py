"""What the docs tell users to apply, read from the page itself, so the tests and the docs agree:
the Role of the RBAC guide is what the backend checks for, what the double grants and what the
real control plane binds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RBAC_GUIDE = REPO / "docs" / "guides" / "rbac.md"


def documented_role_rules(page: Path = RBAC_GUIDE) -> list[dict[str, Any]]:
    """The rules of the first Role manifest on ``page``."""
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
        try:
            doc = yaml.safe_load(block)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "Role":
            return list(doc["rules"])
    raise LookupError(f"{page.relative_to(REPO)} has no Role manifest")


def documented_added_rules(page: Path = RBAC_GUIDE) -> dict[str, list[dict[str, Any]]]:
    """What the guide says each backend, gang setting and spec field adds: ``backend: X`` / ``gang: Y``
    / ``progress_timeout`` (the first comment of each YAML list of rules) -> its rules."""
    found: dict[str, list[dict[str, Any]]] = {}
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
        first = block.splitlines()[0]
        named = re.match(r"# ((?:backend|gang): [a-z]+|progress_timeout)\b", first)
        if named:
            found[named.group(1)] = list(yaml.safe_load(block))
    return found
