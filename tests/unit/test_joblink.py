"""The job link's URL template: checked when the connection is read, values URL-quoted."""

from __future__ import annotations

import pytest

from airflow_mpi.hooks.joblink import check_url_template, render_job_url

FIELDS = {
    "namespace": "ml",
    "job": "train-0123abcd",
    "dag_id": "etl",
    "task_id": "train",
    "run_id": "x",
    "try_number": 1,
}


def test_every_field_is_filled_and_url_quoted() -> None:
    template = "https://dash.example/{namespace}/{job}?dag={dag_id}&task={task_id}&run={run_id}&try={try_number}"
    assert check_url_template(template) is None
    fields = {**FIELDS, "run_id": "manual__2027-01-15T05:00:00+00:00"}
    assert render_job_url(template, fields) == (
        "https://dash.example/ml/train-0123abcd?dag=etl&task=train&run=manual__2027-01-15T05%3A00%3A00%2B00%3A00&try=1"
    )


def test_literal_braces_and_no_template_are_fine() -> None:
    assert check_url_template(None) is None and check_url_template("") is None
    template = "https://logs.example/q={{job:{job}}}"
    assert check_url_template(template) is None
    assert render_job_url(template, FIELDS) == "https://logs.example/q={job:train-0123abcd}"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("https://dash.example/{ns}/{job}", "names the unknown field {ns}"),
        ("https://dash.example/{job!r}", "formats the field {job}"),
        ("https://dash.example/{job:>10}", "formats the field {job}"),
        ("https://dash.example/{0}", "names the unknown field {0}"),
        ("https://dash.example/{job", "is not a template"),
        ("dash.example/{job}", "does not start with https:// or http://"),
        (42, "is int, not text"),
    ],
)
def test_a_bad_template_says_what_and_the_fields_to_use(template: object, says: str) -> None:
    problem = check_url_template(template)
    assert problem is not None and says in problem
    assert "use only the fields {namespace}, {job}, {dag_id}, {task_id}, {run_id}, {try_number}" in problem


def test_a_bad_template_is_shown_whole() -> None:
    template = "https://grafana.example.internal/explore?orgId=1&left=%5B%22now-1h%22%5D&from=now-6h&ns={ns}&job={job}"
    problem = check_url_template(template)
    assert problem is not None and problem.startswith(f"{template!r} names the unknown field {{ns}}")
