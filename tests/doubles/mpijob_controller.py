"""mpi-operator v2beta1's MPIJob controller for the API double, following its ``syncHandler``.

Per MPIJob, each round: skip one being deleted or managed by another controller (``managedBy``);
apply the defaults and validate, and on failure emit only a Warning ``ValidationError`` event
(no condition, as the operator does); set ``Created``; once finished, apply ``cleanPodPolicy``
and stop; otherwise create, in this order, Service ``<job>``, ConfigMap ``<job>-config``
(its ``discover_hosts.sh`` kept to the Running workers), Secret ``<job>-ssh``, then unless
suspended the PodGroup (with ``gang_scheduler``) and the missing worker pods (a failed worker is
never recreated), then the launcher Job (``AtStartup``, or once every worker is Ready for
``WaitForWorkersReady``). A same-named object the MPIJob does not control stops the round with a
Warning ``ErrResourceExists``. Suspending suspends the launcher Job and deletes the workers;
resuming resumes it. Status: conditions ``Created``, ``Running``, ``Succeeded``, ``Failed``
(reason from the launcher Job's, or ``MPIJobEvicted``), ``Suspended``; ``replicaStatuses``,
``startTime``, ``completionTime``. Objects and rules: ``mpijob_objects``; the launcher Job's
controller: ``batch_jobs``. Deleting the MPIJob garbage-collects what it owns (the double's GC).

Knobs for tests: ``evict_worker``, ``end_worker`` and ``end_launcher`` (exit code N).
"""

from __future__ import annotations

import threading
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.doubles import mpijob_objects as mo
from tests.doubles.apivalidation import validate_object
from tests.doubles.batch_jobs import BatchJobs, record_event
from tests.doubles.crd_schema import apply_crd_defaults
from tests.doubles.kube_double import ApiError, KubeDouble, _set_evicted, _set_terminated

Obj = dict[str, Any]
MPIJOBS = ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob")
GROUPS = {
    "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"),
    "scheduler-plugins": ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
}
COMPONENT = "mpi-job-controller"


class _Stop(Exception):
    """The round stops here (the operator returns an error and requeues)."""


def new_key_pair() -> tuple[str, str]:
    """An ECDSA P-521 key as the operator makes it: PEM private key, authorized_keys public key."""
    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private.decode(), public.decode() + "\n"


