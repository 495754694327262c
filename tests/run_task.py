"""Run one queued task instance as Airflow's executors do, in a fresh process:

    python -m tests.run_task DAG_ID RUN_ID TASK_ID

``supervise_task()`` forks Airflow's task runner, reads its stdout and its log channel apart (as
in a real deployment, unlike ``dag.test()``, which runs the task in its own process) and writes
the task's log file, which Airflow's log reader then serves to the UI. The execution API runs in
this process against the session's database. A fresh process, because the supervisor forks: a
test process that has used torch's thread pool would leave the child deadlocked.
"""

from __future__ import annotations

import sys


def main(dag_id: str, run_id: str, task_id: str) -> int:
    from pathlib import Path

    from airflow.configuration import conf
    from airflow.executors.workloads.task import ExecuteTask
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor, supervise_task
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalar(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id
            )
        )
        assert ti is not None, f"no task instance {dag_id}/{run_id}/{task_id}"
        workload = ExecuteTask.make(ti)
    log_path = Path(conf.get("logging", "base_log_folder")) / workload.log_path
    return supervise_task(
        ti=workload.ti,
        bundle_info=workload.bundle_info,
        dag_rel_path=workload.dag_rel_path,
        token="",
        client=InProcessTestSupervisor._api_client(),
        log_path=str(log_path),
    )


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
