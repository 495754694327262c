"""Security on the real control plane: the RBAC guide's worker Role, bound to a ServiceAccount
token, is enough for a job and no verb of it is spare (each removed in turn fails the job, naming
it); the guide's two Roles and RoleBindings as printed let a deferred job run with the worker's
token for the task and the triggerer's for the trigger, and the triggerer's cannot read the job's
Secret; a namespace enforcing the restricted Pod Security Standard refuses a root job with the
admission's own message and runs a ``pod.run_as_user`` job."""

from __future__ import annotations

import copy
import pwd
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import MPIJobError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.permissions import build_job_rules
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import Log, api_client, job_objects
from tests.documented import documented_manifests, documented_role_rules
from tests.integration.test_nonroot import user  # noqa: F401 (the non-root user fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

PROGRAM = (
    "import json, os\n"
    "if os.environ.get('OMPI_COMM_WORLD_RANK') == '0':\n"
    "    print('AIRFLOW_MPI_RESULT ' + json.dumps({'uid': os.getuid(), 'size': int(os.environ['OMPI_COMM_WORLD_SIZE'])}))\n"
)


def make_plan(namespace: str, **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "sec",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM],
        "workers": {"replicas": 1},
        "startup_timeout": 60,
        "timeout": 120,
        "pod": {"namespace": namespace},
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("secdag", "train", f"r-{time.monotonic_ns()}"))


def role_verbs() -> list[tuple[str, str]]:
    """Every verb of the guide's worker Role, by resource."""
    rules = documented_role_rules("worker")
    return [(resource, verb) for rule in rules for resource in rule["resources"] for verb in rule["verbs"]]


