"""The local backend trusts nothing it reads back: its state records (every name in one must be the
one the sandbox rules derive, a recorded PID is killed only while it is still the pod's process),
the state directory (root's alone), a same-named job (never replaced unless it is this task
instance's and its owner is gone), the job's user (none of the host's groups), and the mount
points it made (removed when no job needs them).

No namespace is created here: every record points at names that do not exist, throwaway
directories and a throwaway process.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend, check_prerequisites
from airflow_mpi.backends.local_checks import build_owner, collision_problem
from airflow_mpi.backends.processes import is_pod_process, start_ticks
from airflow_mpi.backends.sandbox import Sandbox, SandboxPod
from airflow_mpi.backends.sandbox_pod import POD_INIT
from airflow_mpi.backends.sandbox_state import (
    NETNS_PREFIX,
    RECORD,
    bridge_name,
    bridge_netns_name,
    prepare_state_dir,
    record_problem,
    state_dir_problem,
    veth_name,
)
from airflow_mpi.backends.sweep import sweep
from airflow_mpi.exceptions import BackendUnavailable, LaunchError
from airflow_mpi.job.naming import RunIdentity
from tests.helpers import plan_for, spec_from

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the local backend runs as root)")


def build_record(name: str, *, alive: bool, pods: dict[str, tuple[int | None, int | None]] | None = None) -> Sandbox:
    """A record as ``Sandbox.create``/``add_pods`` write it; its owner is this process (alive) or
    one that ended (this PID with another start time)."""
    me = os.getpid()
    start = start_ticks(me) or 0
    sandbox = Sandbox(
        name=name,
        dir=Path("/nonexistent"),
        subnet="10.244.77.0/24",
        bridge=bridge_name(name),
        bridge_netns=bridge_netns_name(name),
        owner_pid=me,
        owner_start=start if alive else start + 1,
    )
    hosts = list(ipaddress.ip_network(sandbox.subnet).hosts())
    for index, (pod, (pid, pid_start)) in enumerate((pods or {}).items()):
        sandbox.pods[pod] = SandboxPod(
            pod, f"{NETNS_PREFIX}{pod}", veth_name(name, index), str(hosts[index + 1]), {}, pid, pid_start
        )
    sandbox.next_index = len(sandbox.pods)
    return sandbox


def write_record(state_dir: Path, sandbox: Sandbox, **changes: Any) -> Path:
    data = sandbox.record()
    for key, value in changes.items():
        if key.startswith("pod_"):
            for pod in data["pods"].values():
                pod[key[4:]] = value
        else:
            data[key] = value
    path = state_dir / sandbox.name
    path.mkdir(parents=True, mode=0o700)
    (path / RECORD).write_text(json.dumps(data))
    return path


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def run_state_dir() -> Iterator[Path]:
    """A state directory a job may use: not under /tmp, which every pod gets privately."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="state-"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A throwaway process that is no pod's: a record may name its PID."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


# --- records: every name as the rules made it ---------------------------------------------------


def test_a_record_written_by_the_rules_passes() -> None:
    sandbox = build_record("job-1", alive=True, pods={"job-1-master-0": (None, None), "job-1-worker-0": (None, None)})
    assert record_problem(sandbox.record(), "job-1") is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"pod_netns": "../../home/x"}, "netns"),
        ({"pod_netns": "ampl-other-job-worker-0"}, "netns"),
        ({"pod_veth": "eth0"}, "veth"),
        ({"pod_ip": "192.0.2.7"}, "ip"),
        ({"pod_pid": "1; rm -rf /"}, "pid"),
        ({"bridge": "eth0"}, "bridge"),
        ({"bridge_netns": "ampl-job-2-worker-0"}, "bridge_netns"),
        ({"bridge_netns": "../../run/netns/x"}, "bridge_netns"),
        ({"name": "../etc"}, "name"),
        ({"subnet": "192.0.2.0/24"}, "subnet"),
        ({"subnet": "10.244.0.0/16"}, "subnet"),
        ({"owner_pid": 0}, "owner_pid"),
        ({"next_index": 100000}, "next_index"),
        ({"extra": 1}, "fields"),
    ],
)
def test_a_record_that_breaks_a_rule_is_refused_naming_it(change: dict[str, Any], named: str) -> None:
    data = build_record("job-1", alive=False, pods={"job-1-worker-0": (4242, 1)}).record()
    for key, value in change.items():
        if key.startswith("pod_"):
            data["pods"]["job-1-worker-0"][key[4:]] = value
        else:
            data[key] = value
    problem = record_problem(data, "job-1")
    assert problem is not None and named in problem


