"""What kube-apiserver refuses, and in its words: the validation of Pods, Services, Secrets and
ConfigMaps (create and update) as pure functions returning the causes of a 422 ``Invalid``.

Ported from Kubernetes' own validation (apimachinery ``ValidateObjectMeta``, ``ValidateLabels``,
``ValidateAnnotations``, ``ValidateOwnerReferences``; core ``ValidatePodCreate``/``ValidatePodUpdate``,
``ValidateService``, ``ValidateSecret``, ``ValidateConfigMap``), so a double built on it shares the
real server's rules rather than the product's assumptions. Every cause has the apiserver's field
path, its CauseType (``FieldValueInvalid`` ...) and its message. Where Kubernetes versions differ,
the stricter rule is kept: a job must run on every supported cluster. Rules the apiserver only
applies after defaulting (an absent ``restartPolicy`` is ``Always``) are applied the same way.

Admission (Pod Security, quotas) is not validation and is not here; a check such as
``pod_security_restricted(pod)`` belongs beside ``validate_object``, called by the double after it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.doubles.apiformats import (
    Quantity,
    QuantityError,
    base64_decoded_size,
    base64_error,
    inclusive_range_error,
    is_config_map_key,
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_env_var_name,
    is_label_value,
    is_qualified_name,
    is_valid_ip,
    is_valid_port_name,
    is_valid_port_num,
    mask_trailing_dash,
    parse_quantity,
)

Obj = dict[str, Any]

KINDS = {"pods": "Pod", "services": "Service", "secrets": "Secret", "configmaps": "ConfigMap", "events": "Event"}
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024  # bytes of all annotation keys and values together
MAX_SECRET_SIZE = 1024 * 1024  # bytes of a Secret's or a ConfigMap's data
MAX_INT32 = 2**31 - 1
FIELD_IMMUTABLE = "field is immutable"

INVALID = "FieldValueInvalid"
REQUIRED = "FieldValueRequired"
NOT_FOUND = "FieldValueNotFound"
DUPLICATE = "FieldValueDuplicate"
NOT_SUPPORTED = "FieldValueNotSupported"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"


@dataclass(frozen=True)
class Cause:
    """One reason of a 422, as in ``Status.details.causes``."""

    field: str
    reason: str  # the apiserver's CauseType
    message: str  # without the field, e.g. 'Invalid value: "-1": a valid label must ...'

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    def to_dict(self) -> Obj:
        return {"reason": self.reason, "message": self.message, "field": self.field}


# --- causes, worded as the apiserver words them ----------------------------------------------------


def invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause(field, INVALID, f"Invalid value: {go_value(value)}" + (f": {detail}" if detail else ""))


def required(field: str, detail: str = "") -> Cause:
    return Cause(field, REQUIRED, "Required value" + (f": {detail}" if detail else ""))


def not_found(field: str, value: Any) -> Cause:
    return Cause(field, NOT_FOUND, f"Not found: {go_value(value)}")


def duplicate(field: str, value: Any) -> Cause:
    return Cause(field, DUPLICATE, f"Duplicate value: {go_value(value)}")


def not_supported(field: str, value: Any, supported: Sequence[str]) -> Cause:
    listed = ", ".join(go_quote(choice) for choice in supported)
    return Cause(field, NOT_SUPPORTED, f"Unsupported value: {go_value(value)}: supported values: {listed}")


def forbidden(field: str, detail: str) -> Cause:
    return Cause(field, FORBIDDEN, f"Forbidden: {detail}")


def too_long(field: str, limit: int) -> Cause:
    return Cause(field, TOO_LONG, f"Too long: may not be more than {limit} bytes")


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string."""
    escapes = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
    escapes.update({"\t": "\\t", "\v": "\\v"})
    out = []
    for char in text:
        if char in escapes:
            out.append(escapes[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def go_value(value: Any) -> str:
    """A bad value as ``field.Error`` prints it: strings quoted, numbers bare, the rest as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return go_quote(value)
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def invalid_message(kind: str, name: str, causes: Sequence[Cause]) -> str:
    """``<Kind> "<name>" is invalid: ...``: one cause bare, several in brackets, repeats dropped."""
    texts = list(dict.fromkeys(str(cause) for cause in causes))
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return f"{kind} {go_quote(name)} is invalid: {joined}"


def invalid_details(kind: str, name: str, causes: Sequence[Cause]) -> Obj:
    return {"name": name, "kind": kind, "causes": [cause.to_dict() for cause in causes]}


# --- entry points ----------------------------------------------------------------------------------


def validate_object(plural: str, obj: Mapping[str, Any], *, old: Mapping[str, Any] | None = None) -> list[Cause]:
    """Every cause kube-apiserver gives for refusing ``obj`` with 422: its create, or its update of
    ``old``. Expects what the apiserver validates: names generated, namespace filled in."""
    validators: dict[str, Callable[[Mapping[str, Any]], list[Cause]]] = {
        "pods": validate_pod,
        "services": validate_service,
        "secrets": validate_secret,
        "configmaps": validate_config_map,
        "events": lambda event: validate_metadata(_map(event, "metadata"), is_dns1123_subdomain_name),
    }
    if plural not in validators:
        raise ValueError(f"no validation for {plural!r}; known: {', '.join(validators)}")
    if old is None:
        return validators[plural](obj)
    updates: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], list[Cause]]] = {
        "pods": validate_pod_update,
        "services": validate_service_update,
        "secrets": validate_secret_update,
        "configmaps": validate_config_map_update,
        "events": lambda new, old_: validate_metadata_update(_map(new, "metadata"), _map(old_, "metadata")),
    }
    causes = updates[plural](obj, old)
    if plural == "events":
        causes += validators[plural](obj)
    return causes


def decode_error(plural: str, obj: Mapping[str, Any]) -> str | None:
    """Why the apiserver could not even decode ``obj`` (it answers 400 ``BadRequest``), or None:
    quantities that do not parse, ``data`` that is not base64, maps whose values are not strings."""
    for path, value in _string_maps(plural, obj):
        if not isinstance(value, str):
            kind = "number" if isinstance(value, int | float) and not isinstance(value, bool) else "object"
            return f"json: cannot unmarshal {kind} into Go struct field {path} of type string"
    for value in _quantities(plural, obj):
        try:
            parse_quantity(value)
        except QuantityError as error:
            return str(error)
    for key in ("data", "binaryData") if plural in ("secrets", "configmaps") else ():
        if plural == "configmaps" and key == "data":
            continue
        for value in _map(obj, key).values():
            error_text = base64_error(value) if isinstance(value, str) else "illegal base64 data at input byte 0"
            if error_text:
                return error_text
    return None


def decode_failure_message(plural: str, obj: Mapping[str, Any], base: str) -> str:
    """The 400 message: ``Pod in version "v1" cannot be handled as a Pod: <why>``."""
    kind = KINDS[plural]
    sent = obj.get("kind")
    if sent:
        version = str(obj.get("apiVersion") or "v1").rsplit("/", 1)[-1]
        return f"{sent} in version {go_quote(version)} cannot be handled as a {kind}: {base}"
    text = json.dumps(obj, separators=(",", ":"))
    summary = text[:30] + " ..." if len(text) > 30 else text
    return f"the object provided is unrecognized (must be of type {kind}): {base} ({summary})"


def _string_maps(plural: str, obj: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    meta = _map(obj, "metadata")
    for key in ("labels", "annotations"):
        for value in _map(meta, key).values():
            yield f"ObjectMeta.metadata.{key}", value
    if plural == "configmaps":
        for value in _map(obj, "data").values():
            yield "ConfigMap.data", value
    if plural == "secrets":
        for value in _map(obj, "stringData").values():
            yield "Secret.stringData", value


def _quantities(plural: str, obj: Mapping[str, Any]) -> Iterator[Any]:
    if plural != "pods":
        return
    spec = _map(obj, "spec")
    for key in spec:
        if key in ("containers", "initContainers"):
            for container in _list(spec, key):
                resources = _map(container, "resources")
                for part in resources:
                    if part in ("limits", "requests"):
                        yield from _map(resources, part).values()
        elif key == "volumes":
            for volume in _list(spec, key):
                empty_dir = _map(volume, "emptyDir")
                if "sizeLimit" in empty_dir:
                    yield empty_dir["sizeLimit"]
        elif key == "overhead":
            yield from _map(spec, key).values()


# --- metadata ----------------------------------------------------------------------------------------

NameCheck = Callable[[str, bool], list[str]]


def is_dns1123_subdomain_name(name: str, prefix: bool = False) -> list[str]:
    """Names of Pods, Secrets, ConfigMaps (and Events)."""
    return is_dns1123_subdomain(mask_trailing_dash(name) if prefix else name)


def is_dns1035_label_name(name: str, prefix: bool = False) -> list[str]:
    """Names of Services (they become DNS labels)."""
    return is_dns1035_label(mask_trailing_dash(name) if prefix else name)


STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}


def validate_metadata(meta: Mapping[str, Any], name_check: NameCheck, path: str = "metadata") -> list[Cause]:
    """ObjectMeta on create: names, namespace, labels, annotations, owner references, finalizers."""
    causes = []
    generate_name = meta.get("generateName") or ""
    if generate_name:
        causes += [invalid(f"{path}.generateName", generate_name, m) for m in name_check(generate_name, True)]
    name = meta.get("name") or ""
    if not name:
        causes.append(required(f"{path}.name", "name or generateName is required"))
    else:
        causes += [invalid(f"{path}.name", name, message) for message in name_check(name, False)]
    namespace = meta.get("namespace") or ""
    if not namespace:
        causes.append(required(f"{path}.namespace"))
    else:
        causes += [invalid(f"{path}.namespace", namespace, message) for message in is_dns1123_label(namespace)]
    causes += validate_labels(_map(meta, "labels"), f"{path}.labels")
    causes += validate_annotations(_map(meta, "annotations"), f"{path}.annotations")
    causes += validate_owner_references(_list(meta, "ownerReferences"), f"{path}.ownerReferences")
    for index, finalizer in enumerate(_strings(meta, "finalizers")):
        causes += [invalid(f"{path}.finalizers", finalizer, message) for message in is_qualified_name(finalizer)]
        if "/" not in finalizer and finalizer not in STANDARD_FINALIZERS:
            detail = "name is neither a standard finalizer name nor is it fully qualified"
            causes.append(invalid(f"{path}.finalizers[{index}]", finalizer, detail))
    return causes


def validate_metadata_update(meta: Mapping[str, Any], old: Mapping[str, Any], path: str = "metadata") -> list[Cause]:
    """ObjectMeta on update: identity fields keep their values; labels and the rest stay valid."""
    causes = []
    for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
        if meta.get(key) != old.get(key):
            causes.append(invalid(f"{path}.{key}", meta.get(key) or "", FIELD_IMMUTABLE))
    causes += validate_labels(_map(meta, "labels"), f"{path}.labels")
    causes += validate_annotations(_map(meta, "annotations"), f"{path}.annotations")
    causes += validate_owner_references(_list(meta, "ownerReferences"), f"{path}.ownerReferences")
    return causes


def validate_labels(labels: Mapping[str, Any], path: str) -> list[Cause]:
    """Label keys are qualified names; values at most 63 of ``[-A-Za-z0-9_.]``, alphanumeric at
    both ends (so ``-1`` is refused). The field is the map's, not the key's, as the apiserver says."""
    causes = []
    for key, value in labels.items():
        causes += [invalid(path, key, message) for message in is_qualified_name(key)]
        causes += [invalid(path, value, message) for message in is_label_value(str(value))]
    return causes


def validate_annotations(annotations: Mapping[str, Any], path: str) -> list[Cause]:
    causes = []
    for key in annotations:
        # Case does not matter in annotation keys: checked in lower case.
        causes += [invalid(path, key, message) for message in is_qualified_name(key.lower())]
    size = sum(len(key.encode()) + len(str(value).encode()) for key, value in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE_LIMIT:
        causes.append(too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return causes


def validate_owner_references(references: Sequence[Any], path: str) -> list[Cause]:
    """apiVersion, kind, name and uid are all required; at most one reference is the controller."""
    causes = []
    controller = ""
    for index, ref in enumerate(references):
        ref = ref if isinstance(ref, Mapping) else {}
        where = f"{path}[{index}]"
        api_version = str(ref.get("apiVersion") or "")
        if not api_version:
            causes.append(required(f"{where}.apiVersion", "must not be empty"))
        elif api_version.count("/") > 1 or not api_version.rsplit("/", 1)[-1]:
            causes.append(invalid(f"{where}.apiVersion", api_version, "must be <group>/<version> or <version>"))
        for key in ("kind", "name", "uid"):
            if not ref.get(key):
                causes.append(required(f"{where}.{key}", "must not be empty"))
        if api_version == "v1" and ref.get("kind") == "Event":
            causes.append(invalid(where, dict(ref), "/v1, Kind=Event is disallowed from being an owner"))
        if ref.get("controller") is True:
            this = f"{ref.get('kind', '')}/{ref.get('name', '')}"
            if controller:
                detail = (
                    'Only one reference can have Controller set to true. Found "true" in references for '
                    f"{controller} and {this}"
                )
                causes.append(invalid(path, list(references), detail))
            else:
                controller = this
    return causes


# --- pods ------------------------------------------------------------------------------------------


def validate_pod(pod: Mapping[str, Any]) -> list[Cause]:
    """A Pod on create."""
    causes = _validate_pod_metadata_and_spec(pod)
    if _list(_map(pod, "spec"), "ephemeralContainers"):
        causes.append(forbidden("spec.ephemeralContainers", "cannot be set on create"))
    return causes


def _validate_pod_metadata_and_spec(pod: Mapping[str, Any]) -> list[Cause]:
    """What a Pod must be on create and on every update."""
    spec = _map(pod, "spec")
    causes = validate_metadata(_map(pod, "metadata"), is_dns1123_subdomain_name)
    causes += validate_pod_spec(spec, "spec")
    for key in ("containers", "initContainers"):
        for index, container in enumerate(_list(spec, key)):
            image = str(container.get("image") or "")
            if image != image.strip():
                causes.append(
                    invalid(f"spec.{key}[{index}].image", image, "must not have leading or trailing whitespace")
                )
    return causes


RESTART_POLICIES = ("Always", "OnFailure", "Never")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TERMINATION_MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
PROTOCOLS = ("SCTP", "TCP", "UDP")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
HOST_PATH_TYPES = ("", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket")
# VolumeSource members in the order the apiserver checks them ("may not specify more than 1").
VOLUME_SOURCES = (
    "emptyDir", "hostPath", "gitRepo", "gcePersistentDisk", "awsElasticBlockStore", "secret", "nfs", "iscsi",
    "glusterfs", "flocker", "persistentVolumeClaim", "rbd", "cinder", "cephfs", "quobyte", "downwardAPI", "fc",
    "flexVolume", "configMap", "azureFile", "vsphereVolume", "photonPersistentDisk", "portworxVolume", "azureDisk",
    "storageos", "projected", "scaleIO", "csi", "ephemeral", "image",
)  # fmt: skip


def validate_pod_spec(spec: Mapping[str, Any], path: str) -> list[Cause]:
    causes, volumes = validate_volumes(_list(spec, "volumes"), f"{path}.volumes")
    containers = _list(spec, "containers")
    if not containers:
        causes.append(required(f"{path}.containers"))
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for index, container in enumerate(_list(spec, key)):
            where = f"{path}.{key}[{index}]"
            causes += validate_container(container, volumes, where)
            name = str(container.get("name") or "")
            if name in names:
                causes.append(duplicate(f"{where}.name", name))
            names.add(name)
            if key == "containers" or container.get("restartPolicy") == "Always":
                causes += validate_probes(container, where)
            else:
                for probe in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
                    if container.get(probe) is not None:
                        detail = "may not be set for init containers without restartPolicy=Always"
                        causes.append(forbidden(f"{where}.{probe}", detail))
    causes += _enum(spec, "restartPolicy", RESTART_POLICIES, path)
    causes += _enum(spec, "dnsPolicy", DNS_POLICIES, path)
    causes += validate_labels(_map(spec, "nodeSelector"), f"{path}.nodeSelector")
    for key in ("hostname", "subdomain"):
        if spec.get(key):
            causes += [invalid(f"{path}.{key}", spec[key], message) for message in is_dns1123_label(spec[key])]
    for key in ("serviceAccountName", "nodeName", "priorityClassName"):
        if spec.get(key):
            causes += [invalid(f"{path}.{key}", spec[key], m) for m in is_dns1123_subdomain(spec[key])]
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and not 1 <= deadline <= MAX_INT32:
        causes.append(invalid(f"{path}.activeDeadlineSeconds", deadline, inclusive_range_error(1, MAX_INT32)))
    causes += validate_tolerations(_list(spec, "tolerations"), f"{path}.tolerations")
    return causes


def validate_volumes(volumes: Sequence[Any], path: str) -> tuple[list[Cause], dict[str, Mapping[str, Any]]]:
    """Each volume: a DNS-1123 label name, unique, exactly one source. Returns the valid ones by name."""
    causes: list[Cause] = []
    valid: dict[str, Mapping[str, Any]] = {}
    for index, volume in enumerate(volumes):
        where = f"{path}[{index}]"
        name = str(volume.get("name") or "")
        problems = validate_volume_source(volume, where)
        if not name:
            problems.append(required(f"{where}.name"))
        else:
            problems += [invalid(f"{where}.name", name, message) for message in is_dns1123_label(name)]
        if name in valid:
            problems.append(duplicate(f"{where}.name", name))
        if problems:
            causes += problems
        else:
            valid[name] = volume
    return causes, valid


def validate_volume_source(volume: Mapping[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    chosen = [key for key in VOLUME_SOURCES if volume.get(key) is not None]
    for extra in chosen[1:]:
        causes.append(forbidden(f"{path}.{extra}", "may not specify more than 1 volume type"))
    if not chosen:
        return [required(path, "must specify a volume type")]
    source, where = _map(volume, chosen[0]), f"{path}.{chosen[0]}"
    if chosen[0] == "emptyDir" and "sizeLimit" in source and _negative(source["sizeLimit"]):
        causes.append(forbidden(f"{where}.sizeLimit", "SizeLimit field must be a valid resource quantity"))
    elif chosen[0] == "hostPath":
        host_path = str(source.get("path") or "")
        if not host_path:
            causes.append(required(f"{where}.path"))
        else:
            causes += _no_backsteps(host_path, f"{where}.path")
            if source.get("type") is not None and source["type"] not in HOST_PATH_TYPES:
                causes.append(not_supported(f"{where}.type", source["type"], HOST_PATH_TYPES))
    elif chosen[0] in ("secret", "configMap"):
        name_key = "secretName" if chosen[0] == "secret" else "name"
        if not source.get(name_key):
            causes.append(required(f"{where}.{name_key}"))
        causes += _file_mode(source, "defaultMode", where)
        for index, item in enumerate(_list(source, "items")):
            causes += validate_key_to_path(item, f"{where}.items[{index}]")
    elif chosen[0] == "persistentVolumeClaim" and not source.get("claimName"):
        causes.append(required(f"{where}.claimName"))
    return causes


def validate_key_to_path(item: Mapping[str, Any], path: str) -> list[Cause]:
    causes = []
    if not item.get("key"):
        causes.append(required(f"{path}.key"))
    target = str(item.get("path") or "")
    if not target:
        causes.append(required(f"{path}.path"))
    causes += _local_descending_path(target, f"{path}.path")
    if target.startswith("..") and not target.startswith("../"):
        causes.append(invalid(f"{path}.path", target, "must not start with '..'"))
    return causes + _file_mode(item, "mode", path)


def _file_mode(source: Mapping[str, Any], key: str, path: str) -> list[Cause]:
    mode = source.get(key)
    if mode is not None and not 0 <= mode <= 0o777:
        return [invalid(f"{path}.{key}", mode, "must be a number between 0 and 0777 (octal), both inclusive")]
    return []


def _no_backsteps(target: str, path: str) -> list[Cause]:
    if ".." in target.replace("\\", "/").split("/"):
        return [invalid(path, target, "must not contain '..'")]
    return []


def _local_descending_path(target: str, path: str) -> list[Cause]:
    causes = []
    if target.startswith("/"):
        causes.append(invalid(path, target, "must be a relative path"))
    return causes + _no_backsteps(target, path)


def validate_container(container: Mapping[str, Any], volumes: Mapping[str, Any], path: str) -> list[Cause]:
    """Name, image, ports, env, mounts, pull policy and resources of one container."""
    causes = []
    name = str(container.get("name") or "")
    if not name:
        causes.append(required(f"{path}.name"))
    else:
        causes += [invalid(f"{path}.name", name, message) for message in is_dns1123_label(name)]
    if not container.get("image"):
        causes.append(required(f"{path}.image"))
    causes += _enum(container, "terminationMessagePolicy", TERMINATION_MESSAGE_POLICIES, path)
    causes += validate_container_ports(_list(container, "ports"), f"{path}.ports")
    causes += validate_env(_list(container, "env"), f"{path}.env")
    causes += validate_volume_mounts(_list(container, "volumeMounts"), volumes, f"{path}.volumeMounts")
    causes += _enum(container, "imagePullPolicy", PULL_POLICIES, path)
    causes += validate_resources(_map(container, "resources"), f"{path}.resources")
    return causes


def validate_container_ports(ports: Sequence[Any], path: str) -> list[Cause]:
    causes = []
    names: set[str] = set()
    for index, port in enumerate(ports):
        where = f"{path}[{index}]"
        name = port.get("name") or ""
        if name:
            messages = is_valid_port_name(name)
            causes += [invalid(f"{where}.name", name, message) for message in messages]
            if not messages and name in names:
                causes.append(duplicate(f"{where}.name", name))
            names.add(name)
        number = port.get("containerPort") or 0
        if not number:
            causes.append(required(f"{where}.containerPort"))
        else:
            causes += [invalid(f"{where}.containerPort", number, m) for m in is_valid_port_num(number)]
        if port.get("hostPort"):
            causes += [invalid(f"{where}.hostPort", port["hostPort"], m) for m in is_valid_port_num(port["hostPort"])]
        causes += _enum(port, "protocol", PROTOCOLS, where)
    return causes


def validate_env(env: Sequence[Any], path: str) -> list[Cause]:
    causes = []
    for index, variable in enumerate(env):
        where = f"{path}[{index}]"
        name = str(variable.get("name") or "")
        if not name:
            causes.append(required(f"{where}.name"))
        else:
            causes += [invalid(f"{where}.name", name, message) for message in is_env_var_name(name)]
        source = variable.get("valueFrom")
        if source is not None:
            given = [
                key for key in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef") if key in source
            ]
            if not given:
                detail = "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
                causes.append(invalid(f"{where}.valueFrom", "", detail))
            elif variable.get("value"):
                causes.append(invalid(f"{where}.valueFrom", "", "may not be specified when `value` is not empty"))
            elif len(given) > 1:
                causes.append(invalid(f"{where}.valueFrom", "", "may not have more than one field specified at a time"))
    return causes


def validate_volume_mounts(mounts: Sequence[Any], volumes: Mapping[str, Any], path: str) -> list[Cause]:
    """Each mount names a volume of the pod, at a unique path; subPath stays inside the volume."""
    causes = []
    seen: set[str] = set()
    for index, mount in enumerate(mounts):
        where = f"{path}[{index}]"
        name = str(mount.get("name") or "")
        if not name:
            causes.append(required(f"{where}.name"))
        if name not in volumes:
            causes.append(not_found(f"{where}.name", name))
        mount_path = str(mount.get("mountPath") or "")
        if not mount_path:
            causes.append(required(f"{where}.mountPath"))
        if mount_path in seen:
            causes.append(invalid(f"{where}.mountPath", mount_path, "must be unique"))
        seen.add(mount_path)
        # The apiserver names the list here, not the item (field "...volumeMounts.subPath").
        if mount.get("subPath"):
            causes += _local_descending_path(mount["subPath"], f"{path}.subPath")
        if mount.get("subPathExpr"):
            if mount.get("subPath"):
                detail = "subPathExpr and subPath are mutually exclusive"
                causes.append(invalid(f"{where}.subPathExpr", mount["subPathExpr"], detail))
            causes += _local_descending_path(mount["subPathExpr"], f"{path}.subPathExpr")
    return causes


STANDARD_RESOURCES = {
    "cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory", "requests.ephemeral-storage",
    "limits.cpu", "limits.memory", "limits.ephemeral-storage", "pods", "quota", "services",
    "replicationcontrollers", "secrets", "configmaps", "persistentvolumeclaims", "storage", "requests.storage",
    "services.nodeports", "services.loadbalancers",
}  # fmt: skip
STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
INTEGER_RESOURCES = {
    "pods", "quota", "services", "replicationcontrollers", "secrets", "configmaps", "persistentvolumeclaims",
    "services.nodeports", "services.loadbalancers",
}  # fmt: skip


def is_native_resource(name: str) -> bool:
    """Unprefixed, or in the kubernetes.io/ namespace."""
    return "/" not in name or "kubernetes.io/" in name


def is_extended_resource(name: str) -> bool:
    """A vendor's resource (``nvidia.com/gpu``): whole units only, never overcommitted."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not is_qualified_name("requests." + name)


def is_overcommit_allowed(name: str) -> bool:
    return is_native_resource(name) and not name.startswith("hugepages-")


def validate_resource_name(name: str, path: str) -> list[Cause]:
    causes = [invalid(path, name, message) for message in is_qualified_name(name)]
    if causes:
        return causes
    if "/" not in name:
        if name not in STANDARD_RESOURCES and not name.startswith(("hugepages-", "requests.hugepages-")):
            return [invalid(path, name, "must be a standard resource type or fully qualified")]
        if name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            return [invalid(path, name, "must be a standard resource for containers")]
    elif not is_native_resource(name) and not is_extended_resource(name):
        return [invalid(path, name, "doesn't follow extended resource name standard")]
    return []


def validate_resources(resources: Mapping[str, Any], path: str) -> list[Cause]:
    """Names, non-negative quantities, whole units of extended resources, requests <= limits, and
    for resources that cannot be overcommitted (GPUs, hugepages) a limit equal to the request."""
    causes: list[Cause] = []
    limits, requests = _map(resources, "limits"), _map(resources, "requests")
    for part, amounts in (("limits", limits), ("requests", requests)):
        for name, amount in amounts.items():
            where = f"{path}.{part}[{name}]"
            causes += validate_resource_name(name, where)
            quantity = _quantity(amount)
            if quantity is None:
                continue  # not even decodable: see decode_error
            if quantity.value < 0:
                causes.append(invalid(where, str(quantity), "must be greater than or equal to 0"))
            if (name in INTEGER_RESOURCES or is_extended_resource(name)) and quantity.value.denominator != 1:
                causes.append(invalid(where, str(quantity), "must be an integer"))
            if part != "requests":
                continue
            limit = _quantity(limits[name]) if name in limits else None
            if limit is not None:
                if quantity.value != limit.value and not is_overcommit_allowed(name):
                    detail = f"must be equal to {name} limit of {limit}"
                    causes.append(invalid(f"{path}.requests", str(quantity), detail))
                elif quantity.value > limit.value:
                    detail = f"must be less than or equal to {name} limit of {limit}"
                    causes.append(invalid(f"{path}.requests", str(quantity), detail))
            elif name not in limits and not is_overcommit_allowed(name):
                causes.append(required(f"{path}.limits", "Limit must be set for non overcommitable resources"))
    return causes


def validate_probes(container: Mapping[str, Any], path: str) -> list[Cause]:
    causes = []
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(key)
        if probe is None:
            continue
        where = f"{path}.{key}"
        handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if probe.get(h) is not None]
        if not handlers:
            causes.append(required(where, "must specify a handler type"))
        for extra in handlers[1:]:
            causes.append(forbidden(f"{where}.{extra}", "may not specify more than 1 handler type"))
        if handlers and handlers[0] in ("tcpSocket", "httpGet"):
            causes += validate_port_number_or_name(_map(probe, handlers[0]).get("port"), f"{where}.{handlers[0]}.port")
        for number in (
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ):
            if (probe.get(number) or 0) < 0:
                causes.append(invalid(f"{where}.{number}", probe[number], "must be greater than or equal to 0"))
        if key != "readinessProbe" and probe.get("successThreshold") not in (None, 0, 1):
            causes.append(invalid(f"{where}.successThreshold", probe["successThreshold"], "must be 1"))
        if key == "readinessProbe" and probe.get("terminationGracePeriodSeconds") is not None:
            value = probe["terminationGracePeriodSeconds"]
            causes.append(
                invalid(f"{where}.terminationGracePeriodSeconds", value, "must not be set for readinessProbes")
            )
    return causes


def validate_port_number_or_name(port: Any, path: str) -> list[Cause]:
    if isinstance(port, int) and not isinstance(port, bool):
        return [invalid(path, port, message) for message in is_valid_port_num(port)]
    if isinstance(port, str):
        return [invalid(path, port, message) for message in is_valid_port_name(port)]
    return [required(path)]


def validate_tolerations(tolerations: Sequence[Any], path: str) -> list[Cause]:
    """Keys are label keys; an empty key needs Exists; Equal values are label values; Exists has no
    value; tolerationSeconds only with NoExecute."""
    causes = []
    for index, toleration in enumerate(tolerations):
        where = f"{path}[{index}]"
        key = str(toleration.get("key") or "")
        operator = toleration.get("operator") or ""
        value = str(toleration.get("value") or "")
        effect = toleration.get("effect") or ""
        if key:
            causes += [invalid(f"{where}.key", key, message) for message in is_qualified_name(key)]
        if not key and operator != "Exists":
            detail = 'operator must be Exists when `key` is empty, which means "match all values and all keys"'
            causes.append(invalid(f"{where}.operator", operator, detail))
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            causes.append(
                invalid(f"{where}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set")
            )
        if operator in ("Equal", ""):
            messages = is_label_value(value)
            if messages:  # the apiserver reports the value under "operator"
                causes.append(invalid(f"{where}.operator", value, ";".join(messages)))
        elif operator == "Exists":
            if value:
                causes.append(invalid(f"{where}.operator", value, "value must be empty when `operator` is 'Exists'"))
        else:
            causes.append(not_supported(f"{where}.operator", operator, ("Equal", "Exists")))
        if effect and effect not in TAINT_EFFECTS:
            causes.append(not_supported(f"{where}.effect", effect, TAINT_EFFECTS))
    return causes


UPDATABLE_POD_SPEC_FIELDS = (
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
)


def validate_pod_update(pod: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """A Pod's spec is immutable but for images, a shorter activeDeadlineSeconds, added tolerations."""
    causes = validate_metadata_update(_map(pod, "metadata"), _map(old, "metadata"))
    causes += _validate_pod_metadata_and_spec(pod)
    spec, old_spec = _map(pod, "spec"), _map(old, "spec")
    for key in ("containers", "initContainers"):
        if len(_list(spec, key)) != len(_list(old_spec, key)):
            return [*causes, forbidden(f"spec.{key}", "pod updates may not add or remove containers")]
    deadline, old_deadline = spec.get("activeDeadlineSeconds"), old_spec.get("activeDeadlineSeconds")
    if deadline is not None:
        if not 0 <= deadline <= MAX_INT32:
            return [*causes, invalid("spec.activeDeadlineSeconds", deadline, inclusive_range_error(0, MAX_INT32))]
        if old_deadline is not None and old_deadline < deadline:
            return [
                *causes,
                invalid("spec.activeDeadlineSeconds", deadline, "must be less than or equal to previous value"),
            ]
    elif old_deadline is not None:
        causes.append(
            invalid("spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value")
        )
    tolerations = _list(spec, "tolerations")
    for old_toleration in _list(old_spec, "tolerations"):
        kept = {k: v for k, v in old_toleration.items() if k != "tolerationSeconds"}
        if not any(kept == {k: v for k, v in t.items() if k != "tolerationSeconds"} for t in tolerations):
            detail = "existing toleration can not be modified except its tolerationSeconds"
            causes.append(forbidden("spec.tolerations", detail))
            break
    munged = dict(spec)
    for key in ("containers", "initContainers"):
        if key in munged:
            old_images = [container.get("image") for container in _list(old_spec, key)]
            munged[key] = [{**c, "image": image} for c, image in zip(_list(spec, key), old_images)]
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        munged.pop(key, None)
        if key in old_spec:
            munged[key] = old_spec[key]
    if _normal(munged) != _normal(old_spec):
        diff = "\n".join(
            difflib.unified_diff(_lines(old_spec), _lines(munged), "old spec", "new spec", n=0, lineterm="")
        )
        detail = f"pod updates may not change fields other than {','.join(UPDATABLE_POD_SPEC_FIELDS)}\n{diff}"
        causes.append(forbidden("spec", detail))
    return causes


# --- services --------------------------------------------------------------------------------------

SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")
SESSION_AFFINITIES = ("ClientIP", "None")


def cluster_ips(spec: Mapping[str, Any]) -> list[str]:
    """``spec.clusterIPs`` as the apiserver defaults it from ``spec.clusterIP``."""
    ips = _strings(spec, "clusterIPs")
    return ips or ([str(spec["clusterIP"])] if spec.get("clusterIP") else [])


def validate_service(service: Mapping[str, Any]) -> list[Cause]:
    """A Service on create: a DNS-1035 name, ports, selector, type and the headless rules."""
    causes = validate_metadata(_map(service, "metadata"), is_dns1035_label_name)
    spec = _map(service, "spec")
    kind = spec.get("type") or "ClusterIP"
    ips = cluster_ips(spec)
    headless = ips == ["None"]
    ports = _list(spec, "ports")
    if not ports and not headless and kind != "ExternalName":
        causes.append(required("spec.ports"))
    if headless and kind in ("LoadBalancer", "NodePort"):
        causes.append(invalid("spec.clusterIPs[0]", "None", f"may not be set to 'None' for {kind} services"))
    names: set[str] = set()
    pairs: set[tuple[str, int]] = set()
    for index, port in enumerate(ports):
        where = f"spec.ports[{index}]"
        name = port.get("name") or ""
        if len(ports) > 1 and not name:
            causes.append(required(f"{where}.name"))
        elif name:
            causes += [invalid(f"{where}.name", name, message) for message in is_dns1123_label(name)]
            if name in names:
                causes.append(duplicate(f"{where}.name", name))
            names.add(name)
        number = port.get("port") or 0
        causes += [invalid(f"{where}.port", number, message) for message in is_valid_port_num(number)]
        causes += _enum(port, "protocol", PROTOCOLS, where)
        if port.get("targetPort") not in (None, 0, ""):
            causes += validate_port_number_or_name(port["targetPort"], f"{where}.targetPort")
        if port.get("nodePort") and kind == "ClusterIP":
            causes.append(forbidden(f"{where}.nodePort", "may not be used when `type` is 'ClusterIP'"))
        pair = (port.get("protocol") or "TCP", number)
        if pair in pairs:
            causes.append(duplicate(where, {"Protocol": pair[0], "Port": pair[1]}))
        pairs.add(pair)
    causes += validate_labels(_map(spec, "selector"), "spec.selector")
    causes += _enum(spec, "sessionAffinity", SESSION_AFFINITIES, "spec")
    if kind != "ExternalName":
        causes += _validate_cluster_ips(spec)
    if spec.get("type") and spec["type"] not in SERVICE_TYPES:
        causes.append(not_supported("spec.type", spec["type"], SERVICE_TYPES))
    return causes


def _validate_cluster_ips(spec: Mapping[str, Any]) -> list[Cause]:
    causes = []
    given = _strings(spec, "clusterIPs")
    cluster_ip = str(spec.get("clusterIP") or "")
    if cluster_ip and given and given[0] != cluster_ip:
        causes.append(invalid("spec.clusterIPs", given, "first value must match `clusterIP`"))
    elif not cluster_ip and given:
        causes.append(invalid("spec.clusterIPs", given, "must be empty when `clusterIP` is not specified"))
    ips = cluster_ips(spec)
    for index, ip in enumerate(ips):
        if index == 0 and ip == "None":
            if len(ips) > 1:
                causes.append(invalid("spec.clusterIPs", ips, "'None' must be the first and only value"))
            continue
        causes += [invalid(f"spec.clusterIPs[{index}]", ip, message) for message in is_valid_ip(ip)]
    return causes


def validate_service_update(service: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    causes = validate_metadata_update(_map(service, "metadata"), _map(old, "metadata"))
    new_ips, old_ips = cluster_ips(_map(service, "spec")), cluster_ips(_map(old, "spec"))
    if old_ips and new_ips and new_ips[0] != old_ips[0]:
        causes.append(invalid("spec.clusterIPs[0]", new_ips, "may not change once set"))
    return causes + validate_service(service)


# --- secrets and configmaps ------------------------------------------------------------------------

SECRET_REQUIRED_KEYS = {
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
}


def validate_secret(secret: Mapping[str, Any]) -> list[Cause]:
    """Keys are file names (``[-._a-zA-Z0-9]+``), data at most 1 MiB, typed Secrets have their keys."""
    causes = validate_metadata(_map(secret, "metadata"), is_dns1123_subdomain_name)
    data = _map(secret, "data")
    strings = _map(secret, "stringData")  # the apiserver merges it into data before validating
    size = 0
    for key in dict.fromkeys([*data, *strings]):
        causes += [invalid(f"data[{key}]", key, message) for message in is_config_map_key(key)]
        size += len(str(strings[key]).encode()) if key in strings else base64_decoded_size(str(data[key]))
    if size > MAX_SECRET_SIZE:
        causes.append(too_long("data", MAX_SECRET_SIZE))
    kind = secret.get("type") or "Opaque"
    for key in SECRET_REQUIRED_KEYS.get(kind, ()):
        if key not in data and key not in strings:
            causes.append(required(f"data[{key}]"))
    if kind == "kubernetes.io/basic-auth" and not {"username", "password"} & {*data, *strings}:
        causes += [required("data[username]"), required("data[password]")]
    account = _map(_map(secret, "metadata"), "annotations").get("kubernetes.io/service-account.name")
    if kind == "kubernetes.io/service-account-token" and not account:
        causes.append(required("metadata.annotations[kubernetes.io/service-account.name]"))
    return causes


def validate_secret_update(secret: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    causes = validate_metadata_update(_map(secret, "metadata"), _map(old, "metadata"))
    if (secret.get("type") or "Opaque") != (old.get("type") or "Opaque"):
        causes.append(invalid("type", secret.get("type") or "Opaque", FIELD_IMMUTABLE))
    causes += _immutable_data(secret, old, ("data",))
    return causes + validate_secret(secret)


def validate_config_map(config_map: Mapping[str, Any]) -> list[Cause]:
    """Keys are file names, not in both ``data`` and ``binaryData``; at most 1 MiB in all."""
    causes = validate_metadata(_map(config_map, "metadata"), is_dns1123_subdomain_name)
    data, binary = _map(config_map, "data"), _map(config_map, "binaryData")
    size = 0
    for key, value in data.items():
        causes += [invalid(f"data[{key}]", key, message) for message in is_config_map_key(key)]
        if key in binary:
            causes.append(invalid(f"data[{key}]", key, "duplicate of key present in binaryData"))
        size += len(str(value).encode())
    for key, value in binary.items():
        causes += [invalid(f"binaryData[{key}]", key, message) for message in is_config_map_key(key)]
        size += base64_decoded_size(str(value))
    if size > MAX_SECRET_SIZE:
        causes.append(too_long("", MAX_SECRET_SIZE))  # the apiserver names no field: the whole object
    return causes


def validate_config_map_update(config_map: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    causes = validate_metadata_update(_map(config_map, "metadata"), _map(old, "metadata"))
    causes += _immutable_data(config_map, old, ("data", "binaryData"))
    return causes + validate_config_map(config_map)


def _immutable_data(obj: Mapping[str, Any], old: Mapping[str, Any], keys: Sequence[str]) -> list[Cause]:
    """An object created ``immutable: true`` keeps its data and that flag."""
    if old.get("immutable") is not True:
        return []
    causes = []
    if obj.get("immutable") is not True:
        causes.append(forbidden("immutable", "field is immutable when `immutable` is set"))
    for key in keys:
        if _map(obj, key) != _map(old, key):
            causes.append(forbidden(key, "field is immutable when `immutable` is set"))
    return causes


# --- helpers ---------------------------------------------------------------------------------------


def _map(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """A list of objects (an item that is not one reads as empty: the decoder refuses it first)."""
    value = obj.get(key)
    return [item if isinstance(item, Mapping) else {} for item in value] if isinstance(value, list) else []


def _strings(obj: Mapping[str, Any], key: str) -> list[str]:
    value = obj.get(key)
    return [str(item) for item in value] if isinstance(value, list) else []


def _enum(obj: Mapping[str, Any], key: str, supported: Sequence[str], path: str) -> list[Cause]:
    """An enumerated field; absent or empty means the apiserver's default, which is valid."""
    value = obj.get(key)
    if value and value not in supported:
        return [not_supported(f"{path}.{key}", value, supported)]
    return []


def _quantity(amount: Any) -> Quantity | None:
    try:
        return parse_quantity(amount)
    except QuantityError:
        return None  # a decode error (400), reported before validation


def _negative(amount: Any) -> bool:
    quantity = _quantity(amount)
    return quantity is not None and quantity.value < 0


def _normal(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _lines(value: Any) -> list[str]:
    return json.dumps(value, sort_keys=True, indent=1, default=str).splitlines()
