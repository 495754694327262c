"""Airflow deployed inside the real cluster as users deploy it with the official Helm chart:
PostgreSQL, the migration Job, the api-server, the scheduler (KubernetesExecutor), the
dag-processor and two triggerers in namespace ``airflow``, each under a ServiceAccount of its own
with a projected 10-minute token the kubelet rotates; in namespace ``training`` the walkthrough's
objects (docs/guides/kubernetes-walkthrough.md), the Roles and bindings read from
docs/guides/rbac.md, and the connections made by the walkthrough's own commands.

The manifests are ``deploy/airflow/*.yaml``; ``render`` fills them in (a pure function of the
values and the pages) and adds to every pod of the Airflow image what all of them share, so that
is written once. ``deploy``/``undeploy`` are the imperative shell: ``make airflow-up`` and the
``airflow`` fixture of tests/nodes call them.

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import copy
import json
import os
import re
import secrets
import shutil
import string
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.kubeapi import ApiError, KubeApi, Obj

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "airflow"
RBAC_PAGE = REPO / "docs" / "guides" / "rbac.md"
WALKTHROUGH_PAGE = REPO / "docs" / "guides" / "kubernetes-walkthrough.md"
PART_OF = "airflow-mpi-deployment"  # the label of the cluster-wide objects (PersistentVolumes)
AIRFLOW_UID = 50000  # the image's user, as apache/airflow's
TOKEN_SECONDS = 600  # the shortest lifetime the apiserver grants; the kubelet rotates at 80 %
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
API_PORT = 8080


@dataclass(frozen=True)
class Values:
    """What the manifests are rendered with: names, images, host paths, generated secrets."""

    airflow_image: str
    postgres_image: str
    train_image: str
    dags: str  # the DAGs folder on this machine (every Node shares its disk)
    data_root: str  # where the volumes' directories are made
    admin_password: str
    db_password: str
    fernet_key: str
    jwt_secret: str
    api_secret_key: str
    admin_user: str = "admin"
    namespace: str = "airflow"
    training: str = "training"


def generated_secrets() -> dict[str, str]:
    """Fresh secrets for one deployment (a Fernet key is 32 url-safe base64 bytes)."""
    return {
        "admin_password": secrets.token_urlsafe(18),
        "db_password": secrets.token_urlsafe(18),
        "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "jwt_secret": secrets.token_urlsafe(32),
        "api_secret_key": secrets.token_urlsafe(32),
    }


# --- the pure part: pages -> objects ----------------------------------------------------------


def yaml_blocks(page: str) -> list[Any]:
    """Every ```yaml block of a Markdown page that parses, in order."""
    found = []
    for block in re.findall(r"```yaml\n(.*?)```", page, flags=re.S):
        with contextlib.suppress(yaml.YAMLError):
            found.append(yaml.safe_load(block))
    return found


def section(page: str, number: int) -> str:
    """The text of the page's ``## <number>.`` section."""
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", page, flags=re.S | re.M)
    if not match:
        raise LookupError(f"the walkthrough has no section '## {number}.'")
    return match.group(0)


def connection_commands(walkthrough: str) -> str:
    """The bash block of the walkthrough's step 4 (the connections), as a user pastes it."""
    blocks = re.findall(r"```bash\n(.*?)```", section(walkthrough, 4), flags=re.S)
    if len(blocks) != 1:
        raise LookupError(f"the walkthrough's step 4 has {len(blocks)} bash blocks, not one")
    return blocks[0]


def documented_objects(rbac: str, walkthrough: str, values: Values) -> list[Obj]:
    """The walkthrough's claim (step 3) and the RBAC page's Roles and RoleBindings, as written;
    refused when the pages name other namespaces than the deployment's."""
    claims = [d for d in yaml_blocks(section(walkthrough, 3)) if isinstance(d, dict)]
    claims = [d for d in claims if d.get("kind") == "PersistentVolumeClaim"]
    rbac_objects = [d for d in yaml_blocks(rbac) if isinstance(d, dict) and d.get("kind") in ("Role", "RoleBinding")]
    if len(claims) != 1 or len(rbac_objects) != 4:
        raise LookupError(
            f"expected the walkthrough's one claim and the RBAC page's two Roles and two RoleBindings, "
            f"found {len(claims)} and {len(rbac_objects)}"
        )
    for obj in claims + rbac_objects:
        where = obj["metadata"].get("namespace")
        if where != values.training:
            raise ValueError(
                f"{obj['kind']} {obj['metadata']['name']} is in {where!r}: the jobs run in {values.training!r}"
            )
        for subject in obj.get("subjects", []):
            if subject.get("namespace") != values.namespace:
                raise ValueError(
                    f"{obj['kind']} {obj['metadata']['name']} binds {subject}: Airflow runs in {values.namespace!r}"
                )
    return [copy.deepcopy(o) for o in claims + rbac_objects]


def token_volume() -> Obj:
    """The ServiceAccount token, CA and namespace where in-cluster clients look for them, the
    token projected with a short life the kubelet renews (the auto-mounted one is switched off)."""
    return {
        "name": "kube-api-access",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


SECRET_ENV = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sql-alchemy-conn",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret",
    "AIRFLOW__API__SECRET_KEY": "api-secret-key",
}


def with_shared(pod: Obj, values: Values) -> Obj:
    """``pod`` (a pod spec of the Airflow image) with what every component has: the image's
    user, the projected token, the DAGs folder read-only (the chart's DAG volume), the shared
    logs, the configuration and secrets as environment."""
    pod = copy.deepcopy(pod)
    pod["automountServiceAccountToken"] = False
    pod.setdefault("securityContext", {}).update({"runAsUser": AIRFLOW_UID, "runAsGroup": 0, "fsGroup": 0})
    pod["volumes"] = [
        *pod.get("volumes", []),
        token_volume(),
        {"name": "dags", "hostPath": {"path": values.dags, "type": "Directory"}},
        {"name": "logs", "persistentVolumeClaim": {"claimName": "airflow-logs"}},
    ]
    for container in pod["containers"]:
        container["imagePullPolicy"] = "Never"
        container["envFrom"] = [{"configMapRef": {"name": "airflow-env"}}]
        container["env"] = [
            *container.get("env", []),
            *({"name": name, "valueFrom": {"secretKeyRef": {"name": "airflow-secrets", "key": key}}}
              for name, key in SECRET_ENV.items()),
        ]  # fmt: skip
        container["volumeMounts"] = [
            *container.get("volumeMounts", []),
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
            {"name": "dags", "mountPath": "/opt/airflow/dags", "readOnly": True},
            {"name": "logs", "mountPath": "/opt/airflow/logs"},
        ]
    return pod


def render(values: Values, templates: dict[str, str], rbac: str, walkthrough: str) -> list[Obj]:
    """Every object of the deployment, in the order they are created: the templates (file name
    -> text) filled with ``values``, each pod of the Airflow image completed by ``with_shared``,
    the executor's pod template as a ConfigMap, step 4's commands as the connections script, and
    the pages' objects for the jobs' namespace."""
    fill = {k: str(v) for k, v in asdict(values).items()}
    objects: list[Obj] = []
    for name in sorted(templates):
        for doc in yaml.safe_load_all(string.Template(templates[name]).substitute(fill)):
            if doc:
                objects.append(doc)
    rendered: list[Obj] = []
    for obj in objects:
        if obj["kind"] == "Pod":  # the executor's pod_template_file
            pod = dict(obj, spec=with_shared(obj["spec"], values))
            rendered.append({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "airflow-pod-template", "namespace": values.namespace},
                "data": {"pod_template.yaml": yaml.safe_dump(pod, sort_keys=False)},
            })  # fmt: skip
            continue
        template = obj.get("spec", {}).get("template", {})
        containers = template.get("spec", {}).get("containers", [])
        if any(c["image"] == values.airflow_image for c in containers):
            template["spec"] = with_shared(template["spec"], values)
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "airflow-walkthrough-connections":
            obj["data"]["connections.sh"] = connection_commands(walkthrough)
        rendered.append(obj)
    return rendered + documented_objects(rbac, walkthrough, values)


def manifests(values: Values) -> list[Obj]:
    """``render`` with the repository's templates and pages."""
    templates = {p.name: p.read_text() for p in sorted(MANIFESTS.glob("*.yaml"))}
    return render(values, templates, RBAC_PAGE.read_text(), WALKTHROUGH_PAGE.read_text())


# --- the imperative shell ---------------------------------------------------------------------

# Where each kind is created (namespaced: under /namespaces/<ns>).
PATHS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
}


def collection(obj: Obj) -> str:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}" if namespaced else f"{prefix}/{plural}"


@dataclass
class AirflowDeployment:
    """A running deployment: its api-server's URL as this machine reaches it, the admin login."""

    url: str
    user: str
    password: str
    cluster: Any  # the tests/cluster Cluster (or the handle `make airflow-up` attaches to)
    values: Values
    namespace: str = "airflow"
    training: str = "training"
    timings: dict[str, float] = field(default_factory=dict)

    def api(self) -> KubeApi:
        return KubeApi(self.cluster.kubeconfig)

    def pods(self, component: str) -> list[str]:
        """The running pods of ``component`` (``api-server``, ``scheduler``, ``dag-processor``,
        ``triggerer``, ``postgres``, ``worker``: the task pods), by name."""
        items = self.api().get(f"/api/v1/namespaces/{self.namespace}/pods", labelSelector=f"component={component}")
        return sorted(p["metadata"]["name"] for p in items["items"]
                      if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))  # fmt: skip

    def exec(self, component: str, argv: list[str], timeout: float = 120) -> tuple[int, str]:
        """Run ``argv`` in the first running pod of ``component`` through the apiserver's exec;
        its exit code and its output (stdout and stderr together)."""
        pods = self.pods(component)
        if not pods:
            raise LookupError(f"no running pod of {component} in {self.namespace}")
        return pod_exec(self.cluster.kubeconfig, self.namespace, pods[0], argv, timeout)

    def token(self) -> str:
        """A REST API token of the admin user (``POST /auth/token``)."""
        return api_token(self.url, self.user, self.password)


def pod_exec(kubeconfig: Path, namespace: str, pod: str, argv: list[str], timeout: float) -> tuple[int, str]:
    from kubernetes import client, config
    from kubernetes.stream import stream

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    response = stream(api.connect_get_namespaced_pod_exec, pod, namespace, command=argv, stdout=True,
                      stderr=True, stdin=False, tty=False, _preload_content=False)  # fmt: skip
    output = []
    deadline = time.monotonic() + timeout
    try:
        while response.is_open():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{' '.join(argv)} in {namespace}/{pod}: still running after {timeout:.0f} s")
            response.update(timeout=1)
            if response.peek_stdout():
                output.append(response.read_stdout())
            if response.peek_stderr():
                output.append(response.read_stderr())
    finally:
        response.close()
    code = response.returncode
    return (code if code is not None else -1), "".join(output)


def api_token(url: str, user: str, password: str, timeout: float = 10) -> str:
    body = json.dumps({"username": user, "password": password}).encode()
    request = urllib.request.Request(f"{url}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())["access_token"]


def _nodes(cluster: Any) -> list[Any]:
    return list(cluster.real.nodes) if getattr(cluster, "real", None) is not None else []


def import_images(cluster: Any, archives: dict[str, Path], names: dict[str, str], log=print) -> float:
    """Import each archive into every Node's containerd where its image is missing (in parallel,
    one thread per Node); the seconds it took."""
    from tests.cluster.nodes import _ctr

    started = time.monotonic()

    def one(node: Any) -> None:
        for role, archive in archives.items():
            if _ctr(node.socket, "images", "ls", "-q", f"name=={names[role]}").strip():
                continue
            t0 = time.monotonic()
            _ctr(node.socket, "images", "import", "--snapshotter", "overlayfs", str(archive))
            log(f"airflow: imported {names[role]} into {node.name} in {time.monotonic() - t0:.0f} s")

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for future in [pool.submit(one, node) for node in _nodes(cluster)]:
            future.result()
    return time.monotonic() - started


def _prepare_dirs(root: Path) -> None:
    """The volumes' directories: PostgreSQL's (its entrypoint gives it to the postgres user),
    the logs (the Airflow user's, group root as in the chart), the training data (written by task
    pods as the Airflow user and read by the jobs' pods as root)."""
    root.mkdir(parents=True, exist_ok=True)
    # The entrypoint, as root, makes its PGDATA below this mount and hands it to the postgres
    # user, who must then be able to pass through: the mount's own mode is 0755, as a fresh volume's.
    (root / "postgres").mkdir(exist_ok=True)
    (root / "postgres").chmod(0o755)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    os.chown(logs, AIRFLOW_UID, 0)
    logs.chmod(0o775)
    data = root / "training-data"
    data.mkdir(exist_ok=True)
    data.chmod(0o777)


def default_values(cluster: Any, dags: Path) -> Values:
    from tests.cluster import image

    return Values(
        airflow_image=image.AIRFLOW_IMAGE,
        postgres_image=image.POSTGRES_IMAGE,
        train_image=image.TRAIN_IMAGE,
        dags=str(dags.resolve()),
        data_root=str(Path(cluster.workdir) / "airflow"),
        **generated_secrets(),
    )


def _apply(api: KubeApi, objects: list[Obj]) -> None:
    for obj in objects:
        api.apply_object(collection(obj), obj)


def _pod_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _wait_job(api: KubeApi, namespace: str, name: str, timeout: float) -> None:
    def done() -> bool:
        job = api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
        for condition in job["status"].get("conditions") or []:
            if condition["type"] == "Failed" and condition["status"] == "True":
                raise RuntimeError(
                    f"Job {name} failed: {condition.get('message', '')}\n{_job_logs(api, namespace, name)}"
                )
            if condition["type"] == "Complete" and condition["status"] == "True":
                return True
        return False

    _wait(f"Job {name} complete", done, timeout)


def _job_logs(api: KubeApi, namespace: str, job: str) -> str:
    pods = api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={job}")["items"]
    out = []
    for pod in pods:
        with contextlib.suppress(ApiError):
            text = api.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log")
            out.append(f"--- {pod['metadata']['name']}:\n{str(text)[-3000:]}")
    return "\n".join(out)


def _wait(what: str, check: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except RuntimeError:
            raise
        except Exception as error:  # not answering yet
            last_error = error
        time.sleep(interval)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s" + (f" (last: {last_error})" if last_error else ""))


def diagnosis(api: KubeApi, namespace: str) -> str:
    """Each pod of ``namespace``: phase, readiness, waiting reasons and its log's end."""
    lines = []
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        name = pod["metadata"]["name"]
        states = [f"{s['name']}: {next(iter(s.get('state', {})), '?')} {json.dumps(s.get('state', {}))[:300]}"
                  for s in pod["status"].get("containerStatuses") or []]  # fmt: skip
        lines.append(f"{name} {pod['status'].get('phase')} ready={_pod_ready(pod)} {'; '.join(states)}")
        with contextlib.suppress(ApiError):
            lines.append(str(api.get(f"/api/v1/namespaces/{namespace}/pods/{name}/log", tailLines="15")))
    return "\n".join(lines)


def _reachable_url(api: KubeApi, namespace: str) -> str:
    """The api-server as this machine reaches it: its Service's ClusterIP (kube-proxy routes it
    from the host too), else the pod's own address."""
    service = api.get(f"/api/v1/namespaces/{namespace}/services/airflow-api-server")
    candidates = [f"http://{service['spec']['clusterIP']}:{API_PORT}"]
    pods = api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector="component=api-server")["items"]
    candidates += [f"http://{p['status']['podIP']}:{API_PORT}" for p in pods if p["status"].get("podIP")]
    for url in candidates:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5):
            return url
    raise RuntimeError(f"the api-server answers at none of {candidates}")


def deploy(cluster: Any, dags: Path, log=print, values: Values | None = None) -> AirflowDeployment:
    """Deploy Airflow into ``cluster`` with ``dags`` as its DAGs folder; return once the
    api-server logs the admin in, every component is Ready and the connections exist. On
    failure, what was made is removed and the error says which pod did what."""
    from tests.cluster import image

    if not dags.is_dir():
        raise ValueError(f"DAGS={dags}: not a folder; give the folder of your DAG files")
    archives = image.airflow_archives()
    if not archives:
        raise RuntimeError("the Airflow and PostgreSQL images are not built: run `make airflow-image`")
    values = values or default_values(cluster, dags)
    deployment = AirflowDeployment("", values.admin_user, values.admin_password, cluster, values,
                                   values.namespace, values.training)  # fmt: skip
    started = time.monotonic()
    api = KubeApi(cluster.kubeconfig)
    try:
        names = {"airflow": values.airflow_image, "postgres": values.postgres_image}
        deployment.timings["image import"] = import_images(cluster, archives, names, log)
        _prepare_dirs(Path(values.data_root))
        objects = manifests(values)
        workloads = {"StatefulSet", "Deployment", "Job"}
        _apply(api, [o for o in objects if o["kind"] not in workloads])
        postgres = [o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "airflow-postgres"]
        _apply(api, postgres)
        _wait("PostgreSQL ready", lambda: _ready_pods(api, values.namespace, "postgres") == 1, 180)
        deployment.timings["postgres"] = time.monotonic() - started
        _apply(api, [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == "airflow-migrate"])
        _wait_job(api, values.namespace, "airflow-migrate", 300)
        deployment.timings["migrate"] = time.monotonic() - started
        _apply(api, [o for o in objects if o["kind"] in workloads and o not in postgres
                     and o["metadata"]["name"] != "airflow-migrate"])  # fmt: skip
        expected = {"api-server": 1, "scheduler": 1, "dag-processor": 1, "triggerer": 2}
        for component, count in expected.items():
            _wait(
                f"{component}: {count} pod(s) Ready",
                lambda c=component, n=count: _ready_pods(api, values.namespace, c) == n,
                420,
            )
        deployment.url = _wait("the api-server reachable", lambda: _reachable_url(api, values.namespace), 60)
        _wait("the admin's REST API token", deployment.token, 60)
        _wait_job(api, values.namespace, "airflow-connections", 240)
        deployment.timings["up"] = time.monotonic() - started
        log(f"airflow: deployed in {deployment.timings['up']:.0f} s at {deployment.url}")
        return deployment
    except BaseException as error:
        with contextlib.suppress(Exception):
            detail = diagnosis(api, values.namespace)
            log(f"airflow: the deployment failed ({error}); its pods:\n{detail}")
        undeploy(deployment)
        raise


def _ready_pods(api: KubeApi, namespace: str, component: str) -> int:
    pods = api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"component={component}")["items"]
    return sum(1 for p in pods if _pod_ready(p) and not p["metadata"].get("deletionTimestamp"))


def undeploy(deployment: AirflowDeployment, timeout: float = 180) -> None:
    """Remove what ``deploy`` made: both namespaces (their pods stopped), the PersistentVolumes,
    the volumes' directories."""
    api = KubeApi(deployment.cluster.kubeconfig)
    for namespace in (deployment.namespace, deployment.training):
        api.delete(f"/api/v1/namespaces/{namespace}")
    for namespace in (deployment.namespace, deployment.training):
        _wait(f"namespace {namespace} gone", lambda n=namespace: api.get_or_none(f"/api/v1/namespaces/{n}") is None,
              timeout)  # fmt: skip
    for volume in api.get("/api/v1/persistentvolumes", labelSelector=f"app.kubernetes.io/part-of={PART_OF}")["items"]:
        api.delete(f"/api/v1/persistentvolumes/{volume['metadata']['name']}")
    shutil.rmtree(deployment.values.data_root, ignore_errors=True)


def memory_by_pod(api: KubeApi, namespace: str) -> dict[str, int]:
    """Each pod's working set in bytes, from the kubelets' summary (what `kubectl top` reads)."""
    found: dict[str, int] = {}
    for node in api.get("/api/v1/nodes")["items"]:
        summary = api.get(f"/api/v1/nodes/{node['metadata']['name']}/proxy/stats/summary")
        for pod in summary.get("pods", []):
            if pod["podRef"]["namespace"] == namespace:
                found[pod["podRef"]["name"]] = int(pod.get("memory", {}).get("workingSetBytes", 0))
    return found


__all__ = ["AirflowDeployment", "Values", "deploy", "manifests", "render", "undeploy"]
