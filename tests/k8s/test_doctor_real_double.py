"""`airflow-mpi doctor --image` end to end: the API double's real kubelet runs the doctor pod on
this machine (real sshd, mpiexec, ssh), so every check really runs and passes, and the pod is
gone afterwards. It starts sshd and mpiexec: run it under the integration lock."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from airflow_mpi.doctor import run as doctor
from airflow_mpi.doctor.checks import CHECKS, DOCTOR_RUNTIME_DIR
from tests.doubles.kube_double import KubeDouble
from tests.k8s.test_doctor_k8s import doctor_pods, run_doctor


def test_the_doctor_pod_for_real(
    real_double: KubeDouble, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "POLL_INTERVAL", 0.1)
    mount_point = Path(DOCTOR_RUNTIME_DIR)  # the real kubelet makes it on this machine, as for any volume
    existed = mount_point.exists()
    try:
        assert run_doctor("--timeout", "120") == 0, capsys.readouterr().out
    finally:
        if not existed:
            with contextlib.suppress(OSError):
                mount_point.rmdir()
    out = capsys.readouterr().out
    assert out.count("  ok    ") == len(CHECKS) and "sshd accepts the job key on 127.0.0.1:2222" in out
    assert doctor_pods(real_double) == []
