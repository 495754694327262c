"""The apiserver's rules as pure functions: formats and messages exactly as Kubernetes words them,
quantities, base64 offsets, and the update rules (called directly; tests/k8s/test_api_strictness.py
sends every rule through the real client to the API double)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_mpi.kinds.manifests import render_manifests
from tests.doubles.apiformats import (
    QuantityError,
    base64_error,
    is_dns1123_label,
    is_env_var_name,
    is_label_value,
    is_qualified_name,
    is_valid_port_name,
    parse_quantity,
)
from tests.doubles.apivalidation import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    Cause,
    decode_error,
    decode_failure_message,
    invalid_details,
    invalid_message,
    validate_object,
)
from tests.helpers import plan_for, spec_from

LABEL_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def test_label_value_minus_one_is_refused_in_the_apiservers_words() -> None:
    assert is_label_value("-1") == [LABEL_MESSAGE]
    assert is_label_value("1") == [] and is_label_value("") == []
    assert is_label_value("a" * 64) == ["must be no more than 63 bytes"]
    assert is_label_value("a\n") == [LABEL_MESSAGE]  # Go's $ is the very end: no final newline either


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (is_dns1123_label, "a.b", ["must not contain dots"]),
        (is_dns1123_label, "a" * 64, ["must be no more than 63 characters"]),
        (is_qualified_name, "example.com/", ["name part must be non-empty", "name part must consist"]),
        (is_qualified_name, "/name", ["prefix part must be non-empty"]),
        (is_qualified_name, "a/b/c", ["a valid label key must consist"]),
        (is_qualified_name, "Example.com/x", ["prefix part a lowercase RFC 1123 subdomain"]),
        (is_qualified_name, "x" * 64, ["name part must be no more than 63 bytes"]),
        (is_env_var_name, "1ABC", ["a valid environment variable name must consist of alphabetic characters"]),
        (is_env_var_name, "..", ["must not be '..'"]),
        (is_env_var_name, "..A", ["must not start with '..'"]),
        (is_valid_port_name, "a--b", ["must not contain consecutive hyphens"]),
        (is_valid_port_name, "1234", ["must contain at least one letter (a-z)"]),
        (is_valid_port_name, "a" * 16, ["must be no more than 15 characters"]),
    ],
)
def test_formats(check: Any, value: str, expected: list[str]) -> None:
    found = check(value)
    assert len(found) == len(expected), found
    assert all(text.startswith(start) for text, start in zip(found, expected)), found


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2", "2"),
        ("2000", "2k"),
        ("0.5", "500m"),
        ("1.5", "1500m"),
        ("500m", "500m"),
        ("1Gi", "1Gi"),
        ("0.5Gi", "512Mi"),
        ("1536Mi", "1536Mi"),
        ("1e3", "1e3"),
        (".5", "500m"),
        (3, "3"),
        (0.25, "250m"),
    ],
)
def test_quantities_print_as_the_apiserver_prints_them(text: Any, canonical: str) -> None:
    assert str(parse_quantity(text)) == canonical


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2 cores", "quantities must match the regular expression"),
        ("1.2.3", "quantities must match the regular expression"),
        ("", "quantities must match the regular expression"),
        ("1K", "unable to parse quantity's suffix"),
        ("1e", "unable to parse quantity's suffix"),
        ("1\n", "quantities must match the regular expression"),
        ("\uff11Gi", "quantities must match the regular expression"),  # a fullwidth digit one
    ],
)
def test_quantities_that_do_not_parse(text: str, error: str) -> None:
    with pytest.raises(QuantityError, match=error):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "offset"),
    [("aGVsbG8=", None), ("aGVs\nbG8=", None), ("aGVsbG8", 4), ("aGVsbA=", 7), ("ab!c", 2), ("aGVsbG8=x", 8)],
)
def test_base64_errors_name_the_byte_as_go_does(text: str, offset: int | None) -> None:
    expected = None if offset is None else f"illegal base64 data at input byte {offset}"
    assert base64_error(text) == expected


def test_the_422_message_and_details() -> None:
    one = Cause("metadata.labels", INVALID, 'Invalid value: "-1": x')
    two = Cause("spec.hostname", INVALID, 'Invalid value: "A": y')
    assert invalid_message("Pod", "p", [one]) == 'Pod "p" is invalid: metadata.labels: Invalid value: "-1": x'
    assert invalid_message("Pod", "p", [one, two, one]) == (
        'Pod "p" is invalid: [metadata.labels: Invalid value: "-1": x, spec.hostname: Invalid value: "A": y]'
    )
    details = invalid_details("Pod", "p", [one])
    assert details == {"name": "p", "kind": "Pod", "causes": [one.to_dict()]}
    assert one.to_dict() == {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "-1": x',
        "field": "metadata.labels",
    }


def test_decode_errors_are_a_400_message() -> None:
    pod = {"kind": "Pod", "apiVersion": "v1", "spec": {"containers": [{"resources": {"limits": {"cpu": "2 cores"}}}]}}
    problem = decode_error("pods", pod)
    assert problem is not None and problem.startswith("quantities must match")
    assert decode_failure_message("pods", pod, problem).startswith('Pod in version "v1" cannot be handled as a Pod: ')
    assert decode_error("secrets", {"data": {"k": "not base64!"}}) == "illegal base64 data at input byte 3"
    assert decode_error("configmaps", {"data": {"k": 1}}) is not None
    unnamed = decode_failure_message("pods", {"spec": {}}, "x")
    assert unnamed.startswith("the object provided is unrecognized (must be of type Pod): x (")


def job_objects(**fields: Any) -> dict[str, dict[str, Any]]:
    objects = render_manifests(
        plan_for(spec_from(**fields)), "default", owner_uid="1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    )
    return {o["kind"]: o for o in objects}


def test_every_object_of_a_job_is_valid() -> None:
    plural = {"Service": "services", "Secret": "secrets", "ConfigMap": "configmaps", "Pod": "pods"}
    objects = render_manifests(plan_for(spec_from(workers={"replicas": 2}, hosts_mode="hostfile")), "default")
    for obj in objects:
        assert validate_object(plural[obj["kind"]], obj) == [], obj["metadata"]["name"]
        assert decode_error(plural[obj["kind"]], obj) is None


def fields(causes: list[Cause]) -> list[tuple[str, str]]:
    return [(cause.field, cause.reason) for cause in causes]


def test_pod_spec_is_immutable_but_for_image_deadline_and_added_tolerations() -> None:
    old = job_objects()["Pod"]
    assert validate_object("pods", copy.deepcopy(old), old=old) == []
    allowed = copy.deepcopy(old)
    allowed["spec"]["containers"][0]["image"] = "registry.example/train:2"
    allowed["spec"]["activeDeadlineSeconds"] -= 1
    allowed["spec"]["tolerations"] = [*old["spec"]["tolerations"], {"key": "spot", "operator": "Exists"}]
    allowed["metadata"]["labels"]["extra"] = "yes"
    assert validate_object("pods", allowed, old=old) == []
    changed = copy.deepcopy(old)
    changed["spec"]["containers"][0]["command"] = ["bash", "-c", "true"]
    causes = validate_object("pods", changed, old=old)
    assert fields(causes) == [("spec", FORBIDDEN)]
    assert "pod updates may not change fields other than `spec.containers[*].image`" in causes[0].message
    added = copy.deepcopy(old)
    added["spec"]["containers"].append({**old["spec"]["containers"][0], "name": "second"})
    assert ("spec.containers", FORBIDDEN) in fields(validate_object("pods", added, old=old))
    longer = copy.deepcopy(old)
    longer["spec"]["activeDeadlineSeconds"] += 1
    assert fields(validate_object("pods", longer, old=old)) == [("spec.activeDeadlineSeconds", INVALID)]
    moved = copy.deepcopy(old)
    moved["metadata"]["uid"] = "another"
    assert fields(validate_object("pods", moved, old={**old, "metadata": {**old["metadata"], "uid": "one"}})) == [
        ("metadata.uid", INVALID)
    ]


def test_ephemeral_containers_are_refused_on_create_only() -> None:
    pod = job_objects()["Pod"]
    debug = {**pod, "spec": {**pod["spec"], "ephemeralContainers": [{"name": "debug", "image": "busybox"}]}}
    assert fields(validate_object("pods", debug)) == [("spec.ephemeralContainers", FORBIDDEN)]
    assert validate_object("pods", debug, old=debug) == []  # added through their own subresource


def test_removing_a_toleration_is_forbidden() -> None:
    old = job_objects(pod={"tolerations": [{"key": "gpu", "operator": "Exists"}]})["Pod"]
    new = copy.deepcopy(old)
    new["spec"]["tolerations"] = []
    assert ("spec.tolerations", FORBIDDEN) in fields(validate_object("pods", new, old=old))


def test_immutable_secret_keeps_its_data_and_type() -> None:
    old = {**job_objects()["Secret"], "immutable": True}
    new = copy.deepcopy(old)
    new["data"]["extra"] = "eA=="
    new["type"] = "kubernetes.io/ssh-auth"
    found = fields(validate_object("secrets", new, old=old))
    assert ("data", FORBIDDEN) in found and ("type", INVALID) in found


def test_two_controllers_and_duplicate_volumes() -> None:
    pod = job_objects()["Pod"]
    owner = pod["metadata"]["ownerReferences"][0]
    pod["metadata"]["ownerReferences"] = [owner, {**owner, "name": "other", "uid": "x"}]
    pod["spec"]["volumes"].append(copy.deepcopy(pod["spec"]["volumes"][0]))
    causes = validate_object("pods", pod)
    assert ("metadata.ownerReferences", INVALID) in fields(causes)
    assert any(c.field.endswith(".name") and c.reason == DUPLICATE for c in causes)
    controllers = next(c for c in causes if c.field == "metadata.ownerReferences")
    assert 'Only one reference can have Controller set to true. Found "true" in references for Service/' in (
        controllers.message
    )


def test_unknown_kind_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="no validation for 'deployments'"):
        validate_object("deployments", {})
