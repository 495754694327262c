"""The API double refuses what kube-apiserver refuses: every rule of ``apivalidation`` fires once
here, sent through the real ``kubernetes`` client, and answers the apiserver's 422 ``Invalid``
Status (reason, message, ``details.causes`` with field and CauseType) or its 400 ``BadRequest``.
And what a job creates, mapped or not, is accepted."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.job.naming import LABEL_MAP_INDEX, RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.apivalidation import KINDS, validate_object
from tests.doubles.kube_double import KubeDouble, ScriptedKubelet
from tests.helpers import plan_for, spec_from
from tests.k8s.conftest import api_client_for, job_objects, unique

Obj = dict[str, Any]
NS = "default"
INVALID, REQUIRED, NOT_FOUND = "FieldValueInvalid", "FieldValueRequired", "FieldValueNotFound"
DUPLICATE, NOT_SUPPORTED = "FieldValueDuplicate", "FieldValueNotSupported"
FORBIDDEN, TOO_LONG = "FieldValueForbidden", "FieldValueTooLong"
PLURAL = {kind: plural for plural, kind in KINDS.items()}

SPEC = spec_from(
    workers={"replicas": 1},
    pod={
        "shm_size": "1Gi",
        "volumes": [{"name": "data", "mount_path": "/data", "host_path": "/mnt/data"}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "node_selector": {"pool": "gpu"},
    },
)
# Service, Secret, ConfigMap, worker pod. Pod volumes: 0 mpi-config (configMap), 1 mpi-ssh (secret,
# items), 2 mpi-runtime (emptyDir), 3 dshm (emptyDir), 4 data (hostPath); mounts in that order.
BASE: dict[str, Obj] = {}
for _object in render_manifests(plan_for(SPEC), NS, owner_uid="1b4e28ba-2fa1-11d2-883f-0016d3cca427"):
    BASE.setdefault(_object["kind"], _object)  # the first pod is a worker (it has the readiness probe)


def container(pod: Obj) -> Obj:
    return pod["spec"]["containers"][0]


def resources(pod: Obj, **amounts: dict[str, str]) -> None:
    container(pod)["resources"] = amounts


def meta(obj: Obj) -> Obj:
    return obj["metadata"]


def b64(size: int) -> str:
    return base64.b64encode(b"x" * size).decode()


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    edit: Callable[[Obj], Any]
    field: str  # the cause's field (422) or a part of the message (400)
    reason: str = INVALID
    code: int = 422


CASES = [
    # --- metadata, on any kind -------------------------------------------------------------------
    Case("name required", "ConfigMap", lambda o: meta(o).pop("name"), "metadata.name", REQUIRED),
    Case("pod name not a subdomain", "Pod", lambda o: meta(o).update(name="Worker_0"), "metadata.name"),
    Case("pod name over 253", "Pod", lambda o: meta(o).update(name="a" * 254), "metadata.name"),
    Case("secret name not a subdomain", "Secret", lambda o: meta(o).update(name="-ssh"), "metadata.name"),
    Case("service name starts with a digit", "Service", lambda o: meta(o).update(name="1job"), "metadata.name"),
    Case("service name with a dot", "Service", lambda o: meta(o).update(name="job.a"), "metadata.name"),
    Case("service name over 63", "Service", lambda o: meta(o).update(name="j" * 64), "metadata.name"),
    Case(
        "generateName invalid",
        "ConfigMap",
        lambda o: meta(o).update(name=None, generateName="Job-"),
        "metadata.generateName",
    ),
    Case("label value -1", "Service", lambda o: meta(o)["labels"].update(x="-1"), "metadata.labels"),
    Case("label value over 63", "Pod", lambda o: meta(o)["labels"].update(x="v" * 64), "metadata.labels"),
    Case("label key with a space", "Secret", lambda o: meta(o)["labels"].update({"a b": "1"}), "metadata.labels"),
    Case("label key prefix uppercase", "Pod", lambda o: meta(o)["labels"].update({"A.io/x": "1"}), "metadata.labels"),
    Case("label key name over 63", "Pod", lambda o: meta(o)["labels"].update({"k" * 64: "1"}), "metadata.labels"),
    Case(
        "annotation key invalid",
        "ConfigMap",
        lambda o: meta(o)["annotations"].update({"a/b/c": "x"}),
        "metadata.annotations",
    ),
    Case(
        "annotations over 256 KiB",
        "Pod",
        lambda o: meta(o)["annotations"].update(big="x" * 256 * 1024),
        "metadata.annotations",
        TOO_LONG,
    ),
    Case(
        "owner without uid",
        "Secret",
        lambda o: meta(o)["ownerReferences"][0].pop("uid"),
        "metadata.ownerReferences[0].uid",
        REQUIRED,
    ),
    Case(
        "owner without apiVersion",
        "Pod",
        lambda o: meta(o)["ownerReferences"][0].pop("apiVersion"),
        "metadata.ownerReferences[0].apiVersion",
        REQUIRED,
    ),
    Case(
        "owner without kind",
        "Pod",
        lambda o: meta(o)["ownerReferences"][0].pop("kind"),
        "metadata.ownerReferences[0].kind",
        REQUIRED,
    ),
    Case(
        "owner without name",
        "Pod",
        lambda o: meta(o)["ownerReferences"][0].pop("name"),
        "metadata.ownerReferences[0].name",
        REQUIRED,
    ),
    Case(
        "owner apiVersion malformed",
        "Pod",
        lambda o: meta(o)["ownerReferences"][0].update(apiVersion="a/b/c"),
        "metadata.ownerReferences[0].apiVersion",
    ),
    Case(
        "two controllers",
        "ConfigMap",
        lambda o: meta(o)["ownerReferences"].append({**meta(o)["ownerReferences"][0], "name": "other", "uid": "u2"}),
        "metadata.ownerReferences",
    ),
    Case("finalizer not qualified", "Pod", lambda o: meta(o).update(finalizers=["mine"]), "metadata.finalizers[0]"),
    # --- pods ------------------------------------------------------------------------------------
    Case("no containers", "Pod", lambda o: o["spec"].update(containers=[]), "spec.containers", REQUIRED),
    Case("container name uppercase", "Pod", lambda o: container(o).update(name="Mpi"), "spec.containers[0].name"),
    Case(
        "container names repeat",
        "Pod",
        lambda o: o["spec"]["containers"].append(copy.deepcopy(container(o))),
        "spec.containers[1].name",
        DUPLICATE,
    ),
    Case("image required", "Pod", lambda o: container(o).pop("image"), "spec.containers[0].image", REQUIRED),
    Case("image with spaces", "Pod", lambda o: container(o).update(image=" img "), "spec.containers[0].image"),
    Case(
        "port name with underscore",
        "Pod",
        lambda o: container(o)["ports"][0].update(name="ssh_port"),
        "spec.containers[0].ports[0].name",
    ),
    Case(
        "port name over 15",
        "Pod",
        lambda o: container(o)["ports"][0].update(name="sshd-port-of-job"),
        "spec.containers[0].ports[0].name",
    ),
    Case(
        "port names repeat",
        "Pod",
        lambda o: container(o)["ports"].append({"name": "ssh", "containerPort": 23}),
        "spec.containers[0].ports[1].name",
        DUPLICATE,
    ),
    Case(
        "containerPort missing",
        "Pod",
        lambda o: container(o)["ports"][0].pop("containerPort"),
        "spec.containers[0].ports[0].containerPort",
        REQUIRED,
    ),
    Case(
        "containerPort out of range",
        "Pod",
        lambda o: container(o)["ports"][0].update(containerPort=70000),
        "spec.containers[0].ports[0].containerPort",
    ),
    Case(
        "protocol unknown",
        "Pod",
        lambda o: container(o)["ports"][0].update(protocol="HTTP"),
        "spec.containers[0].ports[0].protocol",
        NOT_SUPPORTED,
    ),
    Case(
        "env name starts with a digit",
        "Pod",
        lambda o: container(o)["env"].append({"name": "1X", "value": "a"}),
        f"spec.containers[0].env[{len(container(BASE['Pod'])['env'])}].name",
    ),
    Case(
        "env name with =",
        "Pod",
        lambda o: container(o)["env"].insert(0, {"name": "A=B", "value": "a"}),
        "spec.containers[0].env[0].name",
    ),
    Case(
        "env value and valueFrom",
        "Pod",
        lambda o: container(o)["env"].insert(0, {"name": "A", "value": "a", "valueFrom": {"fieldRef": {}}}),
        "spec.containers[0].env[0].valueFrom",
    ),
    Case("volume name uppercase", "Pod", lambda o: o["spec"]["volumes"][4].update(name="Data"), "spec.volumes[4].name"),
    Case(
        "volume names repeat",
        "Pod",
        lambda o: o["spec"]["volumes"].append(copy.deepcopy(o["spec"]["volumes"][4])),
        "spec.volumes[5].name",
        DUPLICATE,
    ),
    Case(
        "volume without source",
        "Pod",
        lambda o: o["spec"]["volumes"].append({"name": "x"}),
        "spec.volumes[5]",
        REQUIRED,
    ),
    Case(
        "volume with two sources",
        "Pod",
        lambda o: o["spec"]["volumes"][4].update(emptyDir={}),
        "spec.volumes[4].hostPath",
        FORBIDDEN,
    ),
    Case(
        "mount of no volume",
        "Pod",
        lambda o: container(o)["volumeMounts"][4].update(name="missing"),
        "spec.containers[0].volumeMounts[4].name",
        NOT_FOUND,
    ),
    Case(
        "mount paths repeat",
        "Pod",
        lambda o: container(o)["volumeMounts"][4].update(mountPath="/dev/shm"),
        "spec.containers[0].volumeMounts[4].mountPath",
    ),
    Case(
        "subPath absolute",
        "Pod",
        lambda o: container(o)["volumeMounts"][4].update(subPath="/etc"),
        "spec.containers[0].volumeMounts.subPath",
    ),
    Case(
        "subPath with ..",
        "Pod",
        lambda o: container(o)["volumeMounts"][4].update(subPath="a/../../etc"),
        "spec.containers[0].volumeMounts.subPath",
    ),
    Case(
        "hostPath with ..",
        "Pod",
        lambda o: o["spec"]["volumes"][4]["hostPath"].update(path="/mnt/../etc"),
        "spec.volumes[4].hostPath.path",
    ),
    Case(
        "hostPath type unknown",
        "Pod",
        lambda o: o["spec"]["volumes"][4]["hostPath"].update(type="Dir"),
        "spec.volumes[4].hostPath.type",
        NOT_SUPPORTED,
    ),
    Case(
        "secret item path absolute",
        "Pod",
        lambda o: o["spec"]["volumes"][1]["secret"]["items"][0].update(path="/id"),
        "spec.volumes[1].secret.items[0].path",
    ),
    Case(
        "secret without name",
        "Pod",
        lambda o: o["spec"]["volumes"][1]["secret"].pop("secretName"),
        "spec.volumes[1].secret.secretName",
        REQUIRED,
    ),
    Case(
        "configMap mode over 0777",
        "Pod",
        lambda o: o["spec"]["volumes"][0]["configMap"].update(defaultMode=0o1000),
        "spec.volumes[0].configMap.defaultMode",
    ),
    Case(
        "emptyDir negative size",
        "Pod",
        lambda o: o["spec"]["volumes"][2]["emptyDir"].update(sizeLimit="-1Mi"),
        "spec.volumes[2].emptyDir.sizeLimit",
        FORBIDDEN,
    ),
    Case(
        "pvc without claim",
        "Pod",
        lambda o: o["spec"]["volumes"].__setitem__(4, {"name": "data", "persistentVolumeClaim": {}}),
        "spec.volumes[4].persistentVolumeClaim.claimName",
        REQUIRED,
    ),
    Case("hostname uppercase", "Pod", lambda o: o["spec"].update(hostname="Worker-0"), "spec.hostname"),
    Case("subdomain with dots", "Pod", lambda o: o["spec"].update(subdomain="job.ns"), "spec.subdomain"),
    Case(
        "quantity negative",
        "Pod",
        lambda o: resources(o, limits={"cpu": "-1"}, requests={"cpu": "-1"}),
        "spec.containers[0].resources.limits[cpu]",
    ),
    Case(
        "requests over limits",
        "Pod",
        lambda o: resources(o, limits={"cpu": "1"}, requests={"cpu": "2"}),
        "spec.containers[0].resources.requests",
    ),
    Case(
        "gpu without limit",
        "Pod",
        lambda o: resources(o, requests={"nvidia.com/gpu": "1"}),
        "spec.containers[0].resources.limits",
        REQUIRED,
    ),
    Case(
        "gpu overcommitted",
        "Pod",
        lambda o: resources(o, limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"}),
        "spec.containers[0].resources.requests",
    ),
    Case(
        "gpu fraction",
        "Pod",
        lambda o: resources(o, limits={"nvidia.com/gpu": "500m"}, requests={"nvidia.com/gpu": "500m"}),
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
    ),
    Case(
        "resource not standard",
        "Pod",
        lambda o: resources(o, limits={"gpu": "1"}),
        "spec.containers[0].resources.limits[gpu]",
    ),
    Case(
        "resource not for containers",
        "Pod",
        lambda o: resources(o, limits={"pods": "1"}),
        "spec.containers[0].resources.limits[pods]",
    ),
    Case(
        "extended resource name invalid",
        "Pod",
        lambda o: resources(o, limits={"nvidia.com/gpu_": "1"}),
        "spec.containers[0].resources.limits[nvidia.com/gpu_]",
    ),
    Case("deadline 0", "Pod", lambda o: o["spec"].update(activeDeadlineSeconds=0), "spec.activeDeadlineSeconds"),
    Case(
        "deadline over int32",
        "Pod",
        lambda o: o["spec"].update(activeDeadlineSeconds=2**31),
        "spec.activeDeadlineSeconds",
    ),
    Case(
        "restartPolicy unknown",
        "Pod",
        lambda o: o["spec"].update(restartPolicy="Sometimes"),
        "spec.restartPolicy",
        NOT_SUPPORTED,
    ),
    Case("dnsPolicy unknown", "Pod", lambda o: o["spec"].update(dnsPolicy="Cluster"), "spec.dnsPolicy", NOT_SUPPORTED),
    Case(
        "imagePullPolicy unknown",
        "Pod",
        lambda o: container(o).update(imagePullPolicy="Sometimes"),
        "spec.containers[0].imagePullPolicy",
        NOT_SUPPORTED,
    ),
    Case(
        "terminationMessagePolicy unknown",
        "Pod",
        lambda o: container(o).update(terminationMessagePolicy="Log"),
        "spec.containers[0].terminationMessagePolicy",
        NOT_SUPPORTED,
    ),
    Case("nodeSelector value -1", "Pod", lambda o: o["spec"]["nodeSelector"].update(pool="-1"), "spec.nodeSelector"),
    Case(
        "toleration key invalid",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(key="a b"),
        "spec.tolerations[0].key",
    ),
    Case(
        "toleration without key needs Exists",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(key="", operator="Equal"),
        "spec.tolerations[0].operator",
    ),
    Case(
        "toleration seconds need NoExecute",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(tolerationSeconds=60, effect="NoSchedule"),
        "spec.tolerations[0].effect",
    ),
    Case(
        "toleration Exists with value",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(value="yes"),
        "spec.tolerations[0].operator",
    ),
    Case(
        "toleration value not a label value",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(operator="Equal", value="-1"),
        "spec.tolerations[0].operator",
    ),
    Case(
        "toleration operator unknown",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(operator="In"),
        "spec.tolerations[0].operator",
        NOT_SUPPORTED,
    ),
    Case(
        "toleration effect unknown",
        "Pod",
        lambda o: o["spec"]["tolerations"][0].update(effect="Evict"),
        "spec.tolerations[0].effect",
        NOT_SUPPORTED,
    ),
    Case(
        "probe without handler",
        "Pod",
        lambda o: container(o)["readinessProbe"].pop("tcpSocket"),
        "spec.containers[0].readinessProbe",
        REQUIRED,
    ),
    Case(
        "probe port 0",
        "Pod",
        lambda o: container(o)["readinessProbe"]["tcpSocket"].update(port=0),
        "spec.containers[0].readinessProbe.tcpSocket.port",
    ),
    Case(
        "probe with two handlers",
        "Pod",
        lambda o: container(o)["readinessProbe"].update(exec={"command": ["true"]}),
        "spec.containers[0].readinessProbe.tcpSocket",
        FORBIDDEN,
    ),
    Case(
        "probe count negative",
        "Pod",
        lambda o: container(o)["readinessProbe"].update(periodSeconds=-1),
        "spec.containers[0].readinessProbe.periodSeconds",
    ),
    Case(
        "liveness successThreshold not 1",
        "Pod",
        lambda o: container(o).update(livenessProbe={**container(o)["readinessProbe"], "successThreshold": 2}),
        "spec.containers[0].livenessProbe.successThreshold",
    ),
    Case(
        "readiness with terminationGracePeriodSeconds",
        "Pod",
        lambda o: container(o)["readinessProbe"].update(terminationGracePeriodSeconds=5),
        "spec.containers[0].readinessProbe.terminationGracePeriodSeconds",
    ),
    Case(
        "serviceAccountName invalid",
        "Pod",
        lambda o: o["spec"].update(serviceAccountName="Trainer"),
        "spec.serviceAccountName",
    ),
    Case(
        "priorityClassName invalid",
        "Pod",
        lambda o: o["spec"].update(priorityClassName="High"),
        "spec.priorityClassName",
    ),
    Case(
        "ephemeral containers on create",
        "Pod",
        lambda o: o["spec"].update(ephemeralContainers=[{"name": "debug", "image": "busybox"}]),
        "spec.ephemeralContainers",
        FORBIDDEN,
    ),
    # --- services --------------------------------------------------------------------------------
    Case(
        "headless NodePort",
        "Service",
        lambda o: o["spec"].update(type="NodePort"),
        "spec.clusterIPs[0]",
    ),
    Case(
        "ports required unless headless",
        "Service",
        lambda o: o["spec"].update(clusterIP="", ports=[]),
        "spec.ports",
        REQUIRED,
    ),
    Case(
        "second port without name",
        "Service",
        lambda o: o["spec"]["ports"].append({"port": 2222}),
        "spec.ports[1].name",
        REQUIRED,
    ),
    Case("port name uppercase", "Service", lambda o: o["spec"]["ports"][0].update(name="SSH"), "spec.ports[0].name"),
    Case("port number 0", "Service", lambda o: o["spec"]["ports"][0].update(port=0), "spec.ports[0].port"),
    Case(
        "port repeated",
        "Service",
        lambda o: o["spec"]["ports"].append({**o["spec"]["ports"][0], "name": "ssh2"}),
        "spec.ports[1]",
        DUPLICATE,
    ),
    Case(
        "port names repeat",
        "Service",
        lambda o: o["spec"]["ports"].append({**o["spec"]["ports"][0], "port": 2222}),
        "spec.ports[1].name",
        DUPLICATE,
    ),
    Case(
        "targetPort name invalid",
        "Service",
        lambda o: o["spec"]["ports"][0].update(targetPort="ssh--d"),
        "spec.ports[0].targetPort",
    ),
    Case(
        "nodePort on ClusterIP",
        "Service",
        lambda o: o["spec"]["ports"][0].update(nodePort=30022),
        "spec.ports[0].nodePort",
        FORBIDDEN,
    ),
    Case("selector value invalid", "Service", lambda o: o["spec"]["selector"].update(x="-1"), "spec.selector"),
    Case("type unknown", "Service", lambda o: o["spec"].update(type="Headless"), "spec.type", NOT_SUPPORTED),
    Case("clusterIP lowercase none", "Service", lambda o: o["spec"].update(clusterIP="none"), "spec.clusterIPs[0]"),
    Case(
        "clusterIPs disagree",
        "Service",
        lambda o: o["spec"].update(clusterIPs=["10.0.0.1"]),
        "spec.clusterIPs",
    ),
    Case(
        "sessionAffinity unknown",
        "Service",
        lambda o: o["spec"].update(sessionAffinity="Sticky"),
        "spec.sessionAffinity",
        NOT_SUPPORTED,
    ),
    # --- secrets and configmaps ------------------------------------------------------------------
    Case("secret key with a space", "Secret", lambda o: o["data"].update({"id rsa": "eA=="}), "data[id rsa]"),
    Case("secret key ..", "Secret", lambda o: o["data"].update({"..": "eA=="}), "data[..]"),
    Case("secret stringData key invalid", "Secret", lambda o: o.update(stringData={"a/b": "x"}), "data[a/b]"),
    Case("secret over 1 MiB", "Secret", lambda o: o["data"].update(big=b64(1024 * 1024)), "data", TOO_LONG),
    Case(
        "ssh-auth secret without its key",
        "Secret",
        lambda o: o.update(type="kubernetes.io/ssh-auth"),
        "data[ssh-privatekey]",
        REQUIRED,
    ),
    Case("configmap key with a slash", "ConfigMap", lambda o: o["data"].update({"a/b": "x"}), "data[a/b]"),
    Case(
        "configmap key in data and binaryData",
        "ConfigMap",
        lambda o: o.update(binaryData={"hostfile": "eA=="}, data={**o["data"], "hostfile": "x"}),
        "data[hostfile]",
    ),
    Case("configmap over 1 MiB", "ConfigMap", lambda o: o["data"].update(big="x" * 1024 * 1024), "", TOO_LONG),
    # --- not even decodable: 400 -----------------------------------------------------------------
    Case(
        "quantity that does not parse",
        "Pod",
        lambda o: resources(o, limits={"cpu": "2 cores"}),
        "quantities must match the regular expression",
        code=400,
    ),
    Case(
        "quantity suffix unknown",
        "Pod",
        lambda o: resources(o, limits={"memory": "1K"}),
        "unable to parse quantity's suffix",
        code=400,
    ),
    Case(
        "secret data not base64",
        "Secret",
        lambda o: o["data"].update(bad="not base64!"),
        "illegal base64 data at input byte 3",
        code=400,
    ),
    Case(
        "configmap binaryData not base64",
        "ConfigMap",
        lambda o: o.update(binaryData={"x": "abc"}),
        "illegal base64 data at input byte",
        code=400,
    ),
    Case(
        "label value not a string",
        "Pod",
        lambda o: meta(o)["labels"].update(x=1),
        "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string",
        code=400,
    ),
    Case(
        "namespace other than the URL's",
        "ConfigMap",
        lambda o: meta(o).update(namespace="other"),
        "the namespace of the provided object does not match the namespace sent on the request",
        code=400,
    ),
]


@pytest.fixture(scope="module")
def strict() -> Iterator[tuple[KubeDouble, client.CoreV1Api]]:
    """One double for the table: every case is refused, so nothing is stored between them."""
    kube = KubeDouble(ScriptedKubelet())
    kube.start()
    yield kube, client.CoreV1Api(api_client_for(kube))
    kube.stop()


def create(core: client.CoreV1Api, kind: str, body: Obj) -> Any:
    method = {
        "Pod": core.create_namespaced_pod,
        "Service": core.create_namespaced_service,
        "Secret": core.create_namespaced_secret,
        "ConfigMap": core.create_namespaced_config_map,
    }[kind]
    return method(NS, body, _preload_content=False)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_double_refuses_what_the_apiserver_refuses(case: Case, strict: tuple[KubeDouble, Any]) -> None:
    kube, core = strict
    body = copy.deepcopy(BASE[case.kind])
    body["metadata"]["name"] = unique(body["metadata"]["name"][:40])  # nothing of another case in the way
    case.edit(body)
    with pytest.raises(ApiException) as caught:
        create(core, case.kind, body)
    status = json.loads(caught.value.body)
    assert caught.value.status == case.code, status
    assert status["kind"] == "Status" and status["status"] == "Failure" and status["code"] == case.code
    name = body["metadata"].get("name") or ""
    if case.code == 400:
        assert status["reason"] == "BadRequest" and case.field in status["message"], status
    else:
        assert status["reason"] == "Invalid", status
        named = status["details"]["name"]  # a generated name when only generateName was sent
        assert named == name or (not name and named.startswith(body["metadata"].get("generateName", "")))
        assert status["message"].startswith(f'{case.kind} "{named}" is invalid: '), status["message"]
        assert status["details"]["kind"] == case.kind
        causes = [(c["field"], c["reason"]) for c in status["details"]["causes"]]
        assert (case.field, case.reason) in causes, causes
        assert all(c["message"] in status["message"] for c in status["details"]["causes"])
    if name:
        assert kube.get(PLURAL[case.kind], NS, name) is None


def test_generate_name_is_expanded_as_the_apiserver_does(strict: tuple[KubeDouble, Any]) -> None:
    kube, core = strict
    body = copy.deepcopy(BASE["ConfigMap"])
    body["metadata"].pop("name")
    body["metadata"].pop("ownerReferences")  # no owner: the collector would remove it before the get
    body["metadata"]["generateName"] = "job-" + "x" * 60
    created = json.loads(create(core, "ConfigMap", body).data)
    name = created["metadata"]["name"]
    assert name.startswith("job-" + "x" * 54) and len(name) == 63
    assert kube.get("configmaps", NS, name) is not None


# --- replace (PUT): a pod's spec is immutable ---------------------------------------------------


@pytest.fixture
def stored_pod(strict: tuple[KubeDouble, Any]) -> tuple[Any, Obj]:
    """A created worker pod (no owner: the collector would remove it) and the client."""
    _, core = strict
    body = copy.deepcopy(BASE["Pod"])
    body["metadata"]["name"] = unique("upd")
    body["metadata"].pop("ownerReferences")
    return core, json.loads(create(core, "Pod", body).data)


def replace(core: Any, pod: Obj) -> Any:
    """Unconditional (no resourceVersion), as the apiserver allows for pods: the kubelet side keeps
    changing the pod's status, hence its version."""
    body = copy.deepcopy(pod)
    body["metadata"].pop("resourceVersion", None)
    return core.replace_namespaced_pod(pod["metadata"]["name"], NS, body, _preload_content=False)