class MPIJobController:
    """Plugs the MPIJob and batch/v1 Job controllers into a ``KubeDouble`` (before ``start``).

    ``gang_scheduler``: the operator's ``--gang-scheduling`` ("volcano" or a scheduler-plugins
    name; empty: off). ``cluster_domain``: its ``--cluster-domain`` (appended to hostfile hosts)."""

    def __init__(
        self, double: KubeDouble, *, gang_scheduler: str = "", cluster_domain: str = "", tick: float = 0.02
    ) -> None:
        self.double = double
        self.gang_scheduler = gang_scheduler
        self.cluster_domain = cluster_domain
        self.tick = tick
        self.plural = double.register_custom(*MPIJOBS)
        double.custom_defaulters[self.plural] = apply_crd_defaults
        double.status_subresources.add(self.plural)
        self.jobs = BatchJobs(double)
        self.group_plural = ""
        if gang_scheduler:
            self.group_plural = double.register_custom(
                *GROUPS["volcano" if gang_scheduler == "volcano" else "scheduler-plugins"]
            )
        self.log: list[str] = []  # what the controller did, in order, for tests
        self._events: set[tuple[str, str, str]] = set()  # (uid, reason, message) recorded once
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        double.listeners.append(lambda event, plural, obj: self._wake.set())
        self._thread = threading.Thread(target=self._run, name="mpijob-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    # --- knobs ----------------------------------------------------------------------------

    def evict_worker(self, namespace: str, job: str, index: int) -> None:
        """The kubelet evicts worker ``index`` (phase Failed, reason Evicted)."""
        self._end_pod(namespace, f"{job}-worker-{index}", _set_evicted)

    def end_worker(self, namespace: str, job: str, index: int, exit_code: int = 1) -> None:
        """Worker ``index``'s container exits with ``exit_code`` (0: Succeeded, else Failed)."""
        reason = "Completed" if exit_code == 0 else "Error"
        self._end_pod(namespace, f"{job}-worker-{index}", lambda p: _set_terminated(p, exit_code, reason))

    def end_launcher(self, namespace: str, job: str, exit_code: int) -> str:
        """The newest running launcher pod exits with ``exit_code``; returns its name."""
        pods = [
            p
            for p in self.double.list_objects(
                "pods", namespace, f"{mo.JOB_NAME_LABEL}={job},{mo.JOB_ROLE_LABEL}=launcher"
            )
            if mo.pod_phase(p) not in ("Succeeded", "Failed")
        ]
        if not pods:
            raise LookupError(f"no running launcher pod of MPIJob {namespace}/{job}")
        newest = max(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["resourceVersion"]))
        reason = "Completed" if exit_code == 0 else "Error"
        self._end_pod(namespace, newest["metadata"]["name"], lambda p: _set_terminated(p, exit_code, reason))
        return str(newest["metadata"]["name"])

    def _end_pod(self, namespace: str, name: str, change: Any) -> None:
        pod = self.double.get("pods", namespace, name)
        if pod is None:
            raise LookupError(f"no pod {namespace}/{name}")
        self.double.kubelet.stop(self.double, pod)  # its script (or process) no longer speaks for it
        self.double.update_pod_status(namespace, name, change)
        buffer = self.double.logs.get((namespace, name))
        if buffer is not None:
            buffer.close()

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick)
            self._wake.clear()
            try:
                self.reconcile()
            except (ApiError, LookupError):
                continue  # a race with a deletion: the next round sees the new state

    def reconcile(self) -> None:
        with self._lock:
            self.jobs.reconcile()
            for job in self.double.list_objects(self.plural):
                try:
                    self._sync(job)
                except _Stop:
                    continue

    def _event(self, job: Obj, kind: str, reason: str, message: str) -> None:
        key = (job["metadata"]["uid"], reason, message)
        if key not in self._events:
            self._events.add(key)
            self.log.append(f"{job['metadata']['name']}: {kind} {reason}: {message}")
            record_event(self.double, job, COMPONENT, kind, reason, message)

    def _sync(self, stored: Obj) -> None:
        meta = stored["metadata"]
        managed_by = (stored.get("spec", {}).get("runPolicy") or {}).get("managedBy")
        if meta.get("deletionTimestamp") or managed_by not in (None, "kubeflow.org/mpi-operator"):
            return
        job = mo.defaulted(stored)
        errors = mo.validation_errors(job)
        if errors:
            self._event(job, "Warning", "ValidationError", mo.validation_message(errors))
            return
        status: Obj = dict(job.get("status") or {})
        ns, name = meta["namespace"], meta["name"]
        if not status.get("conditions"):
            message = f"MPIJob {ns}/{name} is created."
            mo.set_condition(status, "Created", "True", "MPIJobCreated", message)
            self._event(job, "Normal", "MPIJobCreated", message)
        if mo.finished(status) and status.get("completionTime"):
            if job["spec"]["runPolicy"]["cleanPodPolicy"] in ("Running", "All"):
                self._clean_up_workers(job, status)
            self._write_status(stored, status)
            return
        if not status.get("startTime") and not mo.suspended(job):
            status["startTime"] = mo.now()
        launcher = self._launcher_job(job)
        workers: list[Obj] = []
        if not (launcher is not None and self._job_finished(launcher)):
            self._get_or_create("services", job, mo.service(job))
            self._config_map(job)
            self._secret(job)
            if not mo.suspended(job):
                if self.gang_scheduler:
                    self._pod_group(job)
                workers = self._workers(job)
            if launcher is None:
                policy = job["spec"]["launcherCreationPolicy"]
                if policy == "AtStartup" or sum(1 for w in workers if mo.pod_ready(w)) == len(workers):
                    launcher = self._create_launcher(job)
        if launcher is not None:
            launcher = self._sync_suspension(job, launcher)
        if mo.suspended(job):
            self._clean_up_workers(job, status)
        self._update_status(job, status, launcher, workers)
        self._write_status(stored, status)

    # --- objects ------------------------------------------------------------------------------

    def _owned_or_stop(self, job: Obj, obj: Obj, kind: str) -> None:
        if not mo.controlled_by(obj, job["metadata"]["uid"]):
            message = (
                f'Resource "{obj["metadata"]["name"]}" of Kind "{kind}" already exists and is not managed by MPIJob'
            )
            self._event(job, "Warning", "ErrResourceExists", message)
            raise _Stop

    def _get_or_create(self, plural: str, job: Obj, body: Obj) -> Obj:
        ns = job["metadata"]["namespace"]
        existing = self.double.get(plural, ns, body["metadata"]["name"])
        if existing is None:
            self.log.append(f"{job['metadata']['name']}: create {plural}/{body['metadata']['name']}")
            return self.double.create(plural, ns, body)
        self._owned_or_stop(job, existing, self.double.kind_of(plural))
        if plural == "services":
            wanted = body["spec"]
            if existing["spec"].get("selector") != wanted["selector"] or bool(
                existing["spec"].get("publishNotReadyAddresses")
            ) != bool(wanted["publishNotReadyAddresses"]):
                existing["spec"].update(
                    selector=wanted["selector"], publishNotReadyAddresses=wanted["publishNotReadyAddresses"]
                )
                return self.double.replace(plural, ns, existing["metadata"]["name"], existing)
        return existing

    def _config_map(self, job: Obj) -> None:
        running = [w["metadata"]["name"] for w in self._worker_pods(job) if mo.pod_phase(w) == "Running"]
        body = mo.config_map(job, running, self.cluster_domain)
        existing = self._get_or_create("configmaps", job, body)
        if existing.get("data") != body["data"]:
            existing["data"] = body["data"]
            self.double.replace("configmaps", job["metadata"]["namespace"], existing["metadata"]["name"], existing)

    def _secret(self, job: Obj) -> None:
        existing = self.double.get("secrets", job["metadata"]["namespace"], f"{job['metadata']['name']}-ssh")
        if existing is None:
            self._get_or_create("secrets", job, mo.ssh_secret(job, *new_key_pair()))
        else:
            self._owned_or_stop(job, existing, "Secret")

    def _pod_group(self, job: Obj) -> None:
        _, body = mo.pod_group(job, self.gang_scheduler)
        existing = self.double.get(self.group_plural, job["metadata"]["namespace"], job["metadata"]["name"])
        if existing is None:
            self.double.create(self.group_plural, job["metadata"]["namespace"], body)
        else:
            self._owned_or_stop(job, existing, "PodGroup")

    def _worker_pods(self, job: Obj) -> list[Obj]:
        selector = ",".join(f"{k}={v}" for k, v in mo.default_labels(job["metadata"]["name"], "worker").items())
        return self.double.list_objects("pods", job["metadata"]["namespace"], selector)

    def _workers(self, job: Obj) -> list[Obj]:
        """Each missing worker is created; one that exists (even Failed) is kept as it is."""
        ns, count = job["metadata"]["namespace"], mo.worker_replicas(job)
        existing = self._worker_pods(job)
        for pod in existing if len(existing) > count else []:
            index = (pod["metadata"].get("labels") or {}).get(mo.REPLICA_INDEX_LABEL, "")
            if index.isdigit() and int(index) >= count:  # the label as written, shifted or not (as in Go)
                self.double.delete("pods", ns, pod["metadata"]["name"])  # scaled down
        workers = []
        for index in range(count):
            found = self.double.get("pods", ns, mo.worker_name(job, index))
            if found is not None:
                pod = found
            else:
                try:
                    pod = self.double.create("pods", ns, mo.worker_pod(job, index, self.gang_scheduler))
                except ApiError as error:
                    self._event(job, "Warning", "MPIJobFailed", f"worker pod created failed: {error.message}")
                    raise _Stop from error
            self._owned_or_stop(job, pod, "Pod")
            workers.append(pod)
        return workers

    def _launcher_job(self, job: Obj) -> Obj | None:
        launcher = self.double.get(
            self.jobs.plural, job["metadata"]["namespace"], f"{job['metadata']['name']}-launcher"
        )
        if launcher is not None:
            self._owned_or_stop(job, launcher, "Job")
        return launcher

    def _create_launcher(self, job: Obj) -> Obj | None:
        template, warnings = mo.launcher_template(job, self.gang_scheduler)
        for warning in warnings:
            self._event(job, "Warning", "SetPodTemplateRestartPolicy", warning)
        body = mo.launcher_job(job, template)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], "name": "launcher", "namespace": job["metadata"]["namespace"]},
        }
        causes = validate_object("pods", {**pod, "spec": template["spec"]})
        try:
            if causes:  # the apiserver validates a Job's pod template on create
                details = ", ".join(f"spec.template.{c}" for c in causes)
                raise ApiError(422, "Invalid", f'Job.batch "{body["metadata"]["name"]}" is invalid: {details}')
            self.log.append(f"{job['metadata']['name']}: create jobs.batch/{body['metadata']['name']}")
            return self.double.create(self.jobs.plural, job["metadata"]["namespace"], body)
        except ApiError as error:
            self._event(job, "Warning", "MPIJobFailed", f"launcher pod created failed: {error.message}")
            raise _Stop from error

    @staticmethod
    def _job_finished(launcher: Obj) -> bool:
        conditions = (launcher.get("status") or {}).get("conditions") or []
        return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)

    def _sync_suspension(self, job: Obj, launcher: Obj) -> Obj:
        wanted = mo.suspended(job)
        if bool(launcher["spec"].get("suspend")) == wanted:
            return launcher
        launcher["spec"]["suspend"] = wanted
        return self.double.replace(
            self.jobs.plural, launcher["metadata"]["namespace"], launcher["metadata"]["name"], launcher
        )

    def _clean_up_workers(self, job: Obj, status: Obj) -> None:
        """``deleteWorkerPods``: under Running, finished workers are kept; Pending and Running go."""
        ns, policy = job["metadata"]["namespace"], job["spec"]["runPolicy"]["cleanPodPolicy"]
        for index in range(mo.worker_replicas(job)):
            pod = self.double.get("pods", ns, mo.worker_name(job, index))
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            self._owned_or_stop(job, pod, "Pod")
            if policy == "Running" and mo.pod_phase(pod) not in ("Running", "Pending"):
                continue
            self.log.append(f"{job['metadata']['name']}: delete pods/{pod['metadata']['name']}")
            try:
                self.double.delete("pods", ns, pod["metadata"]["name"])
            except ApiError:
                pass
        if self.gang_scheduler:
            group = self.double.get(self.group_plural, ns, job["metadata"]["name"])
            if group is not None and mo.controlled_by(group, job["metadata"]["uid"]):
                self.double.delete(self.group_plural, ns, job["metadata"]["name"])
        status.setdefault("replicaStatuses", {})["Worker"] = {}

    # --- status -------------------------------------------------------------------------------

    def _update_status(self, job: Obj, status: Obj, launcher: Obj | None, workers: list[Obj]) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if mo.suspended(job):
            if mo.set_condition(status, "Suspended", "True", "MPIJobSuspended", "MPIJob suspended"):
                self._event(job, "Normal", "MPIJobSuspended", "MPIJob suspended")
        elif mo.condition(status, "Suspended") is not None and mo.set_condition(
            status, "Suspended", "False", "MPIJobResumed", "MPIJob resumed"
        ):
            self._event(job, "Normal", "MPIJobResumed", "MPIJob resumed")
            status["startTime"] = mo.now()
        replicas = status.setdefault("replicaStatuses", {})
        launcher_running = 0
        if launcher is not None:
            pods = self.jobs.pods_of(launcher)
            launcher_running = sum(1 for p in pods if mo.pod_phase(p) == "Running")
            job_status = launcher.get("status") or {}
            conditions = {c["type"]: c for c in job_status.get("conditions") or [] if c.get("status") == "True"}
            counts = {"failed": int(job_status.get("failed") or 0)}
            if "Complete" in conditions:
                counts["succeeded"] = 1
                message = f"MPIJob {ns}/{name} successfully completed."
                self._event(job, "Normal", "MPIJobSucceeded", message)
                status["completionTime"] = status.get("completionTime") or job_status.get("completionTime")
                mo.set_condition(status, "Succeeded", "True", "MPIJobSucceeded", message)
            elif "Failed" in conditions:
                self._failed(job, status, conditions["Failed"], pods)
            else:
                counts["active"] = launcher_running
            replicas["Launcher"] = mo.replica_status(**counts)
        phases = [mo.pod_phase(w) for w in workers]
        evicted = sum(
            1 for w in workers if mo.pod_phase(w) == "Failed" and (w.get("status") or {}).get("reason") == "Evicted"
        )
        replicas["Worker"] = mo.replica_status(
            active=phases.count("Running"), succeeded=phases.count("Succeeded"), failed=phases.count("Failed")
        )
        if evicted:
            message = f"{evicted}/{len(workers)} workers are evicted"
            mo.set_condition(status, "Failed", "True", "MPIJobEvicted", message)
            self._event(job, "Warning", "MPIJobEvicted", message)
        if mo.suspended(job):
            mo.set_condition(status, "Running", "False", "MPIJobSuspended", f"MPIJob {ns}/{name} is suspended.")
        elif mo.finished(status):
            if mo.condition(status, "Running") is None:
                message = f"MPIJob {ns}/{name} is finished but Running condition was never set."
                mo.set_condition(status, "Running", "False", "MPIJobRunning", message)
        elif launcher is not None and launcher_running >= 1 and phases.count("Running") == len(workers):
            message = f"MPIJob {ns}/{name} is running."
            if mo.set_condition(status, "Running", "True", "MPIJobRunning", message):
                self._event(job, "Normal", "MPIJobRunning", f"MPIJob {ns}/{name} is running")

    def _failed(self, job: Obj, status: Obj, failed: Obj, pods: list[Obj]) -> None:
        """The launcher Job's reason; with BackoffLimitExceeded the last failed pod's reason and
        message are appended (often empty: an exit code sets neither)."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        reason = failed.get("reason") or "MPIJobFailed"
        message = failed.get("message") or f"MPIJob {ns}/{name} has failed"
        if reason == "BackoffLimitExceeded":
            dead = [p for p in pods if mo.pod_phase(p) == "Failed"]
            if dead:
                last = max(dead, key=lambda p: p["metadata"]["creationTimestamp"])
                reason += "/" + str((last.get("status") or {}).get("reason") or "")
                message = mo.truncate(message + ": " + str((last.get("status") or {}).get("message") or ""))
        self._event(job, "Warning", reason, message)
        status["completionTime"] = status.get("completionTime") or mo.now()
        mo.set_condition(status, "Failed", "True", reason, message)

    def _write_status(self, stored: Obj, status: Obj) -> None:
        if status == (stored.get("status") or {}):
            return

        def change(j: Obj) -> None:
            j["status"] = status

        self.double.update_object(self.plural, stored["metadata"]["namespace"], stored["metadata"]["name"], change)
