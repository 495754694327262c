"""Against a real cluster: runs only when KUBECONFIG is set (and AIRFLOW_MPI_TEST_IMAGE names an
image built from docker/ that the cluster can pull). Skipped everywhere else, CI included."""

from __future__ import annotations

import os
import uuid

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs KUBECONFIG (a real cluster)"),
    pytest.mark.skipif(not os.environ.get("AIRFLOW_MPI_TEST_IMAGE"), reason="needs AIRFLOW_MPI_TEST_IMAGE"),
]


def test_mpi4py_allreduce_on_a_real_cluster() -> None:
    from kubernetes import client, config

    config.load_kube_config()
    namespace = os.environ.get("AIRFLOW_MPI_TEST_NAMESPACE", "default")
    backend = KubernetesBackend(api_client=client.ApiClient(), namespace=namespace)
    spec = MPIJobSpec.from_dict(
        {
            "name": "cluster-test",
            "image": os.environ["AIRFLOW_MPI_TEST_IMAGE"],
            "command": [
                "python",
                "-c",
                "from mpi4py import MPI; import json; c = MPI.COMM_WORLD\n"
                "s = c.allreduce(c.rank + 1)\n"
                "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s}))",
            ],
            "master": {"cpu": 1, "memory": "512Mi"},
            "workers": {"replicas": 2, "cpu": 1, "memory": "512Mi"},
            "startup_timeout": 600,
            "timeout": 600,
        }
    )
    plan = render_plan(spec, RunIdentity("cluster-test", "allreduce", uuid.uuid4().hex))
    result = JobRunner(backend, plan, print).run()
    assert result.result == {"sum": 6}
    assert backend.leftovers(plan.job_name) == []
