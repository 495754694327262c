"""Airflow deployed inside the real cluster (the ``airflow`` fixture: the official chart's layout,
KubernetesExecutor, two triggerers, PostgreSQL), driven as users drive it: through its REST API
(tests/airflow_rest.py) and ``airflow`` commands in its pods, the provider talking to the cluster
with the workers' and the triggerer's own ServiceAccount tokens under the Roles of
docs/guides/rbac.md.

- the walkthrough (docs/guides/kubernetes-walkthrough.md) step by step, each with its own check;
- the example DAG through the REST API, waiting and deferrable: three ranks on three Nodes, the
  local run's accuracy, the ``train`` log live and complete, the "MPI job" link; the same in a
  real browser signed in to the deployment's UI (the ranks' lines on the task's page while it
  trains, the link on its Details tab), and the ``mpi`` connection form;
- a triggerer pod deleted under a deferred job: another triggerer takes the trigger over;
- a task pod killed while its job trains: the retry reattaches, the job runs once;
- a job longer than the tokens' 10-minute life, waiting and deferred at once;
- the workers' Role without any one of its verbs: the task fails before creating anything (a
  task for each verb, each under a ServiceAccount of its own, all in one run).

After each test nothing of a job is left in namespace ``training``. Every rank takes a whole
core (the ranks are the cores, one per rank) and the Nodes have two each, some of it Airflow's:
a 3-rank job takes a core on each of the three Nodes, so the example's two runs go one after the
other. The long job's two single-rank runs take a core on two Nodes for 12.5 minutes: they start
with the module's first test and run beside the walkthrough, the takeover test (a single rank
on the third Node) and the Role tests (which create no job), which would otherwise add their time
to the tier; the example's runs and the reattach test come after they end.

The tier's own DAGs are tests/nodes/dags/mpi_in_cluster_dags.py: the deployment's DAGs folder
holds them beside the repository's dags/.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from tests.airflow_rest import FINISHED_TASK, JSON, NDJSON, AirflowREST, LogFollow
from tests.browser.conftest import ARTIFACTS, browser  # noqa: F401 (the fixture)
from tests.browser.pages import button, links_named, page_text, press, sign_in, tab
from tests.cluster.cluster import REPO
from tests.cluster.conftest import CORE_LEFT, objects_left
from tests.cluster.image import TRAIN_IMAGE
from tests.cluster.kubeapi import KubeApi

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

EXAMPLE = "mpi_training_pipeline"
LINES_DAG, ROLE_DAG = "mpi_lines", "mpi_role_checks"
RBAC_PAGE = REPO / "docs" / "guides" / "rbac.md"
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# Longer than the ServiceAccount tokens' 10 minutes (the kubelet renews them at 8): the long job.
LONG_JOB_SECONDS = 750
assert LONG_JOB_SECONDS - 120 > 600, "the long job's lines must go on past the tokens' life"
# The job under a triggerer that is deleted: long enough for Airflow to see the triggerer gone
# (its heartbeat older than [triggerer] triggerer_health_check_threshold) and hand the trigger on.
TAKEOVER_JOB_SECONDS = 180
RANK_LINE = re.compile(r"rank (\d+) line (\d{5})")  # mpi_lines' ranks
EPOCH_LINE = re.compile(r"<stdout>:epoch \d+/")  # the example's training
# The example's epochs, here and in the local run it is compared with: enough for the log to be
# read several times while the ranks train, also when the ranks' start starves a triggerer of CPU
# (3 ranks take the Nodes' 2 cores) and its trigger follows late: at 30 (a few seconds of epochs
# after DeepSpeed's start) a late trigger once read every epoch in one go. 120: 16 s of training
# on the local backend, about 30 s here.
EXAMPLE_EPOCHS = 120


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(airflow: Any) -> AirflowREST:
    """The REST API as the deployment's admin, once every DAG this module runs is parsed."""
    rest = AirflowREST(airflow.url, airflow.user, airflow.password)
    for dag_id in (EXAMPLE, LINES_DAG, ROLE_DAG):
        wait(f"DAG {dag_id} in the deployment (its DAGs folder holds dags/ and tests/nodes/dags/)",
             lambda d=dag_id: rest.dag(d), 240, rest)  # fmt: skip
        rest.unpause(dag_id)
    return rest


