"""The provider as it runs in a pod, against the real kube-apiserver: a process whose only
credentials are a ServiceAccount's projected files (``tests.cluster.incluster``: a private mount
namespace, KUBERNETES_SERVICE_HOST/PORT at the apiserver) and an in-cluster ``kubernetes``
connection. Mid-way through a job's log the token file is replaced with a new token and the old
one revoked at once (its bound Secret deleted), as the kubelet's rotation and the old token's
expiry do, only sooner: the waiting and the deferred paths follow the log on, every line once,
and the job finishes and is torn down. With no connection at all, both clients use the pod's
token (10 minutes, as the kubelet projects it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.kinds.permissions import TRIGGERER_RULES, WORKER_RULES
from tests.cluster.cluster import Cluster
from tests.cluster.incluster import PodIdentity
from tests.documented import documented_role_rules

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

ACCOUNT = "airflow-worker"
TICKS, ROTATE_AT, QUIET_AT = 30, 6, 14
# Rank 0 counts ticks; a quiet spell after the rotation makes the follow reopen its stream (its
# read timeout is cut to 3 s below), with whatever token its client sends then.
PROGRAM = (
    "import json, os, time\n"
    "if os.environ.get('OMPI_COMM_WORLD_RANK') == '0':\n"
    f"    for i in range({TICKS}):\n"
    "        print(f'tick {i}', flush=True)\n"
    f"        time.sleep(6 if i == {QUIET_AT} else 0.4)\n"
    f"    print('AIRFLOW_MPI_RESULT ' + json.dumps({{'ticks': {TICKS}}}))\n"
)

# The waiting path, as a task runs it: the mpi connection's backend, JobRunner.
WAITING = """
import json, sys, time
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.runner.retries import plan_for
from airflow_mpi.spec import MPIJobSpec
backend = MPIJobHook("mpi_in").get_backend()
backend.log_read_timeout = 3.0
plan = plan_for(backend, MPIJobSpec.from_dict(json.loads(sys.argv[1])), RunIdentity("rotdag", "train", sys.argv[2]))
result = JobRunner(backend, plan, lambda text: print(text, flush=True)).run()
print("RESULT " + json.dumps({"exit_code": result.exit_code, "result": result.result}), flush=True)
"""

# The deferred path: the operator defers, its trigger runs to its event on this process's event
# loop (as a triggerer runs it), and the operator resumes with the event.
DEFERRED = """
import asyncio, json, logging, sys
from types import SimpleNamespace
import airflow_mpi.triggers.logfollow as logfollow
from airflow_mpi.compat import TaskDeferred
from airflow_mpi.operators.mpi import MPIJobOperator

class QuickReopen(logfollow.MasterLogFollower):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read_timeout = 3.0

logfollow.MasterLogFollower = QuickReopen
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s: %(message)s")
operator = MPIJobOperator(task_id="train", job=json.loads(sys.argv[1]), mpi_conn_id="mpi_in", deferrable=True)
ti = SimpleNamespace(dag_id="rotdag", task_id="train", run_id=sys.argv[2], map_index=-1, try_number=1)
context = {"ti": ti}
try:
    operator.execute(context)
    raise SystemExit("the operator did not defer")
except TaskDeferred as deferred:
    async def first_event():
        async for event in deferred.trigger.run():
            return event
    event = asyncio.run(first_event())
    result = getattr(operator, deferred.method_name)(context, event.payload)
print("RESULT " + json.dumps({"exit_code": 0, "result": result["result"]}), flush=True)
"""

# Who each client is with no connection: the token it sends, and the SelfSubjectReview's user.
WHO = """
import asyncio, json
from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.triggers.api_client import shared_api_client
from airflow_mpi.triggers.rules_review import _whoami

backend = KubernetesBackend()  # kubernetes_default, which does not exist
sync = {"user": backend.objects.whoami(), "token": backend.api_client.configuration.api_key["BearerToken"]}

async def deferred():
    async with shared_api_client("kubernetes_default") as client:
        return {"user": await _whoami(client, 30), "token": client.configuration.api_key["BearerToken"]}

