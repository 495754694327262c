"""The TrainJob backend's objects: a trainer.kubeflow.org/v1alpha1 TrainJob running a
TrainingRuntime of its own (a JobSet of the replicated jobs master and worker, no ML policy),
our Secret and ConfigMap, the host names JobSet's Indexed Jobs give, retries left to Airflow,
what Trainer would refuse refused first, and the TrainJob's status read."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import LABEL_INDEX, LABEL_JOB, LABEL_ROLE, build_job_name
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.gang import KUEUE_QUEUE_LABEL
from airflow_mpi.kinds.manifests import config_map_name, secret_name
from airflow_mpi.kinds.registry import job_kind, kind_of
from airflow_mpi.kinds.trainjob import (
    LABEL_JOBSET,
    VOLCANO_QUEUE_ANNOTATION,
    check_trainjob_plan,
    describe_trainjob_wait,
    master_host_name,
    render_trainjob_manifests,
    render_trainjob_plan,
    worker_host_name,
)
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.spec import Role
from tests.helpers import IDENTITY, spec_from


def _render(**fields: Any) -> tuple[JobPlan, list[dict[str, Any]]]:
    plan = render_trainjob_plan(spec_from(**fields), IDENTITY)
    return plan, render_trainjob_manifests(plan, "ml", owner_uid="uid-1")


def _jobs(runtime: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["name"]: job for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def _pod_spec(runtime: dict[str, Any], job: str) -> dict[str, Any]:
    return dict(_jobs(runtime)[job]["template"]["spec"]["template"]["spec"])


def _env(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in pod_spec["containers"][0]["env"]}


def test_the_trainjob_runs_its_own_runtime_with_a_deadline_behind_the_jobs_timeout() -> None:
    plan, (trainjob, secret, config_map, runtime) = _render(workers={"replicas": 2}, timeout=600, startup_timeout=120)
    job = plan.job_name
    assert (trainjob["apiVersion"], trainjob["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert trainjob["metadata"]["name"] == runtime["metadata"]["name"] == job
    assert trainjob["spec"] == {
        "runtimeRef": {"name": job, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
        "activeDeadlineSeconds": 120 + 600 + 60,
    }
    assert "trainer" not in trainjob["spec"] and "suspend" not in trainjob["spec"]  # Kueue's webhook suspends
    assert (runtime["apiVersion"], runtime["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime")
    assert "mlPolicy" not in runtime["spec"]  # Trainer's MPI policy would bring its own keys and hostfile
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": job, "uid": "uid-1",
             "controller": True}  # fmt: skip
    for obj in (secret, config_map, runtime):
        assert obj["metadata"]["ownerReferences"] == [owner]
    assert (secret["metadata"]["name"], config_map["metadata"]["name"]) == (secret_name(job), config_map_name(job))
    assert contract.CONFIG_HOSTFILE not in config_map["data"]  # host mode: no hostfile
    assert trainjob["metadata"]["labels"][LABEL_JOB] == runtime["metadata"]["labels"][LABEL_JOB] == job


def test_the_jobset_template_is_written_out_for_a_controller_without_its_webhook() -> None:
    plan, (_, _, _, runtime) = _render(workers={"replicas": 3})
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["network"] == {
        "enableDNSHostnames": True,
        "subdomain": plan.job_name,
        "publishNotReadyAddresses": True,
    }
    assert jobset["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["master"]}
    assert jobset["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert "failurePolicy" not in jobset  # any failed Job fails the JobSet at once: Airflow retries
    jobs = _jobs(runtime)
    assert list(jobs) == ["master", "worker"]
    for name, pods in (("master", 1), ("worker", 3)):
        job_spec = jobs[name]["template"]["spec"]
        assert jobs[name]["replicas"] == 1
        assert (job_spec["parallelism"], job_spec["completions"]) == (pods, pods)
        assert job_spec["completionMode"] == "Indexed" and job_spec["backoffLimit"] == 0
        pod_spec = job_spec["template"]["spec"]
        assert pod_spec["restartPolicy"] == "Never"
        assert not {"hostname", "subdomain"} & set(pod_spec)  # JobSet and the Job controller set them
        assert pod_spec["containers"][0]["command"] == ["bash", "/etc/mpi/launch.sh"]
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        assert volumes["mpi-config"]["configMap"]["name"] == config_map_name(plan.job_name)
        assert volumes["mpi-ssh"]["secret"]["secretName"] == secret_name(plan.job_name)
    assert "readinessProbe" in _pod_spec(runtime, "worker")["containers"][0]
    labels = jobs["worker"]["template"]["spec"]["template"]["metadata"]["labels"]
    assert labels[LABEL_JOB] == plan.job_name and labels[LABEL_ROLE] == "worker" and LABEL_INDEX not in labels


def test_a_master_only_job_has_no_worker_job() -> None:
    _, (_, _, _, runtime) = _render(master={"cpu": 4})
    assert list(_jobs(runtime)) == ["master"]


def test_pods_are_named_by_the_host_names_jobsets_indexed_jobs_give() -> None:
    plan, (_, secret, _, runtime) = _render(workers={"replicas": 2}, hosts_mode="hostfile")
    job = plan.job_name
    assert [pod.name for pod in plan.pods] == [f"{job}-master-0-0", f"{job}-worker-0-0", f"{job}-worker-0-1"]
    assert (master_host_name(job), worker_host_name(job, 1)) == (f"{job}-master-0-0", f"{job}-worker-0-1")
    master, worker = _env(_pod_spec(runtime, "master")), _env(_pod_spec(runtime, "worker"))
    assert master[contract.ENV_POD_NAME] == f"{job}-master-0-0"  # the name that resolves
    assert worker[contract.ENV_POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}  # one template for all
    assert master[contract.ENV_MPI_HOST] == f"{job}-worker-0-0.{job},{job}-worker-0-1.{job}"
    assert plan.config_files[contract.CONFIG_HOSTFILE].splitlines()[-1] == f"{job}-worker-0-1.{job} slots=1"
    known = base64.b64decode(secret["data"][contract.SSH_KNOWN_HOSTS]).decode()
    shared = next(line.split(" ", 1)[1] for line in known.splitlines() if line.startswith(f"{job}-worker-0-0."))
    assert f"{job}-worker-0-1.{job},{job}-worker-0-1 {shared}" in known  # one template: one host key


def test_what_trainer_or_jobset_would_refuse_is_refused_first_naming_the_field() -> None:
    with pytest.raises(SpecError) as caught:  # Trainer's schema wants an RFC 1035 label: every kind does
        render_trainjob_plan(spec_from(name="7up"), IDENTITY)
    assert caught.value.fields == ("name",) and "starting with a letter" in str(caught.value)
    # A name that fits the other kinds (<job>-worker-<i>) but not JobSet's <job>-worker-0-<i>.
    longest = "a" * (63 - len(build_job_name("x", IDENTITY)) + 1 - len("-worker-9"))
    assert render_trainjob_plan(spec_from(name="x"), IDENTITY)  # the short one is fine
    spec = spec_from(name=longest, workers={"replicas": 10})
    with pytest.raises(SpecError) as caught:
        render_trainjob_plan(spec, IDENTITY)
    assert caught.value.fields == ("name",) and "shorten name by 2 characters" in str(caught.value)


def test_a_plan_not_made_for_trainjob_is_a_programming_error() -> None:
    from tests.helpers import plan_for

    with pytest.raises(ValueError, match="render_trainjob_plan"):
        check_trainjob_plan(plan_for(spec_from(workers={"replicas": 1})))


def test_a_queue_is_kueues_label_and_a_gang_is_the_runtimes_pod_group_policy() -> None:
    _, (kueue, _, _, runtime) = _render(workers={"replicas": 2}, scheduling={"queue": "training"})
    assert kueue["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "training" and "podGroupPolicy" not in runtime["spec"]
    _, (volcano, _, _, runtime) = _render(workers={"replicas": 2}, scheduling={"gang": "volcano", "queue": "training"})
    assert KUEUE_QUEUE_LABEL not in volcano["metadata"]["labels"]
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert runtime["spec"]["template"]["metadata"]["annotations"] == {VOLCANO_QUEUE_ANNOTATION: "training"}
    assert _pod_spec(runtime, "master")["schedulerName"] == _pod_spec(runtime, "worker")["schedulerName"] == "volcano"
    _, (_, _, _, runtime) = _render(workers={"replicas": 2}, scheduling={"gang": "coscheduling"}, startup_timeout=90)
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 90}}


def _trainjob(*conditions: tuple[str, str], jobs: bool = False) -> dict[str, Any]:
    items = [{"type": t, "status": "True", "reason": r, "message": f"{r} happened"} for t, r in conditions]
    status: dict[str, Any] = {"conditions": items}
    if jobs:
        status["jobsStatus"] = [{"name": "master", "active": 0}]
    return {"metadata": {"name": "j", "labels": {KUEUE_QUEUE_LABEL: "q"}}, "status": status}


def test_status_reading_queued_failed_and_refused() -> None:
    assert describe_trainjob_wait(_trainjob(("Suspended", "Suspended"))) == (
        "queued: TrainJob suspended in queue 'q' until it is admitted"
    )
    assert "not yet run as a JobSet" in (describe_trainjob_wait(_trainjob()) or "")
    assert "have not created pods" in (describe_trainjob_wait(_trainjob(jobs=True)) or "")
    assert describe_trainjob_wait(_trainjob(("Complete", "JobSetCompleted"))) is None
    kind = job_kind("trainjob")
    assert kind.master_gone_failure(_trainjob(("Failed", "FailedJobs"))) == (
        "TrainJob failed: FailedJobs: FailedJobs happened"
    )
    assert kind.master_gone_failure(_trainjob()) is None
    event = {"reason": "TrainJobResourcesCreationFailed", "message": "jobsets.jobset.x-k8s.io is forbidden"}
    assert kind.refusal("j", [{"reason": "Other"}, event], 1.0) == (
        "Trainer could not run TrainJob j (TrainJobResourcesCreationFailed): jobsets.jobset.x-k8s.io is forbidden"
    )
    assert kind.refusal("j", [], 1.0) is None
    assert "Trainer" in (kind.refusal("j", [], 61.0) or "")
    # A runtime Trainer's cache has not seen yet: Trainer retries, so it is a refusal only past the grace.
    cache = {
        "reason": "TrainJobResourcesCreationFailed",
        "message": "TrainingRuntime specified in TrainJob is not found",
    }
    assert kind.refusal("j", [cache], 5.0) is None
    assert "is not found" in (kind.refusal("j", [cache], 61.0) or "")
    assert kind.events_selector("j", _trainjob()) == "involvedObject.name=j,involvedObject.kind=TrainJob"
    assert kind.events_selector("j", _trainjob(jobs=True)) is None
    failed = kind.admission("j", False, None, [], _trainjob(("Failed", "DeadlineExceeded")), lambda: None)
    assert failed.never_starts == "TrainJob j: TrainJob failed: DeadlineExceeded: DeadlineExceeded happened"


def test_the_workers_jobset_deletes_once_the_master_ended_do_not_decide_the_job() -> None:
    kind = job_kind("trainjob")
    master = PodState("j-master-0-0", Role.MASTER, PodPhase.FAILED, exit_code=3)
    killed = PodState("j-worker-0-0", Role.WORKER, PodPhase.FAILED, exit_code=137)
    gone = PodState("j-worker-0-1", Role.WORKER, PodPhase.FAILED, reason="Deleted")
    assert kind.deciding_states(master.name, [master, killed, gone], {"j-worker-0-0"}, None) == [master]
    evicted = PodState("j-worker-0-1", Role.WORKER, PodPhase.FAILED, reason="Evicted")
    running = PodState("j-master-0-0", Role.MASTER, PodPhase.RUNNING)
    assert kind.deciding_states(running.name, [running, evicted], set(), None) == [running, evicted]


def test_a_jobsets_pods_and_the_trainjobs_objects_are_told_apart_from_an_mpijobs() -> None:
    kind = job_kind("trainjob")
    pod = {"metadata": {"name": "j-master-0-0-x1y2z", "labels": {LABEL_JOBSET: "j"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job"}]}}  # fmt: skip
    assert kind_of(pod) is kind
    owned = {"metadata": {"ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"}]}}
    assert kind_of(owned) is kind
    pods = [
        {"metadata": {"name": "j-master-0-0-aaaaa", "creationTimestamp": "2026-01-01T00:00:01Z"}},
        {"metadata": {"name": "j-master-0-0-bbbbb", "creationTimestamp": "2026-01-01T00:00:02Z"}},
    ]
    assert kind.master_pod("j", pods) == "j-master-0-0-bbbbb" and kind.master_pod("j", []) == "j-master-0-0"
    assert kind.master_selector("j") == f"{LABEL_JOBSET}=j,jobset.sigs.k8s.io/replicatedjob-name=master"


class _RefusingCustom:
    """Custom objects whose create is refused ``refusals`` times with ``message``, then made."""

    def __init__(self, refusals: int, message: str) -> None:
        self.refusals, self.message, self.calls = refusals, message, 0

    def create(self, namespace: str, gvk: Any, body: dict[str, Any]) -> dict[str, Any]:
        from airflow_mpi.exceptions import LaunchError

        self.calls += 1
        if self.calls <= self.refusals:
            raise LaunchError(self.message)
        return body


KUEUE_NOT_YET = (
    "creating trainjob j failed: an admission webhook refused it (403): "
    "admission webhook \"vtrainjob.kb.io\" denied the request: runtime 'j' not found"
)


@pytest.mark.parametrize(
    ("refusals", "message", "made", "calls"),
    [
        (2, KUEUE_NOT_YET, True, 3),  # Kueue's cache catches up: made on the third try
        (1, "the service account cannot `create` `trainjobs`", False, 1),  # RBAC: at once
        (1000, KUEUE_NOT_YET, False, None),  # never: bounded by TOP_REFUSED_WAIT
    ],
    ids=["passes", "rbac", "never"],
)
def test_a_trainjob_refused_until_kueue_sees_its_runtime_is_tried_again_briefly(
    monkeypatch: pytest.MonkeyPatch, refusals: int, message: str, made: bool, calls: int | None
) -> None:
    from airflow_mpi.backends import creation
    from airflow_mpi.exceptions import LaunchError

    monkeypatch.setattr(creation, "TOP_REFUSED_WAIT", 1.0)
    custom = _RefusingCustom(refusals, message)
    maker = creation.JobCreation(None, custom, job_kind("trainjob"), 1, None, None)  # type: ignore[arg-type]
    if made:
        assert maker._create_top("ml", {"metadata": {"name": "j"}}, IDENTITY) == {"metadata": {"name": "j"}}
    else:
        with pytest.raises(LaunchError, match=r"trainjobs|not found"):
            maker._create_top("ml", {"metadata": {"name": "j"}}, IDENTITY)
    assert calls is None or custom.calls == calls
    assert custom.calls <= 5  # 0.2 + 0.4 + ... within the second
