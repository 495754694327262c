"""``airflow-mpi`` commands for jobs on a Kubernetes cluster, outside Airflow.

airflow-mpi jobs [--json]                       the jobs in a namespace: identity, phase, age, pods ready, backend
airflow-mpi logs JOB [-f]                       the master's log (-f: follow it live)
airflow-mpi delete JOB                          delete a job and wait until nothing of it is left
airflow-mpi gc --older-than DURATION [--yes]    remove finished or abandoned jobs (dry run by default)
airflow-mpi stacks JOB [--wait S] [--local]     every rank's Python stack, the job going on (a local job too)
airflow-mpi run SPEC --backend kubernetes|volcano|mpijob   (in ``cli``) submit, stream, exit with the job's code

Each takes the cluster as kubectl does (``--kubeconfig``, ``--context``, ``--namespace``) or as
Airflow does (``--conn-id``: an ``mpi`` or a Kubernetes connection, read through Airflow's
connection machinery), and uses the Kubernetes backend's own requests and error messages. A job
of any Kubernetes backend (plain pods, a Volcano Job, an MPIJob) is listed, logged, deleted and
collected through the code of the backend that made it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_mpi.backends import KUBERNETES_KINDS
from airflow_mpi.exceptions import BackendUnavailable
from airflow_mpi.observe.jobtable import gc_verdict, parse_duration, render_table
from airflow_mpi.observe.lines import PartialLine
from airflow_mpi.spec import MPIJobSpec
from airflow_mpi.spec.formats import CONTROL, is_dns1123_label

if TYPE_CHECKING:  # imported when a command runs: `render` and `validate` need no Kubernetes client
    from airflow_mpi.backends.kubernetes import KubernetesBackend

CLI_API_TIMEOUT = 30.0  # seconds the API may stay silent before a command gives up


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """Which cluster, and where in it: kubectl's flags, or an Airflow connection."""
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: its current context)")
    parser.add_argument(
        "--conn-id", default=None, type=_conn_id_arg, help="Airflow connection (type mpi or kubernetes) instead"
    )
    parser.add_argument(
        "--namespace", default=None, type=_namespace_arg, help="namespace (default: the context's or connection's)"
    )
    parser.add_argument(
        "--api-timeout",
        type=_seconds_arg,
        default=CLI_API_TIMEOUT,
        help=f"seconds the API may stay silent before giving up (default {CLI_API_TIMEOUT:.0f})",
    )


CLUSTER_BACKENDS = tuple(KUBERNETES_KINDS)  # `run --backend` and an mpi connection's extra


def cluster_backend(args: argparse.Namespace, kind: str | None = None) -> tuple[KubernetesBackend, str]:
    """The backend (``kind``: kubernetes, volcano or mpijob; default: what ``--conn-id``'s
    connection names, else kubernetes) for the cluster the arguments name, and the namespace."""
    if args.conn_id:
        if args.kubeconfig or args.context:
            raise BackendUnavailable("give either --conn-id or --kubeconfig/--context, not both")
        backend = _backend_from_connection(args.conn_id, args.namespace, args.api_timeout)
    else:
        backend = _backend_from_kubeconfig(args.kubeconfig, args.context, args.namespace, args.api_timeout)
    namespace = backend.namespace_for(MPIJobSpec(name="cli", command=("true",)))
    if kind is not None and kind != backend.name:  # another kind than the connection's, on its cluster
        from airflow_mpi.backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend(
            kubernetes_conn_id=backend.kubernetes_conn_id,
            namespace=namespace,
            kind=KUBERNETES_KINDS[kind],
            api_client=backend.api_client,
            api_timeout=backend.api_timeout,
        )
    return backend, namespace


def _backend_from_kubeconfig(
    path: str | None, context: str | None, namespace: str | None, api_timeout: float
) -> KubernetesBackend:
    from kubernetes import client, config

    from airflow_mpi.backends.kube_connection import configure_client
    from airflow_mpi.backends.kubernetes import KubernetesBackend

    path = path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    if not os.path.isfile(path):
        raise BackendUnavailable(
            f"no kubeconfig at {path}: give --kubeconfig PATH (or set KUBECONFIG), or --conn-id with an Airflow "
            "connection to the cluster"
        )
    configuration = client.Configuration()
    try:
        config.load_kube_config(path, context=context, client_configuration=configuration, persist_config=False)
        contexts, current = config.list_kube_config_contexts(path)
    except (config.ConfigException, ValueError, TypeError, KeyError) as error:
        raise BackendUnavailable(f"kubeconfig {path}: {error}; check the file and --context") from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
    api_client = client.ApiClient(configure_client(configuration))
    return KubernetesBackend(api_client=api_client, namespace=namespace, api_timeout=api_timeout)


