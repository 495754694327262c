"""The MPI job spec: frozen, typed, loadable from a dict (YAML/JSON), validated in full before I/O.

``types`` holds the dataclasses, ``parsing`` turns plain data into them, ``validation`` (with
``mpi_validation``, ``pod_validation`` and ``run_as_validation``) holds the rules, ``quantities``
and ``formats`` the Kubernetes formats, ``slots`` the slot plan. Import the public names from here.
"""

from __future__ import annotations

from airflow_mpi.contract import JOB_HASH_LEN, MAX_DNS_LABEL, HostsMode, Role
from airflow_mpi.spec.formats import is_dns_label, max_name_length
from airflow_mpi.spec.quantities import parse_cpu, parse_quantity, render_cpu, render_quantity
from airflow_mpi.spec.scheduling import Gang, SchedulingSpec
from airflow_mpi.spec.slots import SlotPlan, build_slot_plan
from airflow_mpi.spec.types import (
    MasterSpec,
    MPIJobSpec,
    MPIOptions,
    PodSettings,
    RoleSpec,
    Toleration,
    Volume,
    WorkerSpec,
)
from airflow_mpi.spec.validation import collect_spec_issues

__all__ = [
    "JOB_HASH_LEN",
    "MAX_DNS_LABEL",
    "Gang",
    "HostsMode",
    "MPIJobSpec",
    "MPIOptions",
    "MasterSpec",
    "PodSettings",
    "Role",
    "RoleSpec",
    "SchedulingSpec",
    "SlotPlan",
    "Toleration",
    "Volume",
    "WorkerSpec",
    "build_slot_plan",
    "collect_spec_issues",
    "is_dns_label",
    "max_name_length",
    "parse_cpu",
    "parse_quantity",
    "render_cpu",
    "render_quantity",
]
