"""A job's pods' tolerations: the job's own, and how long its pods stay on a Node the cluster
has lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_mpi.spec import Toleration

Manifest = dict[str, Any]

# The taints the node lifecycle controller puts on a Node that stopped reporting (unreachable)
# or reports not ready. Kubernetes lets a pod stay 300 s on such a Node by default; an MPI job
# cannot go on without one Node's ranks, so its pods leave after NODE_LOST_TOLERATION_SECONDS.
# That eviction is also the only word the API gives of a pod that was never Ready when its Node
# went silent. Not 0: a Node coming back loses its NoSchedule taint a moment before its
# NoExecute one, and a pod the scheduler places in between would be evicted at once.
NODE_LOST_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
NODE_LOST_TOLERATION_SECONDS = 20


def render_tolerations(tolerations: Sequence[Toleration]) -> list[Manifest]:
    """The pod's tolerations: the job's own, then each node-lost taint (``NODE_LOST_TAINTS``)
    tolerated for ``NODE_LOST_TOLERATION_SECONDS``, unless one of the job's tolerations already
    says how long to stay."""
    rendered = [_toleration(t) for t in tolerations]
    for taint in NODE_LOST_TAINTS:
        if not any(_tolerates_no_execute(t, taint) for t in tolerations):
            leave = {"key": taint, "operator": "Exists", "effect": "NoExecute"}
            rendered.append({**leave, "tolerationSeconds": NODE_LOST_TOLERATION_SECONDS})
    return rendered


def _tolerates_no_execute(toleration: Toleration, taint: str) -> bool:
    """Whether ``toleration`` matches the NoExecute taint ``taint`` (these taints have no value)."""
    if toleration.operator == "Exists":
        key_matches = not toleration.key or toleration.key == taint
    else:
        key_matches = toleration.key == taint and not toleration.value
    return key_matches and toleration.effect in (None, "", "NoExecute")


def _toleration(toleration: Toleration) -> Manifest:
    out: Manifest = {"operator": toleration.operator}
    for key, value in (
        ("key", toleration.key),
        ("value", toleration.value),
        ("effect", toleration.effect),
        ("tolerationSeconds", toleration.toleration_seconds),
    ):
        if value is not None:
            out[key] = value
    return out