def refused(core: Any, pod: Obj) -> Obj:
    with pytest.raises(ApiException) as caught:
        replace(core, pod)
    return dict(json.loads(caught.value.body)) | {"http": caught.value.status}


def test_pod_update_may_change_image_labels_and_shorten_the_deadline(stored_pod: tuple[Any, Obj]) -> None:
    core, pod = stored_pod
    pod["spec"]["containers"][0]["image"] = "registry.example/train:2"
    pod["spec"]["activeDeadlineSeconds"] -= 10
    pod["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})
    pod["metadata"]["labels"]["extra"] = "yes"
    updated = json.loads(replace(core, pod).data)
    assert updated["spec"]["containers"][0]["image"] == "registry.example/train:2"
    assert int(updated["metadata"]["resourceVersion"]) > int(pod["metadata"]["resourceVersion"])
    assert updated["status"]["phase"]  # the status is the stored one, not the body's


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda p: container(p).update(command=["bash", "-c", "true"]), "spec", FORBIDDEN),
        (lambda p: p["spec"]["containers"].append({**container(p), "name": "two"}), "spec.containers", FORBIDDEN),
        (
            lambda p: p["spec"].update(activeDeadlineSeconds=p["spec"]["activeDeadlineSeconds"] + 1),
            "spec.activeDeadlineSeconds",
            INVALID,
        ),
        (lambda p: p["spec"].pop("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", INVALID),
        (lambda p: p["spec"].update(tolerations=[]), "spec.tolerations", FORBIDDEN),
        (lambda p: p["metadata"].update(uid="another"), "metadata.uid", INVALID),
        (lambda p: p["metadata"]["labels"].update(x="-1"), "metadata.labels", INVALID),
    ],
    ids=["command", "container added", "deadline longer", "deadline removed", "toleration removed", "uid", "label"],
)
def test_pod_update_is_refused(
    stored_pod: tuple[Any, Obj], edit: Callable[[Obj], Any], field: str, reason: str
) -> None:
    core, pod = stored_pod
    edit(pod)
    status = refused(core, pod)
    assert status["http"] == 422 and status["reason"] == "Invalid"
    assert (field, reason) in [(c["field"], c["reason"]) for c in status["details"]["causes"]], status