# The long jobs' names while they run beside the other tests (their objects are not a leak then).
RUNNING_BESIDE: set[str] = set()


def left_in_training(airflow: Any) -> list[str]:
    """What is left of any job in ``training`` but of the long jobs still running beside."""
    left = objects_left(airflow.cluster.api(), airflow.training, CORE_LEFT)
    return [name for name in left if not any(job in name for job in RUNNING_BESIDE)]


@pytest.fixture(autouse=True)
def training_left_clean(airflow: Any) -> Iterator[None]:
    """Nothing of any job (pods, Services, Secrets, ConfigMaps, Leases) left in ``training``."""
    yield
    with contextlib.suppress(TimeoutError):
        wait_plain("training empty", lambda: not left_in_training(airflow), 120)
    assert left_in_training(airflow) == []


@dataclass
class LongJobs:
    """The long job's two runs (waiting and deferred), each followed from when it runs."""

    runs: dict[str, str]
    followed: dict[str, Followed]
    token_before: str


@pytest.fixture(scope="module")
def long_jobs(airflow: Any, client: AirflowREST) -> Iterator[LongJobs]:
    """Started by the first test that names it; ``test_a_job_longer_than_the_token_life...``
    waits for their end. Should that test not run, they are failed here at the module's end."""
    code, before = airflow.exec("triggerer", ["cat", TOKEN])
    assert code == 0, before
    conf = {"seconds": LONG_JOB_SECONDS, "workers": 0}
    runs = {
        mode: client.trigger(LINES_DAG, {**conf, "deferrable": mode == "deferred"}) for mode in ("waiting", "deferred")
    }
    try:
        followed = {mode: follow_try(client, LINES_DAG, run_id, RANK_LINE, every=5.0, timeout=LONG_JOB_SECONDS + 900)
                    for mode, run_id in runs.items()}  # fmt: skip
        for run_id in runs.values():
            ref = wait_plain(
                "the long job's name in XCom", lambda r=run_id: client.xcom(LINES_DAG, r, "train", key="mpi_job"), 300
            )
            RUNNING_BESIDE.add(ref["job"])
        yield LongJobs(runs, followed, before)
    finally:
        for run_id in runs.values():
            if client.run(LINES_DAG, run_id)["state"] not in ("success", "failed"):  # the test did not run
                client.patch(f"/api/v2/dags/{LINES_DAG}/dagRuns/{run_id}", {"state": "failed"})
        with contextlib.suppress(TimeoutError):
            wait_plain(
                "the long jobs removed",
                lambda: (
                    not left_in_training(airflow)
                    and not objects_left(airflow.cluster.api(), airflow.training, CORE_LEFT)
                ),
                180,
            )
        RUNNING_BESIDE.clear()


# What the local backend's run of the example gives with EXAMPLE_EPOCHS (``airflow dags test
# mpi_training_pipeline -c '{"epochs": 120}'``: 0.9800, the same on every run, the training being
# seeded). Not run here: a local job in this session would be a leak to the session beside it.
LOCAL_ACCURACY = 0.98


@pytest.fixture(scope="module")
def ui(airflow: Any, browser: Any) -> Any:  # noqa: F811 (the fixture imported above)
    """Chromium signed in to the deployment's UI (its api-server) as its admin."""
    sign_in(browser, airflow.url, airflow.user, airflow.password, wait_plain)
    return browser


# The walkthrough's "MPI job" link (step 4's job_url_template), for a job in ``training``.
JOB_LINK = "https://dashboard.example.com/#/search?namespace=training&q={job}"


# ---- helpers ----------------------------------------------------------------------------------


def wait(what: str, check: Any, timeout: float, client: AirflowREST, every: float = 2.0) -> Any:
    """``check()`` until truthy; a timeout says what Airflow's import errors are."""
    try:
        return wait_plain(what, check, timeout, every)
    except TimeoutError as error:
        with contextlib.suppress(Exception):
            raise TimeoutError(f"{error}; import errors: {client.import_errors()}") from None
        raise


def wait_plain(what: str, check: Any, timeout: float, every: float = 2.0) -> Any:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            if got := check():
                return got
        except Exception as error:  # not there yet
            last = error
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s" + (f" (last: {last})" if last else ""))


