"""Who owns a job: the run identity, the keys and labels derived from it, and the rule that
decides whether an object found on a cluster (or anything a backend finds under a job's name)
is a job's own.

A job belongs to one try of one task instance of one Airflow deployment: (deployment, DAG, task,
run, map index, try). The deployment is part of it because two Airflow deployments (staging and
production) produce the same run ids (``scheduled__<date>``) and may share a namespace.

How a backend compares two identities: ``owner_key(a) == owner_key(b)`` (one string, 160 bits of
SHA-256; store it beside what the job makes), or ``owned_by(identity, labels)`` for an object
that carries ``owner_labels``. A backend deletes or adopts only what is owned by its own
identity; anything else is a collision, reported with both owners (``describe_owner``) and left
alone.

The deployment: ``build_deployment_id`` takes the explicit name (``[mpi] deployment``) or else
hashes a value every component of one deployment shares and another deployment does not (its
``[api_auth] jwt_secret``, else ``[core] fernet_key``): one-way, so the label leaks nothing.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LABEL_PREFIX = "airflow-mpi.io"
LABEL_RUN_KEY = f"{LABEL_PREFIX}/run-key"  # hash of the identity without try: finds earlier tries
LABEL_TRY_NUMBER = f"{LABEL_PREFIX}/try-number"
LABEL_DEPLOYMENT = f"{LABEL_PREFIX}/deployment"
ANNOTATION_DEPLOYMENT = LABEL_DEPLOYMENT  # the same key, as an annotation: the exact value
DEPLOYMENT_HASH_LEN = 16  # a derived deployment id: "h" and 15 base32 characters (75 bits)
# A label value: at most 63 of [-A-Za-z0-9_.], alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


@dataclass(frozen=True)
class RunIdentity:
    """Which Airflow task-instance try, of which deployment, a job belongs to (``deployment``
    "" where there is none: ``airflow-mpi run`` gives each invocation a run id of its own)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1
    deployment: str = ""

    def digest(self, *, with_try: bool = True) -> bytes:
        parts = [self.deployment, self.dag_id, self.task_id, self.run_id, str(self.map_index)]
        if with_try:
            parts.append(str(self.try_number))
        return hashlib.sha256("\x1f".join(parts).encode()).digest()


def build_job_hash(identity: RunIdentity, length: int) -> str:
    """``length`` lowercase base32 characters of the identity's hash (5 bits each: a DNS label's
    alphabet). 13 give 65 bits: at a million jobs a day, a name collision once in ~10^8 days."""
    return base64.b32encode(identity.digest()).decode().lower()[:length]


def build_run_key(identity: RunIdentity) -> str:
    """Label value shared by every try of one task instance of one deployment (it finds an
    earlier try's job, and only its own deployment's)."""
    return identity.digest(with_try=False).hex()[:40]


def owner_key(identity: RunIdentity) -> str:
    """One string per owner (deployment, DAG, task, run, map index, try): equal keys, same owner."""
    return f"{build_run_key(identity)}.{identity.try_number}"


def owner_labels(identity: RunIdentity) -> dict[str, str]:
    """The labels that say who owns an object (``owned_by`` reads them back)."""
    labels = {LABEL_RUN_KEY: build_run_key(identity), LABEL_TRY_NUMBER: str(identity.try_number)}
    if identity.deployment:
        labels[LABEL_DEPLOYMENT] = identity.deployment
    return labels


def owned_by(identity: RunIdentity, labels: Mapping[str, str] | None) -> bool:
    """Whether an object with ``labels`` belongs to this very try of this task instance."""
    labels = labels or {}
    return labels.get(LABEL_RUN_KEY) == build_run_key(identity) and labels.get(LABEL_TRY_NUMBER) == str(
        identity.try_number
    )


def describe_identity(identity: RunIdentity) -> str:
    """An owner in words, for an error that names it."""
    words = [f"DAG {identity.dag_id!r}", f"task {identity.task_id!r}", f"run {identity.run_id!r}"]
    if identity.map_index >= 0:
        words.append(f"map index {identity.map_index}")
    words.append(f"try {identity.try_number}")
    words.append(f"deployment {identity.deployment!r}" if identity.deployment else "no deployment")
    return ", ".join(words)


def describe_owner(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None) -> str:
    """Who owns an object found on a cluster, in words, from what it carries: the exact values
    of its annotations where they are, else its (possibly shortened) labels."""
    labels, annotations = labels or {}, annotations or {}

    def value(key: str) -> str | None:
        return annotations.get(f"{LABEL_PREFIX}/{key}") or labels.get(f"{LABEL_PREFIX}/{key}")

    if not labels.get(LABEL_RUN_KEY):
        return "no airflow-mpi job (it carries no run key)"
    words = [f"DAG {value('dag-id')!r}", f"task {value('task-id')!r}", f"run {value('run-id')!r}"]
    if value("map-index"):
        words.append(f"map index {value('map-index')}")
    words.append(f"try {labels.get(LABEL_TRY_NUMBER, '?')}")
    deployment = value("deployment")
    words.append(f"deployment {deployment!r}" if deployment else "no deployment")
    return ", ".join(words)


def is_configured(value: object) -> bool:
    """Whether a configuration value was really set: not empty, and not the unexpanded template
    (``{JWT_SECRET_KEY}``) a Task SDK process reads for an option nobody set."""
    return isinstance(value, str) and bool(value.strip()) and not re.fullmatch(r"\{[A-Z_]+\}", value.strip())


def check_deployment_name(name: str) -> str | None:
    """What is wrong with an explicit deployment name (None: fine): it is written as a label."""
    if _LABEL_VALUE.match(name):
        return None
    return (
        f"is {name!r:.70}; give at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
        "or digit, e.g. 'production'"
    )


def build_deployment_id(explicit: str | None, shared_values: Sequence[str | None]) -> str:
    """The deployment's id: ``explicit`` when given (checked by ``check_deployment_name``), else
    a one-way hash of the first configured value of ``shared_values`` (what every component of
    one deployment shares and another deployment does not), else "" (none can be told)."""
    if explicit is not None and explicit.strip():
        problem = check_deployment_name(explicit.strip())
        if problem:
            raise ValueError(problem)
        return explicit.strip()
    for value in shared_values:
        if is_configured(value):
            assert value is not None
            digest = hashlib.sha256(b"airflow-mpi deployment\x1f" + value.strip().encode()).digest()
            return "h" + base64.b32encode(digest).decode().lower()[: DEPLOYMENT_HASH_LEN - 1]
    return ""


def render_name_taken(
    what: str,
    name: str,
    namespace: str,
    ours: RunIdentity,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
) -> str:
    """The error for a name another owner holds: both owners, that nothing was touched, and what
    to do."""
    return (
        f"{what} {name} in namespace {namespace} belongs to another job ({describe_owner(labels, annotations)}), "
        f"not to this one ({describe_identity(ours)}); it was left alone and nothing was created. Two Airflow "
        "deployments that share a namespace need deployment names of their own: set [mpi] deployment (e.g. "
        "AIRFLOW__MPI__DEPLOYMENT=staging) differently in each, or give each its own namespace "
        "(docs/guides/kubernetes.md#one-job-never-touches-another)"
    )
