"""airflow-mpi: run MPI training jobs (DeepSpeed, Horovod, mpi4py) from Apache Airflow.

One master pod plus N worker pods, on Kubernetes or on an embedded local backend. Importing the
package loads nothing heavy; import what you need from its modules, e.g.
``from airflow_mpi.operators.mpi import MPIJobOperator``.
"""

from __future__ import annotations

__version__ = "0.1.0"
