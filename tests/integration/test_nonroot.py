"""Jobs without root on the local backend, for real: sshd on an unprivileged port and every rank
run as a non-root user, without capabilities, with the job's ssh files private to that user.

The user is this machine's: created for the tests (and removed after) when it is absent.
Every test ends with the leak check of conftest.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.faults import FaultRow
from tests.integration.conftest import SHARED_ROOT
from tests.integration.test_local_backend import Log

TEST_USER = "airflow-mpi-test"
HOST_GROUP = "airflow-mpi-test-host"  # a supplementary group of the user on this machine
PORT = 2222
LAUNCH = Path(__file__).resolve().parents[2] / "airflow_mpi" / "scripts" / "launch.sh"

# What each rank reports about itself and its pod: its ids, capabilities, no_new_privs, who runs
# the pod's sshd, and the owner and modes of the ssh files the launch script installed.
RANK = r"""
import json, os
def status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
me = status("self")
sshd = sorted({int(status(p)["Uid"].split()[0]) for p in os.listdir("/proc") if p.isdigit()
               and status(p).get("Name") == "sshd"})
ssh = "/run/airflow-mpi/ssh"
files = {n: [os.stat(f"{ssh}/{n}").st_uid, oct(os.stat(f"{ssh}/{n}").st_mode & 0o777)] for n in os.listdir(ssh)}
print("REPORT", json.dumps({
    "rank": int(os.environ["RANK"]), "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
    "groups": sorted(os.getgroups()),
    "cap_eff": me["CapEff"], "cap_bnd": me["CapBnd"], "no_new_privs": me["NoNewPrivs"],
    "home": os.environ["HOME"], "sshd_uids": sshd,
    "ssh_dir": [os.stat(ssh).st_uid, oct(os.stat(ssh).st_mode & 0o777)], "ssh_files": files,
}), flush=True)
"""


@pytest.fixture(scope="module")
def user() -> Iterator[pwd.struct_passwd]:
    """A non-root user with a home and bash, and a member of a group of this machine (its pods
    must not get it); created here when absent, then removed."""
    created = False
    subprocess.run(["groupadd", "--system", HOST_GROUP], check=False, capture_output=True)
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        home = SHARED_ROOT / f"home-{TEST_USER}"  # not /tmp: every pod has a private /tmp
        subprocess.run(
            ["useradd", "--system", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", TEST_USER],
            check=True,
            capture_output=True,
        )
        created = True
    subprocess.run(["usermod", "--append", "--groups", HOST_GROUP, TEST_USER], check=True, capture_output=True)
    yield pwd.getpwnam(TEST_USER)
    if created:
        subprocess.run(["userdel", "--remove", TEST_USER], check=False, capture_output=True)
    subprocess.run(["groupdel", HOST_GROUP], check=False, capture_output=True)


def make_plan(user: pwd.struct_passwd, command: list[str], **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "nonroot",
        "command": command,
        "workers": {"replicas": 2},
        "ssh_port": PORT,
        "pod": {"run_as_user": user.pw_uid, "run_as_group": user.pw_gid},
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("itest", "nonroot", f"r-{time.time_ns()}"))


def test_sshd_and_every_rank_run_as_the_user(backend: LocalBackend, user: pwd.struct_passwd) -> None:
    # /usr/bin/python3: the user cannot enter /root, where this machine's virtualenv lives.
    plan = make_plan(user, ["/usr/bin/python3", "-c", RANK])
    log = Log()
    result = JobRunner(backend, plan, log).run()
    assert result.exit_code == 0 and result.np == 3
    reports = sorted(
        (json.loads(line.split("REPORT ", 1)[1]) for line in log.lines if "REPORT {" in line), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in reports] == [0, 1, 2]
    for report in reports:
        assert (report["uid"], report["euid"], report["gid"]) == (user.pw_uid, user.pw_uid, user.pw_gid)
        # None of the host's groups of the user (it is in HOST_GROUP here): only its own gid at most.
        assert grp.getgrnam(HOST_GROUP).gr_gid not in report["groups"]
        assert set(report["groups"]) <= {user.pw_gid}
        assert report["cap_eff"] == "0000000000000000" and report["cap_bnd"] == "0000000000000000"
        assert report["no_new_privs"] == "1"
        assert report["home"] == user.pw_dir
        assert report["sshd_uids"] == [user.pw_uid]  # sshd itself runs as the user, in every pod
        assert report["ssh_dir"] == [user.pw_uid, "0o700"]
        assert report["ssh_files"] and all(v == [user.pw_uid, "0o600"] for v in report["ssh_files"].values())


@pytest.mark.fault
def test_a_uid_without_a_user_here_is_refused_before_anything_is_created(
    backend: LocalBackend, fault_row: FaultRow
) -> None:
    uid = next(u for u in range(40000, 60000) if not _user_exists(u))
    data = {"name": "nouser", "command": ["true"], "ssh_port": PORT, "pod": {"run_as_user": uid}}
    plan = render_plan(MPIJobSpec.from_dict(data), RunIdentity("itest", "nouser", f"r-{time.time_ns()}"))
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        JobRunner(backend, plan, Log()).run()
    seconds = time.monotonic() - started
    assert caught.value.fields == ("pod.run_as_user",)
    assert f"uid {uid} has no user on this machine" in str(caught.value)
    assert f"useradd --uid {uid} --create-home --shell /bin/bash" in str(caught.value)
    left = backend.leftovers(plan.job_name)
    assert left == [] and not (backend.state_dir / plan.job_name).exists()
    problem = str(caught.value).splitlines()[1].strip(" -")  # the first line only counts the problems
    fault_row("run_as_user with no such user", "local", "waiting", "failed", seconds, problem, left)


def _user_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_launch_script_refuses_a_runtime_dir_the_user_does_not_own(user: pwd.struct_passwd, tmp_path: Path) -> None:
    """What a world-writable emptyDir at /run/airflow-mpi gives on Kubernetes: sshd (StrictModes)
    would refuse the job key; the launch script says so, and what the image must provide."""
    shared = SHARED_ROOT / f"rt-{time.time_ns()}"
    runtime, secret = shared / "runtime", shared / "secret"
    runtime.mkdir(parents=True, mode=0o755)
    secret.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    os.chmod(runtime, 0o1777)  # as an emptyDir: root's, writable by everyone
    env = {
        "PATH": "/usr/bin:/bin",
        "GJ_TRAINING_ROLE": "worker",
        "GJ_TRAINING_POD_NAME": "job-worker-0",
        "GJ_TRAINING_VC_JOB_NAME": "job",
        "AIRFLOW_MPI_RUNTIME_DIR": str(runtime),
        "AIRFLOW_MPI_SSH_SECRET_DIR": str(secret),
    }
    try:
        done = subprocess.run(
            ["setpriv", "--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--init-groups", "--",
             "bash", str(LAUNCH)],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
    assert done.returncode == 1
    assert f"sshd on port 22 as {user.pw_name} (uid {user.pw_uid})" in done.stdout
    assert f"{runtime} belongs to uid:gid 0:0 (mode 1777), not to uid {user.pw_uid}" in done.stderr
    assert "sshd would refuse the job key (StrictModes)" in done.stderr
    assert f"install -d -o {user.pw_uid} -g {user.pw_gid} -m 0755 {runtime}" in done.stderr


# A rank that sleeps in a function the stacks must name.
NAPPING = """
import os, time
def napping_step(step):
    time.sleep(0.25)
for step in range(40):
    print(f"step {step} rank {os.environ['RANK']}", flush=True)
    napping_step(step)
"""


def test_stacks_of_a_users_job_are_taken_as_that_user(backend: LocalBackend, user: pwd.struct_passwd) -> None:
    # Root enters the pods and `launch.sh stacks` goes on as the user owning their runtime
    # directory: the dumps still come, from every rank.
    plan = make_plan(user, ["/usr/bin/python3", "-c", NAPPING], workers={"replicas": 1})
    log = Log()
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(JobRunner(backend, plan, log).run()))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not any(line.endswith("step 2 rank 0") for line in log.lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        outputs, errors = backend.take_stacks(plan.job_name, 3)
    finally:
        thread.join(120)
    assert not errors, errors
    text = "\n".join(outputs.values())
    assert results and results[0].exit_code == 0
    assert text.count("state=answered") == results[0].np, text
    assert "napping_step" in text
