"""The rules of the command: a program mpiexec can start on every slot, never a second launcher.

mpiexec already starts one process per slot: a launcher under it (deepspeed, torchrun, horovodrun,
mpirun) would start its own processes and the ranks would clash (docs/contract.md#failures-and-fixes).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import CONTROL

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

LAUNCHERS = {
    "deepspeed": "DeepSpeed's launcher",
    "torchrun": "torchrun",
    "horovodrun": "horovodrun",
    "mpirun": "mpirun",
    "mpiexec": "mpiexec",
    "accelerate": "accelerate's launcher",
}
LAUNCHER_MODULES = ("deepspeed.launcher", "torch.distributed.run", "torch.distributed.launch")
SCRIPT_INTERPRETERS = {".sh": "bash", ".bash": "bash", ".py": "python", ".pl": "perl"}
SHELLS = {"bash", "sh", "dash", "zsh"}
# Words that run the next word as the command: `env X=1 deepspeed ...` is still deepspeed.
COMMAND_PREFIXES = {"env", "exec", "nohup", "time", "nice", "stdbuf", "numactl", "taskset"}


def check_command(spec: MPIJobSpec) -> list[SpecIssue]:
    command = spec.command
    if not command:
        return [SpecIssue("command", "is empty", "give the entry as an argv list, e.g. ['python', '/app/train.py']")]
    issues = []
    for index, arg in enumerate(command):
        if not isinstance(arg, str):
            issues.append(SpecIssue(f"command[{index}]", f"{arg!r} is not a string", "quote it"))
        elif "\0" in arg:
            issues.append(SpecIssue(f"command[{index}]", "contains a NUL byte", "remove it"))
    if issues:
        return issues
    if not command[0].strip() or CONTROL.search(command[0]) or command[0] != command[0].strip():
        issues.append(
            SpecIssue(
                "command[0]",
                f"{command[0]!r} is not a program name (empty, or with spaces or control characters around it)",
                "give the program alone as the first item, e.g. 'python'; each argument is its own item",
            )
        )
    issues += _check_launcher(command)
    program = command[0].rsplit("/", 1)[-1]
    for suffix, interpreter in SCRIPT_INTERPRETERS.items():  # docs/contract.md#script-without-bash
        if program.endswith(suffix):
            issues.append(
                SpecIssue(
                    "command",
                    f"starts with the script {command[0]!r} without an interpreter; mpiexec starts it on remote "
                    "nodes, where it runs only if its mode bits and #! line are right",
                    f"say [{interpreter!r}, {command[0]!r}, ...]",
                )
            )
    return issues


def _check_launcher(command: tuple[str, ...]) -> list[SpecIssue]:
    """A second launcher under mpiexec (docs/contract.md#nested-launcher): first word, behind
    ``env``/``nohup``-style prefixes, or first word of a ``bash -c`` script."""
    words = _effective_command(command)
    if not words:
        return []
    program = words[0].rsplit("/", 1)[-1]
    shown = " ".join(words[:3])
    if program in LAUNCHERS:
        return [
            SpecIssue(
                "command",
                f"starts with {LAUNCHERS[program]} ({shown!r}); mpiexec already starts one process per "
                "slot, and a second launcher inside each would start its own ranks that clash with mpiexec's",
                "run the script itself, e.g. ['python', 'train.py', ...]: under MPI DeepSpeed is a library only",
            )
        ]
    if _is_python(program) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if any(module == m or module.startswith(m + ".") for m in LAUNCHER_MODULES):
            return [
                SpecIssue(
                    "command",
                    f"runs the launcher module {module!r} under mpiexec (two launchers clash ranks)",
                    "run the training script directly: ['python', 'train.py', ...]",
                )
            ]
    return []


def _effective_command(command: tuple[str, ...]) -> list[str]:
    """The words that name what runs: prefixes and VAR=value skipped, a ``sh -c`` script split
    the way the shell would split its first command (a script too clever to split is left alone)."""
    words = list(command)
    while words and (words[0].rsplit("/", 1)[-1] in COMMAND_PREFIXES or re.match(r"^[A-Za-z_]\w*=", words[0])):
        words = words[1:]
        while words and words[0].startswith("-") and len(words) > 1:  # the prefix's own options
            words = words[1:]
    if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in SHELLS and words[1] == "-c":
        first = re.split(r"[;&|\n]", words[2], maxsplit=1)[0]
        try:
            inner = tuple(shlex.split(first))
        except ValueError:
            return words
        return _effective_command(inner) if inner else words
    return words


def _is_python(program: str) -> bool:
    return bool(re.match(r"^python[0-9.]*$", program))