print("WHO " + json.dumps({"sync": sync, "async": asyncio.run(deferred())}), flush=True)
"""


def pod_of(cluster: Cluster, namespace: str, root: Path, rules: list[dict[str, Any]]) -> Iterator[PodIdentity]:
    cluster.service_account_kubeconfig(namespace, ACCOUNT, rules, root / "unused.kubeconfig")
    identity = PodIdentity(cluster, namespace, ACCOUNT, root / "pod")
    try:
        yield identity
    finally:
        identity.close()


TESTED = """
from airflow_mpi.hooks.mpi import MPIJobHook
print("TESTED", *MPIJobHook("mpi_default").test_connection(), flush=True)
"""


@pytest.fixture
def pod(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[PodIdentity]:
    """ServiceAccount ``airflow-worker`` of the test's namespace, bound to the worker's and the
    triggerer's Roles (one process here runs the task and its trigger), and a first token."""
    yield from pod_of(cluster, namespace, tmp_path, [dict(rule) for rule in (*WORKER_RULES, *TRIGGERER_RULES)])


def run_in_pod(pod: PodIdentity, script: str, argv: list[str], connections: dict[str, Any]) -> subprocess.Popen[str]:
    """``script`` run by this Python with ``argv``, as in a pod of ``pod`` with ``connections`` only."""
    return run_command_in_pod(pod, [sys.executable, "-c", script, *argv], connections)


def run_command_in_pod(
    pod: PodIdentity, argv: list[str], connections: dict[str, Any], **settings: str
) -> subprocess.Popen[str]:
    env = {**os.environ, **pod.env(), "PYTHONUNBUFFERED": "1", **settings}
    env.pop("KUBECONFIG", None)
    env.pop("AIRFLOW_CONN_MPI_DEFAULT", None)
    for conn_id, connection in connections.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(connection)
    return subprocess.Popen(
        pod.command(argv),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def in_cluster_connections(namespace: str) -> dict[str, Any]:
    """What the walkthrough's step 4 creates: an in-cluster kubernetes connection, an mpi one on it."""
    return {
        "kube_in": {"conn_type": "kubernetes", "extra": {"in_cluster": True}},
        "mpi_in": {
            "conn_type": "mpi",
            "extra": {"backend": "kubernetes", "kubernetes_conn_id": "kube_in", "namespace": namespace},
        },
    }


def job(namespace: str) -> str:
    return json.dumps({
        "name": "rot",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM],
        "workers": {"replicas": 1},
        "startup_timeout": 60,
        "timeout": 180,
        "pod": {"namespace": namespace},
    })  # fmt: skip


def follow_rotating(child: subprocess.Popen[str], pod: PodIdentity, first: str) -> tuple[list[str], float | None]:
    """The child's output lines; once it shows ``tick ROTATE_AT``, a new token is written and
    ``first`` revoked (the time that happened, None if it never did)."""
    lines: list[str] = []
    rotated: float | None = None
    assert child.stdout is not None
    timer = threading.Timer(240, child.kill)
    timer.start()
    try:
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if rotated is None and re.search(rf"\btick {ROTATE_AT}\b", line):
                pod.issue()
                pod.revoke(first)
                rotated = time.monotonic()
        child.wait()
    finally:
        timer.cancel()
    return lines, rotated


def ticks(lines: list[str]) -> list[int]:
    return [int(match.group(1)) for line in lines for match in [re.search(r"\btick (\d+)\b", line)] if match]


@pytest.mark.parametrize("path", ["waiting", "deferred"])
def test_a_job_follows_its_log_on_across_a_token_rotation(pod: PodIdentity, namespace: str, path: str) -> None:
    first = pod.issue()
    child = run_in_pod(pod, WAITING if path == "waiting" else DEFERRED, [job(namespace), f"r-{time.monotonic_ns()}"],
                       in_cluster_connections(namespace))  # fmt: skip
    lines, rotated = follow_rotating(child, pod, first)
    out = "\n".join(lines)
    assert rotated is not None, out[-6000:]
    assert child.returncode == 0, out[-6000:]
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT ") :])
    assert result == {"exit_code": 0, "result": {"ticks": TICKS}}, out[-6000:]
    # Every line once, in order: the quiet spell after the rotation reopened the stream with the new token.
    assert ticks(lines) == list(range(TICKS)), out[-6000:]
    # A status code, not digits of a timestamp ("16:34:01.044011Z" holds "401").
    assert not re.search(r"\b401\b", out) and "Unauthorized" not in out, out[-6000:]


def test_with_no_connection_both_clients_are_the_pods_service_account(pod: PodIdentity, namespace: str) -> None:
    pod.issue(seconds=600)
    claims = pod.token_claims()
    assert claims["exp"] - claims["iat"] == 600
    child = run_in_pod(pod, WHO, [], {})
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out[-6000:]
    who = json.loads(next(line for line in out.splitlines() if line.startswith("WHO "))[len("WHO ") :])
    token = (pod.dir / "token").read_text()
    for client in ("sync", "async"):
        assert who[client]["user"] == f"system:serviceaccount:{namespace}:{ACCOUNT}", out[-6000:]
        assert who[client]["token"].split()[-1] == token, client


