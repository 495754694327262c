"""Known failures, recognised in what a pod printed: each becomes a cause in plain words and its fix.

An MPI job that fails for a setup reason (sshd, keys, PATH, the image, the command) prints the
reason somewhere in the master's or a worker's output, usually above a generic mpiexec error.
``diagnose`` maps output lines to ``Diagnosis`` objects (cause, fix, the line that showed it);
``EvidenceCollector`` keeps the first such line per cause while a job streams, in bounded memory.
The failure builders of both backends (``runner``) and ``airflow-mpi doctor`` (``preflight``) use
them, so one failure reads the same wherever it is caught. docs/contract.md#failures-and-fixes
explains each cause; the anchors below point there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

CONTRACT_DOC = "docs/contract.md"
MAX_EVIDENCE = 300  # characters of the line kept as evidence


class Cause(str, Enum):
    """The failures the platform's users hit most, each diagnosed from pod output."""

    SSHD_PRIVSEP_DIR = "sshd-privsep-dir"
    SSHD_NOT_LISTENING = "sshd-not-listening"
    SSHD_BAD_MODES = "sshd-bad-modes"
    SSH_KEY_REFUSED = "ssh-key-refused"
    HOST_KEY_MISMATCH = "host-key-mismatch"
    HOST_NOT_RESOLVING = "host-not-resolving"
    MPIRUN_AS_ROOT = "mpirun-as-root"
    NESTED_LAUNCHER = "nested-launcher"
    SCRIPT_WITHOUT_BASH = "script-without-bash"
    NO_MPIEXEC = "no-mpiexec"
    NO_SSHD = "no-sshd"
    ORTED_NOT_FOUND = "orted-not-found"


@dataclass(frozen=True)
class KnownFailure:
    cause: Cause
    summary: str  # the cause, in plain words
    fix: str
    anchor: str  # section of docs/contract.md
    patterns: tuple[re.Pattern[str], ...]

    def matches(self, line: str) -> bool:
        return any(pattern.search(line) for pattern in self.patterns)


def _patterns(*texts: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(text) for text in texts)


