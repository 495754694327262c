"""Namespaces that enforce the Pod Security Standards, through the API double over real HTTP: the
default (root) pods are refused with the admission's 403 and nothing is left; a job with
``pod.run_as_user`` runs end to end there."""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import LaunchError
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.operators.mpi import MPIJobOperator
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.doubles.podsecurity import check_pod
from tests.faults import FaultRow
from tests.k8s.conftest import JOB_KINDS, Scripts, api_client_for, unique
from tests.k8s.test_kubernetes_backend import Log, make_plan, run

NAMESPACE = "training"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
NON_ROOT: dict[str, Any] = {"ssh_port": 2222, "pod": {"namespace": NAMESPACE, "run_as_user": 1000}}
# A root job's pods already carry the secure defaults (seccomp, no privilege escalation): root
# itself, and its capabilities, are what the restricted level refuses.
ROOT_DENIAL = (
    'violates PodSecurity "restricted:latest": '
    'unrestricted capabilities (container "mpi" must set securityContext.capabilities.drop=["ALL"]), '
    'runAsNonRoot != true (pod or container "mpi" must set securityContext.runAsNonRoot=true)'
)


def left_in(kube: KubeDouble, namespace: str) -> list[str]:
    return [f"{p}/{o['metadata']['name']}" for p in JOB_KINDS for o in kube.list_objects(p, namespace)]


@pytest.mark.fault
@pytest.mark.usefixtures("connections")
@pytest.mark.parametrize("mode", ["waiting", "deferrable"])
def test_root_pods_are_refused_in_a_restricted_namespace(double: KubeDouble, fault_row: FaultRow, mode: str) -> None:
    """The task as Airflow runs it: the refusal comes at create, before either mode waits."""
    double.label_namespace(NAMESPACE, RESTRICTED)
    job = {**make_plan().spec.to_dict(), "pod": {"namespace": NAMESPACE}}
    operator = MPIJobOperator(task_id="train", job=job, mpi_conn_id="mpi_k8s", deferrable=mode == "deferrable")
    ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=unique("run"), map_index=-1, try_number=1)
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        operator.execute({"ti": ti, "task_state_store": None})  # type: ignore[arg-type]
    seconds = time.monotonic() - started
    message = str(caught.value)
    assert re.search(rf'pods "kjob-[a-z2-7]{{13}}-worker-\d" is forbidden: {re.escape(ROOT_DENIAL)}', message), message
    assert "403 Forbidden" in message
    assert message.endswith(
        "; the namespace enforces the Pod Security Standards and the pods run as root: run the job without root "
        "(pod.run_as_user, ssh_port 1024 or above, an image with that user; docs/contract.md#jobs-without-root)"
    )
    assert double.request_count("POST", f"/namespaces/{NAMESPACE}/pods") >= 1
    # The pods are posted at once, the master with the workers, and each is refused alike.
    assert double.request_count("POST", f"/namespaces/{NAMESPACE}/pods") <= 3
    left = left_in(double, NAMESPACE)
    assert left == []
    fault_row("root pods in a namespace enforcing restricted", "kubernetes", mode, "failed", seconds, message, left)


def test_a_non_root_job_runs_end_to_end_in_a_restricted_namespace(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    double.label_namespace(NAMESPACE, RESTRICTED)
    scripts.on(
        "-master-", PodScript(lines=lambda: iter(['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"uid": 1000}']), exit_code=0)
    )
    plan = make_plan(workers=2, **NON_ROOT)
    log = Log()
    result = run(backend, plan, log)
    assert result.exit_code == 0 and result.result == {"uid": 1000}
    pods = [b for b in double.created if b.get("kind") == "Pod"]
    assert len(pods) == 3
    for pod in pods:
        assert check_pod("restricted", pod) == []
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
        kubernetes_validate.validate(pod, "1.33.0", strict=True)
    assert left_in(double, NAMESPACE) == []


def test_a_host_path_volume_is_refused_even_without_root(backend: KubernetesBackend, double: KubeDouble) -> None:
    double.label_namespace(NAMESPACE, RESTRICTED)
    pod = {**NON_ROOT["pod"], "volumes": [{"name": "ckpt", "mount_path": "/ckpt", "host_path": "/mnt/ckpt"}]}
    plan = make_plan(workers=1, ssh_port=2222, pod=pod)
    with pytest.raises(LaunchError) as caught:
        run(backend, plan)
    assert 'restricted volume types (volume "ckpt" uses restricted volume type "hostPath")' in str(caught.value)
    assert left_in(double, NAMESPACE) == []


def test_a_baseline_namespace_admits_the_root_pods(backend: KubernetesBackend, double: KubeDouble) -> None:
    double.label_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    result = run(backend, make_plan(workers=1, pod={"namespace": NAMESPACE}))
    assert result.exit_code == 0


def test_the_api_answers_403_forbidden_with_a_status_body(double: KubeDouble) -> None:
    """What a client sees on the wire: 403, reason Forbidden, the admission's message; the same
    pod is created in a namespace without the label."""
    double.label_namespace(NAMESPACE, RESTRICTED)
    core = client.CoreV1Api(api_client_for(double))
    spec = make_plan(workers=0).spec
    (root_pod,) = [
        o for o in render_manifests(make_plan(workers=0, pod={"namespace": NAMESPACE}), NAMESPACE) if o["kind"] == "Pod"
    ]
    root_pod["metadata"].pop("ownerReferences")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NAMESPACE, root_pod)
    body = json.loads(caught.value.body)
    assert caught.value.status == 403 and body["reason"] == "Forbidden" and body["code"] == 403
    assert body["message"] == f'pods "{root_pod["metadata"]["name"]}" is forbidden: {ROOT_DENIAL}'
    assert spec.pod.run_as is None
    root_pod["metadata"]["namespace"] = "default"
    core.create_namespaced_pod("default", root_pod)  # no label: admitted
    assert double.get("pods", "default", root_pod["metadata"]["name"]) is not None