def connection_backend(conn_id: str) -> str:
    """The backend an Airflow connection names: an ``mpi`` connection's extra ``backend`` (default
    local); ``kubernetes`` for a Kubernetes connection itself."""
    hook, connection = _read_connection(conn_id)
    if connection.conn_type != "mpi":
        return "kubernetes"
    return str(hook.connection_extras().get("backend") or "local")


def _read_connection(conn_id: str) -> tuple[Any, Any]:
    try:
        from airflow_mpi.hooks.mpi import MPIJobHook
    except ImportError as error:
        raise BackendUnavailable(f"--conn-id needs Airflow ({error}); use --kubeconfig instead") from None
    hook = MPIJobHook(conn_id)
    try:
        return hook, hook.get_connection(conn_id)
    except Exception as error:
        raise BackendUnavailable(f"cannot read Airflow connection {conn_id!r}: {error}") from None


def _backend_from_connection(conn_id: str, namespace: str | None, api_timeout: float) -> KubernetesBackend:
    from airflow_mpi.backends.kubernetes import KubernetesBackend

    hook, connection = _read_connection(conn_id)
    if connection.conn_type != "mpi":  # a Kubernetes connection itself
        return KubernetesBackend(kubernetes_conn_id=conn_id, namespace=namespace, api_timeout=api_timeout)
    extras = hook.connection_extras()
    if (extras.get("backend") or "local") not in CLUSTER_BACKENDS:
        raise BackendUnavailable(
            f"connection {conn_id!r} uses the {extras.get('backend') or 'local'} backend: the cluster commands need "
            f"one whose extra 'backend' is {', '.join(map(repr, CLUSTER_BACKENDS[:-1]))} or {CLUSTER_BACKENDS[-1]!r}, "
            "or a Kubernetes connection"
        )
    return KubernetesBackend(
        kubernetes_conn_id=extras.get("kubernetes_conn_id") or "kubernetes_default",
        namespace=namespace or extras.get("namespace"),
        kind=KUBERNETES_KINDS[extras.get("backend")],
        api_timeout=api_timeout,
    )