def test_pod_update_with_a_stale_version_or_another_name(stored_pod: tuple[Any, Obj]) -> None:
    core, pod = stored_pod
    pod["metadata"]["labels"]["first"] = "yes"
    replace(core, pod)
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod(pod["metadata"]["name"], NS, pod, _preload_content=False)  # its version is old
    status = json.loads(caught.value.body)
    assert caught.value.status == 409 and status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    other = copy.deepcopy(pod)
    other["metadata"]["name"] = "someone-else"
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod(pod["metadata"]["name"], NS, other, _preload_content=False)
    assert (
        caught.value.status == 400 and "does not match the name on the URL" in json.loads(caught.value.body)["message"]
    )


def test_immutable_configmap_keeps_its_data(strict: tuple[KubeDouble, Any]) -> None:
    _, core = strict
    body = {"metadata": {"name": unique("frozen")}, "data": {"a": "1"}, "immutable": True}
    stored = json.loads(create(core, "ConfigMap", body).data)
    stored["data"]["a"] = "2"
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_config_map(stored["metadata"]["name"], NS, stored, _preload_content=False)
    assert caught.value.status == 422
    causes = json.loads(caught.value.body)["details"]["causes"]
    assert ("data", FORBIDDEN) in [(c["field"], c["reason"]) for c in causes], causes


