"""The deferred path on the real controllers' kinds: a Volcano Job, an MPIJob and a TrainJob,
each run by ``MPIJobOperator(deferrable=True)`` through Airflow (``dag.test()``) against the real
kube-apiserver, vc-controller-manager + vc-scheduler, mpi-operator, and Trainer with JobSet. The
trigger reads the pods as the kind does (Volcano's policy deletes the other pods once a rank
failed; JobSet deletes the Jobs still running once one failed) and follows the master's log; an
MPIJob's master is the launcher Job's own pod, a TrainJob's its master Job's, whose name the
trigger learns from its watch. A job succeeds with its result, a failing rank is named, and
nothing is left."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import CORE_LEFT, install_connections, objects_left

pytestmark = [pytest.mark.cluster, pytest.mark.integration]
LEFT = (
    *CORE_LEFT,
    "/apis/batch/v1/namespaces/{ns}/jobs",
    "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
    "/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs",
    "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups",
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainingruntimes",
    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
)
KINDS = ("volcano", "mpijob", "trainjob")


def test_deferred_volcano_jobs_and_mpijobs_succeed_and_fail_as_when_waiting(
    dagbag: Any, cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    cluster.controller("volcano")
    cluster.controller("mpi-operator")
    cluster.controller("trainer")
    for kind in KINDS:
        install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id=f"mpi_real_{kind}", backend=kind)
    dag_run = dagbag.get_dag("mpi_test_real_kinds").test()
    out = capfd.readouterr().out
    states = task_states(dag_run)
    assert states == {f"{kind}_{task}": state for kind in KINDS
                      for task, state in (("ok", "success"), ("rank", "failed"))}, out[-6000:]  # fmt: skip
    for kind in KINDS:
        assert xcom(dag_run, f"{kind}_ok")["result"] == {"sum": 6, "size": 3}, kind
    # The trigger showed the master's lines while the job ran (its records name the master's log
    # as their source), the MPIJob's included: it followed the launcher Job's pod, not a pod named
    # after the launcher. Each "ok" job sleeps 4 s after its lines, so the trigger meets them live.
    records = re.split(r"\n(?=\d{4}-\d\d-\d\dT)", out)
    followed = [record for record in records if "[airflow_mpi.master:" in record and "rank 0 of 3" in record]
    assert len(followed) >= len(KINDS), out[-6000:]
    # Each trigger kept its shown mark on the job's Lease: no warning that it could not.
    assert "cannot write the live log's mark" not in out and "cannot read the live log's mark" not in out
    assert "is not believed" not in out, out[-6000:]
    named = [line for line in out.splitlines() if "rank 2 on pod" in line and "exited with code 3" in line]
    assert len(named) >= len(KINDS), out[-6000:]
    assert objects_left(cluster.api(), namespace, LEFT) == []