def without(rules: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    """The rules with ``verb`` on ``resource`` taken away (and nothing else)."""
    out = []
    for rule in copy.deepcopy(rules):
        if resource in rule["resources"] and verb in rule["verbs"]:
            rest = [r for r in rule["resources"] if r != resource]
            if rest:
                out.append({**rule, "resources": rest})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                out.append({**rule, "resources": [resource], "verbs": verbs})
        else:
            out.append(rule)
    return out


def backend_as(cluster: Cluster, namespace: str, rules: list[dict[str, Any]], tmp_path: Path) -> KubernetesBackend:
    kubeconfig = cluster.service_account_kubeconfig(namespace, "airflow-worker", rules, tmp_path / "sa.kubeconfig")
    return KubernetesBackend(api_client=api_client(kubeconfig), namespace=namespace)


NO_NEW_PRIVS = (
    "import os\n"
    "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
    "print('nnp', os.environ['OMPI_COMM_WORLD_RANK'], os.getuid(), status['NoNewPrivs'].strip(), flush=True)\n"
)


def test_a_root_job_runs_through_sshd_without_privilege_escalation(cluster: Cluster, namespace: str) -> None:
    """Every pod says ``allowPrivilegeEscalation: false``; the node agent gives a root container
    no_new_privs, as a container runtime does: sshd's privilege separation still logs mpiexec in,
    and every rank, on the master and through sshd on the workers, runs as root under it."""
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    plan = make_plan(namespace, command=[sys.executable, "-c", NO_NEW_PRIVS], workers={"replicas": 2})
    log = Log()
    result = JobRunner(backend, plan, log).run()
    assert result.exit_code == 0, log
    ranks = sorted(line.split("nnp ", 1)[1].split() for line in log if "nnp " in line)
    assert ranks == [[str(rank), "0", "1"] for rank in range(len(ranks))] and len(ranks) >= 3, log


def test_the_guides_worker_role_is_enough(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    backend = backend_as(cluster, namespace, documented_role_rules("worker"), tmp_path)
    log = Log()
    result = JobRunner(backend, make_plan(namespace), log).run()
    assert result.exit_code == 0 and result.result == {"uid": 0, "size": 2}, log
    assert job_objects(cluster.api(), namespace) == []


@pytest.fixture(scope="module")
def refused_namespace(cluster: Cluster) -> Iterator[str]:
    """One namespace for every refused job: nothing is created in it (the check comes first)."""
    name = f"refused-{time.monotonic_ns() % 10**8}"
    cluster.create_namespace(name)
    yield name
    left = job_objects(cluster.api(), name)
    cluster.delete_namespace(name, wait=0)
    assert left == []


@pytest.mark.parametrize(("resource", "verb"), role_verbs(), ids=[f"{r}-{v}" for r, v in role_verbs()])
def test_each_verb_of_the_guides_worker_role_is_needed(
    cluster: Cluster, refused_namespace: str, tmp_path: Path, resource: str, verb: str
) -> None:
    namespace = refused_namespace
    backend = backend_as(cluster, namespace, without(documented_role_rules("worker"), resource, verb), tmp_path)
    plan = make_plan(namespace)
    with pytest.raises(MPIJobError) as caught:
        JobRunner(backend, plan, Log()).run()
    message = str(caught.value)
    # Named by the identity the API server gives the token (a SelfSubjectReview).
    who = f"the service account {namespace}/airflow-worker"
    assert message.startswith(f"{who} cannot `{verb}` `{resource}` in namespace {namespace}"), message
    assert f"add `{verb}` on `{resource}`" in message, message
    assert "checked before anything was created" in message
    assert job_objects(cluster.api(), namespace) == []


# A verb each backend, or gang setting, adds to the Role (docs/guides/rbac.md): taken away, the
# job fails naming it before anything is created, as for the Role's own verbs.
ADDED = [
    ("volcano", None, "jobs", "create"),
    ("mpijob", None, "mpijobs", "delete"),
    ("mpijob", None, "mpijobs", "create"),
    ("pods", {"gang": "volcano"}, "podgroups", "create"),
    ("pods", {"gang": "kueue", "queue": "training"}, "workloads", "delete"),
]


@pytest.mark.parametrize(
    ("kind", "scheduling", "resource", "verb"), ADDED, ids=[f"{k}-{r}-{v}" for k, _, r, v in ADDED]
)
def test_each_verb_a_backend_or_gang_adds_is_checked_before_anything_is_created(
    cluster: Cluster, refused_namespace: str, tmp_path: Path, kind: str, scheduling: Any, resource: str, verb: str
) -> None:
    namespace = refused_namespace
    gang = scheduling["gang"] if scheduling else None
    rules = without([dict(rule) for rule in build_job_rules(job_kind(kind)._rules, gang)], resource, verb)
    kubeconfig = cluster.service_account_kubeconfig(namespace, "airflow-worker", rules, tmp_path / "sa.kubeconfig")
    backend = KubernetesBackend(api_client=api_client(kubeconfig), namespace=namespace, kind=kind)
    spec = make_plan(namespace, **({"scheduling": scheduling} if scheduling else {})).spec
    plan = backend.kind.render_plan(spec, RunIdentity("secdag", "train", f"r-{time.monotonic_ns()}"))
    with pytest.raises(MPIJobError) as caught:
        JobRunner(backend, plan, Log()).run()
    message = str(caught.value)
    assert f"cannot `{verb}` `{resource}` in namespace {namespace}" in message, message
    assert "checked before anything was created" in message
    assert job_objects(cluster.api(), namespace) == []
    tops = {"volcano": "/apis/batch.volcano.sh/v1alpha1", "mpijob": "/apis/kubeflow.org/v2beta1"}
    if kind in tops:  # nor the top object (without its CRD, which its controller installs, none can be)
        plural = "jobs" if kind == "volcano" else "mpijobs"
        found = cluster.api().get_or_none(f"{tops[kind]}/namespaces/{namespace}/{plural}")
        assert found is None or found["items"] == []


RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def test_a_restricted_namespace_refuses_a_root_job_with_the_admission_message(cluster: Cluster) -> None:
    namespace = f"r-{time.monotonic_ns() % 10**8}"
    cluster.create_namespace(namespace, RESTRICTED)
    try:
        backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
        with pytest.raises(MPIJobError) as caught:
            JobRunner(backend, make_plan(namespace), Log()).run()
        message = str(caught.value)
        assert 'violates PodSecurity "restricted:latest"' in message, message
        assert "403 Forbidden" in message and "pod.run_as_user" in message, message
        assert job_objects(cluster.api(), namespace) == []
    finally:
        cluster.delete_namespace(namespace, wait=0)


def test_a_run_as_user_job_runs_in_a_restricted_namespace(cluster: Cluster, user: pwd.struct_passwd) -> None:  # noqa: F811
    namespace = f"r-{time.monotonic_ns() % 10**8}"
    cluster.create_namespace(namespace, RESTRICTED)
    try:
        backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
        plan = make_plan(
            namespace,
            command=["/usr/bin/python3", "-c", PROGRAM],  # the user cannot enter /root (this interpreter's home)
            ssh_port=2222,
            pod={"namespace": namespace, "run_as_user": user.pw_uid, "run_as_group": user.pw_gid},
        )
        log = Log()
        result = JobRunner(backend, plan, log).run()
        assert result.result == {"uid": user.pw_uid, "size": 2}, log
        assert job_objects(cluster.api(), namespace) == []
    finally:
        cluster.delete_namespace(namespace, wait=0)


def test_the_guides_roles_run_a_deferred_job_with_the_worker_and_the_triggerer_tokens(
    cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two Roles and RoleBindings as the RBAC guide prints them (its namespaces replaced by
    the test's), applied to the real API server, each bound to a ServiceAccount whose token comes
    from a TokenRequest: the operator creates and resumes the job with the worker's token, the
    trigger checks its Role and follows the job with the triggerer's; the triggerer's token cannot
    read the job's Secret."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    from airflow_mpi.operators.mpi import MPIJobOperator
    from tests.cluster.conftest import install_connections

    api = cluster.api()
    home = f"airflow-{namespace}"  # where Airflow's service accounts live
    cluster.create_namespace(home)
    try:
        for manifest in (*documented_manifests("Role"), *documented_manifests("RoleBinding")):
            manifest = copy.deepcopy(manifest)
            manifest["metadata"]["namespace"] = namespace
            for subject in manifest.get("subjects") or []:
                subject["namespace"] = home
            plural = "roles" if manifest["kind"] == "Role" else "rolebindings"
            api.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}", manifest)
        kubeconfigs = {}
        for name in ("airflow-worker", "airflow-triggerer"):
            api.create(f"/api/v1/namespaces/{home}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                                       "metadata": {"name": name}})  # fmt: skip
            token = api.create(f"/api/v1/namespaces/{home}/serviceaccounts/{name}/token", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600},
            })["status"]["token"]  # fmt: skip
            assert cluster.plane.pki is not None
            kubeconfigs[name] = cluster.plane.pki.kubeconfig(tmp_path / f"{name}.kubeconfig", cluster.plane.server,
                                                             f"{home}-{name}", token=token)  # fmt: skip

        def connect_as(name: str) -> None:
            install_connections(monkeypatch, kubeconfigs[name], namespace, mpi_conn_id="mpi_real")

        job = make_plan(namespace).spec.to_dict()
        ti = SimpleNamespace(dag_id="secdag", task_id="train", run_id=f"r-{time.monotonic_ns()}", map_index=-1,
                             try_number=1)  # fmt: skip

        def operator() -> MPIJobOperator:
            return MPIJobOperator(task_id="train", job=job, mpi_conn_id="mpi_real", deferrable=True)

        async def first_event(trigger: Any) -> dict[str, Any]:
            async for event in trigger.run():
                return dict(event.payload)
            raise AssertionError("the trigger ended without an event")

        connect_as("airflow-worker")
        events: list[dict[str, Any]] = []
        try:
            result = operator().execute({"ti": ti})  # type: ignore[arg-type]
        except TaskDeferred as deferred:
            pending = deferred
            while True:
                connect_as("airflow-triggerer")
                if not events:  # while the job exists: the triggerer's token cannot read its key
                    secrets = [s for s in api.get(f"/api/v1/namespaces/{namespace}/secrets")["items"]
                               if "airflow-mpi.io/job" in (s["metadata"].get("labels") or {})]  # fmt: skip
                    assert secrets, "the job's Secret"
                    with pytest.raises(ApiException) as refused:
                        CoreV1Api(api_client(kubeconfigs["airflow-triggerer"])).read_namespaced_secret(
                            secrets[0]["metadata"]["name"], namespace
                        )
                    assert refused.value.status == 403
                events.append(asyncio.run(first_event(pending.trigger)))
                connect_as("airflow-worker")
                assert events[-1]["outcome"] != "api_refused", events[-1]
                try:
                    result = getattr(operator(), pending.method_name)({"ti": ti}, events[-1])
                    break
                except TaskDeferred as again:
                    pending = again
        assert events, "the operator deferred"
        assert result["exit_code"] == 0 and result["result"] == {"uid": 0, "size": 2}, (result, events)
        assert job_objects(api, namespace) == []
    finally:
        cluster.delete_namespace(home, wait=0)
