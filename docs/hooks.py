"""The reference pages, generated from the code and committed, so they read in the repository as
in the site; ``python docs/hooks.py`` (``make reference``) writes them, and the site's build
(this file is its MkDocs hook) and ``tests/unit/test_docs_pages.py`` fail while one is stale.

- ``reference/spec.md``: every job spec field with its type, default, meaning (the field's
  docstring in ``airflow_mpi.spec``) and rules (what the validator answers when the field is given
  a bad value: the same messages a user gets);
- ``reference/connection.md``: the ``mpi`` connection's fields (``get_provider_info``);
- ``reference/cli.md``: ``airflow-mpi`` and every subcommand (``build_parser``);
- ``reference/failures.md``: every failure the output diagnosis recognises, with its fix.

``mkdocs build --strict`` runs it (``make docs``); ``tests/integration/test_docs_site.py`` builds
the site and checks these pages hold every field, option and cause.

    python docs/hooks.py    # rewrite the generated pages from the code
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GENERATED = "<!-- generated from the code by docs/hooks.py (make reference): edit the code, not this page -->"

# The spec's sections: (path, type, how a bad value is placed in a valid spec).
VALID_SPEC: dict[str, Any] = {"name": "doc", "command": ["python", "train.py"], "workers": {"replicas": 1}}
VALID_VOLUME = {"name": "data", "mount_path": "/data", "empty_dir": True}
VALID_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}


def on_pre_build(config: Any) -> None:
    """The site is built from the committed pages: refuse to build it from stale ones."""
    stale = stale_pages()
    if stale:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"generated pages out of date: {', '.join(stale)}; run `make reference`")


def stale_pages() -> list[str]:
    """The generated pages whose committed text is not what the code renders now."""
    pages = {path: REPO / "docs" / path for path in PAGES}
    return [path for path, page in pages.items() if not page.is_file() or page.read_text() != PAGES[path]()]


def write_pages() -> list[str]:
    """Write every generated page; the ones that changed."""
    changed = stale_pages()
    for path in changed:
        (REPO / "docs" / path).write_text(PAGES[path]())
    return changed


def render_image_guide() -> str:
    """``docker/README.md`` (beside the Dockerfile it explains), its links made the site's."""
    text = (REPO / "docker" / "README.md").read_text()
    text = text.replace("](../docs/", "](../").replace("](Dockerfile)", "](#the-training-image)")
    return f"{GENERATED}\n\n{text}"


# --- the job spec ---------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after it), the class's own over its bases'."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, [*body.body[1:], None], strict=True):
            named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                found[node.target.id] = inspect.cleandoc(str(after.value.value))
    return found


def spec_sections() -> list[tuple[str, type]]:
    from airflow_mpi.spec.scheduling import SchedulingSpec
    from airflow_mpi.spec.types import MasterSpec, MPIJobSpec, MPIOptions, PodSettings, Toleration, Volume, WorkerSpec

    return [
        ("", MPIJobSpec),
        ("master", MasterSpec),
        ("workers", WorkerSpec),
        ("mpi", MPIOptions),
        ("pod", PodSettings),
        ("pod.tolerations[]", Toleration),
        ("pod.volumes[]", Volume),
        ("scheduling", SchedulingSpec),
    ]


def anchor(path: str) -> str:
    return path.replace(".", "").replace("[]", "") or "the-spec"


