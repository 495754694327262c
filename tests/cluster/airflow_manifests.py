"""The in-cluster Airflow deployment's objects, as a pure function: ``deploy/airflow/*.yaml``
filled with the deployment's values, every pod of the Airflow image completed with what all of
them share (written once here), the executor's pod template as a ConfigMap, the walkthrough's
step 4 commands as the connections script, and the objects docs/guides/rbac.md and
docs/guides/kubernetes-walkthrough.md tell users to apply in the jobs' namespace, read from the
pages (so the pages cannot drift from what runs). tests/cluster/airflow.py deploys them.

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import re
import secrets
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.kubeapi import Obj

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "airflow"
RBAC_PAGE = REPO / "docs" / "guides" / "rbac.md"
WALKTHROUGH_PAGE = REPO / "docs" / "guides" / "kubernetes-walkthrough.md"
PART_OF = "airflow-mpi-deployment"  # the label of the cluster-wide objects (PersistentVolumes)
AIRFLOW_UID = 50000  # the image's user, as apache/airflow's
TOKEN_SECONDS = 600  # the shortest lifetime the apiserver grants; the kubelet rotates at 80 %


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
