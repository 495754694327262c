"""The one error tree of airflow-mpi.

Backends translate their own failures (subprocess, HTTP, Kubernetes API) into these at one
boundary with ``raise ... from e``; the operator turns them into task failures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class MPIJobError(Exception):
    """Base of every error this package raises on purpose."""


@dataclass(frozen=True)
class SpecIssue:
    """One thing wrong with a job spec: the field path, what is wrong, and how to fix it."""

    field: str
    problem: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.field}: {self.problem}"
        return f"{text}; {self.fix}" if self.fix else text


class SpecError(MPIJobError, ValueError):
    """The job spec is invalid. Raised before anything is created; lists every issue found."""

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        self.issues = tuple(issues)
        count = len(self.issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"invalid MPI job spec ({count} problem{'s' if count != 1 else ''}):\n{lines}")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(issue.field for issue in self.issues)


class BackendUnavailable(MPIJobError):
    """The backend cannot run here (missing privilege, tool, cluster access or configuration)."""


class BackendError(MPIJobError):
    """A request to the place that runs the pods failed; the subclass says which kind."""


class LaunchError(BackendError):
    """Creating the job's pods or shared objects failed."""


class JobNameTaken(LaunchError):
    """The job's name is held by another job's object (another deployment, task, run or try):
    it is left alone, and the message names both owners."""


class BackendRequestFailed(BackendError):
    """Reading, listing, deleting or following something of a job failed (not a create)."""


class BackendUnreachable(BackendError):
    """The place that runs the pods did not answer (refused, silent, or only errors) for longer
    than the bound a wait allows; the job's pods may still run there."""


class JobNotFound(BackendError):
    """No job of this name where the backend looks (never created, or already deleted)."""


class SshdNotReady(LaunchError):
    """Some worker's sshd never accepted the job key within the startup timeout."""

    def __init__(self, message: str, problems: Sequence[str] = (), *, causes: Sequence[str] = ()) -> None:
        self.problems = tuple(problems)
        self.causes = tuple(causes)  # diagnosis.Cause values the workers' logs showed
        super().__init__(message)


class JobFailed(MPIJobError):
    """The MPI job ended without success; names the failing pod or rank and what it printed."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        pod: str | None = None,
        rank: int | None = None,
        tail: Sequence[str] = (),
        causes: Sequence[str] = (),
    ) -> None:
        self.exit_code = exit_code
        self.pod = pod
        self.rank = rank
        self.tail = tuple(tail)
        self.causes = tuple(causes)  # diagnosis.Cause values recognised in the pods' output
        super().__init__(message)


class JobHung(JobFailed):
    """No rank made progress for ``progress_timeout``: every rank's stack was logged, then the job
    was ended."""


class JobTimeout(JobFailed):
    """The job ran past its ``timeout`` and was ended."""
