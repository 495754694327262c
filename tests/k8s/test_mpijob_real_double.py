"""The double's MPIJob controller with the real kubelet: the launcher pod it makes really runs, reads
the controller's ``/etc/mpi/hostfile``, sees the injected env and the ssh keys at sshAuthMountPath,
and resolves a worker by ``<pod>.<job>``; deleting the MPIJob leaves nothing. It creates network
namespaces: run it under the integration lock."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from kubernetes import client

from tests.doubles.kube_double import KubeDouble
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import STATE_ROOT, api_client_for
from tests.k8s.test_mpijob_double import container, until

SSH_PATH = STATE_ROOT / "mpijob-ssh"  # the real kubelet makes a mount point on this machine
SCRIPT = (
    "sleep 1; cat /etc/mpi/hostfile; echo role=$K_MPI_JOB_ROLE hostfile=$OMPI_MCA_orte_default_hostfile "
    f"slots=$OMPI_MCA_orte_set_default_slots; ls {SSH_PATH}; getent hosts rl-worker-1.rl >/dev/null && echo resolved"
)


def test_the_launcher_pod_reads_the_controllers_hostfile_and_env_for_real(real_double: KubeDouble) -> None:
    made = [p for p in (Path("/etc/mpi"), SSH_PATH) if not p.exists()]
    controller = MPIJobController(real_double)
    api = client.CustomObjectsApi(api_client_for(real_double))
    body = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "rl"},
        "spec": {
            "slotsPerWorker": 2,
            "sshAuthMountPath": str(SSH_PATH),
            "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [container(command=["sh", "-c", SCRIPT])]}},
                },
                "Worker": {
                    "replicas": 2,
                    "template": {"spec": {"containers": [container(command=["sleep", "60"])]}},
                },
            },
        },
    }
    try:
        api.create_namespaced_custom_object("kubeflow.org", "v2beta1", "default", "mpijobs", body)

        def succeeded() -> bool:
            job = api.get_namespaced_custom_object("kubeflow.org", "v2beta1", "default", "mpijobs", "rl")
            conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions") or []}
            assert conditions.get("Failed") != "True", job["status"]
            return conditions.get("Succeeded") == "True"

        until(succeeded, timeout=60)
        (launcher,) = real_double.list_objects("pods", "default", "training.kubeflow.org/job-role=launcher")
        log = [line for _, line in real_double.logs[("default", launcher["metadata"]["name"])].lines]
        assert log == [
            "rl-worker-0.rl.default.svc slots=2",
            "rl-worker-1.rl.default.svc slots=2",
            "role=launcher hostfile=/etc/mpi/hostfile slots=2",
            "authorized_keys",
            "id_rsa",
            "id_rsa.pub",
            "resolved",
        ]
        until(lambda: not real_double.list_objects("pods", "default", "training.kubeflow.org/job-role=worker"))
    finally:
        with contextlib.suppress(Exception):
            api.delete_namespaced_custom_object(
                "kubeflow.org",
                "v2beta1",
                "default",
                "mpijobs",
                "rl",
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )
        deadline = time.monotonic() + 30
        while real_double.list_objects("pods", "default") and time.monotonic() < deadline:
            time.sleep(0.1)
        controller.stop()
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
    assert real_double.list_objects("pods", "default") == []