def test_a_path_traversal_netns_is_refused_and_nothing_outside_our_names_is_touched(
    state_dir: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "home" / "x"
    victim.mkdir(parents=True)
    (victim / "keep").write_text("mine")
    forged = build_record("job-1", alive=False, pods={"job-1-worker-0": (None, None)})
    record_dir = write_record(state_dir, forged, pod_netns=f"../..{victim}")
    with pytest.raises(LaunchError, match=r"netns .*is not ampl-job-1-worker-0.*nothing it names was touched"):
        Sandbox.load(state_dir, "job-1")
    assert sweep(state_dir) == []
    assert (victim / "keep").read_text() == "mine"
    assert (record_dir / RECORD).exists()  # left for a person to look at


def test_a_name_that_is_a_path_loads_nothing(state_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / RECORD).write_text("{cut short")  # a torn record is removed: never one outside
    assert Sandbox.load(state_dir, "../outside") is None
    assert (outside / RECORD).exists()


def test_a_reused_pid_is_not_killed(state_dir: Path, stranger: subprocess.Popen[bytes]) -> None:
    start = start_ticks(stranger.pid)
    # Its PID with its own start time (as if the kernel reused the pod's PID at once), and with an
    # older start time (the pod's): neither is the pod's first process, so neither is killed.
    for name, pid_start in (("job-1", start), ("job-2", (start or 0) - 1)):
        write_record(state_dir, build_record(name, alive=False, pods={f"{name}-worker-0": (stranger.pid, pid_start)}))
    assert sorted(sweep(state_dir)) == ["job-1", "job-2"]  # the records go...
    assert stranger.poll() is None  # ...the process they named stays
    assert not is_pod_process(stranger.pid, start, "ampl-job-1-worker-0")


def test_a_pod_process_is_known_by_its_start_time_and_command_line() -> None:
    netns = "ampl-job-1-worker-0"
    proc = subprocess.Popen(["bash", "-c", "sleep 60; exit", "pod-init", netns])  # not exec'd: stays bash
    try:
        deadline = time.monotonic() + 5
        while b"pod-init" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)  # until it has exec'd
        start = start_ticks(proc.pid)
        assert is_pod_process(proc.pid, start, netns)
        assert not is_pod_process(proc.pid, (start or 0) + 1, netns)
        assert not is_pod_process(proc.pid, start, "ampl-job-2-worker-0")
    finally:
        proc.kill()
        proc.wait()


def test_a_live_owners_record_is_not_swept(state_dir: Path) -> None:
    path = write_record(state_dir, build_record("job-1", alive=True, pods={"job-1-worker-0": (None, None)}))
    assert sweep(state_dir) == []
    assert (path / RECORD).exists()


def test_a_dead_record_naming_a_live_ones_pods_is_not_swept(state_dir: Path) -> None:
    write_record(state_dir, build_record("job-1", alive=True, pods={"job-1-worker-0": (None, None)}))
    copy = build_record("job-2", alive=False)
    copy.pods["job-1-worker-0"] = SandboxPod(
        "job-1-worker-0", "ampl-job-1-worker-0", veth_name("job-2", 0), "10.244.77.2"
    )
    copy.next_index = 1
    write_record(state_dir, copy)
    assert sweep(state_dir) == []
    assert (state_dir / "job-2" / RECORD).exists()


# --- the state directory: root's alone ----------------------------------------------------------


@as_root
def test_an_absent_state_dir_is_created_roots_with_mode_0700(tmp_path: Path) -> None:
    path = tmp_path / "a" / "state"
    prepare_state_dir(path)
    info = path.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert state_dir_problem(path) is None


@as_root
@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: (p.mkdir(), p.chmod(0o777)), "mode 0777"),
        (lambda p: (p.mkdir(mode=0o700), os.chown(p, NOBODY, NOBODY)), f"owned by uid {NOBODY}"),
        (lambda p: (p.with_name("real").mkdir(mode=0o700), p.symlink_to(p.with_name("real"))), "symbolic link"),
        (lambda p: (p.parent.chmod(0o777), p.mkdir(mode=0o700)), "which a user other than root can change"),
    ],
    ids=["mode 0777", "another owner", "a symlink", "an open parent"],
)
def test_a_state_dir_others_can_change_stops_the_job_naming_it(tmp_path: Path, make: Any, problem: str) -> None:
    path = tmp_path / "parent" / "state"
    path.parent.mkdir()
    make(path)
    with pytest.raises(BackendUnavailable) as caught:
        prepare_state_dir(path)
    message = str(caught.value)
    assert str(path) in message and problem in message
    assert f"chown root:root {path} && chmod 0700 {path}" in message


