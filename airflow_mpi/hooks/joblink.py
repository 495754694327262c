"""The operator's extra link: a URL to the job (a cluster dashboard, a log viewer) from a template
in the ``mpi`` connection's extra ``job_url_template``, e.g.
``https://dash.example/#/pods/{namespace}?labelSelector=airflow-mpi.io/job%3D{job}``.

A template is checked when the connection is read, so a misspelt field fails the task before any
job exists rather than giving a broken link afterwards. Values are URL-quoted as they are put in.
"""

from __future__ import annotations

from collections.abc import Mapping
from string import Formatter
from urllib.parse import quote

URL_TEMPLATE_EXTRA = "job_url_template"
URL_FIELDS = ("namespace", "job", "dag_id", "task_id", "run_id", "try_number")


def check_url_template(template: object) -> str | None:
    """What is wrong with a ``job_url_template`` extra, or None when it is usable (or unset)."""
    if template is None or template == "":
        return None
    fix = f"use only the fields {{{'}, {'.join(URL_FIELDS)}}}, e.g. https://dash.example/{{namespace}}/{{job}}"
    if not isinstance(template, str):
        return f"is {type(template).__name__}, not text; {fix}"
    if not template.startswith(("https://", "http://")):
        return f"{template!r} does not start with https:// or http://; {fix}"
    try:
        parts = list(Formatter().parse(template))
    except ValueError as error:
        return f"{template!r} is not a template ({error}); write a literal brace as {{{{ or }}}}; {fix}"
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in URL_FIELDS:
            return f"{template!r} names the unknown field {{{field}}}; {fix}"
        if spec or conversion:
            return f"{template!r} formats the field {{{field}}}; write it bare; {fix}"
    return None


def render_job_url(template: str, fields: Mapping[str, object]) -> str:
    """The link, each field's value URL-quoted (a run id such as ``manual__2026-01-01T00:00:00``
    keeps the URL valid); a field the caller does not know is left empty."""
    values = {name: quote(str(fields.get(name, "")), safe="") for name in URL_FIELDS}
    return template.format(**values)