def without(rules: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    """``rules`` less ``verb`` on ``resource`` (kept for the rule's other resources)."""
    kept = []
    for rule in rules:
        if resource in rule["resources"] and verb in rule["verbs"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                kept.append(dict(rule, resources=others))
            rule = dict(rule, resources=[resource], verbs=[v for v in rule["verbs"] if v != verb])
        if rule["verbs"]:
            kept.append(dict(rule))
    return kept


# The worker's check (pods `create`: nothing is created) and the trigger's (leases `update`, the
# one verb only the triggerer's Role has: the job was created, the trigger refuses to follow it).
REFUSED = [("waiting", "pods", "create"), ("deferred", "leases", "update")]


@pytest.mark.parametrize(("path", "resource", "verb"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_role_without_a_verb_fails_naming_it_and_the_pods_service_account(
    cluster: Cluster, namespace: str, tmp_path: Path, path: str, resource: str, verb: str
) -> None:
    rules = without([dict(rule) for rule in (*WORKER_RULES, *TRIGGERER_RULES)], resource, verb)
    for pod in pod_of(cluster, namespace, tmp_path, rules):
        pod.issue()
        child = run_in_pod(pod, WAITING if path == "waiting" else DEFERRED, [job(namespace), f"r-{time.monotonic_ns()}"],
                           in_cluster_connections(namespace))  # fmt: skip
        out, _ = child.communicate(timeout=180)
        assert child.returncode != 0, out[-6000:]
        group = ".coordination.k8s.io" if resource == "leases" else ""
        component = "worker" if path == "waiting" else "triggerer"
        assert f"the service account {namespace}/{ACCOUNT} cannot `{verb}` `{resource}` in namespace {namespace}" in out
        assert f"add `{verb}` on `{resource}` to the {component}'s Role" in out, out[-6000:]
        user = f"system:serviceaccount:{namespace}:{ACCOUNT}"
        assert f"`kubectl auth can-i {verb} {resource}{group} -n {namespace} --as {user}` says yes" in out, out[-6000:]
        assert "tick 0" not in out, out[-6000:]  # refused before the job ran (the trigger: before it followed)


def test_the_walkthroughs_checks_pass_with_exactly_the_documented_worker_role(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Steps 4 and 5 of docs/guides/kubernetes-walkthrough.md as the workers' ServiceAccount runs
    them: its connections, then ``airflow connections test mpi_default`` (a list of the
    namespace's pods) and ``airflow-mpi doctor --image`` (one pod, created, read and deleted)."""
    connections = {
        "kubernetes_default": {"conn_type": "kubernetes", "extra": {"in_cluster": True}},
        "mpi_default": {
            "conn_type": "mpi",
            "extra": {"backend": "kubernetes", "kubernetes_conn_id": "kubernetes_default", "namespace": namespace},
        },
    }
    bin_dir = Path(sys.executable).parent
    for pod in pod_of(cluster, namespace, tmp_path, documented_role_rules("worker")):
        pod.issue()
        test = [str(bin_dir / "airflow"), "connections", "test", "mpi_default"]
        tested = run_command_in_pod(pod, test, connections, AIRFLOW__CORE__TEST_CONNECTION="Enabled")
        out, _ = tested.communicate(timeout=180)
        assert tested.returncode == 0 and "Connection success!" in out, out[-6000:]
        said = run_in_pod(pod, TESTED, [], connections)  # what the command does not print: the test's answer
        out, _ = said.communicate(timeout=120)
        assert (
            f"TESTED True the Kubernetes API at https://127.0.0.1:{cluster.plane.port} lists pods in namespace {namespace}"
            in out
        )
        doctor = [str(bin_dir / "airflow-mpi"), "doctor", "--image", "registry.example/airflow-mpi-train:0.1",
                  "--kubernetes-conn-id", "kubernetes_default", "--namespace", namespace]  # fmt: skip
        checked = run_command_in_pod(pod, doctor, connections)
        out, _ = checked.communicate(timeout=300)
        assert checked.returncode == 0 and "every check passed" in out, out[-6000:]
        assert "sshd" in out and "mpiexec" in out, out[-6000:]  # the checks ran, in the pod
        left = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        assert [p["metadata"]["name"] for p in left] == [], "the doctor's pod is left"