def type_text(hint: Any, sections: Mapping[type, str]) -> str:
    """A field's type in the words of YAML: ``list of str``, ``map of str to str``, ``one of ...``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in sections:
        return f"[{sections[hint] or 'spec'}](#{anchor(sections[hint])})"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in hint)
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        text = " or ".join(type_text(arg, sections) for arg in kept)
        return f"{text} (optional)" if len(kept) < len(args) else text
    if origin is tuple:
        return f"list of {type_text(args[0], sections)}"
    if origin in (Mapping, dict, typing.Mapping):
        return f"map of {type_text(args[0], sections)} to {type_text(args[1], sections)}"
    return getattr(hint, "__name__", str(hint))


def default_text(field: dataclasses.Field[Any]) -> str:
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        return "**required**"
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if dataclasses.is_dataclass(value):
        return "see below"
    if value is None:
        return "-"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, Mapping):
        value = dict(value)
    return f"`{json.dumps(value)}`"


def bad_values(hint: Any) -> list[Any]:
    """Values a user might mistype for a field of this type: what the validator says to each is
    the field's rule."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        if str in kept and int in kept:  # cpu: a number or a quantity
            return ["lots", -1, 0, 100000]
        return [value for arg in kept for value in bad_values(arg)]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return ["nope"]
    if hint is bool:
        return ["yes"]
    if hint is int:
        return ["one", -1, 0, 10**12]
    if hint is str:
        return ["", "Bad Value!", "$(reboot)", "x" * 300]
    if origin is tuple:
        if dataclasses.is_dataclass(args[0]):
            return ["text"]
        return ["text", [""], ["Bad Value!"], ["x" * 300]]
    if origin in (Mapping, dict, typing.Mapping):
        return ["text", {"": "v"}, {"Bad Key!": "v"}, {"key": 7}, {"key": "$(reboot)\n"}]
    return []


def placed(path: str, value: Any) -> dict[str, Any]:
    """A valid spec with ``value`` at ``path`` (``pod.volumes[].name``: in its one volume)."""
    spec = json.loads(json.dumps(VALID_SPEC))
    section, _, key = path.rpartition(".")
    target = spec
    if section.endswith("[]"):
        parent, _, listed = section[:-2].rpartition(".")
        item = dict(VALID_VOLUME if listed == "volumes" else VALID_TOLERATION)
        target = spec.setdefault(parent, {})
        target[listed] = [item]
        target = item
    elif section:
        for part in section.split("."):
            target = target.setdefault(part, {})
    target[key] = value
    return spec


def field_rules(path: str, hint: Any) -> list[str]:
    """What the validator tells a user who gives this field each bad value (the fix, once each)."""
    from airflow_mpi.exceptions import SpecError
    from airflow_mpi.spec.types import MPIJobSpec

    rules: list[str] = []
    plain = path.replace("[]", "")
    for value in bad_values(hint):
        try:
            MPIJobSpec.from_dict(placed(path, value))
        except SpecError as error:
            for issue in error.issues:
                field = re.sub(r"\[\d+\]", "", issue.field)  # pod.volumes[0].name -> pod.volumes.name
                if field.startswith(plain) and issue.fix and issue.fix not in rules:
                    rules.append(issue.fix)
    return rules


