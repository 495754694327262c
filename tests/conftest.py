"""Session setup shared by every test directory.

Airflow reads its configuration at import time, so its home is set here, before any test module
imports it: a fresh SQLite database per session, migrated once (see tests/dags/conftest.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="airflow-mpi-tests-home-"))
os.environ.setdefault("AIRFLOW_HOME", str(_HOME))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(Path(__file__).parent.parent / "dags"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
