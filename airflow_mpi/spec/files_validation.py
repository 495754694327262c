"""The rules for a spec's ``files``: what may go into the job's config directory (the ConfigMap).

Each file becomes a ConfigMap key and a file under /etc/mpi in every pod, on both backends, so
its name must be a ConfigMap key and may not replace one of the product's own files, and all of
them together must leave the product's files room in the ConfigMap's 1 MiB.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_mpi.contract import CONFIG_FILES_MAX_BYTES, CONFIG_OWN_FILES
from airflow_mpi.exceptions import SpecIssue

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")
MAX_KEY_LENGTH = 253


def check_files(spec: MPIJobSpec) -> list[SpecIssue]:
    issues = []
    total = 0
    for name, text in spec.files.items():
        path = f"files.{name}"
        # Kubernetes refuses a ConfigMap key that starts with '..' (its volume keeps such names).
        if not isinstance(name, str) or not CONFIG_KEY.match(name) or len(name) > MAX_KEY_LENGTH or name == ".":
            issues.append(
                SpecIssue(
                    path,
                    f"{name!r} is not a file name a ConfigMap accepts",
                    f"use at most {MAX_KEY_LENGTH} of [-._a-zA-Z0-9], no '/', e.g. 'settings.json'",
                )
            )
        elif name.startswith(".."):
            issues.append(
                SpecIssue(
                    path,
                    f"{name!r} starts with '..', which a ConfigMap keeps for its own files",
                    "give your file a name that does not start with '..', e.g. 'settings.json'",
                )
            )
        elif name in CONFIG_OWN_FILES:
            issues.append(
                SpecIssue(
                    path,
                    "is one of the product's own files in the config directory "
                    f"({', '.join(sorted(CONFIG_OWN_FILES))})",
                    "give your file another name",
                )
            )
        if not isinstance(text, str):
            issues.append(SpecIssue(path, f"content is {type(text).__name__}, not text", "give the file's text"))
            continue
        total += len(text.encode("utf-8", "surrogatepass"))
    if total > CONFIG_FILES_MAX_BYTES:
        sizes = ", ".join(f"{name} {_size(text)}" for name, text in spec.files.items() if isinstance(text, str))
        issues.append(
            SpecIssue(
                "files",
                f"hold {total} bytes ({sizes}), over the {CONFIG_FILES_MAX_BYTES} bytes the job's ConfigMap leaves "
                "them (Kubernetes keeps at most 1 MiB in one)",
                "ship large inputs another way: put them on a volume or in object storage and pass their path or URI",
            )
        )
    return issues


def _size(text: str) -> str:
    return f"{len(text.encode('utf-8', 'surrogatepass'))} bytes"
