"""Known failures recognised in pod output: each real message maps to its cause, fix and doc
section; ordinary output maps to nothing; the collector stays bounded on any volume."""

from __future__ import annotations

import pytest

from airflow_mpi.observe.diagnosis import (
    EARLY_LINES,
    KNOWN_FAILURES,
    Cause,
    Diagnosis,
    EvidenceCollector,
    diagnose,
    explain,
    merge_diagnoses,
)
from tests.unit.test_contract_doc import ANCHORS

# What the programs really print (bash 5.2, OpenSSH 9.2, Open MPI 4.1, DeepSpeed 0.19, torch 2.x),
# as the task log shows it: mpiexec's own lines bare, a rank's lines tagged.
SAMPLES: list[tuple[str, Cause]] = [
    ("Missing privilege separation directory: /run/sshd", Cause.SSHD_PRIVSEP_DIR),
    ("/etc/mpi/launch.sh: line 58: /usr/sbin/sshd: No such file or directory", Cause.NO_SSHD),
    ("/etc/mpi/launch.sh: line 58: exec: /usr/sbin/sshd: not found", Cause.NO_SSHD),
    ("/etc/mpi/launch.sh: line 300: exec: mpiexec: not found", Cause.NO_MPIEXEC),
    ("bash: line 1: mpiexec: command not found", Cause.NO_MPIEXEC),
    ("bash: line 1: orted: command not found", Cause.ORTED_NOT_FOUND),
    ("sh: 1: orted: not found", Cause.ORTED_NOT_FOUND),
    ("mpiexec has detected an attempt to run as root.", Cause.MPIRUN_AS_ROOT),
    ("[1,0]<stderr>:mpirun has detected an attempt to run as root.", Cause.MPIRUN_AS_ROOT),
    (
        "[1,0]<stdout>:[2026-11-30 20:00:00,000] [INFO] [launch.py:256:main] WORLD INFO DICT: {'localhost': [0]}",
        Cause.NESTED_LAUNCHER,
    ),
    ("[1,1]<stdout>:[INFO] [runner.py:568:main] cmd = python -u -m deepspeed.launcher.launch --world_info=e30=", Cause.NESTED_LAUNCHER),
    ('[1,0]<stderr>:  File "/usr/lib/python3/dist-packages/torch/distributed/run.py", line 9, in main', Cause.NESTED_LAUNCHER),
    ("[1,0]<stderr>:torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", Cause.NESTED_LAUNCHER),
    ("[1,0]<stderr>:horovodrun: error: argument -np is required", Cause.NESTED_LAUNCHER),
    ("[1,0]<stderr>:/etc/mpi/launch.sh: line 371: exec: /app/train: cannot execute: Permission denied", Cause.SCRIPT_WITHOUT_BASH),
    ("[1,1]<stderr>:/etc/mpi/launch.sh: line 498: /var/tmp/t/train: Permission denied", Cause.SCRIPT_WITHOUT_BASH),
    ("[1,0]<stderr>:/etc/mpi/launch.sh: /app/run: /bin/bash^M: bad interpreter: No such file or directory", Cause.SCRIPT_WITHOUT_BASH),
    ("[1,0]<stderr>:/etc/mpi/launch.sh: line 371: /app/run: cannot execute: required file not found", Cause.SCRIPT_WITHOUT_BASH),
    ("[1,0]<stderr>:/etc/mpi/launch.sh: line 371: /app/run: cannot execute binary file: Exec format error", Cause.SCRIPT_WITHOUT_BASH),
    ("mpiexec was unable to launch the specified application as it lacked permissions to execute an executable:", Cause.SCRIPT_WITHOUT_BASH),
    ("Authentication refused: bad ownership or modes for file /run/airflow-mpi/ssh/authorized_keys", Cause.SSHD_BAD_MODES),
    ("Authentication refused: bad ownership or modes for directory /run/airflow-mpi/ssh", Cause.SSHD_BAD_MODES),
    ("root@job-worker-0.job: Permission denied (publickey).", Cause.SSH_KEY_REFUSED),
    ("ssh: connect to host job-worker-0.job port 22: Connection refused", Cause.SSHD_NOT_LISTENING),
    ("[airflow-mpi]   job-worker-0.job: port closed: nothing listens on port 22: sshd is not running", Cause.SSHD_NOT_LISTENING),
    ("Host key verification failed.", Cause.HOST_KEY_MISMATCH),
    ("  w-1.job: host key mismatch: the host answering as w-1.job is not this job's pod", Cause.HOST_KEY_MISMATCH),
    ("  w-1.job: not resolving: w-1.job has no address (pod not running yet)", Cause.HOST_NOT_RESOLVING),
    ("ssh: Could not resolve hostname job-worker-0.job: Name or service not known", Cause.HOST_NOT_RESOLVING),
]  # fmt: skip