def documented_roles() -> dict[str, list[dict[str, Any]]]:
    """The Roles of docs/guides/rbac.md's first blocks (name -> rules), as a user applies them."""
    roles = {}
    for block in re.findall(r"```yaml\n(.*?)```", RBAC_PAGE.read_text(), flags=re.S):
        with contextlib.suppress(yaml.YAMLError):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and doc.get("kind") == "Role":
                roles[doc["metadata"]["name"]] = doc["rules"]
    assert set(roles) == {"airflow-mpi-worker", "airflow-mpi-triggerer"}, set(roles)
    return roles


def verbs_of(rules: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every verb of ``rules``."""
    return [(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]]  # fmt: skip


WORKER_VERBS = verbs_of(documented_roles()["airflow-mpi-worker"])


def can_i(api: KubeApi, account: str, verb: str, group: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i VERB RESOURCE -n NAMESPACE --as system:serviceaccount:airflow:ACCOUNT``,
    asked as a SubjectAccessReview with the groups a ServiceAccount's token carries."""
    resource, _, subresource = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:airflow:{account}",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:airflow", "system:authenticated"],
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": resource,
                                   "subresource": subresource},
        },
    }  # fmt: skip
    return bool(api.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get("allowed"))


def rank_lines(text: str) -> dict[str, list[str]]:
    """Each rank's numbered lines, in the order shown."""
    found: dict[str, list[str]] = {}
    for rank, number in RANK_LINE.findall(text):
        found.setdefault(rank, []).append(number)
    return found


def numbered(count: int) -> list[str]:
    return [f"{i:05d}" for i in range(count)]


def token_claims(text: str) -> dict[str, Any]:
    import base64
    import json

    payload = text.strip().split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def job_pods(api: KubeApi, namespace: str, job: str) -> list[dict[str, Any]]:
    return list(api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"airflow-mpi.io/job={job}")["items"])


def task_pod(api: KubeApi, namespace: str, dag_id: str, run_id: str, task_id: str, try_number: int) -> dict[str, Any]:
    """The KubernetesExecutor's pod of a task try (its annotations name the try)."""
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        notes = pod["metadata"].get("annotations") or {}
        if (notes.get("dag_id"), notes.get("run_id"), notes.get("task_id"), notes.get("try_number")) == (
            dag_id, run_id, task_id, str(try_number)):  # fmt: skip
            return dict(pod)
    raise LookupError(f"no pod of {dag_id}/{run_id}/{task_id} try {try_number} in {namespace}")


LATE_POLLS = 3  # log reads in a row the api-server may leave unanswered (30 s each) before the follow fails


@dataclass
class Followed:
    """A try's log followed through the REST API in a thread: when each poll's rank lines came."""

    follow: LogFollow
    pattern: re.Pattern[str]  # the lines that count (the job's)
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, new rank lines)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self, every: float, timeout: float) -> Followed:
        def run() -> None:
            deadline, late = time.monotonic() + timeout, 0
            try:
                while not self.follow.ended and time.monotonic() < deadline:
                    try:
                        lines = self.follow.poll()
                    except TimeoutError:  # a loaded api-server answers late once: ask again, as a reader would
                        late += 1
                        if late > LATE_POLLS:
                            raise
                        continue
                    late = 0
                    self.arrivals.append((time.monotonic(), sum(bool(self.pattern.search(line)) for line in lines)))
                    time.sleep(every)
            except BaseException as error:
                self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the log follower did not end"
        if self.error is not None:
            raise self.error

    def live_polls(self) -> int:
        """How many polls before the last brought the job's lines (the last reads what is left)."""
        return sum(1 for _, new in self.arrivals[:-1] if new)

    def longest_silence(self) -> float:
        """The longest time between two polls that brought the job's lines, from the first to the last."""
        times = [at for at, new in self.arrivals if new]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def follow_try(client: AirflowREST, dag_id: str, run_id: str, pattern: re.Pattern[str], every: float = 3.0,
               timeout: float = 1800, form: str = JSON) -> Followed:  # fmt: skip
    """Follow the train task's first try's log from when it runs (the endpoint has nothing before)."""
    wait_started(client, dag_id, run_id)
    return Followed(client.follow_log(dag_id, run_id, "train", 1, form=form), pattern).start(every, timeout)