# Most specific first: a diagnosis list is shown in this order.
KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        Cause.SSHD_PRIVSEP_DIR,
        "sshd exited: its privilege separation directory /run/sshd does not exist",
        "create it before sshd starts: mkdir -p /run/sshd; chmod 0755 /run/sshd (the launch script does; an "
        "image entrypoint or a volume mounted over /run must not remove it)",
        "sshd-missing-privilege-separation-directory",
        _patterns(r"Missing privilege separation directory"),
    ),
    KnownFailure(
        Cause.NO_SSHD,
        "the image has no sshd: /usr/sbin/sshd is missing, so a worker cannot accept mpiexec's ssh logins",
        "install the OpenSSH server in the image (Debian/Ubuntu: apt-get install openssh-server)",
        "missing-mpiexec-or-sshd",
        _patterns(r"/sshd: (No such file or directory|not found)", r"exec: \S*sshd: not found"),
    ),
    KnownFailure(
        Cause.NO_MPIEXEC,
        "the image has no mpiexec on the master's PATH",
        "install the job's MPI in the image so its mpiexec is on the PATH (Debian/Ubuntu: apt-get install "
        "openmpi-bin, or mpich), or name the launcher by its path in mpi.mpiexec",
        "missing-mpiexec-or-sshd",
        _patterns(r"\bmpiexec: (command )?not found", r"\bmpiexec: No such file or directory"),
    ),
    KnownFailure(
        Cause.ORTED_NOT_FOUND,
        "the MPI's daemon is not found in a worker's ssh session: mpiexec starts it there with a non-interactive "
        "ssh command (Open MPI 4: orted, 5: prted, by name on the session's PATH; MPICH and Intel MPI: "
        "hydra_pmi_proxy, by the absolute path it has beside mpiexec on the master)",
        "install the same MPI, at the same path, in every pod's image (Open MPI: orted or prted in a directory on "
        "the image's PATH; the launch script gives sshd sessions the pod's PATH and LD_LIBRARY_PATH); a profile "
        "script does not help, a non-login ssh command never reads it",
        "orted-command-not-found",
        _patterns(
            r"\b(orted|prted): (command )?not found",
            r"\b(orted|prted|hydra_pmi_proxy): No such file or directory",
        ),
    ),
    KnownFailure(
        Cause.MPIRUN_AS_ROOT,
        "mpiexec refused to run as root (Open MPI needs --allow-run-as-root for root)",
        "start ranks through the launch script, which always passes --allow-run-as-root; if your command starts "
        "its own mpirun or mpiexec, remove it (mpiexec already starts one process per slot), or give that one "
        "--allow-run-as-root",
        "running-as-root",
        _patterns(r"has detected an attempt to run as root"),
    ),
    KnownFailure(
        Cause.NESTED_LAUNCHER,
        "a second launcher (deepspeed, torchrun or horovodrun) runs inside the ranks mpiexec started: each "
        "starts its own processes, so ranks clash (wrong world size, the same rank twice, ports in use)",
        "under mpiexec run the training script itself, e.g. ['python', 'train.py', ...]: DeepSpeed and "
        "torch.distributed then read RANK, WORLD_SIZE and LOCAL_RANK from the rank wrapper",
        "nested-launcher",
        _patterns(
            r"deepspeed[./]launcher[./](launch|runner)",
            r"\[launch\.py:\d+:\w+\]",
            r"torch[./]distributed[./](run|launch)\b",
            r"torch\.distributed\.elastic\.",
            r"horovod[./]runner",
            r"\bhorovodrun\b",
        ),
    ),
    KnownFailure(
        Cause.SCRIPT_WITHOUT_BASH,
        "the command is a script run without its interpreter, and the system could not execute it (its mode "
        "bits or its #! line are wrong in the pod)",
        "run it through its interpreter: ['bash', 'run.sh', ...] (and start it with #!/usr/bin/env bash); "
        "a #! line saved with Windows line ends also fails this way",
        "script-without-bash",
        _patterns(
            r"cannot execute: Permission denied",
            # the rank wrapper's exec of a file without its execute bit (bash 5.2 says no more)
            r"^\[\d+,\d+\]<std(?:err|out)>:\S*launch\.sh: line \d+: \S+: Permission denied$",
            r"cannot execute: required file not found",
            r"bad interpreter",
            r"cannot execute binary file",
            r"Exec format error",
            r"lacked permissions to execute an executable",
        ),
    ),
    KnownFailure(
        Cause.SSHD_BAD_MODES,
        "sshd (StrictModes) refused the job key because a key file or one of its directories has modes or an "
        "owner it does not accept",
        "keep the job's ssh files 0600 under a 0700 directory owned by root, and every directory above it not "
        "writable by group or others (the launch script installs them so under /run/airflow-mpi/ssh; an image "
        "or entrypoint must not change those modes)",
        "permission-denied-publickey",
        _patterns(r"bad ownership or modes for (file|directory)"),
    ),
    KnownFailure(
        Cause.SSH_KEY_REFUSED,
        "sshd refused the job's key (Permission denied (publickey))",
        "the job's public key must be in authorized_keys, and with StrictModes sshd refuses key files others can "
        "read or write (files 0600 under a 0700 directory); check that nothing in the image replaces the job's "
        "sshd_config or authorized_keys",
        "permission-denied-publickey",
        _patterns(r"Permission denied \(publickey"),
    ),
    KnownFailure(
        Cause.SSHD_NOT_LISTENING,
        "sshd is not running on a worker, or not on the job's ssh port (Connection refused); a bare mpiexec "
        "then prints nothing or hangs",
        "the worker's log shows sshd's own error; in the pod, 'ps aux | grep sshd' and 'ss -lntp' tell whether "
        "and where it listens; ssh_port must be the port sshd listens on",
        "sshd-not-running",
        _patterns(r"port \d+: Connection refused", r"port closed: nothing listens on port"),
    ),
    KnownFailure(
        Cause.HOST_KEY_MISMATCH,
        "a worker answered ssh with a host key that is not the one pinned for the job (Host key verification failed)",
        "host keys are pinned per job: a host name that resolves to another pod (stale DNS, a name reused by "
        "another job) is refused; check the job's headless Service and pod IPs",
        "host-key-mismatch",
        _patterns(
            r"Host key verification failed",
            r"REMOTE HOST IDENTIFICATION HAS CHANGED",
            r"host key mismatch: the host answering as",
        ),
    ),
    KnownFailure(
        Cause.HOST_NOT_RESOLVING,
        "a worker host name has no address (the pod is not running yet, or the headless Service is missing)",
        "on Kubernetes the job's headless Service <job> (publishNotReadyAddresses) must exist; check "
        "'kubectl get svc <job>' and the pods",
        "host-not-resolving",
        _patterns(
            r"Could not resolve hostname",
            r"Name or service not known",
            r"Temporary failure in name resolution",
            r"not resolving: \S+ has no address",
        ),
    ),
)

