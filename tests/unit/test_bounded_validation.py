"""Validation ends in bounded time whatever the numbers, and every text field can be carried:
quantities are bounded before any arithmetic, a string with a NUL byte or a lone surrogate is
refused wherever it is, and Kubernetes' own limits (ConfigMap keys, text-only maps, the product's
annotation prefix) are checked before anything is created."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.spec import parse_cpu, parse_quantity
from tests.helpers import spec_from

HUGE = ["1e999999999", "1e1000000", "1e19", "9" * 41, "1" + "0" * 5000, "99999999999999999999Ei"]


@pytest.mark.parametrize("value", HUGE, ids=lambda v: v[:20])
@pytest.mark.parametrize("field", ["master.cpu", "workers.cpu", "master.memory", "workers.memory", "pod.shm_size"])
def test_absurd_quantities_are_refused_quickly_naming_the_field(field: str, value: str) -> None:
    section, key = field.split(".")
    fields: dict[str, Any] = {section: {key: value}, "scheduling": {"gang": "volcano"}}
    if section == "workers":
        fields["workers"]["replicas"] = 2
    started = time.perf_counter()
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    assert time.perf_counter() - started < 1.0
    message = next(str(issue) for issue in caught.value.issues if issue.field == field)
    assert "at most" in message or "not a CPU quantity" in message, message  # cpu takes no "Ei"


def test_numbers_past_the_bounds_are_no_quantity() -> None:
    assert parse_cpu("1e999999999") is None and parse_quantity("1e999999999") is None
    assert parse_cpu(10**30) is None
    assert parse_quantity("1e18") == 10**18 and parse_cpu("4") == 4  # the bounds themselves are fine


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"master": {"memory": "1Pi"}}, None),
        ({"master": {"memory": "1025Ti"}}, "master.memory"),
        ({"master": {"cpu": 4096}}, None),
        ({"master": {"cpu": 1e308}}, "master.cpu"),
        ({"master": {"cpu": "1e3"}, "workers": {"replicas": 1}}, None),
    ],
)
def test_quantity_range(fields: dict[str, Any], field: str | None) -> None:
    if field is None:
        spec_from(**fields)
        return
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    assert field in caught.value.fields


# Every kind of string field: a value, a list item, a map value, a map key, a nested field.
TEXT_DOORS: list[tuple[dict[str, Any], str]] = [
    ({"image": "train:1\x00"}, "image"),
    ({"command": ["python", "a\udc80"]}, "command[1]"),
    ({"env": {"A": "\ud800"}}, "env.A"),
    ({"env": {"A\x00": "1"}}, "env.A\ufffd"),
    ({"mpi": {"extra_args": ["--report-bindings", "\udfff"]}}, "mpi.extra_args[1]"),
    ({"mpi": {"wdir": "/w\x00"}}, "mpi.wdir"),
    ({"pod": {"labels": {"a": "b\udc80"}}}, "pod.labels.a"),
    ({"pod": {"volumes": [{"name": "d", "mount_path": "/d\udc80", "empty_dir": True}]}}, "pod.volumes[0].mount_path"),
    ({"files": {"a.txt": "text\x00"}}, "files.a.txt"),
    ({"progress_pattern": "step\udc80", "progress_timeout": 60}, "progress_pattern"),
]


@pytest.mark.parametrize(
    ("fields", "field"), TEXT_DOORS, ids=[d[1].encode("ascii", "replace").decode() for d in TEXT_DOORS]
)
def test_nul_and_lone_surrogates_are_refused_in_every_string_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    assert field in caught.value.fields, caught.value.fields
    message = str(caught.value)
    message.encode("utf-8")  # the refusal itself can be printed and logged
    assert "NUL byte" in message or "lone surrogate" in message


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"files": {"..data": "x"}}, "files...data", "starts with '..'"),
        ({"files": {"..2024_01_01": "x"}}, "files...2024_01_01", "starts with '..'"),
        ({"pod": {"annotations": {"a": 3}}}, "pod.annotations.a", "quote it: '3'"),
        ({"pod": {"annotations": {"a": 1e3}}}, "pod.annotations.a", "not text"),
        ({"pod": {"node_selector": {"zone": 1.10}}}, "pod.node_selector.zone", "not text"),
        ({"pod": {"annotations": {"airflow-mpi.io/log-shown": "1"}}}, "pod.annotations.airflow-mpi.io/log-shown",
         "your own prefix"),
        ({"pod": {"annotations": {"airflow-mpi.io/anything": "1"}}}, "pod.annotations.airflow-mpi.io/anything",
         "airflow-mpi.io/"),
    ],
)  # fmt: skip
def test_kubernetes_text_rules(fields: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    message = next(str(issue) for issue in caught.value.issues if issue.field == field)
    assert words in message, message


def test_what_stays_accepted() -> None:
    spec = spec_from(
        files={".hidden": "x", "a..b": "y"},
        pod={"annotations": {"team.example.com/owner": "ml", "note": "1.10"}, "labels": {"v": "3"}},
        env={"THREADS": 4},  # env keeps taking numbers: they are exported as text
    )
    assert spec.env["THREADS"] == "4" and spec.pod.annotations["note"] == "1.10"