def wait_started(client: AirflowREST, dag_id: str, run_id: str, task_id: str = "train", timeout: float = 600) -> None:
    """Until the task runs (or is deferred); a run that fails first says why (its tasks' logs)."""

    def started() -> bool:
        states = client.task_states(dag_id, run_id)
        if states.get(task_id) in ("running", "deferred"):
            return True
        if states.get(task_id) in FINISHED_TASK or "failed" in states.values():
            raise AssertionError(f"{dag_id} {run_id} ended before {task_id} ran: {states}\n"
                                 + run_failure(client, dag_id, run_id))  # fmt: skip
        return False

    deadline = time.monotonic() + timeout
    while not started():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} {run_id}: {task_id} not running within {timeout:.0f} s: "
                               f"{client.task_states(dag_id, run_id)}")  # fmt: skip
        time.sleep(2)


def log_timeline(client: AirflowREST, dag_id: str, run_id: str, task_id: str = "train") -> list[tuple[str, str]]:
    """When the try's log says its task deferred, its trigger started, and every tenth job line
    came (each record's own time): what a failed check of liveness needs to be read."""
    records, _ = client.log_records(dag_id, run_id, task_id, 1, form=NDJSON, full_content=True)
    marks, lines = [], 0
    for record in records:
        event = str(record.get("event", ""))
        if "<stdout>:" in event:
            lines += 1
            if lines % 10 != 1:
                continue
        elif not any(word in event for word in ("DEFERRED", "trigger", "Trigger", "mpiexec", "resum")):
            continue
        marks.append((str(record.get("timestamp", "")), event[:80]))
    return marks


def run_failure(client: AirflowREST, dag_id: str, run_id: str) -> str:
    """What the runs' task logs end with, for an assertion's message."""
    text = []
    for task_id, state in client.task_states(dag_id, run_id).items():
        with contextlib.suppress(Exception):
            tries = int(client.task_instance(dag_id, run_id, task_id)["try_number"])
            text.append(f"--- {task_id} ({state}):\n{client.log_text(dag_id, run_id, task_id, tries)[-3000:]}")
    return "\n".join(text)


# ---- a. the walkthrough, step by step -----------------------------------------------------------


def test_the_walkthrough_step_by_step(airflow: Any, long_jobs: LongJobs) -> None:
    # 1. The provider in Airflow's image: `airflow providers list` shows it, in every component.
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        code, output = airflow.exec(component, ["airflow", "providers", "list"])
        assert code == 0 and "airflow-mpi" in output, (component, output[-2000:])

    # 3. The Roles, as `kubectl auth can-i ... --as system:serviceaccount:airflow:<account>` asks.
    api = airflow.cluster.api()
    roles = documented_roles()
    for account, role in (("airflow-worker", "airflow-mpi-worker"), ("airflow-triggerer", "airflow-mpi-triggerer")):
        refused = [(verb, resource) for group, resource, verb in verbs_of(roles[role])
                   if not can_i(api, account, verb, group, resource, airflow.training)]  # fmt: skip
        assert refused == [], f"{account} lacks what {role} grants: {refused}"
    # The triggerer reads no Secret and creates nothing; neither has more than its Role grants.
    for verb in ("get", "list", "watch"):
        assert not can_i(api, "airflow-triggerer", verb, "", "secrets", airflow.training)
    assert not can_i(api, "airflow-triggerer", "create", "", "pods", airflow.training)
    assert not can_i(api, "airflow-worker", "update", "", "pods", airflow.training)
    assert not can_i(api, "airflow-worker", "create", "", "pods", "default")

    # 4. The connections: `airflow connections test mpi_default` lists pods in training with the
    # connection's identity (in the triggerer: its Role lists pods).
    code, output = airflow.exec("triggerer", ["airflow", "connections", "test", "mpi_default"])
    assert code == 0 and "Connection success" in output, output[-2000:]

    # 4 and 5 with the workers' identity, in a pod of the executor's pod template (a task pod's
    # ServiceAccount and settings): the connection test, then `airflow-mpi doctor --image` (a pod
    # of the training image in training, then removed). A task itself cannot run them: Airflow
    # gives a task's processes no database, where the connections are.
    code, output = run_as_worker(airflow, [
        "bash", "-c", "airflow connections test mpi_default && airflow-mpi doctor --image " + TRAIN_IMAGE
        + " --kubernetes-conn-id kubernetes_default --namespace " + airflow.training])  # fmt: skip
    assert code == 0 and "Connection success" in output, output[-3000:]
    assert "checks on" in output and "missing:" not in output, output[-3000:]


