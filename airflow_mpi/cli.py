"""``airflow-mpi``: render a job's Kubernetes objects, check this machine, or run a job locally.

airflow-mpi render SPEC.yaml [--backend kubernetes|volcano] [--run-id ID] [--namespace NS] [--show-secrets] [--json]
airflow-mpi validate SPEC.yaml
airflow-mpi run SPEC.yaml [--run-id ID]     (local backend, same code path as the operator)
airflow-mpi doctor                          (can this machine run the local backend?)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from airflow_mpi.exceptions import BackendError, JobFailed, MPIJobError, SpecError, SpecIssue
from airflow_mpi.naming import RunIdentity
from airflow_mpi.spec import MPIJobSpec, build_slot_plan


def load_spec(path: str) -> MPIJobSpec:
    """Read a YAML or JSON spec file (the same field names as ``MPIJobSpec``)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError([SpecIssue("<file>", f"{path} is not valid YAML/JSON: {error}")]) from error
    return MPIJobSpec.from_dict(data if data is not None else {})


def cli_identity(spec: MPIJobSpec, args: argparse.Namespace) -> RunIdentity:
    return RunIdentity(
        dag_id=args.dag_id, task_id=args.task_id or spec.name, run_id=args.run_id, try_number=args.try_number
    )


def cmd_render(args: argparse.Namespace) -> int:
    """Exactly what the chosen backend creates (with its gang setting, if the spec has one)."""
    from airflow_mpi.gang import render_gang_manifests
    from airflow_mpi.plan import render_plan
    from airflow_mpi.volcano import render_volcano_manifests

    spec = load_spec(args.spec)
    plan = render_plan(spec, cli_identity(spec, args))
    namespace = spec.pod.namespace or args.namespace
    render = render_volcano_manifests if args.backend == "volcano" else render_gang_manifests
    objects = render(plan, namespace, redact_secrets=not args.show_secrets)
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
    return run_job_from_cli(spec, cli_identity(spec, args), state_dir=args.state_dir)


def run_job_from_cli(spec: MPIJobSpec, identity: RunIdentity, state_dir: str | None = None) -> int:
    """``airflow-mpi run``: the operator's flow on the local backend, output to stdout. Exits
    with the job's own exit code (e.g. a rank's) when it has one."""
    import signal

    from airflow_mpi.backends.local import LocalBackend
    from airflow_mpi.plan import render_plan
    from airflow_mpi.runner import JobRunner

    plan = render_plan(spec, identity)
    backend = LocalBackend(state_dir=state_dir)

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
    from airflow_mpi.backends.local import LocalBackend, check_prerequisites

    problems = check_prerequisites()
    if args.clean and not problems:
        for item in LocalBackend(state_dir=args.state_dir).sweep_orphans():
            print(f"removed: {item}")
    for problem in problems:
        print(f"missing: {problem}")
    if not problems:
        print("ok: this machine can run the local backend (root, iproute2, util-linux, sshd, Open MPI)")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-mpi", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def add_spec_args(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("spec", help="job spec file (YAML or JSON; '-' for stdin)")
        sub.add_argument("--run-id", default="manual", help="run id that names the job (default: manual)")
        sub.add_argument("--dag-id", default="cli", help="dag id of the run identity (default: cli)")
        sub.add_argument("--task-id", default=None, help="task id of the run identity (default: the spec's name)")
        sub.add_argument("--try-number", type=int, default=1, help="try number of the run identity")

    render = commands.add_parser("render", help="print every object the backend creates (no cluster needed)")
    add_spec_args(render)
    render.add_argument(
        "--backend",
        choices=("kubernetes", "volcano"),
        default="kubernetes",
        help="the backend whose objects to print (default: kubernetes, with the spec's gang setting)",
    )
    render.add_argument("--namespace", default="default", help="namespace when the spec names none")
    render.add_argument("--show-secrets", action="store_true", help="print the generated keys too")
    render.add_argument("--json", action="store_true", help="a JSON v1 List instead of a YAML stream")
    render.set_defaults(func=cmd_render)

    validate = commands.add_parser("validate", help="check a spec and print its hosts and NP")
    validate.add_argument("spec")
    validate.set_defaults(func=cmd_validate)

    run = commands.add_parser("run", help="run the job on the local backend, output streamed")
    add_spec_args(run)
    run.add_argument("--state-dir", default=None, help="local backend state directory")
    run.set_defaults(func=cmd_run)

    doctor = commands.add_parser("doctor", help="check this machine for the local backend")
    doctor.add_argument("--clean", action="store_true", help="also remove local jobs left by dead owners")
    doctor.add_argument("--state-dir", default=None, help="local backend state directory")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: Any = args.func(args)
    except BrokenPipeError:  # e.g. `airflow-mpi render spec.yaml | head`
        sys.stderr.close()
        return 0
    except SpecError as error:
        print(f"airflow-mpi: {error}", file=sys.stderr)
        return 2
    except MPIJobError as error:
        print(f"airflow-mpi: {error}", file=sys.stderr)
        return 1
    return int(result)


if __name__ == "__main__":
    sys.exit(main())