BY_CAUSE = {failure.cause: failure for failure in KNOWN_FAILURES}
# One search per line finds the (rare) lines worth a closer look: a job may print millions.
_ANY_MARKER = re.compile("|".join(f"(?:{p.pattern})" for f in KNOWN_FAILURES for p in f.patterns))
MAX_SCANNED = 4096  # characters of a line searched: markers sit near the start of short lines
# Setup failures show in a job's first lines, or in mpiexec's own (untagged) output: past this
# many lines only untagged lines are searched, so a long training log costs nothing here.
EARLY_LINES = 5000


@dataclass(frozen=True)
class Diagnosis:
    """One recognised cause and the line that showed it."""

    cause: Cause
    evidence: str

    @property
    def known(self) -> KnownFailure:
        return BY_CAUSE[self.cause]

    @property
    def summary(self) -> str:
        return self.known.summary

    @property
    def fix(self) -> str:
        return self.known.fix

    @property
    def doc(self) -> str:
        return f"{CONTRACT_DOC}#{self.known.anchor}"


class EvidenceCollector:
    """Feed it every output line of a job; it keeps the first line that shows each cause.

    Memory is bounded by the number of causes, and time by ``EARLY_LINES``: after those, rank
    output (``[job,rank]<stdout>:`` lines) is skipped and only mpiexec's own lines are searched.
    Feed the tails again when the job fails, so nothing near the end is missed."""

    def __init__(self) -> None:
        self._first: dict[Cause, str] = {}
        self._seen = 0

    def feed(self, lines: Iterable[str], *, every_line: bool = False) -> None:
        """Search ``lines``; ``every_line``: rank output too, however late (a failure's tails)."""
        batch = list(lines)
        early = max(0, EARLY_LINES - self._seen)  # how many of these are among the first lines
        self._seen += len(batch)
        if not every_line and len(batch) > early:  # one pass that drops rank output, not a loop
            batch = batch[:early] + [line for line in batch[early:] if not (line[:1] == "[" and ">:" in line[:40])]
        for line in batch:
            head = line[:MAX_SCANNED]
            if not _ANY_MARKER.search(head):
                continue
            for failure in KNOWN_FAILURES:
                if failure.cause not in self._first and failure.matches(head):
                    self._first[failure.cause] = head.strip()[:MAX_EVIDENCE]

    def diagnoses(self) -> list[Diagnosis]:
        """What was seen, most specific cause first."""
        return [Diagnosis(f.cause, self._first[f.cause]) for f in KNOWN_FAILURES if f.cause in self._first]


def diagnose(lines: Iterable[str]) -> list[Diagnosis]:
    """Every known cause the lines show, most specific first, each with the first line showing it."""
    collector = EvidenceCollector()
    collector.feed(lines, every_line=True)
    return collector.diagnoses()


def merge_diagnoses(*groups: Iterable[Diagnosis]) -> list[Diagnosis]:
    """One diagnosis per cause (the first group's evidence wins), most specific first."""
    found: dict[Cause, Diagnosis] = {}
    for group in groups:
        for diagnosis in group:
            found.setdefault(diagnosis.cause, diagnosis)
    return [found[f.cause] for f in KNOWN_FAILURES if f.cause in found]


def explain(lead: str, diagnoses: Sequence[Diagnosis], message: str) -> str:
    """``message`` preceded by the causes: the first line is ``lead`` + the most specific cause,
    then its fix and the line that showed it, then any further cause the same way. Unchanged
    when nothing is recognised."""
    if not diagnoses:
        return message
    first, *others = diagnoses
    lines = [f"{lead}{first.summary}", f"  fix: {first.fix} ({first.doc})", f"  seen: {first.evidence}"]
    for other in others:
        lines += [f"  also: {other.summary}", f"  fix: {other.fix} ({other.doc})", f"  seen: {other.evidence}"]
    return "\n".join([*lines, message])