def run_as_worker(airflow: Any, argv: list[str], timeout: float = 300) -> tuple[int, str]:
    """``argv`` in a pod made from the KubernetesExecutor's pod template (as the scheduler reads
    it), so with the identity and settings of the task pods: its exit code and output."""
    code, text = airflow.exec("scheduler", ["bash", "-c", 'cat "$AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE"'])
    assert code == 0, text
    pod = yaml.safe_load(text)
    name = f"walkthrough-{uuid.uuid4().hex[:8]}"
    pod["metadata"] = {"name": name, "namespace": airflow.namespace, "labels": {"component": "walkthrough-check"}}
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["command"] = argv
    api = airflow.cluster.api()
    path = f"/api/v1/namespaces/{airflow.namespace}/pods"
    api.create(path, pod)
    try:
        ended = wait_plain(
            f"{name} ended",
            lambda: (p := api.get(f"{path}/{name}"))["status"].get("phase") in ("Succeeded", "Failed") and p,
            timeout,
        )
        (status,) = ended["status"]["containerStatuses"]
        return int(status["state"]["terminated"]["exitCode"]), str(api.get(f"{path}/{name}/log"))
    finally:
        api.delete(f"{path}/{name}")
        wait_plain(f"{name} gone", lambda: api.get_or_none(f"{path}/{name}") is None, 120)


# ---- c. a triggerer deleted under a deferred job ------------------------------------------------


@pytest.mark.slow
def test_a_deleted_triggerers_trigger_is_taken_over(airflow: Any, client: AirflowREST, long_jobs: LongJobs) -> None:
    api = airflow.cluster.api()
    seconds = TAKEOVER_JOB_SECONDS
    # One rank: the long jobs hold a core on two Nodes meanwhile, the third has one for this.
    run_id = client.trigger(LINES_DAG, {"seconds": seconds, "workers": 0, "deferrable": True})
    wait_started(client, LINES_DAG, run_id)
    ti = client.wait_task(LINES_DAG, run_id, "train", {"deferred", *FINISHED_TASK}, 600)
    assert ti["state"] == "deferred", run_failure(client, LINES_DAG, run_id)
    # Lines shown while deferred: the trigger follows the job.
    wait_plain(
        "the ranks' lines in the log while deferred",
        lambda: len(rank_lines(client.log_text(LINES_DAG, run_id, "train", 1)).get("0", [])) >= 10,
        240,
    )
    ti = client.task_instance(LINES_DAG, run_id, "train")
    first = ti["triggerer_job"]
    assert ti["state"] == "deferred" and first, ti
    pod = first["hostname"].split(".")[0]
    assert pod in airflow.pods("triggerer"), (pod, airflow.pods("triggerer"))
    api.delete(f"/api/v1/namespaces/{airflow.namespace}/pods/{pod}")
    deleted_at = time.monotonic()

    def taken_over() -> dict[str, Any] | None:
        now = client.task_instance(LINES_DAG, run_id, "train")
        job = now.get("triggerer_job")
        return job if now["state"] != "deferred" or (job and job["id"] != first["id"]) else None

    second = wait_plain("another triggerer running the trigger", taken_over, 240)
    took = time.monotonic() - deleted_at
    state = client.wait_run(LINES_DAG, run_id, seconds + 600)
    assert state == "success", run_failure(client, LINES_DAG, run_id)
    assert second and second["id"] != first["id"], (first, second)
    assert took < seconds - 30, f"taken over after {took:.0f} s: the job ended first"
    # Every rank's lines once, in order, in the log Airflow merges (the triggers' and the task's).
    shown = rank_lines(client.log_text(LINES_DAG, run_id, "train", 1))
    assert shown == {"0": numbered(seconds)}, {r: (len(v), v[:3]) for r, v in shown.items()}
    assert client.xcom(LINES_DAG, run_id, "train")["result"] == {"lines": seconds}


# ---- e. the workers' Role without one verb ------------------------------------------------------


