"""Every XCom key an MPI task instance writes, in one place.

XCom keys are one namespace per task instance: two features that pick the same key overwrite each
other without an error (the "MPI job" link once read the decorator's job summary, stored under the
link's key, and showed nothing). A new key goes here, and ``KEYS`` must stay free of duplicates
(a unit test checks it).
"""

from __future__ import annotations

RETURN_VALUE = "return_value"  # Airflow's: what the task returns (the job's result dict, or rank 0's value)
JOB_REF = "mpi_job"  # {"job": ..., "namespace": ...}: pushed when the job is submitted, read by the link
JOB_SUMMARY = "mpi_job_summary"  # @task.mpi: the job's summary (name, ranks, timings), without rank 0's value
# Airflow's key for what the UI shows as the "MPI job" link: BaseOperatorLink.xcom_key of
# MPIJobLink ("_link_" + its class name). Airflow stores get_link()'s answer there when the task
# ends; the operator also stores it when it submits the job, so the link is there while it runs.
JOB_LINK = "_link_MPIJobLink"

KEYS = (RETURN_VALUE, JOB_REF, JOB_SUMMARY, JOB_LINK)
