"""`make test`: the real-Node tier (tests/nodes, then the unit tests and some of the k8s tier's) in
a pytest session of its own, beside the session that runs every other test, both at once.

Both mostly wait (on kubelets and containers, on sshd, Airflow and the API server), so on a
2-core machine side by side they take about as long as the longer one. Each tier checks what it
leaves behind and only that (tests/leaks.py: processes in a real Node's cgroups are the Node
tier's; its host-state check leaves the local sandbox's namespaces to the others). The main
session's output is live; the Node session's follows once both end. Explicit test paths run one
session, as plain pytest does.

    python -m tests.lanes [pytest options]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODE_TIER = "tests/nodes"
# After the real-Node tier, in its session: tests that make nothing a leak check could see (no
# sandbox, sshd or mpiexec: the unit tests, and the API double's modules whose kubelet is scripted
# and whose Airflow processes take most of the k8s tier's time, about 610 s of its 1074 alone).
# They balance the two sessions: the main one was 4912 s in CI, the Node one 4157 s.
BESIDE_NODES = (
    "tests/unit",
    *(f"tests/k8s/test_{name}.py" for name in ("deferred_every_kind", "deferred_live_log", "airflow_ui", "retries",
                                               "ownership", "wait_rules_table", "trigger_progress_pattern",
                                               "manifest_properties")),
)  # fmt: skip
# Last in the main session, in this order: by then the Node tier's start (images imported into
# containerd, three kubelets, Airflow deployed) is long over and it has most likely ended.
# - tests/browser: its deferred test needs the master's lines on the page while the task is
#   deferred; run first, beside that start, the API double in pytest's own process took 28 s to
#   create the job and its log reached the trigger only once the master had ended.
# - tests/cluster: both sessions start mpi-operator, whose health port is fixed, so one waits for
#   the other (``controlplane.host_lock``).
MAIN_LAST = ("tests/browser", "tests/cluster")


def names_tests(args: list[str]) -> bool:
    """Whether the arguments pick tests by path or node id (then one plain session runs them)."""
    return any(not arg.startswith("-") and ("::" in arg or Path(arg).exists()) for arg in args)


def main_session_paths() -> list[str]:
    """Every test directory but the Node session's, MAIN_LAST last; the Node session's modules
    in those directories left out."""
    others = {NODE_TIER, *BESIDE_NODES, *MAIN_LAST}
    found = sorted(str(d) for d in Path("tests").iterdir() if d.is_dir() and any(d.rglob("test_*.py")))
    paths = [d for d in found if d not in others] + [d for d in MAIN_LAST if d in found]
    return paths + [f"--ignore={module}" for module in BESIDE_NODES if module.endswith(".py")]


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if names_tests(args):
        return subprocess.call([*pytest, *args])
    if missing := [path for path in BESIDE_NODES if not Path(path).exists()]:
        print(f"tests/lanes.py: BESIDE_NODES names what is not there: {missing}", file=sys.stderr)
        return 2
    handle, name = tempfile.mkstemp(prefix="airflow-mpi-node-tier-", suffix=".log")
    log = Path(name)
    started = time.monotonic()
    main_rc = nodes_rc = None
    try:
        with os.fdopen(handle, "wb") as out:
            nodes = subprocess.Popen([*pytest, NODE_TIER, *BESIDE_NODES, *args], stdout=out, stderr=subprocess.STDOUT)
        signal.signal(signal.SIGTERM, _interrupted)
        main = subprocess.Popen([*pytest, *main_session_paths(), *args])
        try:
            main_rc = main.wait()
            main_s = time.monotonic() - started
            nodes_rc = nodes.wait()
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): both sessions tear their clusters down
            for session in (main, nodes):
                session.send_signal(signal.SIGINT)
            for session in (main, nodes):
                session.wait()
            raise
    finally:  # the Node session's output, whatever happened
        print(f"\n{'=' * 30} the real-Node tier ({NODE_TIER}), run beside the rest {'=' * 30}", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        log.unlink()
    print(
        f"\nlanes: the rest exited {main_rc} after {main_s:.0f}s; the real-Node tier exited {nodes_rc}; "
        f"{time.monotonic() - started:.0f}s in all",
        flush=True,
    )
    return main_rc or nodes_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