def rules_without(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> list[dict[str, Any]]:
    """``rules`` with ``verb`` on ``resource`` gone, the rule's other resources keeping every verb."""
    kept = []
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            others = [r for r in rule["resources"] if r != resource]
            kept += [dict(rule, resources=others)] if others else []
            rule = dict(rule, resources=[resource], verbs=[v for v in rule["verbs"] if v != verb])
        if rule["verbs"]:
            kept.append(rule)
    return kept


@pytest.fixture
def accounts_without_a_verb(airflow: Any) -> Iterator[dict[str, tuple[str, str, str]]]:
    """For every verb of the workers' Role (as deployed in training), a ServiceAccount in Airflow's
    namespace bound to that Role without the verb, named as the DAG's task pods use them:
    task id -> (apiGroup, resource, verb). All removed afterwards."""
    from tests.nodes.dags.mpi_in_cluster_dags import account_without

    api = airflow.cluster.api()
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{airflow.training}"
    rules = api.get(f"{rbac}/roles/airflow-mpi-worker")["rules"]
    made: list[str] = []
    try:
        for group, resource, verb in WORKER_VERBS:
            name = account_without(resource, verb)
            made.append(name)
            api.create(f"/api/v1/namespaces/{airflow.namespace}/serviceaccounts",
                       {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name},
                        "automountServiceAccountToken": False})  # fmt: skip
            role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
                    "rules": rules_without(rules, group, resource, verb)}  # fmt: skip
            api.create(f"{rbac}/roles", role)
            api.create(f"{rbac}/rolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": airflow.namespace}]})  # fmt: skip
        for index, (group, resource, verb) in enumerate(WORKER_VERBS):
            name, other = account_without(resource, verb), WORKER_VERBS[index - 1]
            wait_plain(f"{name} bound", lambda n=name, gone=(group, resource, verb), kept=other: (
                not can_i(api, n, gone[2], gone[0], gone[1], airflow.training)
                and can_i(api, n, kept[2], kept[0], kept[1], airflow.training)), 30)  # fmt: skip
        yield {account_without(r, v).replace("-", "_"): (g, r, v) for g, r, v in WORKER_VERBS}
    finally:
        for name in made:
            api.delete(f"{rbac}/rolebindings/{name}")
            api.delete(f"{rbac}/roles/{name}")
            api.delete(f"/api/v1/namespaces/{airflow.namespace}/serviceaccounts/{name}")


@pytest.mark.slow
def test_a_role_without_any_one_verb_fails_the_task_before_anything_is_created(
    airflow: Any, client: AirflowREST, accounts_without_a_verb: dict[str, tuple[str, str, str]]
) -> None:
    """Every case at once (one run, a task each), beside the long jobs: the workers' own Role
    stays whole, each task pod runs under its own ServiceAccount."""
    tasks = {t["task_id"] for t in client.get(f"/api/v2/dags/{ROLE_DAG}/tasks")["tasks"]}
    assert tasks == set(accounts_without_a_verb), "the DAG's tasks are not the documented Role's verbs"
    run_id = client.trigger(ROLE_DAG)
    assert client.wait_run(ROLE_DAG, run_id, 900) == "failed"
    states = client.task_states(ROLE_DAG, run_id)
    assert states == dict.fromkeys(accounts_without_a_verb, "failed"), states
    for task_id, (_, resource, verb) in accounts_without_a_verb.items():
        log = client.log_text(ROLE_DAG, run_id, task_id, 1)
        # The verb and the resource, and that it was known before the job was created.
        assert f"`{verb}` `{resource}`" in log and "checked before anything was created" in log, (task_id, log[-3000:])
    assert left_in_training(airflow) == []


# ---- f. a job longer than the tokens' life, waiting and deferred at once --------------------------


@pytest.mark.slow
def test_a_job_longer_than_the_token_life_streams_and_ends(
    airflow: Any, client: AirflowREST, long_jobs: LongJobs
) -> None:
    seconds = LONG_JOB_SECONDS
    states = {mode: client.wait_run(LINES_DAG, run_id, seconds + 900) for mode, run_id in long_jobs.runs.items()}
    for mode, run_id in long_jobs.runs.items():
        followed = long_jobs.followed[mode]
        followed.join(120)
        assert states[mode] == "success", (mode, run_failure(client, LINES_DAG, run_id))
        shown = rank_lines(client.log_text(LINES_DAG, run_id, "train", 1))
        assert shown == {"0": numbered(seconds)}, (mode, {r: (len(v), v[:3], v[-3:]) for r, v in shown.items()})
        # Live the whole time: lines over the whole run, never silent for long (the token renewed
        # at 8 minutes does not stop the stream; a triggerer deleted meanwhile, by the takeover
        # test, hands the deferred one on within Airflow's health check threshold).
        arrivals = [at for at, new in followed.arrivals if new]
        assert arrivals and arrivals[-1] - arrivals[0] > seconds - 120, (mode, followed.arrivals[:3])
        assert followed.longest_silence() < 150, (mode, followed.longest_silence())
    RUNNING_BESIDE.clear()
    # The kubelet did renew the tokens meanwhile.
    code, after = airflow.exec("triggerer", ["cat", TOKEN])
    assert code == 0, after
    assert token_claims(after)["iat"] > token_claims(long_jobs.token_before)["iat"], (
        "the triggerer's token was not renewed"
    )