def render_spec_reference() -> str:
    sections = spec_sections()
    names = {cls: path for path, cls in sections}
    out = [
        "# Job spec reference",
        "",
        GENERATED,
        "",
        "The fields of a job spec, the same in Python (`MPIJobSpec`), YAML and JSON. *Rules* are what",
        "the validator answers when the field is given a bad value: every problem of a spec is",
        "reported at once, before anything is created, each naming the field and the fix. Where a rule",
        "depends on the rest of the spec (slots, for `mpi.np`), it is shown for one master and one",
        "worker of 1 core each. The [job spec guide](../guides/job-spec.md) explains slots, ranks and",
        "the options with examples.",
        "",
    ]
    for path, cls in sections:
        title = path or "The spec"
        out += [f"## {title} {{#{anchor(path)}}}", "", inspect.cleandoc(cls.__doc__ or ""), ""]
        out += ["| field | type | default | meaning | rules |", "|---|---|---|---|---|"]
        docs = attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            full = f"{path}.{field.name}" if path else field.name
            hint = hints[field.name]
            nested = hint in names
            rules = [] if nested else field_rules(full, hint)
            cells = [
                f"`{field.name}`",
                type_text(hint, names),
                default_text(field),
                markdown_cell(docs.get(field.name, "")),
                "<br>".join(markdown_cell(rule) for rule in rules) or "-",
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def markdown_cell(text: str) -> str:
    """reST-style double backticks to Markdown's, one line, pipes escaped."""
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


# --- the connection -------------------------------------------------------------------------


def render_connection_reference() -> str:
    from airflow_mpi.get_provider_info import get_provider_info

    (connection,) = get_provider_info()["connection-types"]
    out = [
        "# The `mpi` connection",
        "",
        GENERATED,
        "",
        f"Connection type `{connection['connection-type']}` ({connection['hook-name']},"
        f" `{connection['hook-class-name']}`). Its fields live in the connection's extra; the form",
        "in the Airflow UI shows each of them. Without a connection (`mpi_conn_id` naming none), a",
        "job runs on the local backend.",
        "",
        "| extra | form label | type | meaning |",
        "|---|---|---|---|",
    ]
    for name, field in connection["conn-fields"].items():
        schema = field["schema"]
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        kind = " or ".join(k for k in kinds if k != "null") + (" (optional)" if "null" in kinds else "")
        if "enum" in schema:
            kind = "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
            kind += f" (default `{schema['default']}`)" if "default" in schema else ""
        if "minimum" in schema:
            kind += f", {schema['minimum']} to {schema['maximum']}"
        out.append(f"| `{name}` | {field['label']} | {kind} | {markdown_cell(field['description'])} |")
    hidden = connection["ui-field-behaviour"]["hidden-fields"]
    out += ["", "The form hides the generic fields (" + ", ".join(f"`{f}`" for f in hidden) + ").", ""]
    out += [
        "Example:",
        "",
        "```bash",
        "airflow connections add mpi_default --conn-type mpi \\",
        '  --conn-extra \'{"backend": "kubernetes", "kubernetes_conn_id": "kubernetes_default",'
        ' "namespace": "training"}\'',
        "```",
        "",
    ]
    return "\n".join(out)


# --- the command line -----------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub, helps.get(name) or ""
                yield from subcommands(sub, f"{prefix} {name}")


def argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{option}`" for option in action.option_strings) or f"`{action.dest}`"
        if action.choices is not None:
            name += " {" + ", ".join(str(choice) for choice in action.choices) + "}"
        default = action.default
        shown = "-" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        rows.append(f"| {name} | {markdown_cell(action.help or '')} | {shown} |")
    return rows


def render_cli_reference() -> str:
    from airflow_mpi.cli.main import build_parser

    parser = build_parser()
    out = ["# `airflow-mpi` command line", "", GENERATED, "", parser.description or "", ""]
    out += ["```", parser.format_usage().strip(), "```", ""]
    out += ["| argument | meaning | default |", "|---|---|---|", *argument_rows(parser), ""]
    for name, sub, help_text in subcommands(parser, "airflow-mpi"):
        out += [f"## `{name}`", "", markdown_cell(help_text or sub.description or ""), ""]
        out += ["```", sub.format_usage().strip().removeprefix("usage: "), "```", ""]
        rows = argument_rows(sub)
        if rows:
            out += ["| argument | meaning | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out)


# --- the diagnosed failures -----------------------------------------------------------------


def render_failures_reference() -> str:
    from airflow_mpi.observe.diagnosis import KNOWN_FAILURES

    out = [
        "# Diagnosed failures",
        "",
        GENERATED,
        "",
        "A job that fails for a setup reason (sshd, keys, `PATH`, the image, the command) prints the",
        "reason somewhere in the master's or a worker's output, usually above a generic `mpiexec`",
        "error. The task's failure message then starts with the cause and its fix, and quotes the",
        "line that showed it; `airflow-mpi doctor` checks for the same causes before a job. Each",
        "cause below links to the rule of the [pod contract](../contract.md) it breaks.",
        "",
    ]
    for failure in KNOWN_FAILURES:
        out += [f"## {prose(failure.summary)} {{#{failure.cause.value}}}", ""]
        out += [f"**Fix:** {prose(failure.fix)}", ""]
        out += [f"The rule: [pod contract](../contract.md#{failure.anchor}). Recognised in output lines matching:", ""]
        out += [f"- `{pattern.pattern}`" for pattern in failure.patterns]
        out.append("")
    return "\n".join(out)


def prose(text: str) -> str:
    """A message as Markdown text: ``<job>`` outside code spans would be read as an HTML tag."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;") for i, part in enumerate(parts))


PAGES: dict[str, Callable[[], str]] = {
    "reference/spec.md": render_spec_reference,
    "reference/connection.md": render_connection_reference,
    "reference/cli.md": render_cli_reference,
    "reference/failures.md": render_failures_reference,
    "guides/image.md": render_image_guide,
}


if __name__ == "__main__":
    written = write_pages()
    print("docs/hooks.py: " + (f"wrote {', '.join(written)}" if written else "every generated page is current"))
