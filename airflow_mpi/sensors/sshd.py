"""SshdReadySensor: waits until every worker of a job accepts the job's key over ssh.

A real ssh login with the job key and the pinned host keys, not a TCP connect; on timeout it
says per host what is wrong (not resolving, port closed, key refused, host key mismatch). The
operator waits with the same check (``airflow_mpi.runner.waits.check_sshd_once``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_mpi.compat import AirflowFailException, AirflowSensorTimeout
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.observe.readiness import HostProbe, summarize_not_ready
from airflow_mpi.runner.waits import check_sshd_once

if TYPE_CHECKING:
    from airflow.sdk import Context


class SshdReadySensor(BaseSensorOperator):
    """:param job_name: the job (as created by a backend), e.g. pulled from XCom.
    :param startup_timeout: seconds to wait before failing with a reason per host."""

    template_fields: Sequence[str] = ("job_name", "mpi_conn_id")

    def __init__(
        self,
        *,
        job_name: str,
        mpi_conn_id: str = MPIJobHook.default_conn_name,
        startup_timeout: float = 300,
        ssh_port: int = 22,
        poke_interval: float = 1,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", startup_timeout)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job_name = job_name
        self.mpi_conn_id = mpi_conn_id
        self.ssh_port = ssh_port
        self._last_probes: list[HostProbe] = []

    def poke(self, context: Context) -> bool:
        backend = MPIJobHook(self.mpi_conn_id).get_backend()
        try:
            report = check_sshd_once(backend, self.job_name)
        finally:
            backend.release(self.job_name)  # Kubernetes: stop this poke's watch
        if report.failure is not None:
            raise AirflowFailException(f"MPI job {self.job_name}: {report.failure.reason}")
        self._last_probes = report.probes
        if report.ready:
            self.log.info("sshd answers on all %d worker(s) of %s", len(report.probes), self.job_name)
            return True
        for probe in report.probes:
            if not probe.ok:
                self.log.info("not ready: %s", probe.describe(self.ssh_port))
        return False

    def execute(self, context: Context) -> Any:
        try:
            return super().execute(context)
        except AirflowSensorTimeout as error:
            if not self._last_probes:
                raise
            summary = summarize_not_ready(self._last_probes, float(self.timeout), self.ssh_port)
            raise AirflowSensorTimeout(f"MPI job {self.job_name}: {summary}") from error