# ---- b. the example DAG through the REST API ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("deferrable", [False, True], ids=["waiting", "deferrable"])
def test_the_example_dag_through_the_rest_api(airflow: Any, client: AirflowREST, ui: Any, deferrable: bool) -> None:
    api = airflow.cluster.api()
    run_id = client.trigger(EXAMPLE, {"deferrable": deferrable, "epochs": EXAMPLE_EPOCHS})
    # Read as the UI reads it (NDJSON, the whole log each time). The JSON form's continuation token
    # skips lines across a deferral under KubernetesExecutor (Airflow 3.3.2 counts the running
    # pod's own output into its position, and that source goes with the pod): seen here once.
    followed = follow_try(client, EXAMPLE, run_id, EPOCH_LINE, every=1.0, timeout=1200, form=NDJSON)
    # In the browser: the ranks' lines on the task's page while it trains.
    ui.get(f"{airflow.url}/dags/{EXAMPLE}/runs/{quote(run_id)}/tasks/train")
    wait_plain("the ranks' epochs on the task's page", lambda: "<stdout>:epoch" in page_text(ui), 600)
    assert client.task_states(EXAMPLE, run_id)["train"] in ("running", "deferred"), "not seen live"
    ui.save_screenshot(str(ARTIFACTS / f"in-cluster-{'deferred' if deferrable else 'waiting'}-log.png"))
    ui.get("about:blank")  # its polling and rendering off the two cores the ranks train on
    # The job's pods, while they run: one rank each, on three different Nodes.
    ref = wait_plain("the job's name in XCom", lambda: client.xcom(EXAMPLE, run_id, "train", key="mpi_job"), 600)

    def placed() -> dict[str, str] | None:
        found = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in job_pods(api, ref["namespace"], ref["job"])}
        return found if len(found) == 3 and all(found.values()) else None

    nodes = wait_plain("the job's three pods scheduled", placed, 300)
    if deferrable:
        client.wait_task(EXAMPLE, run_id, "train", {"deferred", *FINISHED_TASK}, 300)
    state = client.wait_run(EXAMPLE, run_id, 1200)
    followed.join(60)
    assert state == "success", run_failure(client, EXAMPLE, run_id)
    assert len(set(nodes.values())) == 3, nodes

    # The log, live: the ranks' lines came over several polls while train ran.
    assert followed.live_polls() >= 2, (followed.arrivals, log_timeline(client, EXAMPLE, run_id))
    log = client.log_text(EXAMPLE, run_id, "train", 1)
    epochs = re.findall(rf"<stdout>:epoch (\d+)/{EXAMPLE_EPOCHS}", log)
    assert epochs == [str(e) for e in range(1, EXAMPLE_EPOCHS + 1)], epochs  # each once, in order
    # Every rank's own lines are in the log (each rank says where it trains).
    ranks = re.findall(r"\[1,(\d)\]<stdout>:rank \d/3 on (\S+):", log)
    assert sorted(rank for rank, _ in ranks) == ["0", "1", "2"], ranks

    # The result: the local run's accuracy, in XCom.
    train = client.xcom(EXAMPLE, run_id, "train")
    accuracy = float(client.xcom(EXAMPLE, run_id, "evaluate"))
    assert train["np"] == 3 and train["result"]["world_size"] == 3
    assert abs(train["result"]["test_accuracy"] - accuracy) < 1e-3
    assert accuracy >= 0.85 and abs(accuracy - LOCAL_ACCURACY) <= 0.01, (accuracy, LOCAL_ACCURACY)
    # The "MPI job" link (step 4's job_url_template), through the API and on the Details tab.
    link = JOB_LINK.format(job=train["job_name"])
    assert client.extra_links(EXAMPLE, run_id, "train") == {"MPI job": link}
    ui.get(f"{airflow.url}/dags/{EXAMPLE}/runs/{quote(run_id)}/tasks/train")
    press(ui, wait_plain("the Details tab", lambda: tab(ui, "Details"), 60))
    shown = wait_plain("the MPI job link", lambda: links_named(ui, "MPI job"), 60)
    assert shown[0].get_attribute("href") == link


