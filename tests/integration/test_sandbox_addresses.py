"""A long-lived sandbox (the test cluster's node agent keeps one for a whole session) creates
more pods over its life than its /24 has addresses: a removed pod's address and veth are
handed out again, so 300 pods one after another all get one; 254 at once do not fit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_mpi.backends.local import check_prerequisites
from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.exceptions import LaunchError

pytestmark = pytest.mark.integration


def test_removed_pods_addresses_are_handed_out_again(tmp_path: Path) -> None:
    if check_prerequisites():
        pytest.skip("needs " + "; ".join(check_prerequisites()))
    sandbox = Sandbox.create(tmp_path / "state", f"addr-{uuid.uuid4().hex[:6]}")
    try:
        addresses = set()
        for i in range(300):
            (pod,) = sandbox.add_pods([f"p{i}"])
            addresses.add(pod.ip)
            if i >= 2:  # two live at a time
                sandbox.remove_pod(f"p{i - 2}")
        assert len(addresses) == 253 and len(sandbox.pods) == 2, len(addresses)
        live = {pod.ip for pod in sandbox.pods.values()}
        assert len(live) == 2
        with pytest.raises(LaunchError, match="at once"):
            sandbox.add_pods([f"q{i}" for i in range(252)])
    finally:
        sandbox.destroy()
