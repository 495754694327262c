"""Jobs without root: the ``pod.run_as_user``/``run_as_group`` option's rules, the securityContext
it renders (passing the Pod Security Standards' "restricted" level), and the ssh/sshd configs of
a non-root sshd. Root jobs render exactly as before (the golden manifests stay as they are)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.podsecurity import check_pod
from tests.helpers import plan_for, spec_from

NON_ROOT: dict[str, Any] = {"ssh_port": 2222, "pod": {"run_as_user": 1000}}


def pods_for(**fields: Any) -> list[dict[str, Any]]:
    spec = spec_from(workers={"replicas": 2}, **fields)
    return [o for o in render_manifests(plan_for(spec), "ml") if o["kind"] == "Pod"]


def problems(**fields: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    return {issue.field: f"{issue.problem}; {issue.fix}" for issue in caught.value.issues}


# --- the option's rules ----------------------------------------------------------------------


def test_run_as_defaults_the_group_to_the_user() -> None:
    assert spec_from(**NON_ROOT).pod.run_as == (1000, 1000)
    assert spec_from(ssh_port=2222, pod={"run_as_user": 1000, "run_as_group": 0}).pod.run_as == (1000, 0)
    assert spec_from().pod.run_as is None


def test_uid_0_is_refused_with_the_fix() -> None:
    found = problems(pod={"run_as_user": 0})
    assert list(found) == ["pod.run_as_user"]
    assert "is 0, which is root, but this option is for running the job without root" in found["pod.run_as_user"]
    assert (
        "leave it out to run as the image's user (root), or use a non-root uid such as 1000" in found["pod.run_as_user"]
    )


@pytest.mark.parametrize(
    ("pod", "field", "words"),
    [
        ({"run_as_user": -1}, "pod.run_as_user", "use a non-root uid from 1 to 2147483647"),
        ({"run_as_user": 2**31}, "pod.run_as_user", "use a non-root uid from 1 to 2147483647"),
        ({"run_as_user": 1000, "run_as_group": -5}, "pod.run_as_group", "use a gid from 0 to 2147483647"),
        ({"run_as_group": 1000}, "pod.run_as_group", "set pod.run_as_user too"),
        ({"run_as_user": True}, "pod.run_as_user", "True is not an integer"),
        ({"run_as_user": "mpiuser"}, "pod.run_as_user", "'mpiuser' is not an integer"),
    ],
)
def test_bad_ids_name_the_field_and_the_fix(pod: dict[str, Any], field: str, words: str) -> None:
    found = problems(ssh_port=2222, pod=pod)
    assert field in found and words in found[field], found


def test_a_privileged_port_without_root_is_refused() -> None:
    found = problems(pod={"run_as_user": 1000})  # ssh_port stays 22
    assert list(found) == ["ssh_port"]
    assert "is 22, a privileged port (below 1024); sshd running as uid 1000" in found["ssh_port"]
    assert "set ssh_port to an unprivileged port, e.g. 2222" in found["ssh_port"]
    assert spec_from(ssh_port=1024, pod={"run_as_user": 1000}).ssh_port == 1024
    assert spec_from(ssh_port=22).ssh_port == 22  # root may


def test_templated_ids_parse_and_round_trip() -> None:
    spec = spec_from(ssh_port="2222", pod={"run_as_user": "1000", "run_as_group": "1001"})
    assert spec.pod.run_as == (1000, 1001)
    assert MPIJobSpec.from_dict(spec.to_dict()) == spec


# --- the rendered pods -----------------------------------------------------------------------


def test_non_root_pods_carry_the_restricted_security_context() -> None:
    for pod in pods_for(ssh_port=2222, pod={"run_as_user": 1000, "run_as_group": 2000}):
        assert pod["spec"]["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 2000,
            "fsGroup": 2000,  # the ssh Secret's files become readable by the job's group
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in pod["spec"]["containers"]:
            assert container["securityContext"] == {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 2000,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            }
            assert container["ports"][0]["containerPort"] == 2222
        assert check_pod("restricted", pod) == []


def test_non_root_pods_use_the_images_runtime_dir_not_an_empty_dir() -> None:
    """An emptyDir is writable by everyone, and sshd (StrictModes) refuses authorized_keys under it."""
    for pod in pods_for(**NON_ROOT):
        names = [v["name"] for v in pod["spec"]["volumes"]]
        assert "mpi-runtime" not in names
        mounts = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
        assert "/run/airflow-mpi" not in mounts and "/etc/airflow-mpi/ssh" in mounts
    root_pod = pods_for()[0]
    assert "mpi-runtime" in [v["name"] for v in root_pod["spec"]["volumes"]]


def test_root_pods_carry_the_secure_defaults_and_fail_restricted_only_for_root() -> None:
    """A root job's pods: the runtime's default seccomp profile and no privilege escalation; what
    keeps them out of the restricted profile is root itself (and its capabilities, which sshd's
    privilege separation needs)."""
    for pod in pods_for():
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["spec"]["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
        assert [v.reason for v in check_pod("restricted", pod)] == [
            "unrestricted capabilities",
            "runAsNonRoot != true",
        ]
        assert check_pod("baseline", pod) == []


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_non_root_objects_pass_strict_schema(version: str) -> None:
    spec = spec_from(workers={"replicas": 1}, pod={"run_as_user": 1000, "shm_size": "1Gi"}, ssh_port=2222)
    for obj in render_manifests(plan_for(spec), "ml"):
        kubernetes_validate.validate(obj, version, strict=True)


# --- ssh and sshd configs --------------------------------------------------------------------


def test_non_root_ssh_logs_in_as_its_own_user_and_sshd_lets_no_root_in() -> None:
    files = plan_for(spec_from(**NON_ROOT)).ssh_files()
    client = files["ssh_config"].splitlines()
    assert not [line for line in client if line.strip().startswith("User ")]  # the pod's own user
    assert "  Port 2222" in client
    server = files["sshd_config"].splitlines()
    assert "PermitRootLogin no" in server and "StrictModes yes" in server and "Port 2222" in server
    assert "AuthorizedKeysFile /run/airflow-mpi/ssh/authorized_keys" in server
    assert not [line for line in server if "PrivilegeSeparation" in line]  # deprecated; nothing to separate


def test_root_ssh_configs_are_unchanged() -> None:
    files = plan_for(spec_from()).ssh_files()
    assert "  User root" in files["ssh_config"].splitlines()
    assert "PermitRootLogin prohibit-password" in files["sshd_config"].splitlines()
