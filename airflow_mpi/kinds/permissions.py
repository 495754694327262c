"""What a job's credentials must be allowed to do, and which of it a rules review lacks.

The plain pods backend starts, follows, reattaches to and tears down a job with exactly the
permissions of ``POD_BACKEND_RULES`` (the Role docs/guides/rbac.md tells users to bind; a test
keeps the two equal); each other kind, and each gang setting, adds its own (``JobKind.rules``,
``GANG_RULES``: the same guide's table, kept equal by a test too). The backend asks the API
server once, before it creates anything, what its credentials may do (a SelfSubjectRulesReview),
so a Role without one of those verbs fails the task at once, naming the verb, instead of mid-job
or at teardown with the job's objects left behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Permission:
    """One verb on one resource of one API group (``""``: the core group)."""

    group: str
    resource: str
    verb: str

    def describe(self) -> str:
        return f"`{self.verb}` `{self.resource}`"


# The RBAC guide's Role, rule by rule (apiGroups, resources, verbs).
POD_BACKEND_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["services", "secrets", "configmaps"],
        "verbs": ["create", "get", "list", "delete"],
    },
    # A deferred job's live log keeps how far it was shown on a Lease of the job's (``logshown``):
    # the worker creates, reads and deletes it with the job; the triggerer reads and updates it.
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
)


Rules = tuple[dict[str, list[str]], ...]
# What each kind adds to the Role is the kind's own (``JobKind.rules``).
# What a job with ``progress_timeout`` adds: the hang watchdog asks each pod for its ranks' stacks
# (``launch.sh stacks`` through the exec API; websocket exec is a `get` before Kubernetes 1.31,
# a `create` since).
WATCHDOG_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
)
# What each gang setting adds: the group object the job creates (Kueue makes its Workload itself:
# the job reads and removes it).
GANG_RULES: dict[str, tuple[dict[str, list[str]], ...]] = {
    "volcano": (
        {
            "apiGroups": ["scheduling.volcano.sh"],
            "resources": ["podgroups"],
            "verbs": ["create", "get", "list", "delete"],
        },
    ),
    "coscheduling": (
        {
            "apiGroups": ["scheduling.x-k8s.io"],
            "resources": ["podgroups"],
            "verbs": ["create", "get", "list", "delete"],
        },
    ),
    "kueue": ({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "delete"]},),
}


def build_job_rules(kind_rules: Rules, gang: str | None) -> Rules:
    """Every rule a job needs: the base Role, what its kind adds (``kind_rules``) and what its
    ``gang`` setting, if any, adds."""
    return (*POD_BACKEND_RULES, *kind_rules, *(GANG_RULES[gang] if gang else ()))


def build_permissions(rules: Iterable[Mapping[str, Any]]) -> tuple[Permission, ...]:
    """Every (group, resource, verb) a list of Role rules names, in order."""
    return tuple(
        Permission(group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups") or [""]
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    )


def _grants(rule: Mapping[str, Any], wanted: Permission) -> bool:
    if rule.get("resourceNames"):  # only for named objects: no create or list
        return False
    groups, resources, verbs = rule.get("apiGroups") or [], rule.get("resources") or [], rule.get("verbs") or []
    return (
        ("*" in groups or wanted.group in groups)
        and ("*" in resources or wanted.resource in resources)
        and ("*" in verbs or wanted.verb in verbs)
    )


def missing_permissions(granted: Sequence[Mapping[str, Any]], needed: Sequence[Permission]) -> list[Permission]:
    """The ``needed`` permissions no rule of ``granted`` (a rules review's ``resourceRules``,
    with ``apiGroups``/``resources``/``verbs``, ``*`` meaning all) allows."""
    return [want for want in needed if not any(_grants(rule, want) for rule in granted)]


def render_missing(missing: Sequence[Permission], namespace: str, doc: str) -> str:
    """The task's error for credentials that lack ``missing`` in ``namespace``."""
    names = ", ".join(p.describe() for p in missing)
    verbs = ", ".join(f"`{p.verb}` on `{p.resource}`" for p in missing)
    return (
        f"the Kubernetes credentials cannot {names} in namespace {namespace} (checked before anything was "
        f"created; a job needs them to start, follow, reattach to and tear down its objects): add {verbs} to "
        f"the Role bound to them; see {doc}"
    )