# Lines a healthy job prints: none may be taken for a failure.
ORDINARY = [
    "[airflow-mpi] Starting MPI worker job-worker-0: sshd on port 22",
    "Server listening on 0.0.0.0 port 22.",
    "Accepted publickey for root from 10.244.3.2 port 40000 ssh2: ED25519 SHA256:abc",
    "MPI_HOSTS=job-master-0.job:1,job-worker-0.job:1",
    "[1,0]<stdout>:epoch 3 loss 0.1234 acc 0.91",
    "[1,0]<stderr>:INFO:root:using torch.distributed with the gloo backend, world size 3",
    "[1,1]<stderr>:PermissionError: [Errno 13] Permission denied: '/data/checkpoint.pt'",
    "/etc/mpi/launch.sh: line 68: /run/airflow-mpi/ssh/id_ed25519: Permission denied",  # not a rank's exec
    "[1,0]<stdout>:[INFO] [comm.py:700:init_distributed] Initializing TorchBackend in DeepSpeed with backend gloo",
    "[1,0]<stdout>:Rank 0 launched on host job-master-0",
]


@pytest.mark.parametrize(("line", "cause"), SAMPLES, ids=[f"{c.value}:{i}" for i, (_, c) in enumerate(SAMPLES)])
def test_each_real_message_is_diagnosed(line: str, cause: Cause) -> None:
    found = diagnose([line])
    assert [d.cause for d in found] == [cause]
    assert found[0].evidence == line.strip()


def test_every_cause_has_a_real_sample() -> None:
    assert {cause for _, cause in SAMPLES} == set(Cause)


@pytest.mark.parametrize("line", ORDINARY)
def test_ordinary_output_is_no_failure(line: str) -> None:
    assert diagnose([line]) == []


def test_every_cause_names_a_fix_and_an_existing_doc_section() -> None:
    for failure in KNOWN_FAILURES:
        assert failure.summary and failure.fix and failure.patterns, failure.cause
        assert failure.anchor in ANCHORS, failure.anchor
    causes = [f.cause for f in KNOWN_FAILURES]
    assert sorted(causes) == sorted(Cause)  # exactly one entry per cause


def test_explain_leads_with_the_most_specific_cause() -> None:
    lines = [
        "root@w-0.job: Permission denied (publickey).",
        "Authentication refused: bad ownership or modes for file /run/airflow-mpi/ssh/authorized_keys",
    ]
    text = explain("MPI job j failed: ", diagnose(lines), "original message")
    first, fix, seen, also = text.splitlines()[:4]
    assert first.startswith("MPI job j failed: sshd (StrictModes) refused the job key")
    assert (
        fix.startswith("  fix: keep the job's ssh files 0600") and "docs/contract.md#permission-denied-publickey" in fix
    )
    assert seen == f"  seen: {lines[1]}"
    assert also.startswith("  also: sshd refused the job's key")
    assert text.endswith("\noriginal message")
    assert explain("x: ", [], "unchanged") == "unchanged"


def test_the_collector_keeps_the_first_line_per_cause_in_bounded_memory() -> None:
    collector = EvidenceCollector()
    collector.feed(["bash: line 1: orted: command not found"])
    collector.feed([f"[1,0]<stdout>:step {i}" for i in range(EARLY_LINES)])
    collector.feed(
        ["bash: line 7: orted: command not found", "[1,0]<stderr>:mpirun has detected an attempt to run as root"]
    )
    collector.feed(["ssh: connect to host w port 22: Connection refused"])  # mpiexec's own line: always read
    found = {d.cause: d.evidence for d in collector.diagnoses()}
    assert found == {
        Cause.ORTED_NOT_FOUND: "bash: line 1: orted: command not found",
        Cause.SSHD_NOT_LISTENING: "ssh: connect to host w port 22: Connection refused",
    }  # the late rank line was skipped: past EARLY_LINES only untagged lines are searched
    collector.feed(["[1,0]<stderr>:mpirun has detected an attempt to run as root"], every_line=True)
    assert Cause.MPIRUN_AS_ROOT in {d.cause for d in collector.diagnoses()}
    assert len(collector._first) <= len(KNOWN_FAILURES)


def test_evidence_is_cut_and_huge_lines_do_not_stall() -> None:
    line = "bash: line 1: orted: command not found " + "x" * 10_000_000
    [found] = diagnose([line])
    assert found.cause is Cause.ORTED_NOT_FOUND and len(found.evidence) <= 300


def test_merge_keeps_one_per_cause_most_specific_first() -> None:
    refused = Diagnosis(Cause.SSH_KEY_REFUSED, "a")
    modes = Diagnosis(Cause.SSHD_BAD_MODES, "b")
    assert merge_diagnoses([refused], [modes, Diagnosis(Cause.SSH_KEY_REFUSED, "c")]) == [modes, refused]
