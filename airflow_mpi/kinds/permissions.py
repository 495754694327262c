"""What each component's credentials must be allowed to do, and which of it a rules review lacks.

Two components talk to the API server, each with its own Role (docs/guides/rbac.md prints both;
a test keeps them equal to the tables here): the worker, which creates, follows and tears down a
job (``WORKER_RULES``), and the triggerer, which only watches a deferred job, follows its log,
moves the log's mark on the job's Lease and deletes the job on a kill (``TRIGGERER_RULES``): it
never creates anything and never reads a Secret, so a triggerer's token cannot read a job's
private key or rewrite the launch script its pods run. Each kind, gang setting and the hang
watchdog add their own rules per component (``JobKind._rules`` and ``_trigger_rules``,
``GANG_RULES``, ``TRIGGER_GANG_RULES``, ``WATCHDOG_RULES``). Each component asks the API server
once, before it acts, what its credentials may do (a SelfSubjectRulesReview), so a Role without
one of its verbs fails the task at once, naming the verb and who lacks it, instead of mid-job or
at teardown with the job's objects left behind.
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


LEASES = "coordination.k8s.io"
# The worker's Role, rule by rule (apiGroups, resources, verbs): it creates a job's objects,
# follows it, reattaches to it on a retry and tears it down. Nothing is ever updated in place:
# the live log's mark is a Lease of the job's own, the one object a triggerer writes.
WORKER_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["services", "secrets", "configmaps"],
        "verbs": ["create", "get", "list", "delete"],
    },
    {"apiGroups": [LEASES], "resources": ["leases"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
)
# The triggerer's Role: it watches the pods, reads the master's log and the events, moves the
# log's mark on the job's Lease and, on a kill, deletes the job's Service (the rest is owned by it).
TRIGGERER_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["delete"]},
    {"apiGroups": [LEASES], "resources": ["leases"], "verbs": ["get", "update"]},
)


Rules = tuple[dict[str, list[str]], ...]
# What each kind adds to each Role is the kind's own (``JobKind._rules``, ``JobKind._trigger_rules``).
# What a job with ``progress_timeout`` adds to the worker's: the hang watchdog asks each pod for its ranks' stacks
# (``launch.sh stacks`` through the exec API; websocket exec is a `get` before Kubernetes 1.31,
# a `create` since).
WATCHDOG_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
)
# What each gang setting adds to the worker's Role: the group object the job creates (Kueue makes its Workload itself:
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


# What each gang setting adds to the triggerer's: a kill deletes Kueue's Workload of a job of ours.
TRIGGER_GANG_RULES: dict[str, tuple[dict[str, list[str]], ...]] = {
    "kueue": ({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["delete"]},),
}


def build_job_rules(kind_rules: Rules, gang: str | None) -> Rules:
    """Every rule the worker needs for a job: its Role, what the job's kind adds (``kind_rules``)
    and what its ``gang`` setting, if any, adds."""
    return (*WORKER_RULES, *kind_rules, *(GANG_RULES[gang] if gang else ()))


def build_job_permissions(kind_rules: Rules, gang: str | None, watched: bool) -> tuple[Permission, ...]:
    """Every verb the worker needs for a job: ``build_job_rules``, and the hang watchdog's
    (``watched``: the job sets ``progress_timeout``)."""
    return build_permissions((*build_job_rules(kind_rules, gang), *(WATCHDOG_RULES if watched else ())))


def build_trigger_rules(kind_trigger_rules: Rules, deleted_on_kill: Iterable[Sequence[str]]) -> Rules:
    """Every rule the triggerer needs for a deferred job: its Role, what the job's kind adds
    (``kind_trigger_rules``), and `delete` on each custom resource (group, version, plural) a
    kill deletes (the kind's top object, Kueue's Workload of a job of ours)."""
    deletes = tuple(
        {"apiGroups": [group], "resources": [plural], "verbs": ["delete"]} for group, _, plural in deleted_on_kill
    )
    return (*TRIGGERER_RULES, *kind_trigger_rules, *deletes)


def build_trigger_permissions(
    kind_trigger_rules: Rules, deleted_on_kill: Iterable[Sequence[str]]
) -> tuple[Permission, ...]:
    """Every verb of ``build_trigger_rules``, each once: what the trigger checks before it follows the job."""
    return build_permissions(build_trigger_rules(kind_trigger_rules, deleted_on_kill))


def build_permissions(rules: Iterable[Mapping[str, Any]]) -> tuple[Permission, ...]:
    """Every (group, resource, verb) a list of Role rules names, in order, each once."""
    return tuple(
        dict.fromkeys(
            Permission(group, resource, verb)
            for rule in rules
            for group in rule.get("apiGroups") or [""]
            for resource in rule.get("resources") or []
            for verb in rule.get("verbs") or []
        )
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


def describe_user(username: str | None, connection: str | None = None) -> str:
    """Who a SelfSubjectReview says the credentials are (``system:serviceaccount:NS:NAME``), in
    words; unknown (the review not served or not allowed): the credentials of ``connection``."""
    parts = (username or "").split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return f"the service account {parts[2]}/{parts[3]}"
    if username:
        return f"the user {username}"
    return f"the credentials of Kubernetes connection {connection!r}" if connection else "the Kubernetes credentials"


# Why each component checks before it acts, for its error.
WHEN_CHECKED = {
    "worker": "checked before anything was created; a job needs them to start, follow, reattach to and tear "
    "down its objects",
    "triggerer": "checked before the trigger followed the job; the triggerer needs them to watch it, follow "
    "its log and delete it on a kill",
}


def render_missing(
    missing: Sequence[Permission],
    namespace: str,
    doc: str,
    *,
    user: str | None = None,
    component: str = "worker",
    connection: str | None = None,
) -> str:
    """The task's error for ``component``'s credentials (``user``: who a SelfSubjectReview said
    they are, when known; else named as ``connection``'s) that lack ``missing`` in ``namespace``.
    A known user gets the ``kubectl auth can-i`` line that shows the fix took (the RoleBinding's
    subject is that name)."""
    names = ", ".join(p.describe() for p in missing)
    verbs = ", ".join(f"`{p.verb}` on `{p.resource}`" for p in missing)
    who = describe_user(user, connection)
    check = ""
    if user:
        first = missing[0]
        resource = f"{first.resource}.{first.group}" if first.group else first.resource
        check = f" (then `kubectl auth can-i {first.verb} {resource} -n {namespace} --as {user}` says yes)"
    return (
        f"{who} cannot {names} in namespace {namespace} ({WHEN_CHECKED[component]}): add {verbs} to the "
        f"{component}'s Role bound to {'them' if user is None else 'it'}{check}; see {doc}"
    )
