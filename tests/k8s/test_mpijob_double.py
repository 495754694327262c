"""The API double's MPIJob controller behaves as mpi-operator v2beta1's source does, seen through
the real ``kubernetes`` client: the objects it makes (names, labels, mounts, env, hostfile, owners),
schema rejection (422) against its own (a ``ValidationError`` event and no condition),
``ErrResourceExists``, launcher creation order, conditions and ``replicaStatuses``,
``cleanPodPolicy``, suspend and resume, deadlines and backoff, and deletion leaving nothing."""

from __future__ import annotations

import base64
import copy
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.doubles.crd_schema import crd_dir, crd_errors
from tests.doubles.kube_double import LEASES, KubeDouble, PodScript, ScriptedKubelet
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import Scripts, api_client_for
from tests.k8s.test_gang import _crd_validator

NS = "default"
MPIJOBS = "mpijobs.kubeflow.org"
LEFT_KINDS = ("pods", "services", "secrets", "configmaps", LEASES, "jobs.batch", "podgroups.scheduling.volcano.sh")


class Cluster:
    def __init__(self, kube: KubeDouble, controller: MPIJobController) -> None:
        self.kube, self.controller = kube, controller
        api = api_client_for(kube)
        self.custom, self.core, self.batch = client.CustomObjectsApi(api), client.CoreV1Api(api), client.BatchV1Api(api)

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", body))

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", name))

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in self.job(name).get("status", {}).get("conditions") or []}

    def pods(self, selector: str = "") -> dict[str, Any]:
        return {p.metadata.name: p for p in self.core.list_namespaced_pod(NS, label_selector=selector).items}

    def launcher_pods(self, name: str) -> list[Any]:
        selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
        return sorted(self.pods(selector).values(), key=lambda p: p.metadata.creation_timestamp)

    def events(self, name: str) -> list[tuple[str, str, str]]:
        return [
            (e.type, e.reason, e.message)
            for e in self.core.list_namespaced_event(NS).items
            if e.involved_object.kind == "MPIJob" and e.involved_object.name == name
        ]

    def change(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """GET, edit, PUT: again on 409, as a client does while the controller writes status."""
        for _ in range(50):
            job = self.job(name)
            edit(job)
            try:
                self.custom.replace_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", name, job)
                return
            except ApiException as error:
                if error.status != 409:
                    raise
        raise AssertionError(f"MPIJob {name} kept changing")

    def left(self) -> list[str]:
        return [
            f"{plural}/{o['metadata']['name']}" for plural in LEFT_KINDS for o in self.kube.list_objects(plural, NS)
        ]


@pytest.fixture
def cluster(scripts: Scripts) -> Iterator[Cluster]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    controller = MPIJobController(kube)
    kube.custom_validator = _crd_validator
    kube.start()
    yield Cluster(kube, controller)
    controller.stop()
    assert_every_mpijob_fits_its_crd(kube)
    kube.stop()


def assert_every_mpijob_fits_its_crd(kube: KubeDouble) -> None:
    """What the controller wrote (status, conditions, replicaStatuses) passes the CRD's schema too."""
    if crd_dir() is not None:
        for job in kube.list_objects(MPIJOBS):
            assert crd_errors(job) == [], job


def until(check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def container(**extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": "registry.example/train:1", **extra}


def mpijob(name: str, workers: int = 2, **spec: Any) -> dict[str, Any]:
    """An MPIJob as a user writes it: launcher ``mpirun``, workers without a command."""
    launcher = {
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {
            "metadata": {"labels": {"team": "ml"}},
            "spec": {
                "containers": [
                    container(command=["mpirun", "-np", "4", "python", "train.py"], env=[{"name": "A", "value": "1"}]),
                    container(name="sidecar", command=["sleep", "infinity"]),
                ]
            },
        },
    }
    worker = {"replicas": workers, "template": {"spec": {"containers": [container()]}}}
    body: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {"runPolicy": {"backoffLimit": 0}, "mpiReplicaSpecs": {"Launcher": launcher, "Worker": worker}},
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def long_launcher(seconds: float = 0.6, exit_code: int = 0) -> PodScript:
    def lines() -> Iterator[str]:
        yield "[1,0]<stdout>:start"
        time.sleep(seconds)
        yield "[1,0]<stdout>:done"

    return PodScript(lines=lines, exit_code=exit_code)


# --- objects -------------------------------------------------------------------------------------


def test_the_controller_makes_its_objects_named_labelled_mounted_and_owned_as_mpi_operator(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript())  # runs until deleted
    job = cluster.submit(mpijob("pi", slotsPerWorker=2, runPolicy={"activeDeadlineSeconds": 600, "backoffLimit": 0}))
    uid = job["metadata"]["uid"]
    launcher = until(lambda: cluster.launcher_pods("pi"))[0]
    owner = {"api_version": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "pi", "uid": uid, "controller": True}

    def owned(obj: Any) -> None:
        (ref,) = obj.metadata.owner_references
        assert {k: getattr(ref, k) for k in owner} == owner

    service = cluster.core.read_namespaced_service("pi", NS)
    owned(service)
    assert service.spec.cluster_ip == "None" and not service.spec.publish_not_ready_addresses
    assert service.spec.selector == {
        "training.kubeflow.org/operator-name": "mpi-operator",
        "training.kubeflow.org/job-name": "pi",
    }

    secret = cluster.core.read_namespaced_secret("pi-ssh", NS)
    owned(secret)
    assert secret.type == "kubernetes.io/ssh-auth" and sorted(secret.data) == ["ssh-privatekey", "ssh-publickey"]
    assert base64.b64decode(secret.data["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert base64.b64decode(secret.data["ssh-publickey"]).startswith(b"ecdsa-sha2-nistp521 ")

    config = cluster.core.read_namespaced_config_map("pi-config", NS)
    owned(config)
    assert config.data["hostfile"] == "pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n"
    until(
        lambda: "echo pi-worker-1" in cluster.core.read_namespaced_config_map("pi-config", NS).data["discover_hosts.sh"]
    )

    for index in range(2):
        worker = cluster.core.read_namespaced_pod(f"pi-worker-{index}", NS)
        owned(worker)
        assert worker.spec.hostname == f"pi-worker-{index}" and worker.spec.subdomain == "pi"
        assert worker.metadata.labels == {
            "training.kubeflow.org/operator-name": "mpi-operator",
            "training.kubeflow.org/job-name": "pi",
            "training.kubeflow.org/job-role": "worker",
            "training.kubeflow.org/replica-index": str(index),
        }
        assert worker.spec.restart_policy == "Never"  # the Worker default
        assert worker.spec.dns_config.searches == ["pi.default.svc.cluster.local"]
        main = worker.spec.containers[0]
        assert main.command == ["/usr/sbin/sshd", "-De"]  # no command: the controller's sshd
        assert [(e.name, e.value) for e in main.env] == [("K_MPI_JOB_ROLE", "worker")]
        assert [(m.name, m.mount_path) for m in main.volume_mounts] == [("ssh-auth", "/root/.ssh")]
        (volume,) = worker.spec.volumes
        assert volume.secret.secret_name == "pi-ssh" and volume.secret.default_mode == 0o600
        assert [(i.key, i.path) for i in volume.secret.items] == [
            ("ssh-privatekey", "id_rsa"),
            ("ssh-publickey", "id_rsa.pub"),
            ("ssh-publickey", "authorized_keys"),
        ]

    launcher_job = cluster.batch.read_namespaced_job("pi-launcher", NS)
    owned(launcher_job)
    assert launcher_job.spec.backoff_limit == 0 and launcher_job.spec.active_deadline_seconds == 600
    assert launcher_job.spec.pod_replacement_policy == "Failed"
    assert re.fullmatch(r"pi-launcher-[bcdfghjklmnpqrstvwxz2456789]{5}", launcher.metadata.name)
    (job_ref,) = launcher.metadata.owner_references
    assert (job_ref.kind, job_ref.name, job_ref.controller) == ("Job", "pi-launcher", True)
    assert launcher.spec.hostname == "pi-launcher" and launcher.spec.subdomain == "pi"
    assert launcher.spec.restart_policy == "Never"
    labels = launcher.metadata.labels
    assert labels["training.kubeflow.org/job-role"] == "launcher" and labels["team"] == "ml"
    assert labels["batch.kubernetes.io/job-name"] == "pi-launcher"
    main, sidecar = launcher.spec.containers
    assert [(e.name, e.value) for e in main.env] == [
        ("A", "1"),
        ("K_MPI_JOB_ROLE", "launcher"),
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
        ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
        ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
        ("OMPI_MCA_orte_set_default_slots", "2"),
        ("NVIDIA_VISIBLE_DEVICES", None),
        ("NVIDIA_DRIVER_CAPABILITIES", None),
    ]
    assert main.command == ["mpirun", "-np", "4", "python", "train.py"]
    assert [(m.name, m.mount_path) for m in main.volume_mounts] == [
        ("ssh-auth", "/root/.ssh"),
        ("mpi-job-config", "/etc/mpi"),
    ]
    assert sidecar.env is None and sidecar.volume_mounts is None  # container[0] only
    config_volume = next(v for v in launcher.spec.volumes if v.name == "mpi-job-config")
    assert config_volume.config_map.name == "pi-config"
    assert [(i.key, i.mode) for i in config_volume.config_map.items] == [
        ("hostfile", 0o444),
        ("discover_hosts.sh", 0o555),
    ]


def test_run_launcher_as_worker_lists_the_launcher_first_and_publishes_not_ready_addresses(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("law", workers=1, runLauncherAsWorker=True, slotsPerWorker=4))
    launcher = until(lambda: cluster.launcher_pods("law"))[0]
    hostfile = cluster.core.read_namespaced_config_map("law-config", NS).data["hostfile"]
    assert hostfile == "law-launcher.law.default.svc slots=4\nlaw-worker-0.law.default.svc slots=4\n"
    assert cluster.core.read_namespaced_service("law", NS).spec.publish_not_ready_addresses is True
    assert launcher.metadata.labels["training.kubeflow.org/replica-index"] == "0"
    worker = cluster.core.read_namespaced_pod("law-worker-0", NS)
    assert worker.metadata.labels["training.kubeflow.org/replica-index"] == "1"  # shifted by one
    assert "NVIDIA_VISIBLE_DEVICES" not in [e.name for e in launcher.spec.containers[0].env]


def test_a_non_root_ssh_path_gets_the_default_mode_and_intel_gets_its_hostfile_and_env(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("intel", workers=1, sshAuthMountPath="/home/mpiuser/.ssh", mpiImplementation="Intel"))
    launcher = until(lambda: cluster.launcher_pods("intel"))[0]
    ssh = next(v for v in launcher.spec.volumes if v.name == "ssh-auth")
    assert ssh.secret.default_mode is None
    assert ("ssh-auth", "/home/mpiuser/.ssh") in [
        (m.name, m.mount_path) for m in launcher.spec.containers[0].volume_mounts
    ]
    assert (
        cluster.core.read_namespaced_config_map("intel-config", NS).data["hostfile"]
        == "intel-worker-0.intel.default.svc:1\n"
    )
    env = {e.name: e.value for e in launcher.spec.containers[0].env}
    assert env["I_MPI_HYDRA_HOST_FILE"] == "/etc/mpi/hostfile" and env["I_MPI_PERHOST"] == "1"
    assert "OMPI_MCA_orte_default_hostfile" not in env


def test_the_apiserver_fills_the_crd_defaults_and_keeps_status_out_of_a_plain_put(cluster: Cluster) -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout: the defaults come from the CRD's schema")
    body = mpijob("dflt", workers=1)
    del body["spec"]["runPolicy"], body["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"]
    cluster.submit(body)
    stored = cluster.job("dflt")
    spec = stored["spec"]
    assert (spec["slotsPerWorker"], spec["sshAuthMountPath"], spec["mpiImplementation"]) == (1, "/root/.ssh", "OpenMPI")
    assert (spec["launcherCreationPolicy"], spec["runLauncherAsWorker"]) == ("AtStartup", False)
    until(lambda: "Created" in cluster.conditions("dflt"))
    cluster.change("dflt", lambda job: job.update(status={"conditions": []}))
    assert "Created" in cluster.conditions("dflt")  # status is written through /status only
    job = cluster.batch.read_namespaced_job("dflt-launcher", NS)
    assert job.spec.template.spec.restart_policy == "OnFailure"  # the launcher's default


# --- rejection ------------------------------------------------------------------------------------


def test_a_crd_violation_is_refused_with_422_and_nothing_is_stored(cluster: Cluster) -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout")
    for change in ({"mpiImplementation": "OpenMPIv5"}, {"slotsPerWorker": "two"}, {"sshKeys": "x"}):
        with pytest.raises(ApiException) as caught:
            cluster.submit(mpijob("bad", **change))
        assert caught.value.status == 422 and next(iter(change)) in str(caught.value.body)
    assert cluster.kube.list_objects(MPIJOBS) == []


REJECTED = [
    pytest.param(
        {"mpiReplicaSpecs": {"Launcher": {"replicas": 2, "template": {"spec": {"containers": [container()]}}}}},
        "spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: 2: must be 1",
        id="two-launchers",
    ),
    pytest.param(
        {"runPolicy": {"cleanPodPolicy": "Sometimes"}},
        'spec.runPolicy.cleanPodPolicy: Unsupported value: "Sometimes": supported values: "All", "None", "Running"',
        id="clean-pod-policy",
    ),
    pytest.param(
        {"runPolicy": {"activeDeadlineSeconds": -1}},
        "spec.runPolicy.activeDeadlineSeconds: Invalid value: -1: must be greater than or equal to 0",
        id="negative-deadline",
    ),
]


@pytest.mark.parametrize(("change", "message"), REJECTED)
def test_a_spec_the_controller_rejects_gets_a_validation_error_event_and_no_condition(
    cluster: Cluster, change: dict[str, Any], message: str
) -> None:
    body = mpijob("rej")
    for key, value in change.items():
        if key == "mpiReplicaSpecs":
            body["spec"]["mpiReplicaSpecs"].update(value)
        else:
            body["spec"][key] = value
    cluster.submit(body)
    (event,) = until(lambda: cluster.events("rej"))
    assert event[:2] == ("Warning", "ValidationError") and event[2].startswith("Found validation errors: ")
    assert message in event[2]
    time.sleep(0.2)
    assert "status" not in cluster.job("rej") and cluster.left() == []


@pytest.mark.parametrize("manager", ["kueue.x-k8s.io/multikueue", "someone/else"])
def test_a_job_managed_by_another_controller_is_left_alone_even_before_validation(
    cluster: Cluster, manager: str
) -> None:
    cluster.submit(mpijob("other", runPolicy={"managedBy": manager}))
    time.sleep(0.3)
    assert cluster.events("other") == [] and "status" not in cluster.job("other") and cluster.left() == []


@pytest.mark.parametrize(
    ("workers", "restart", "message"),
    [
        (0, "Never", "spec.mpiReplicaSpecs[Worker].replicas: Invalid value: 0: must be greater than or equal to 1"),
        (2, "Always", 'spec.mpiReplicaSpecs[Worker].restartPolicy: Unsupported value: "Always"'),
    ],
)
def test_worker_rules_fire(cluster: Cluster, workers: int, restart: str, message: str) -> None:
    body = mpijob("wr", workers=workers)
    body["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = restart
    cluster.submit(body)
    (event,) = until(lambda: cluster.events("wr"))
    assert event[1] == "ValidationError" and message in event[2]


def test_a_name_leaving_no_room_for_the_worker_host_names_is_rejected_by_the_controller(cluster: Cluster) -> None:
    name = "j" + "a" * 54  # 55 characters: "<name>-worker-10" is 65, over a DNS label's 63
    cluster.submit(mpijob(name, workers=11))
    (event,) = until(lambda: cluster.events(name))
    assert event[1] == "ValidationError"
    assert f'will not able to create pod and service with invalid DNS label "{name}-worker-10"' in event[2]
    assert cluster.left() == []


@pytest.mark.parametrize(
    ("plural", "kind", "name", "made_before"),
    [
        ("services", "Service", "clash", []),
        ("configmaps", "ConfigMap", "clash-config", ["services/clash"]),
        ("secrets", "Secret", "clash-ssh", ["services/clash", "configmaps/clash-config"]),
    ],
)
def test_a_same_named_object_it_does_not_own_stops_the_controller_with_err_resource_exists(
    cluster: Cluster, plural: str, kind: str, name: str, made_before: list[str]
) -> None:
    ours: dict[str, Any] = {"metadata": {"name": name, "namespace": NS}}
    if plural == "services":
        ours["spec"] = {"clusterIP": "None", "selector": {"app": "x"}}
    elif plural == "secrets":
        ours["stringData"] = {"k": "v"}
    else:
        ours["data"] = {"k": "v"}
    cluster.kube.create(plural, NS, ours)
    cluster.submit(mpijob("clash"))
    message = f'Resource "{name}" of Kind "{kind}" already exists and is not managed by MPIJob'
    until(lambda: ("Warning", "ErrResourceExists", message) in cluster.events("clash"))
    time.sleep(0.2)
    assert sorted(cluster.left()) == sorted([f"{plural}/{name}", *made_before])  # nothing more: no pods, no Job
    assert "status" not in cluster.job("clash")  # the round stopped before the status was written


# --- launcher creation policy ---------------------------------------------------------------------


def worker_with_probe(body: dict[str, Any]) -> dict[str, Any]:
    worker = body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["readinessProbe"] = {"tcpSocket": {"port": 2222}}
    return body


@pytest.mark.parametrize("policy", ["AtStartup", "WaitForWorkersReady"])
def test_the_launcher_job_comes_with_the_workers_or_once_they_are_ready(
    cluster: Cluster, scripts: Scripts, policy: str
) -> None:
    scripts.on("-worker-", PodScript(ready_delay=5.0))  # far past the check below, on a loaded machine too
    scripts.on("-launcher-", PodScript())
    cluster.submit(worker_with_probe(mpijob("order", launcherCreationPolicy=policy)))
    until(lambda: len(cluster.pods("training.kubeflow.org/job-role=worker")) == 2)
    time.sleep(0.3)
    workers = cluster.pods("training.kubeflow.org/job-role=worker").values()
    ready = [any(c.type == "Ready" and c.status == "True" for c in w.status.conditions or []) for w in workers]
    jobs = [j.metadata.name for j in cluster.batch.list_namespaced_job(NS).items]
    assert not any(ready)
    assert jobs == (["order-launcher"] if policy == "AtStartup" else [])
    until(lambda: cluster.batch.list_namespaced_job(NS).items, timeout=30)
    assert cluster.controller.log.index("order: create jobs.batch/order-launcher") > cluster.controller.log.index(
        "order: create secrets/order-ssh"
    )


# --- success and failure ----------------------------------------------------------------------------


def test_success_sets_running_then_succeeded_with_replica_statuses(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", long_launcher(1.0))
    cluster.submit(mpijob("ok"))
    running = until(lambda: cluster.conditions("ok").get("Running"))
    assert (running["status"], running["reason"]) == ("True", "MPIJobRunning")
    status = cluster.job("ok")["status"]
    assert status["replicaStatuses"] == {"Launcher": {"active": 1}, "Worker": {"active": 2}}
    succeeded = until(lambda: cluster.conditions("ok").get("Succeeded"))
    assert (succeeded["status"], succeeded["reason"]) == ("True", "MPIJobSucceeded")
    assert succeeded["message"] == "MPIJob default/ok successfully completed."
    conditions = cluster.conditions("ok")
    assert conditions["Running"]["status"] == "False" and conditions["Created"]["status"] == "True"
    status = cluster.job("ok")["status"]
    assert status["replicaStatuses"]["Launcher"] == {"succeeded": 1}
    assert status["startTime"] and status["completionTime"]
    assert ("Normal", "MPIJobSucceeded", "MPIJob default/ok successfully completed.") in cluster.events("ok")


def test_a_launcher_exit_fails_the_job_with_the_launcher_jobs_reason_and_keeps_the_pod(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", long_launcher(0.2, exit_code=3))
    cluster.submit(mpijob("bad"))
    failed = until(lambda: cluster.conditions("bad").get("Failed"))
    # The reason is the Job's plus the last failed pod's status.reason, empty for an exit code.
    assert (failed["status"], failed["reason"]) == ("True", "BackoffLimitExceeded/")
    assert failed["message"] == "Job has reached the specified backoff limit: "
    (pod,) = cluster.launcher_pods("bad")
    assert pod.status.phase == "Failed" and pod.status.container_statuses[0].state.terminated.exit_code == 3
    job = cluster.batch.read_namespaced_job("bad-launcher", NS)
    assert [(c.type, c.reason) for c in job.status.conditions] == [("Failed", "BackoffLimitExceeded")]
    assert cluster.job("bad")["status"]["replicaStatuses"]["Launcher"] == {"failed": 1}


def test_backoff_limit_with_restart_never_makes_a_new_launcher_pod_per_failure(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript(exit_code=1))
    cluster.submit(mpijob("retry", runPolicy={"backoffLimit": 2}))
    until(lambda: cluster.conditions("retry").get("Failed"))
    pods = cluster.launcher_pods("retry")
    assert len(pods) == 3 and {p.status.phase for p in pods} == {"Failed"}  # every failed pod is kept
    assert cluster.batch.read_namespaced_job("retry-launcher", NS).status.failed == 3


def test_on_failure_restarts_in_place_and_at_the_limit_the_job_deletes_the_pod_and_its_log(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript(lines=lambda: iter(["boom"]), exit_code=1))
    body = mpijob("onf", runPolicy={"backoffLimit": 1})
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "OnFailure"
    cluster.submit(body)
    failed = until(lambda: cluster.conditions("onf").get("Failed"))
    assert failed["reason"] == "BackoffLimitExceeded"  # no failed pod is left to name
    until(lambda: not cluster.launcher_pods("onf"))  # mpi-operator#154: the log is gone with it
    assert sum("restarted onf-launcher-" in line for line in cluster.controller.jobs.log) == 1


def test_an_evicted_worker_fails_the_mpijob_while_the_launcher_still_runs(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("ev", runPolicy={"cleanPodPolicy": "Running"}))
    until(lambda: cluster.conditions("ev").get("Running", {}).get("status") == "True")
    cluster.controller.evict_worker(NS, "ev", 1)
    failed = until(lambda: cluster.conditions("ev").get("Failed"))
    assert (failed["reason"], failed["message"]) == ("MPIJobEvicted", "1/2 workers are evicted")
    assert cluster.conditions("ev")["Running"]["status"] == "False"
    time.sleep(0.2)
    # No completionTime: the controller cleans nothing up and the launcher keeps running.
    assert "completionTime" not in cluster.job("ev")["status"]
    assert cluster.launcher_pods("ev")[0].status.phase == "Running"
    assert cluster.core.read_namespaced_pod("ev-worker-0", NS).status.phase == "Running"


def test_a_failed_worker_is_counted_never_recreated_and_sets_no_condition(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("wf"))
    until(lambda: cluster.conditions("wf").get("Running"))
    cluster.controller.end_worker(NS, "wf", 0, exit_code=137)
    until(lambda: cluster.job("wf")["status"]["replicaStatuses"]["Worker"] == {"active": 1, "failed": 1})
    time.sleep(0.2)
    assert cluster.core.read_namespaced_pod("wf-worker-0", NS).status.phase == "Failed"
    assert "Failed" not in cluster.conditions("wf")


def test_the_deadline_kills_the_launcher_and_fails_with_deadline_exceeded(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("late", runPolicy={"activeDeadlineSeconds": 1, "cleanPodPolicy": "Running"}))
    failed = until(lambda: cluster.conditions("late").get("Failed"), timeout=15)
    assert (failed["reason"], failed["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    until(lambda: not cluster.launcher_pods("late") and not cluster.pods("training.kubeflow.org/job-role=worker"))


def test_the_launcher_knob_ends_the_newest_launcher_pod(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("knob"))
    until(lambda: cluster.conditions("knob").get("Running"))
    name = cluster.controller.end_launcher(NS, "knob", 0)
    until(lambda: cluster.conditions("knob").get("Succeeded"))
    assert name == cluster.launcher_pods("knob")[0].metadata.name


# --- cleanPodPolicy, suspend, deletion ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "workers_left"),
    [
        ("None", {"cl-worker-0": "Succeeded", "cl-worker-1": "Running"}),
        ("Running", {"cl-worker-0": "Succeeded"}),
        ("All", {}),
    ],
)
def test_clean_pod_policy_applies_when_the_job_finishes_and_keeps_the_launcher_pod(
    cluster: Cluster, scripts: Scripts, policy: str, workers_left: dict[str, str]
) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("cl", runPolicy={"cleanPodPolicy": policy}))
    until(lambda: cluster.conditions("cl").get("Running"))
    cluster.controller.end_worker(NS, "cl", 0, exit_code=0)
    until(lambda: cluster.core.read_namespaced_pod("cl-worker-0", NS).status.phase == "Succeeded")
    cluster.controller.end_launcher(NS, "cl", 0)
    until(lambda: cluster.conditions("cl").get("Succeeded"))
    time.sleep(0.3)
    workers = {n: p.status.phase for n, p in cluster.pods("training.kubeflow.org/job-role=worker").items()}
    until(
        lambda: (
            {n: p.status.phase for n, p in cluster.pods("training.kubeflow.org/job-role=worker").items()}
            == workers_left
        )
    )
    assert cluster.launcher_pods("cl")[0].status.phase == "Succeeded"
    assert workers is not None


def test_suspend_creates_no_pods_and_resume_creates_them(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("sus", runPolicy={"suspend": True, "backoffLimit": 0}))
    suspended = until(lambda: cluster.conditions("sus").get("Suspended"))
    assert (suspended["status"], suspended["reason"]) == ("True", "MPIJobSuspended")
    time.sleep(0.3)
    assert sorted(cluster.left()) == [
        "configmaps/sus-config",
        "jobs.batch/sus-launcher",
        "secrets/sus-ssh",
        "services/sus",
    ]
    assert cluster.batch.read_namespaced_job("sus-launcher", NS).spec.suspend is True
    assert "startTime" not in cluster.job("sus")["status"]
    assert cluster.conditions("sus")["Running"]["reason"] == "MPIJobSuspended"

    def set_suspend(value: bool) -> None:
        cluster.change("sus", lambda job: job["spec"]["runPolicy"].update(suspend=value))

    set_suspend(False)
    until(lambda: cluster.conditions("sus").get("Running", {}).get("status") == "True")
    resumed = cluster.conditions("sus")["Suspended"]
    assert (resumed["status"], resumed["reason"]) == ("False", "MPIJobResumed")
    assert cluster.job("sus")["status"]["startTime"]
    assert len(cluster.pods("training.kubeflow.org/job-name=sus")) == 3
    set_suspend(True)  # suspending a running job deletes its workers and the launcher's pod
    until(lambda: not cluster.pods("training.kubeflow.org/job-name=sus"))
    assert cluster.batch.read_namespaced_job("sus-launcher", NS).spec.suspend is True


@pytest.mark.parametrize("propagation", ["Foreground", "Background"])
def test_deleting_the_mpijob_collects_everything_it_owns(cluster: Cluster, scripts: Scripts, propagation: str) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("gone"))
    until(lambda: cluster.conditions("gone").get("Running"))
    assert len(cluster.left()) == 7  # Service, Secret, ConfigMap, 2 workers, the launcher Job and its pod
    cluster.custom.delete_namespaced_custom_object(
        "kubeflow.org", "v2beta1", NS, "mpijobs", "gone", body=client.V1DeleteOptions(propagation_policy=propagation)
    )
    until(lambda: cluster.left() == [] and not cluster.kube.list_objects(MPIJOBS))


def test_with_gang_scheduling_a_pod_group_is_made_and_the_pods_name_it(scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    kube = KubeDouble(ScriptedKubelet(scripts))
    controller = MPIJobController(kube, gang_scheduler="volcano")
    kube.custom_validator = _crd_validator
    kube.start()
    try:
        cluster = Cluster(kube, controller)
        policy = {"queue": "training", "minAvailable": 3, "priorityClass": "high"}
        cluster.submit(mpijob("gang", runPolicy={"schedulingPolicy": policy, "cleanPodPolicy": "Running"}))
        launcher = until(lambda: cluster.launcher_pods("gang"))[0]
        group = kube.get("podgroups.scheduling.volcano.sh", NS, "gang")
        assert group is not None and group["spec"] == {"minMember": 3, "queue": "training", "priorityClassName": "high"}
        assert group["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
        worker = cluster.core.read_namespaced_pod("gang-worker-0", NS)
        for pod in (launcher, worker):
            assert pod.spec.scheduler_name == "volcano"
            assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "gang"
        controller.end_launcher(NS, "gang", 0)
        until(lambda: kube.get("podgroups.scheduling.volcano.sh", NS, "gang") is None)  # cleaned up with the workers
    finally:
        controller.stop()
        assert_every_mpijob_fits_its_crd(kube)
        kube.stop()


def test_an_unknown_launcher_creation_policy_passes_everything_and_waits_for_ready_workers(
    cluster: Cluster, scripts: Scripts
) -> None:
    """The CRD declares no enum for it and the controller does not validate it: anything but
    AtStartup waits for the workers."""
    scripts.on("-worker-", PodScript(ready_delay=0.8))
    cluster.submit(worker_with_probe(mpijob("odd", launcherCreationPolicy="Eventually")))
    until(lambda: len(cluster.pods("training.kubeflow.org/job-role=worker")) == 2)
    assert cluster.batch.list_namespaced_job(NS).items == []
    until(lambda: cluster.batch.list_namespaced_job(NS).items)
    assert [reason for kind, reason, _ in cluster.events("odd") if kind == "Warning"] == []


def test_batch_jobs_are_served_listed_watched_and_deleting_one_collects_its_pod(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("bj"))
    (launcher,) = until(lambda: cluster.launcher_pods("bj"))
    listed = cluster.batch.list_namespaced_job(NS, label_selector="app=bj")
    (job,) = listed.items
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": job.metadata.uid}
    assert launcher.metadata.labels["batch.kubernetes.io/controller-uid"] == job.metadata.uid
    until(lambda: cluster.batch.read_namespaced_job("bj-launcher", NS).status.active == 1)
    stream = cluster.batch.list_namespaced_job(
        NS, watch=True, resource_version=listed.metadata.resource_version, timeout_seconds=5, _preload_content=False
    )
    cluster.batch.delete_namespaced_job("bj-launcher", NS, body=client.V1DeleteOptions(propagation_policy="Background"))
    seen = [line for line in stream.read().decode().splitlines() if '"DELETED"' in line]
    assert seen, "the watch saw no deletion"
    until(lambda: launcher.metadata.name not in cluster.pods())


def test_a_gang_that_does_not_fit_keeps_every_pod_pending_and_the_mpijob_only_created(scripts: Scripts) -> None:
    """Gang-scheduled by Volcano on a cluster without room: no pod starts, so the MPIJob has only
    ``Created``: what a waiting task sees."""
    from tests.doubles.gang_controllers import GangControllers

    kube = KubeDouble(ScriptedKubelet(scripts))
    gangs = GangControllers(kube, gpus_per_node=[2])
    controller = MPIJobController(kube, gang_scheduler="volcano")
    kube.custom_validator = _crd_validator
    kube.start()
    try:
        cluster = Cluster(kube, controller)
        body = mpijob("big")
        gpu = {"limits": {"nvidia.com/gpu": "2"}}
        body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"] = gpu
        cluster.submit(body)
        until(lambda: len(cluster.pods("training.kubeflow.org/job-name=big")) == 3)
        time.sleep(0.3)
        pods = cluster.pods("training.kubeflow.org/job-name=big").values()
        assert {p.status.phase for p in pods} == {"Pending"}
        assert all(
            any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or []) for p in pods
        )
        assert set(cluster.conditions("big")) == {"Created"}
    finally:
        controller.stop()
        gangs.stop()
        assert_every_mpijob_fits_its_crd(kube)
        kube.stop()


def test_kueue_suspends_a_queued_mpijob_until_its_workload_is_admitted(scripts: Scripts) -> None:
    from tests.doubles.kueue_mpijobs import KueueMPIJobs

    scripts.on("-launcher-", PodScript())
    kube = KubeDouble(ScriptedKubelet(scripts))
    controller = MPIJobController(kube)
    kueue = KueueMPIJobs(kube, controller)
    kube.custom_validator = _crd_validator
    kube.start()
    try:
        cluster = Cluster(kube, controller)
        # Long enough to see the job suspended after its create, which validates it against the
        # MPIJob CRD's schema when the CRDs are beside the checkout (over a second on a busy machine).
        kueue.hold_admission(5.0)
        body = mpijob("queued")
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "training"}
        cluster.submit(body)
        assert cluster.job("queued")["spec"]["runPolicy"]["suspend"] is True  # the webhook's doing
        until(lambda: cluster.conditions("queued").get("Suspended", {}).get("status") == "True")
        # Kueue makes the Workload on its own (a thread of the double), not with the suspension.
        (workload,) = until(lambda: kube.list_objects("workloads.kueue.x-k8s.io", NS))
        assert workload["spec"] == {
            "queueName": "training",
            "podSets": [{"name": "launcher", "count": 1}, {"name": "worker", "count": 2}],
        }
        assert workload["metadata"]["ownerReferences"][0]["name"] == "queued"
        assert cluster.pods("training.kubeflow.org/job-name=queued") == {}
        until(lambda: cluster.conditions("queued").get("Running", {}).get("status") == "True")
        assert cluster.conditions("queued")["Suspended"]["reason"] == "MPIJobResumed"
        controller.end_launcher(NS, "queued", 0)

        def workload_conditions() -> list[str]:
            (workload,) = kube.list_objects("workloads.kueue.x-k8s.io", NS)
            return [c["type"] for c in workload["status"]["conditions"]]

        until(lambda: workload_conditions() == ["QuotaReserved", "Admitted", "Finished"])
        cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v2beta1", NS, "mpijobs", "queued")
        until(lambda: cluster.left() == [] and not kube.list_objects("workloads.kueue.x-k8s.io", NS))
    finally:
        kueue.stop()
        controller.stop()
        assert_every_mpijob_fits_its_crd(kube)
        kube.stop()


def test_a_launcher_job_or_worker_pod_it_does_not_own_stops_it_too(cluster: Cluster, scripts: Scripts) -> None:
    scripts.on("-launcher-", PodScript())
    template = {"spec": {"containers": [container(command=["true"])], "restartPolicy": "Never"}}
    cluster.batch.create_namespaced_job(
        NS,
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "cj-launcher"}, "spec": {"template": template}},
    )
    cluster.submit(mpijob("cj"))
    message = 'Resource "cj-launcher" of Kind "Job" already exists and is not managed by MPIJob'
    until(lambda: ("Warning", "ErrResourceExists", message) in cluster.events("cj"))
    assert not any(name.startswith(("services/", "configmaps/", "secrets/")) for name in cluster.left())

    cluster.kube.create("pods", NS, {"metadata": {"name": "cw-worker-0"}, "spec": {"containers": [container()]}})
    cluster.submit(mpijob("cw"))
    message = 'Resource "cw-worker-0" of Kind "Pod" already exists and is not managed by MPIJob'
    until(lambda: ("Warning", "ErrResourceExists", message) in cluster.events("cw"))
    time.sleep(0.2)
    assert (
        cluster.kube.get("pods", NS, "cw-worker-1") is None
        and cluster.kube.get("jobs.batch", NS, "cw-launcher") is None
    )


@pytest.mark.parametrize("role", ["Worker", "Launcher"])
def test_a_template_the_apiserver_refuses_is_reported_as_an_mpijob_failed_event(cluster: Cluster, role: str) -> None:
    body = mpijob("tpl")
    body["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]["name"] = "Main_1"
    cluster.submit(body)
    what = "worker" if role == "Worker" else "launcher"
    event = until(lambda: [e for e in cluster.events("tpl") if e[1] == "MPIJobFailed"])[0]
    assert event[0] == "Warning" and event[2].startswith(f"{what} pod created failed: ")
    assert "Main_1" in event[2]
    assert "Failed" not in cluster.conditions("tpl")  # an event only: the controller retries


def test_a_restart_policy_in_the_launcher_template_is_overridden_with_a_warning_event(cluster: Cluster) -> None:
    body = mpijob("rp")
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    cluster.submit(body)
    until(lambda: cluster.launcher_pods("rp"))
    message = "Restart policy in pod template overridden by restart policy in replica spec"
    assert ("Warning", "SetPodTemplateRestartPolicy", message) in cluster.events("rp")
    assert cluster.launcher_pods("rp")[0].spec.restart_policy == "Never"  # the replica spec's


def test_a_running_job_follows_its_spec_fewer_workers_and_the_launcher_as_worker(
    cluster: Cluster, scripts: Scripts
) -> None:
    scripts.on("-launcher-", PodScript())
    cluster.submit(mpijob("grow"))
    until(lambda: cluster.conditions("grow").get("Running"))

    def edit(job: dict[str, Any]) -> None:
        job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 1
        job["spec"]["runLauncherAsWorker"] = True

    cluster.change("grow", edit)
    until(lambda: "grow-worker-1" not in cluster.pods())
    until(lambda: cluster.core.read_namespaced_service("grow", NS).spec.publish_not_ready_addresses is True)
    hostfile = cluster.core.read_namespaced_config_map("grow-config", NS).data["hostfile"]
    assert hostfile == "grow-launcher.grow.default.svc slots=1\ngrow-worker-0.grow.default.svc slots=1\n"
