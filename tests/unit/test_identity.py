"""Who owns a job: the hash bits of its name, names within 63 characters, deployments that
differ, the owner rule a backend applies before deleting or adopting, the collision message."""

from __future__ import annotations

import re

import pytest

from airflow_mpi.contract import JOB_HASH_LEN, MAX_DNS_LABEL
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.identity import (
    LABEL_DEPLOYMENT,
    LABEL_RUN_KEY,
    LABEL_TRY_NUMBER,
    RunIdentity,
    build_deployment_id,
    build_run_key,
    describe_owner,
    is_configured,
    owned_by,
    owner_key,
    owner_labels,
    render_name_taken,
)
from airflow_mpi.job.naming import build_job_labels, build_job_name
from airflow_mpi.kinds.trainjob import render_trainjob_plan
from airflow_mpi.spec import max_name_length
from tests.helpers import plan_for, spec_from

STAGING = RunIdentity("etl", "train", "scheduled__2026-12-05T00:00:00+00:00", -1, 1, build_deployment_id(None, ["s"]))
PRODUCTION = RunIdentity(
    "etl", "train", "scheduled__2026-12-05T00:00:00+00:00", -1, 1, build_deployment_id(None, ["p"])
)


def test_the_name_carries_at_least_64_bits_of_hash() -> None:
    suffix = build_job_name("x", STAGING).split("-", 1)[1]
    assert re.fullmatch(r"[a-z2-7]+", suffix) and len(suffix) == JOB_HASH_LEN
    bits = JOB_HASH_LEN * 5
    assert bits >= 64
    # Birthday bound at a million jobs a day: expected collisions n^2 / 2^(bits+1) per day.
    assert 1e6**2 / 2 ** (bits + 1) < 1e-7
    assert 1e6**2 / 2 ** (32 + 1) > 100  # what 8 hex characters gave
    assert len({build_job_name("x", RunIdentity("d", "t", f"r{i}")) for i in range(20000)}) == 20000


@pytest.mark.parametrize("replicas", [0, 1, 9, 10, 99, 100, 999, 1000])
def test_every_derived_name_fits_a_label_at_the_longest_name_allowed(replicas: int) -> None:
    spec = spec_from(name="a" * max_name_length(replicas), workers={"replicas": replicas})
    plan = plan_for(spec)
    assert max(len(pod.name) for pod in plan.pods) <= MAX_DNS_LABEL
    assert len(plan.job_name) <= MAX_DNS_LABEL  # the Service
    assert max(len(value) for value in plan.labels.values()) <= MAX_DNS_LABEL


def test_trainjob_host_names_fit_or_the_spec_is_refused_naming_the_field() -> None:
    # JobSet's <job>-worker-0-<i>: two characters more than <job>-worker-<i>.
    fits = spec_from(name="a" * (max_name_length(10) - 2), workers={"replicas": 10})
    plan = render_trainjob_plan(fits, STAGING)
    assert max(len(pod.name) for pod in plan.pods) == MAX_DNS_LABEL
    with pytest.raises(SpecError, match="shorten name by 1 characters"):
        render_trainjob_plan(spec_from(name="a" * (max_name_length(10) - 1), workers={"replicas": 10}), STAGING)


def test_two_deployments_with_the_same_run_ids_differ_in_name_run_key_and_owner() -> None:
    assert STAGING.deployment != PRODUCTION.deployment
    assert build_job_name("digits", STAGING) != build_job_name("digits", PRODUCTION)
    assert build_run_key(STAGING) != build_run_key(PRODUCTION)
    assert owner_key(STAGING) != owner_key(PRODUCTION)
    assert not owned_by(STAGING, owner_labels(PRODUCTION))
    assert owned_by(STAGING, build_job_labels("j", STAGING))


def test_the_owner_is_the_try_not_only_the_task_instance() -> None:
    retry = RunIdentity(**{**STAGING.__dict__, "try_number": 2})
    assert build_run_key(retry) == build_run_key(STAGING)  # found by a retry
    assert owner_key(retry) != owner_key(STAGING)
    assert not owned_by(retry, owner_labels(STAGING))
    assert not owned_by(STAGING, {})
    assert not owned_by(STAGING, {LABEL_RUN_KEY: build_run_key(STAGING)})  # no try: not provably ours


def test_a_derived_deployment_id_is_stable_one_way_and_a_label() -> None:
    secret = "Zx9-very-secret-jwt-key"
    first = build_deployment_id(None, [secret, "fernet"])
    assert first == build_deployment_id("", [secret, "other fernet"])  # the first configured value decides
    assert re.fullmatch(r"h[a-z2-7]{15}", first) and secret.lower() not in first
    assert build_deployment_id(None, ["{JWT_SECRET_KEY}", "fernet"]) == build_deployment_id(None, [None, "fernet"])
    assert build_deployment_id(None, [None, "", "{FERNET_KEY}"]) == ""
    assert not is_configured("{JWT_SECRET_KEY}") and not is_configured("  ") and is_configured("x")


def test_an_explicit_deployment_wins_and_a_bad_one_says_what_to_give() -> None:
    assert build_deployment_id(" staging ", ["secret"]) == "staging"
    assert owner_labels(RunIdentity("d", "t", "r", deployment="staging"))[LABEL_DEPLOYMENT] == "staging"
    with pytest.raises(ValueError, match=r"at most 63 letters.*production"):
        build_deployment_id("staging env", [])
    with pytest.raises(ValueError, match=r"at most 63"):
        build_deployment_id("x" * 64, [])


def test_a_collision_names_both_owners_and_what_to_do() -> None:
    theirs = build_job_labels("digits-x", RunIdentity("etl", "train", "manual", 2, 3, "production"))
    annotations = {"airflow-mpi.io/run-id": "manual"}
    text = render_name_taken("Service", "digits-x", "ml", STAGING, theirs, annotations)
    assert "Service digits-x in namespace ml" in text
    assert "DAG 'etl', task 'train', run 'manual', map index 2, try 3, deployment 'production'" in text
    assert f"run {STAGING.run_id!r}, try 1, deployment {STAGING.deployment!r}" in text
    assert "left alone" in text and "[mpi] deployment" in text
    assert describe_owner({LABEL_TRY_NUMBER: "1"}, None).startswith("no airflow-mpi job")