def test_the_mpi_connection_form_in_the_deployments_ui(airflow: Any, ui: Any) -> None:
    """The api-server's image has the provider: its form for type ``mpi`` shows every field."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    ui.get(f"{airflow.url}/connections")
    press(ui, wait_plain("Add Connection", lambda: button(ui, "Add Connection"), 60))
    wait_plain("the form", lambda: ui.find_elements(By.NAME, "connection_id"), 30)
    kind = ui.find_element(By.XPATH, "//div[@role='dialog']//input[@role='combobox']")
    kind.click()
    kind.send_keys("MPI job backend")
    time.sleep(0.5)
    kind.send_keys(Keys.ENTER)
    press(ui, wait_plain("Extra Fields", lambda: button(ui, "Extra Fields", dialog=True), 30))
    labels = ("Backend", "Kubernetes connection id", "Namespace", "API timeout (seconds)", "Job link URL template")
    wait_plain("the mpi fields", lambda: all(label in page_text(ui) for label in labels), 30)
    for extra in ("backend", "kubernetes_conn_id", "namespace", "api_timeout", "job_url_template", "state_dir"):
        assert ui.find_elements(By.NAME, f"element_{extra}"), extra
    ui.save_screenshot(str(ARTIFACTS / "in-cluster-connection-form.png"))
    kind.send_keys(Keys.ESCAPE)


# ---- d. a task pod killed while its job trains ----------------------------------------------------


@pytest.mark.slow
def test_a_killed_task_pods_retry_reattaches(airflow: Any, client: AirflowREST) -> None:
    """The task pod's processes SIGKILLed on its Node (as when a Node is lost; a pod deleted
    gracefully gets SIGTERM, on which the task tears its job down, as Airflow's kill asks):
    the DAG's retry finds the job the first try left and follows it to its end."""
    api = airflow.cluster.api()
    epochs = 120  # minutes of training: the kill comes while it runs
    run_id = client.trigger(EXAMPLE, {"deferrable": False, "epochs": epochs})
    wait_started(client, EXAMPLE, run_id)
    ref = wait_plain("the job's name in XCom", lambda: client.xcom(EXAMPLE, run_id, "train", key="mpi_job"), 600)
    wait_plain(
        "training under way",
        lambda: len(re.findall(r"<stdout>:epoch \d+/", client.log_text(EXAMPLE, run_id, "train", 1))) >= 2,
        600,
    )
    pod = task_pod(api, airflow.namespace, EXAMPLE, run_id, "train", 1)
    node = airflow.cluster.real.node(pod["spec"]["nodeName"])
    running = [c["id"] for c in node.containers()
               if c["labels"].get("io.kubernetes.pod.name") == pod["metadata"]["name"]
               and c["state"] == "CONTAINER_RUNNING"]  # fmt: skip
    assert running, f"no running container of {pod['metadata']['name']} on {node.name}"
    for container in running:
        node.crictl("stop", "--timeout", "0", container)

    wait_plain("the retry", lambda: client.task_instance(EXAMPLE, run_id, "train")["try_number"] == 2, 600)
    state = client.wait_run(EXAMPLE, run_id, 1500)
    assert state == "success", run_failure(client, EXAMPLE, run_id)
    first, second = (client.log_text(EXAMPLE, run_id, "train", n) for n in (1, 2))
    assert f"reattached to {ref['job']}" in second, second[-3000:]
    assert client.xcom(EXAMPLE, run_id, "train")["job_name"] == ref["job"]  # the one job, to its end
    shown = [int(e) for e in re.findall(rf"<stdout>:epoch (\d+)/{epochs}", first + "\n" + second)]
    assert sorted(set(shown)) == list(range(1, epochs + 1)), shown  # no epoch missing
    later = [int(e) for e in re.findall(rf"<stdout>:epoch (\d+)/{epochs}", second)]
    assert later and later[0] > 1 and later == sorted(later), later  # went on, did not start over