# --- what a job creates is accepted, mapped or not ------------------------------------------------


@pytest.mark.parametrize("map_index", [-1, 0, 7])
def test_every_object_of_a_job_is_accepted(backend: KubernetesBackend, double: KubeDouble, map_index: int) -> None:
    spec = MPIJobSpec.from_dict(
        {
            "name": "kjob",
            "image": "registry.example/train:1",
            "command": ["python", "/app/train.py"],
            "master": {"cpu": 4, "memory": "16Gi", "gpus": 2, "gpu_type": "NVIDIA-A100-SXM4-80GB"},
            "workers": {
                "replicas": 2,
                "cpu": "3500m",
                "memory": "16Gi",
                "gpus": 2,
                "gpu_type": "NVIDIA-A100-SXM4-80GB",
            },
            "hosts_mode": "hostfile",
            "env": {"NCCL_DEBUG": "INFO"},
            "pod": {
                "shm_size": "8Gi",
                "labels": {"team": "ml"},
                "annotations": {"example.com/owner": "ml-team"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "volumes": [
                    {"name": "data", "mount_path": "/data", "persistent_volume_claim": "datasets", "sub_path": "v1"}
                ],
            },
        }
    )
    identity = RunIdentity("my.dag", "train_model", "scheduled__2026-11-30T19:52:07.123456+00:00", map_index, 3)
    plan = render_plan(spec, identity)
    backend.create(plan)
    backend.start_master(plan.job_name)
    try:
        sent = [b for b in double.created if b.get("kind") not in ("Event", "Lease")]  # the Lease: no core kind
        assert [b["kind"] for b in sent] == ["Service", "Secret", "ConfigMap", "Pod", "Pod", "Pod"]
        stored = job_objects(double, plan.job_name)
        assert len(stored) == 7, stored
        for body in sent:
            assert validate_object(PLURAL[body["kind"]], body) == []
            assert (LABEL_MAP_INDEX in body["metadata"]["labels"]) == (map_index >= 0)
        found = backend.find_jobs(identity, NS)
        assert [(j.job_name, j.try_number) for j in found] == [(plan.job_name, 3)]
    finally:
        backend.teardown(plan.job_name)
        backend.leftovers(plan.job_name)
