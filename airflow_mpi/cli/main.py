"""``airflow-mpi``: render a job's Kubernetes objects, check this machine, or run a job locally.

airflow-mpi render SPEC.yaml [--backend kubernetes|volcano|mpijob] [--run-id ID] [--namespace NS]
    [--show-secrets] [--json]
airflow-mpi validate SPEC.yaml
airflow-mpi run SPEC.yaml [--run-id ID]     (local backend, same code path as the operator; each run its own id)
airflow-mpi run SPEC.yaml [--backend kubernetes|volcano|mpijob] [--kubeconfig F | --conn-id ID]  (on a cluster)
airflow-mpi jobs | logs JOB [-f] | delete JOB | gc --older-than D [--yes]  (jobs on a cluster: cli_cluster)
airflow-mpi stacks JOB [--wait S] [--local]  (every rank's Python stack of a running job, local or cluster)
airflow-mpi doctor [--local | --image IMAGE] [--mpi openmpi|mpich|intel] [--mpiexec LAUNCHER]
    (can this machine, or this image, run a job's pods?)
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from airflow_mpi import __version__
from airflow_mpi.backends import BACKEND_NAMES, KUBERNETES_KINDS
from airflow_mpi.cli.cluster import add_cluster_args, add_cluster_commands
from airflow_mpi.exceptions import BackendError, JobFailed, MPIJobError, SpecError, SpecIssue
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.spec import MPIJobSpec, build_slot_plan
from airflow_mpi.spec.formats import CONTROL, is_dns1123_label
from airflow_mpi.spec.mpi_validation import launcher_problem
from airflow_mpi.spec.mpiexec_args import IMPLEMENTATIONS
from airflow_mpi.spec.types import MPIOptions

if TYPE_CHECKING:
    from airflow_mpi.backends.base import Backend


def load_spec(path: str) -> MPIJobSpec:
    """Read a YAML or JSON spec file (the same field names as ``MPIJobSpec``). Every problem,
    the file's own included, is a ``SpecError`` naming it and the fix."""
    return MPIJobSpec.from_dict(read_spec_data(path))


def read_spec_data(path: str) -> dict[str, Any]:
    """The mapping in a spec file; a missing, unreadable, empty or non-mapping file is a ``SpecError``."""
    where = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([SpecIssue(where, "does not exist", "give the path of a YAML or JSON spec file")]) from None
    except IsADirectoryError:
        raise SpecError([SpecIssue(where, "is a directory", "give the path of a YAML or JSON spec file")]) from None
    except PermissionError:
        raise SpecError([SpecIssue(where, "cannot be read (permission denied)", "make it readable")]) from None
    except UnicodeDecodeError as error:
        raise SpecError(
            [SpecIssue(where, f"is not UTF-8 text (byte {error.start})", "save the spec as UTF-8 YAML or JSON")]
        ) from None
    except OSError as error:
        raise SpecError([SpecIssue(where, f"cannot be read: {error.strerror}", "check the path")]) from None
    if not text.strip():
        raise SpecError([SpecIssue(where, "is empty", "write the job's fields, at least name and command")])
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(
            [SpecIssue(where, f"is not valid YAML or JSON: {_yaml_problem(error)}", "fix the syntax")]
        ) from None
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({type(data).__name__})"
        raise SpecError(
            [
                SpecIssue(
                    where,
                    f"holds {kind}, not a mapping of fields",
                    "write key: value pairs (name: ..., command: [...])",
                )
            ]
        )
    return data


def _yaml_problem(error: yaml.YAMLError) -> str:
    """The parser's problem and where, without its internal context dump."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(problem)


def cli_identity(spec: MPIJobSpec, args: argparse.Namespace, run_id: str = "manual") -> RunIdentity:
    """The run identity from ``--dag-id``, ``--task-id``, ``--run-id`` (else ``run_id``), ``--try-number``."""
    return RunIdentity(
        dag_id=args.dag_id,
        task_id=args.task_id or spec.name,
        run_id=args.run_id or run_id,
        try_number=args.try_number,
    )


def invocation_run_id(now: float, token: str) -> str:
    """``airflow-mpi run``'s own run id: two runs of one spec at once never share a job."""
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H-%M-%S")
    return f"cli__{stamp}_{token}"


