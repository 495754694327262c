"""MPIJobOperator: one Airflow task = one MPI job (1 master + N workers), torn down on every path.

    train = MPIJobOperator(
        task_id="train",
        job={"name": "digits", "command": ["python", "/app/train.py"], "workers": {"replicas": 2}},
    )

``job`` is an ``MPIJobSpec`` or the same fields as a dict (templated). The task's run identity
(with its Airflow deployment: ``deployment_identity``) names the job, so retries, backfills,
mapped tasks and two deployments sharing a namespace never collide. The master's output streams
live into the task log; the return value (XCom) is a small result dict.

On a retry after the Airflow worker died, the job the earlier try left is found by its labels,
in the namespace that try recorded in the task's state store (and the one the spec gives now):
the task reattaches to it (the log goes on where that try's stopped, the result is the same) or,
when it cannot, removes it and starts clean. ``deferrable=True`` (Kubernetes) waits for
readiness and for the end in triggers, holding no worker slot.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator

from airflow_mpi.backends.base import Backend, DeferrableBackend, QueueAwareBackend, ReattachableBackend
from airflow_mpi.compat import AirflowFailException, conf
from airflow_mpi.events import JobEvent
from airflow_mpi.exceptions import BackendUnavailable, SpecError, SpecIssue
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.job.identity import build_deployment_id
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.operators.links import MPIJobLink, store_job_link
from airflow_mpi.operators.xcomkeys import JOB_REF
from airflow_mpi.runner.deferral import wait_contract
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.runner.retries import plan_for, resume_or_clean
from airflow_mpi.spec import MPIJobSpec

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)
PROGRESS_KEY = "airflow_mpi"
PROGRESS_EVERY = 1.0  # seconds between task_state_store updates of the lines shown
_WARNED_NO_DEPLOYMENT: list[bool] = []  # a deployment that cannot be told is warned about once


class MPIJobOperator(BaseOperator):
    """Run an MPI training job (DeepSpeed, Horovod, mpi4py) and stream its output into the log.

    :param job: an ``MPIJobSpec``, or a dict with its fields (templated).
    :param mpi_conn_id: connection of type ``mpi`` choosing the backend; local if it does not exist.
    :param deferrable: wait in triggers instead of a worker slot (Kubernetes backends). Default:
        ``[operators] default_deferrable``, as for Airflow's own deferrable operators; where that
        default meets a backend whose pods live in the worker process (``local``), the task waits
        in the worker and says so. An explicit ``deferrable=True`` there fails instead.
    :param reattach: on a retry, reattach to the job an earlier try left running.
    """

    template_fields: Sequence[str] = ("job", "mpi_conn_id")
    template_fields_renderers = {"job": "json"}
    ui_color = "#e8d4f0"
    operator_extra_links = (MPIJobLink(),)

    def __init__(
        self,
        *,
        job: MPIJobSpec | Mapping[str, Any],
        mpi_conn_id: str = MPIJobHook.default_conn_name,
        deferrable: bool | None = None,
        reattach: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # None: the configured default, which gives way to a backend that cannot defer.
        self.deferrable_by_default = deferrable is None
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        issues = check_operator_arguments(job, mpi_conn_id, self.deferrable, reattach)
        if isinstance(job, MPIJobSpec | Mapping):
            try:  # no templates: a bad spec fails the DAG import, not a run
                job = job.validated().to_dict() if isinstance(job, MPIJobSpec) else job
                if "{{" not in json.dumps(job, default=str):
                    MPIJobSpec.from_dict(job)
            except SpecError as error:
                issues += error.issues
        if issues:
            raise SpecError(issues)
        assert isinstance(job, Mapping)
        self.job = dict(job)
        self.mpi_conn_id = mpi_conn_id
        self.reattach = reattach
        self._runner: JobRunner | None = None

    # --- the flow -------------------------------------------------------------------------

    def _prepare(self, context: Context) -> tuple[MPIJobSpec, RunIdentity, Backend]:
        try:
            spec = MPIJobSpec.from_dict(self.job)
            backend = MPIJobHook(self.mpi_conn_id).get_backend()
        except (SpecError, BackendUnavailable) as error:
            raise AirflowFailException(str(error)) from error  # retrying cannot fix these
        if self.deferrable and self.deferrable_by_default and not isinstance(backend, DeferrableBackend):
            self.log.info(
                "[operators] default_deferrable is True, but connection %r gives the %s backend, whose pods "
                "live in the worker process: this task waits in the worker",
                self.mpi_conn_id,
                backend.name,
            )
            self.deferrable = False
        if self.deferrable:
            self._deferrable(backend)
        return spec, run_identity(context), backend

    def _deferrable(self, backend: Backend) -> DeferrableBackend:
        if not isinstance(backend, DeferrableBackend):
            raise AirflowFailException(
                f"deferrable=True needs the kubernetes backend; connection {self.mpi_conn_id!r} gives the "
                f"{backend.name} backend, whose pods live in the worker process: use deferrable=False"
            )
        return backend

    def execute(self, context: Context) -> dict[str, Any]:
        spec, identity, backend = self._prepare(context)
        progress = _Progress(context)
        try:
            plan = plan_for(backend, spec, identity)
            adopted = resume_or_clean(backend, spec, identity, progress.namespaces()) if self.reattach else None
        except SpecError as error:
            raise AirflowFailException(str(error)) from error
        if adopted is not None:
            self.log.info("reattached to %s, left running by an earlier try", adopted.job_name)
            plan = adopted
        if isinstance(backend, ReattachableBackend):  # before anything exists: a retry looks there
            progress.begin(plan.job_name, backend.namespace_for(plan.spec), keep_lines=adopted is not None)
        self._push_job_ref(context, plan, backend)
        runner = self._runner = JobRunner(
            backend,
            plan,
            emit=self._emit,
            skip_lines=progress.shown(plan.job_name) if adopted is not None else 0,
            on_progress=progress.saver(plan.job_name),
            warn=self._warn,
        )
        if self.deferrable:
            return self._defer_start(runner, adopted is not None)
        result = runner.run(adopted=adopted is not None)
        progress.clear()
        self.log.info(
            "MPI job %s succeeded in %ss (%s ranks)", result.job_name, result.durations_s.get("total"), result.np
        )
        return result.to_dict()

    def _defer_start(self, runner: JobRunner, adopted: bool) -> NoReturn:
        """Create the job whole and defer once, until it ends. The master starts with the workers
        (its launch script waits, bounded by ``startup_timeout``, until each worker's sshd
        accepts the job key; the trigger bounds the workers' readiness the same way). One
        deferral, not a short one for readiness and then one for the run: Airflow fails a task
        whose trigger fires before the scheduler has read the executor's report of the deferral
        (apache/airflow#72716), which a readiness wait of seconds meets on a busy scheduler."""
        if adopted:
            self._defer(runner)
        try:
            runner.create()
            if not _starts_master_with_workers(runner):
                runner.start_master_with_workers()
        except BaseException as error:
            runner.teardown(error)
            raise
        runner.marks["mpiexec_started"] = time.time()
        self._defer(runner)

    def _defer(self, runner: JobRunner) -> NoReturn:
        from airflow_mpi.triggers.mpi import MPIJobTrigger

        backend = self._deferrable(runner.backend)
        contract = wait_contract(runner, backend, time.time())
        backend.release(contract.job_name)  # the trigger watches from here on
        self.defer(
            trigger=MPIJobTrigger(contract.to_dict()),
            method_name="execute_complete",
            timeout=timedelta(seconds=contract.timeout + 300),
        )

    def execute_complete(self, context: Context, event: JobEvent) -> dict[str, Any]:
        """Resumed from the trigger: start the master (workers ready), or collect the end."""
        job_name, marks, try_number = event["job_name"], event.get("marks") or {}, int(event["try_number"])
        spec, identity, backend = self._prepare(context)
        progress = _Progress(context)
        deferrable = self._deferrable(backend)
        # Where the job's try recorded it was: a templated namespace may render another way now.
        namespace = progress.namespace_of(job_name) or deferrable.namespace_for(spec)
        spec = dataclasses.replace(spec, pod=dataclasses.replace(spec.pod, namespace=namespace))
        plan = plan_for(backend, spec, dataclasses.replace(identity, try_number=try_number))
        if plan.job_name != job_name:
            raise AirflowFailException(f"resumed for job {job_name} but the spec now names {plan.job_name}")
        # The trigger showed the master's lines up to ``log_lines``: they are read again (the
        # result and a failure's tails come from them) but not shown twice. A retry that
        # reattaches learns the same from the task's state store.
        shown = int(event.get("log_lines", 0) or 0)
        progress.save(plan.job_name, shown)
        runner = self._runner = JobRunner(
            backend,
            plan,
            emit=self._emit,
            marks=marks,
            skip_lines=shown,
            on_progress=progress.saver(plan.job_name),
            warn=self._warn,
        )
        runner.marks["finished_event"] = float(event.get("at", time.time()))
        try:
            deferrable.adopt(plan, namespace)
            failure = runner.event_failure(event)
            if failure is not None:
                raise failure
            # Finished, or the master failed: its log names the rank.
            result = runner.finish(shown_tail=event.get("tail") or ())
        except BaseException as error:
            runner.teardown(error)
            raise
        runner.teardown()
        progress.clear()
        return result.to_dict()

    def _push_job_ref(self, context: Context, plan: JobPlan, backend: Backend) -> None:
        """The job's name and namespace (never keys), and the task's "MPI job" link at once, so
        the UI shows it while the job runs. The link is a convenience: a task instance that
        cannot push XCom still runs its job."""
        namespace = backend.namespace_for(plan.spec) if isinstance(backend, ReattachableBackend) else backend.name
        ref = {"job": plan.job_name, "namespace": namespace}
        try:
            context["ti"].xcom_push(key=JOB_REF, value=ref)
            store_job_link(self.mpi_conn_id, ref, context["ti"])
        except Exception as error:
            self.log.warning("no 'MPI job' link for %s: %s", plan.job_name, error)

    def _emit(self, text: str) -> None:
        self.log.info("%s", text)

    def _warn(self, text: str) -> None:
        self.log.warning("%s", text)

    def on_kill(self) -> None:
        if self._runner is not None:
            left = self._runner.teardown(notice=True)
            self.log.info(
                "task killed: MPI job %s removed%s", self._runner.job_name, f" (left: {left})" if left else ""
            )


class _Progress:
    """This task instance's job in Airflow 3.3's task_state_store, kept across tries: its name and
    namespace (a retry looks for it there) and how many master log lines were shown (a retry that
    reattaches goes on where the log stopped). Without a store it is a no-op."""

    def __init__(self, context: Context) -> None:
        try:
            self.store: Any = context.get("task_state_store")
        except Exception:
            self.store = None
        self.namespace: str | None = None  # where this try's job is, once known

    def _value(self) -> dict[str, Any]:
        try:
            value = self.store.get(PROGRESS_KEY) if self.store is not None else None
        except Exception:
            return {}
        return value if isinstance(value, dict) else {}

    def _record(self, job_name: str, lines: int) -> dict[str, Any]:
        record: dict[str, Any] = {"job": job_name, "lines": lines}
        namespace = self.namespace or self.namespace_of(job_name)
        if namespace:
            record["namespace"] = namespace
        return record

    def shown(self, job_name: str) -> int:
        value = self._value()
        return int(value.get("lines", 0)) if value.get("job") == job_name else 0

    def namespaces(self) -> list[str]:
        """Where an earlier try recorded its job was."""
        namespace = self._value().get("namespace")
        return [namespace] if isinstance(namespace, str) and namespace else []

    def namespace_of(self, job_name: str) -> str | None:
        """Where the try that made ``job_name`` recorded it was (None: not recorded)."""
        value = self._value()
        namespace = value.get("namespace")
        return namespace if value.get("job") == job_name and isinstance(namespace, str) and namespace else None

    def begin(self, job_name: str, namespace: str, *, keep_lines: bool) -> None:
        """Record the job and its namespace before it is created (the lines shown so far kept
        for a job reattached to)."""
        self.namespace = namespace
        if self.store is None:
            return
        try:
            self.store.set(PROGRESS_KEY, self._record(job_name, self.shown(job_name) if keep_lines else 0))
        except Exception:
            self.store = None

    def save(self, job_name: str, lines: int) -> None:
        """Record ``lines`` now (when a trigger showed them), if any."""
        if self.store is None or lines <= 0:
            return
        try:
            self.store.set(PROGRESS_KEY, self._record(job_name, lines))
        except Exception:
            self.store = None

    def saver(self, job_name: str) -> Callable[[int], None]:
        last = [0.0]

        def save(lines: int) -> None:
            now = time.monotonic()
            if self.store is None or now - last[0] < PROGRESS_EVERY:
                return
            last[0] = now
            try:
                self.store.set(PROGRESS_KEY, self._record(job_name, lines))
            except Exception:
                self.store = None  # not available here (e.g. an old Airflow): stop trying

        return save

    def clear(self) -> None:
        if self.store is not None:
            try:
                self.store.delete(PROGRESS_KEY)
            except Exception:
                self.store = None


def check_operator_arguments(job: object, mpi_conn_id: object, deferrable: object, reattach: object) -> list[SpecIssue]:
    """The operator's own arguments: the kind of ``job`` and the types of the rest."""
    issues = []
    if not isinstance(job, MPIJobSpec | Mapping):
        issues.append(
            SpecIssue("job", f"is {type(job).__name__} {job!r:.60}", "give an MPIJobSpec or a dict of its fields")
        )
    if not isinstance(mpi_conn_id, str) or not mpi_conn_id.strip() or "\n" in mpi_conn_id:
        issues.append(
            SpecIssue("mpi_conn_id", f"is {mpi_conn_id!r:.60}", "give an Airflow connection id, e.g. 'mpi_default'")
        )
    for name, value in (("deferrable", deferrable), ("reattach", reattach)):
        if not isinstance(value, bool):
            issues.append(SpecIssue(name, f"is {value!r:.60}, not True or False", f"pass {name}=True or False"))
    return issues


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (False when unset), as Airflow's deferrable operators read it."""
    return bool(conf().getboolean("operators", "default_deferrable", fallback=False))


def _starts_master_with_workers(runner: JobRunner) -> bool:
    backend = runner.backend
    return isinstance(backend, QueueAwareBackend) and backend.starts_master_with_workers(runner.plan)


def run_identity(context: Context) -> RunIdentity:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return RunIdentity(
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=ti.run_id,
        map_index=-1 if map_index is None else int(map_index),
        try_number=int(getattr(ti, "try_number", 1) or 1),
        deployment=deployment_identity(),
    )


def configured_secret(config: Any, section: str, key: str) -> str | None:
    """A secret as the deployment configures it: its environment variable (or ``_CMD``/``_SECRET``
    form, through Airflow), else the config file as it is on disk now. Never a value a process
    generated for itself: a process that loaded its configuration before the file was written
    holds a random one in memory, and a retry in another process would not find its job."""
    variable = f"AIRFLOW__{section.upper()}__{key.upper()}"
    if os.environ.get(variable):
        return os.environ[variable]
    if os.environ.get(f"{variable}_CMD") or os.environ.get(f"{variable}_SECRET"):
        value = config.get(section, key, fallback=None)
        return None if value is None else str(value)
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    path = os.environ.get("AIRFLOW_CONFIG") or os.path.join(home, "airflow.cfg")
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None
    return parser.get(section, key, fallback=None)


def deployment_identity() -> str:
    """This Airflow deployment's id in its jobs' names and labels: ``[mpi] deployment`` when set,
    else a one-way hash of ``[api_auth] jwt_secret``, else of ``[core] fernet_key`` (values every
    component of one deployment shares and another deployment does not; the Task SDK reads an
    unset one as its template, which counts as unset). "" where none is set: warned about once."""
    config = conf()
    explicit = config.get("mpi", "deployment", fallback=None)
    shared = [configured_secret(config, "api_auth", "jwt_secret"), configured_secret(config, "core", "fernet_key")]
    try:
        deployment = build_deployment_id(explicit, shared)
    except ValueError as error:
        raise AirflowFailException(f"[mpi] deployment {error} (AIRFLOW__MPI__DEPLOYMENT)") from error
    if not deployment and not _WARNED_NO_DEPLOYMENT:
        _WARNED_NO_DEPLOYMENT.append(True)
        log.warning(
            "neither [mpi] deployment, [api_auth] jwt_secret nor [core] fernet_key is set here: this "
            "deployment's MPI jobs cannot be told from another's that shares their namespace and run ids; "
            "set [mpi] deployment (e.g. AIRFLOW__MPI__DEPLOYMENT=production)"
        )
    return deployment
