"""sshd readiness: what one ssh login attempt to a worker says, as a problem and its fix.

The operator, the sensor and the local backend share these. The launch script classifies the
same ssh messages the same way in bash: its markers and hints are these, word for word (a test
reads the script and compares). Each problem is explained in docs/contract.md#failures-and-fixes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.spec import Role


class HostProblem(str, Enum):
    OK = "ok"
    NOT_RESOLVING = "not resolving"
    PORT_CLOSED = "port closed"
    KEY_REFUSED = "key refused"
    HOST_KEY_MISMATCH = "host key mismatch"
    NO_ANSWER = "no answer"
    POD_ENDED = "pod ended"
    NOT_READY = "pod not ready"
    SSH_FAILED = "ssh failed"


# (problem, markers in ssh's stderr), checked in order; launch.sh's probe_host matches the same.
SSH_FAILURE_MARKERS: tuple[tuple[HostProblem, tuple[str, ...]], ...] = (
    (
        HostProblem.NOT_RESOLVING,
        ("Could not resolve hostname", "Name or service not known", "Temporary failure in name resolution"),
    ),
    (HostProblem.PORT_CLOSED, ("Connection refused",)),
    (HostProblem.KEY_REFUSED, ("Permission denied",)),
    (HostProblem.HOST_KEY_MISMATCH, ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")),
    (HostProblem.NO_ANSWER, ("timed out", "No route to host", "Network is unreachable")),
)

# What each problem means and how to fix it; ``{host}`` and ``{port}`` are filled in (launch.sh
# prints the first five with ``$host`` and ``$port``).
PROBLEM_HINTS = {
    HostProblem.NOT_RESOLVING: "{host} has no address (pod not running yet, or the headless Service is missing)",
    HostProblem.PORT_CLOSED: "nothing listens on port {port}: sshd is not running in the pod, so mpirun prints "
    "nothing or hangs; check 'ps aux | grep sshd' and 'ss -lntp | grep :{port}' in the pod",
    HostProblem.KEY_REFUSED: "sshd rejected the job key (Permission denied (publickey)): the job's public key "
    "must be in authorized_keys, and sshd refuses key files others can read (files 0600 under a 0700 directory)",
    HostProblem.HOST_KEY_MISMATCH: "the host answering as {host} is not this job's pod "
    "(its host key is not the pinned one)",
    HostProblem.NO_ANSWER: "packets to {host} port {port} are dropped (network policy or routing): allow TCP to "
    "port {port} between the job's pods",
    HostProblem.POD_ENDED: "the pod's process ended before sshd answered",
    HostProblem.NOT_READY: "the pod is not running yet",
    HostProblem.SSH_FAILED: "ssh failed",
}


@dataclass(frozen=True)
class HostProbe:
    host: str
    problem: HostProblem
    detail: str = ""  # the last line ssh printed, or the pod's own reason

    @property
    def ok(self) -> bool:
        return self.problem is HostProblem.OK

    def describe(self, port: int = 22) -> str:
        if self.ok:
            return f"{self.host}: ok"
        hint = PROBLEM_HINTS[self.problem].format(host=self.host, port=port)
        detail = f" [{self.detail}]" if self.detail else ""
        return f"{self.host}: {self.problem.value}: {hint}{detail}"


def classify_ssh_result(host: str, returncode: int, stderr: str) -> HostProbe:
    """One ``ssh host true`` attempt -> what is wrong with the host, if anything."""
    if returncode == 0:
        return HostProbe(host, HostProblem.OK)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {returncode}"
    for problem, markers in SSH_FAILURE_MARKERS:
        if any(marker in stderr for marker in markers):
            return HostProbe(host, problem, last)
    return HostProbe(host, HostProblem.SSH_FAILED, last)


def summarize_not_ready(probes: Sequence[HostProbe], waited: float, port: int = 22) -> str:
    """The failure message when the startup timeout passes: one line per host not ready."""
    failing = [p for p in probes if not p.ok]
    lines = [f"{len(failing)} of {len(probes)} worker host(s) did not accept ssh within {waited:.0f}s:"]
    lines += [f"  {probe.describe(port)}" for probe in failing]
    return "\n".join(lines)


def probes_from_states(job_name: str, states: Sequence[PodState], roles: Mapping[str, Role]) -> list[HostProbe]:
    """Worker readiness from pod states (Kubernetes: the readiness probe is a TCP check of the
    sshd port; the master's launch script then checks a real ssh login from inside the cluster)."""
    by_name = {s.name: s for s in states}
    probes = []
    for pod, role in roles.items():
        if role is not Role.WORKER:
            continue
        host, state = f"{pod}.{job_name}", by_name.get(pod)
        if state is None or state.phase is PodPhase.PENDING:
            detail = f"{state.reason}: {state.message}" if state and state.reason else "pod not running yet"
            probes.append(HostProbe(host, HostProblem.NOT_READY, detail))
        elif state.ended:
            probes.append(HostProbe(host, HostProblem.POD_ENDED, state.describe()))
        elif not state.ready:
            probes.append(HostProbe(host, HostProblem.PORT_CLOSED, "readiness probe on the sshd port failing"))
        else:
            probes.append(HostProbe(host, HostProblem.OK))
    return probes


def ready_since(pods: Iterable[Mapping[str, object]]) -> float | None:
    """When the last of ``pods`` became Ready (epoch seconds, from the API's ``Ready``
    condition), the moment mpiexec may start; None when one of them does not say. Read from the
    pods, so a trigger started again elsewhere finds the same moment."""
    latest: float | None = None
    for pod in pods:
        when = _ready_at(pod)
        if when is None:
            return None
        latest = when if latest is None else max(latest, when)
    return latest


def _ready_at(pod: Mapping[str, object]) -> float | None:
    """When ``pod``'s ``Ready`` condition last turned True (epoch seconds), or None: not Ready."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            try:
                return (
                    datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if isinstance(stamp, str) else None
                )
            except ValueError:
                return None
    return None