def cmd_jobs(args: argparse.Namespace) -> int:
    from airflow_mpi.backends.cluster import list_jobs

    backend, namespace = cluster_backend(args)
    rows = list_jobs(backend, namespace)
    if args.json:
        fields = ("name", "dag_id", "task_id", "run_id", "try_number", "phase", "ready", "age_s", "why", "backend")
        json.dump([{f: getattr(row, f) for f in fields} for row in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not rows:
        print(f"no airflow-mpi jobs in namespace {namespace}")
    else:
        print("\n".join(render_table(rows)))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from airflow_mpi.backends.cluster import follow_master_log, plain_line, read_master_log

    backend, namespace = cluster_backend(args)
    if not args.follow:
        for line in read_master_log(backend, args.job, namespace):
            print(line)
        return 0
    try:
        for batch in follow_master_log(backend, args.job, namespace):
            for line in batch:
                if isinstance(line, PartialLine):
                    continue  # a line still being rewritten (a progress bar): its final state follows
                sys.stdout.write(plain_line(line) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 130  # the job is not this command's: it goes on
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from airflow_mpi.backends.cluster import delete_job

    backend, namespace = cluster_backend(args)
    left = delete_job(backend, args.job, namespace)
    if left:
        print(f"airflow-mpi: job {args.job} is still there: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"deleted job {args.job} in namespace {namespace} (nothing of it is left)")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from airflow_mpi.backends.cluster import delete_job, list_jobs

    backend, namespace = cluster_backend(args)
    chosen, failed = 0, 0
    rows = list_jobs(backend, namespace)
    for row in rows:
        remove, why = gc_verdict(row, args.older_than)
        if not remove:
            print(f"keep          {row.name}: {why}")
            continue
        chosen += 1
        if not args.yes:
            print(f"would delete  {row.name}: {why}")
            continue
        left = delete_job(backend, row.name, namespace)
        failed += bool(left)
        print(f"{'NOT deleted' if left else 'deleted':<13} {row.name}: {why}{f' (left: {left})' if left else ''}")
    if args.yes:
        print(f"{chosen - failed} of {len(rows)} job(s) in namespace {namespace} deleted")
    else:
        print(f"{chosen} of {len(rows)} job(s) in namespace {namespace} would be deleted: run again with --yes")
    return 1 if failed else 0


def cmd_stacks(args: argparse.Namespace) -> int:
    """Every rank's Python stack of a running job, without stopping it: a local job when one of
    that name runs here (or ``--local``), else on the cluster."""
    from airflow_mpi.backends.local import DEFAULT_STATE_DIR, LocalBackend
    from airflow_mpi.backends.sandbox import Sandbox
    from airflow_mpi.observe.stacks import build_report

    backend: Any
    state_dir = args.state_dir or DEFAULT_STATE_DIR
    if args.local or Sandbox.load(Path(state_dir), args.job) is not None:
        backend = LocalBackend(state_dir=state_dir)
    else:
        backend, _ = cluster_backend(args)
    outputs, errors = backend.take_stacks(args.job, args.wait)
    report = build_report(outputs, errors)
    if not report.stacks and not report.errors:
        print(f"airflow-mpi: job {args.job}: no running Python rank registered for stacks", file=sys.stderr)
        return 1
    print("\n".join([f"Python stacks of job {args.job} (most recent call first):", *report.render()]))
    silent = report.silent_ranks()
    if silent:
        print(f"airflow-mpi: rank(s) {', '.join(map(str, silent))} did not answer (see above)", file=sys.stderr)
    return 1 if silent or report.errors else 0


def add_cluster_commands(commands: Any) -> None:
    """``jobs``, ``logs``, ``delete`` and ``gc`` on the ``airflow-mpi`` parser's subcommands."""
    jobs = commands.add_parser("jobs", help="list the jobs in a namespace (Kubernetes)")
    add_cluster_args(jobs)
    jobs.add_argument("--json", action="store_true", help="a JSON list instead of a table")
    jobs.set_defaults(func=cmd_jobs)

    logs = commands.add_parser("logs", help="print a job's master log (Kubernetes)")
    logs.add_argument("job", type=_job_arg, help="job name, as `airflow-mpi jobs` lists it")
    logs.add_argument("-f", "--follow", action="store_true", help="follow the log until the master ends")
    add_cluster_args(logs)
    logs.set_defaults(func=cmd_logs)

    delete = commands.add_parser("delete", help="delete a job and wait until it is gone (Kubernetes)")
    delete.add_argument("job", type=_job_arg, help="job name, as `airflow-mpi jobs` lists it")
    add_cluster_args(delete)
    delete.set_defaults(func=cmd_delete)

    stacks = commands.add_parser(
        "stacks", help="print every rank's Python stack of a running job, without stopping it (local or Kubernetes)"
    )
    stacks.add_argument("job", type=_job_arg, help="job name, as `airflow-mpi jobs` or the task log names it")
    stacks.add_argument(
        "--wait", type=_positive_seconds_arg, default=5, help="seconds each rank has to answer (default 5)"
    )
    stacks.add_argument("--local", action="store_true", help="a job of the local backend (default: when one runs here)")
    stacks.add_argument("--state-dir", default=None, help="local backend state directory")
    add_cluster_args(stacks)
    stacks.set_defaults(func=cmd_stacks)

    gc = commands.add_parser("gc", help="remove finished or abandoned jobs (Kubernetes; dry run by default)")
    gc.add_argument(
        "--older-than", required=True, type=_duration_arg, help="only jobs older than this (e.g. 30m, 2h, 1d)"
    )
    gc.add_argument("--yes", action="store_true", help="delete them (default: only print what would go and why)")
    add_cluster_args(gc)
    gc.set_defaults(func=cmd_gc)


def _checked(check: Callable[[str], bool], what: str, example: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not check(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: {example}")
        return text

    return parse


_job_arg = _checked(
    is_dns1123_label, "a job name", "use the NAME column of `airflow-mpi jobs` (lowercase letters, digits, '-')"
)
_namespace_arg = _checked(
    is_dns1123_label, "a namespace name", "use at most 63 lowercase letters, digits and '-', e.g. ml-training"
)
_conn_id_arg = _checked(
    lambda text: bool(text.strip()) and not CONTROL.search(text) and len(text) <= 250,
    "a connection id",
    "give the id of an Airflow connection, e.g. mpi_k8s",
)


def _duration_arg(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return seconds


def _seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 1 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds from 1 to 86400 (default {CLI_API_TIMEOUT:.0f})"
        )
    return seconds


def _positive_seconds_arg(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds from 1 to 600")
    return int(text)