def cmd_render(args: argparse.Namespace) -> int:
    """Exactly what the chosen backend creates (with its gang setting, if the spec has one)."""
    from airflow_mpi.kinds.registry import kind_for_backend

    spec = load_spec(args.spec)
    kind = kind_for_backend(args.backend)
    plan = kind.render_plan(spec, cli_identity(spec, args))
    objects = kind.render(plan, spec.pod.namespace or args.namespace, redact_secrets=not args.show_secrets)
    if args.json:
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"# airflow-mpi job {plan.job_name}: mpiexec command line of the master:\n")
        sys.stdout.write(f"#   {' '.join(plan.mpiexec_argv)}\n")
        yaml.dump_all(objects, sys.stdout, Dumper=_BlockDumper, sort_keys=False, width=120)
    return 0


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the launch script, hostfile, args) as readable ``|`` blocks."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _represent_str)


def cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    slots = build_slot_plan(spec)
    print(f"{args.spec}: valid. {slots.case_text}; MPI_NP={spec.mpi.np or slots.np} on {slots.rank_nodes} pod(s)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    backend = None
    name = args.backend
    if name is None:  # the connection's own backend, if one is named
        from airflow_mpi.cli.cluster import connection_backend

        name = connection_backend(args.conn_id) if args.conn_id else "local"
    if name != "local":
        from airflow_mpi.cli.cluster import cluster_backend

        backend, _ = cluster_backend(args, args.backend)  # None: the connection's own kind
    identity = cli_identity(spec, args, invocation_run_id(time.time(), secrets.token_hex(6)))
    return run_job_from_cli(spec, identity, state_dir=args.state_dir, backend=backend)


def run_job_from_cli(
    spec: MPIJobSpec, identity: RunIdentity, state_dir: str | None = None, backend: Backend | None = None
) -> int:
    """``airflow-mpi run``: the operator's flow on the local backend (or the one given), output
    to stdout. Exits with the job's own exit code (e.g. a rank's) when it has one; Ctrl-C or
    SIGTERM removes the job and everything it made."""
    import signal

    from airflow_mpi.backends.local import LocalBackend
    from airflow_mpi.runner.job import JobRunner
    from airflow_mpi.runner.retries import plan_for

    backend = backend if backend is not None else LocalBackend(state_dir=state_dir)
    plan = plan_for(backend, spec, identity)  # an MPIJob's controller names its master

    def emit(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    runner = JobRunner(backend, plan, emit)

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        result = runner.run()
    except KeyboardInterrupt:
        print(f"airflow-mpi: interrupted; job {plan.job_name} removed", file=sys.stderr)
        return 130
    except (JobFailed, BackendError) as error:
        print(f"airflow-mpi: {error}", file=sys.stderr)
        if isinstance(error, JobFailed) and error.exit_code:
            return error.exit_code
        return 1
    emit(f"airflow-mpi: done in {result.durations_s['total']}s; result: {result.result}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """The pre-job checks here (``--local``, the default) or in an image (``--image``)."""
    from airflow_mpi.doctor.checks import render_doctor_report
    from airflow_mpi.doctor.run import run_image_doctor, run_local_doctor

    if args.image:
        from airflow_mpi.backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend(kubernetes_conn_id=args.kubernetes_conn_id, namespace=args.namespace)
        namespace = backend.namespace_for(MPIJobSpec(name="doctor", command=("true",)))
        report = run_image_doctor(
            backend.objects.core, args.image, namespace, timeout=args.timeout, mpi=args.mpi, mpiexec=args.mpiexec
        )
    else:
        report = run_local_doctor(mpi=args.mpi, mpiexec=args.mpiexec)
        if args.clean and not report.missing:
            from airflow_mpi.backends.local import LocalBackend

            for item in LocalBackend(state_dir=args.state_dir).sweep_orphans():
                print(f"removed: {item}")
    for problem in report.missing:
        print(f"missing: {problem}")
    if not args.image and not report.missing:
        print("ok: this machine can run the local backend (root, iproute2, util-linux, sshd, an MPI)")
    extra = [line for line in report.output if line.startswith("airflow-mpi doctor: the ")]
    for line in [*render_doctor_report(report.results, f"checks on {report.where}:"), *extra]:
        print(line)
    return 0 if report.ok else 1


def _text_arg(what: str) -> Callable[[str], str]:
    """An identity part (run id, dag id, task id): any text on one line."""

    def check(text: str) -> str:
        if not text.strip() or CONTROL.search(text) or len(text) > 250:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {what}: give 1 to 250 characters on one line, e.g. 'manual'"
            )
        return text

    return check


def _namespace_arg(text: str) -> str:
    if not is_dns1123_label(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name: use at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _image_arg(text: str) -> str:
    if not text or re.search(r"\s", text) or CONTROL.search(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an image reference: give e.g. 'registry.example/train:1'")
    return text


def _launcher_arg(text: str) -> str:
    if problem := launcher_problem(text):
        raise argparse.ArgumentTypeError(f"{problem}: give e.g. mpiexec or /usr/bin/mpiexec.mpich")
    return text


def _directory_arg(text: str) -> str:
    if not text.startswith("/") or CONTROL.search(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute path: give e.g. /run/airflow-mpi-local")
    return text


RUN_ID_HELP = "run id that names the job (default: manual)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-mpi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"airflow-mpi {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def add_spec_args(sub: argparse.ArgumentParser, run_id_help: str = RUN_ID_HELP) -> None:
        sub.add_argument("spec", help="job spec file (YAML or JSON; '-' for stdin)")
        sub.add_argument("--run-id", default=None, type=_text_arg("run id"), help=run_id_help)
        sub.add_argument("--dag-id", default="cli", type=_text_arg("dag id"), help="dag id of the run identity")
        sub.add_argument(
            "--task-id", default=None, type=_text_arg("task id"), help="task id of the run identity (default: name)"
        )
        sub.add_argument("--try-number", type=_positive_int, default=1, help="try number of the run identity")

    render = commands.add_parser("render", help="print every object the backend creates (no cluster needed)")
    add_spec_args(render)
    render.add_argument(
        "--backend",
        choices=tuple(KUBERNETES_KINDS),
        default="kubernetes",
        help="the backend whose objects to print (default: kubernetes, with the spec's gang setting)",
    )
    render.add_argument(
        "--namespace", default="default", type=_namespace_arg, help="namespace when the spec names none"
    )
    render.add_argument("--show-secrets", action="store_true", help="print the generated keys too")
    render.add_argument("--json", action="store_true", help="a JSON v1 List instead of a YAML stream")
    render.set_defaults(func=cmd_render)

    validate = commands.add_parser("validate", help="check a spec and print its hosts and NP")
    validate.add_argument("spec")
    validate.set_defaults(func=cmd_validate)

    run = commands.add_parser("run", help="run the job (local backend, or on a cluster), output streamed")
    add_spec_args(run, "run id that names the job (default: one of this invocation's own, cli__<time>_<random>)")
    run.add_argument("--state-dir", default=None, type=_directory_arg, help="local backend state directory")
    run.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default=None,
        help="where the job runs (default: the backend of the --conn-id connection, else local)",
    )
    add_cluster_args(run)  # --backend kubernetes|volcano|mpijob: which cluster
    run.set_defaults(func=cmd_run)

    doctor = commands.add_parser(
        "doctor", help="check this machine (--local, the default) or an image (--image) before a job"
    )
    where = doctor.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="check this machine for the local backend (default)")
    where.add_argument("--image", type=_image_arg, help="check this image in one short pod on Kubernetes")
    doctor.add_argument(
        "--kubernetes-conn-id",
        default="kubernetes_default",
        type=_text_arg("connection id"),
        help="Airflow connection to the cluster (--image)",
    )
    doctor.add_argument(
        "--mpi",
        choices=IMPLEMENTATIONS,
        default=MPIOptions.implementation,
        help=f"the job's MPI, as its mpi.implementation (default: {MPIOptions.implementation})",
    )
    doctor.add_argument(
        "--mpiexec",
        default=MPIOptions.mpiexec,
        type=_launcher_arg,
        help=f"the job's launcher, as its mpi.mpiexec (default: {MPIOptions.mpiexec})",
    )
    doctor.add_argument("--namespace", default=None, type=_namespace_arg, help="namespace of the pod (--image)")
    doctor.add_argument("--timeout", type=_positive_int, default=300, help="seconds the pod may take (--image)")
    doctor.add_argument("--clean", action="store_true", help="also remove local jobs left by dead owners")
    doctor.add_argument("--state-dir", default=None, type=_directory_arg, help="local backend state directory")
    doctor.set_defaults(func=cmd_doctor)
    add_cluster_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: Any = args.func(args)
    except BrokenPipeError:  # e.g. `airflow-mpi render spec.yaml | head`
        sys.stderr.close()
        return 0
    except SpecError as error:
        spec = getattr(args, "spec", None)
        print(f"airflow-mpi: {spec + ': ' if spec else ''}{error}", file=sys.stderr)
        return 2
    except MPIJobError as error:
        print(f"airflow-mpi: {error}", file=sys.stderr)
        return 1
    return int(result)


if __name__ == "__main__":
    sys.exit(main())