@as_root
def test_the_backend_refuses_an_open_state_dir_before_creating_anything(run_state_dir: Path) -> None:
    if check_prerequisites():
        pytest.skip("the local backend cannot run here")
    state = run_state_dir
    state.chmod(0o777)
    plan = plan_for(spec_from(workers={"replicas": 1}))
    with pytest.raises(BackendUnavailable, match=f"{state} has mode 0777"):
        LocalBackend(state_dir=state).create(plan)
    assert list(state.iterdir()) == []


def test_the_state_dir_message_suggests_only_root_owned_places() -> None:
    problems = check_prerequisites(state_dir=Path("/tmp/state"))
    text = next(p for p in problems if "state_dir" in p)
    assert "/var/tmp" not in text and "/var/lib/airflow-mpi" in text and "/run/airflow-mpi-local" in text


# --- a same-named job ---------------------------------------------------------------------------

OTHER = RunIdentity("other_dag", "other_task", "manual__2026-12-05", -1, 2)


def test_a_collision_names_both_owners() -> None:
    plan = plan_for(spec_from())
    theirs = build_owner(dataclasses.replace(plan, identity=OTHER))
    message = collision_problem(plan, Path("/run/x"), theirs, 4242, owner_alive=True) or ""
    assert f"local job {plan.job_name} already exists in /run/x" in message
    assert "process 4242, is still running" in message
    assert "DAG 'other_dag', task 'other_task', run 'manual__2026-12-05', try 2" in message
    me = plan.identity
    assert f"this task is DAG {me.dag_id!r}, task {me.task_id!r}, run {me.run_id!r}, try {me.try_number}" in message
    assert "Nothing was created or removed" in message


def test_only_this_task_instances_job_with_its_owner_gone_may_be_replaced() -> None:
    plan = plan_for(spec_from())
    ours, theirs = build_owner(plan), build_owner(dataclasses.replace(plan, identity=OTHER))
    assert collision_problem(plan, Path("/s"), ours, 1, owner_alive=False) is None
    assert "is still running" in (collision_problem(plan, Path("/s"), ours, 1, owner_alive=True) or "")
    assert "another task instance" in (collision_problem(plan, Path("/s"), theirs, 1, owner_alive=False) or "")
    unnamed = collision_problem(plan, Path("/s"), None, 1, owner_alive=False) or ""
    assert "a task this record does not name" in unnamed


@as_root
def test_a_same_named_live_job_is_reported_not_destroyed(
    run_state_dir: Path, stranger: subprocess.Popen[bytes]
) -> None:
    state_dir = run_state_dir
    if check_prerequisites():
        pytest.skip("the local backend cannot run here")
    plan = plan_for(spec_from(workers={"replicas": 1}))
    live = build_record(plan.job_name, alive=True, pods={plan.master.name: (stranger.pid, start_ticks(stranger.pid))})
    live.meta["owner"] = build_owner(dataclasses.replace(plan, identity=OTHER))
    path = write_record(state_dir, live)
    before = (path / RECORD).read_text()
    with pytest.raises(LaunchError, match=f"local job {plan.job_name} already exists .* still running"):
        LocalBackend(state_dir=state_dir).create(plan)
    assert (path / RECORD).read_text() == before
    assert stranger.poll() is None
    assert sorted(p.name for p in state_dir.iterdir()) == [plan.job_name]


# --- the job's user: no groups of the host ---------------------------------------------------


def test_pods_of_a_user_get_no_supplementary_groups_of_the_host() -> None:
    assert "--clear-groups" in POD_INIT and "--init-groups" not in POD_INIT


# --- mount points made on the host --------------------------------------------------------------


@as_root
def test_mount_points_the_backend_made_go_when_no_job_needs_them(state_dir: Path, tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    backend = LocalBackend(state_dir=state_dir)
    needed = build_record("job-1", alive=True)
    needed.meta["mount_points"] = [str(tmp_path / "new" / "b")]
    write_record(state_dir, needed)
    backend._make_mount_points([str(existing / "a"), str(tmp_path / "new" / "b" / "c"), str(tmp_path / "new" / "b")])
    assert (existing / "a").is_dir() and (tmp_path / "new" / "b" / "c").is_dir()
    backend._remove_mount_points()
    # What no record needs went; what another job's record needs stays (and the directories above
    # it), and so does what was there before.
    assert existing.is_dir() and not (existing / "a").exists()
    assert (tmp_path / "new" / "b").is_dir() and not (tmp_path / "new" / "b" / "c").exists()
    shutil.rmtree(state_dir / "job-1")
    backend._remove_mount_points()
    assert not (tmp_path / "new").exists()
    assert existing.is_dir()
    assert not (state_dir / ".mount-points.json").exists()
