"""Values that reach the launcher: MCA values (typed, ``mpi.mca``, ``OMPI_MCA_*`` in ``env``,
``--mca`` in ``extra_args``) keep to characters no shell treats specially, since Open MPI copies
them onto each worker daemon's command line; ``extra_args`` read as mpiexec reads them cannot
say what the product owns; ``-x`` values follow the environment's rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.mpirun import build_mpiexec_argv
from airflow_mpi.job.naming import build_job_name
from airflow_mpi.job.topology import build_topology
from airflow_mpi.spec import MPIJobSpec
from tests.helpers import IDENTITY, spec_from

SHELL_SPECIAL = set(";&|$`\\\"'<>(){}*?[]!~# \t\n")
GOOD_MCA = ["^openib", "10.0.0.0/8", "tcp,self", "eth0", "0", "-1", "/opt/x", "a:b", "ucx", "lo,docker0", "1024"]
BAD_MCA = ["0;id>/tmp/p", "tcp,self$(id)", "`id`", "a b", "x\ny", "a|b", "a&b", 'a"b', "a'b", "<x", "x>", "(x)",
           "{x}", "*", "x?", "[x]", "!x", "~/x", "#x", "a\\b", ""]  # fmt: skip


def refused(**fields: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        spec_from(**fields)
    return {issue.field: str(issue) for issue in caught.value.issues}


@pytest.mark.parametrize("value", GOOD_MCA)
@pytest.mark.parametrize("key", ["btl", "btl_tcp_if_include", "oob_tcp_if_exclude", "pml"])
def test_real_mca_values_are_accepted_in_every_door(key: str, value: str) -> None:
    spec_from(mpi={key: value})
    spec_from(mpi={"mca": {"btl_openib_warn_no_device_params_found": value}})
    spec_from(env={"OMPI_MCA_btl": value})
    spec_from(mpi={"extra_args": ["--mca", "btl", value]})


@pytest.mark.parametrize("value", BAD_MCA, ids=repr)
def test_shell_special_mca_values_are_refused_in_every_door(value: str) -> None:
    assert "may hold only" in refused(mpi={"btl": value}).get("mpi.btl", "") or not value
    assert "mpi.mca.x" in refused(mpi={"mca": {"x": value}})
    assert "mpi.extra_args[2]" in refused(mpi={"extra_args": ["--mca", "btl", value]})
    if value:
        assert "env.OMPI_MCA_btl" in refused(env={"OMPI_MCA_btl": value})
        assert "mpi.map_by" in refused(mpi={"map_by": f"slot:{value}"})


# extra_args: (items, the field refused, a phrase of the message)
BAD_EXTRA: list[tuple[list[str], str, str]] = [
    (["--mca", "orte_abort_on_non_zero_status", "0"], "mpi.extra_args[1]", "set by airflow-mpi"),
    (["-mca", "plm_rsh_agent", "sh"], "mpi.extra_args[1]", "set by airflow-mpi"),
    (["--gmca", "orte_rsh_agent", "sh"], "mpi.extra_args[1]", "set by airflow-mpi"),
    (["--mca", "orte_launch_agent", "orted"], "mpi.extra_args[1]", "set by airflow-mpi"),
    (["--mca", "btl", "tcp$(id)"], "mpi.extra_args[2]", "may hold only"),
    (["--report-bindings", "--mca", "btl"], "mpi.extra_args[1]", "a name and a value"),
    (["--mca=btl", "tcp"], "mpi.extra_args[0]", "a name and a value"),
    (["-x", "MPI_NP=99"], "mpi.extra_args[1]", "owned by the platform"),
    (["--x", "GJ_TRAINING_ROLE=worker"], "mpi.extra_args[1]", "owned by the platform"),
    (["-x", "OMPI_MCA_orte_abort_on_non_zero_status=0"], "mpi.extra_args[1]", "set by airflow-mpi"),
    (["-x", "A=1\nB=2"], "mpi.extra_args[1]", "on one line"),
    (["-x", "A=" + "a" * (128 * 1024)], "mpi.extra_args[1]", "128 KiB"),
    (["-x=FOO"], "mpi.extra_args[0]", "its variable"),
    (["-x"], "mpi.extra_args[0]", "its variable"),
    (["--np=4"], "mpi.extra_args[0]", "mpi.np"),
    (["--n", "4"], "mpi.extra_args[0]", "mpi.np"),
    (["-H", "evil:8"], "mpi.extra_args[0]", "never both"),
    (["--default-hostfile", "/h"], "mpi.extra_args[0]", "never both"),
    (["-timeout", "5"], "mpi.extra_args[0]", "use timeout instead"),
    (["--enable-recovery"], "mpi.extra_args[0]", "after a rank fails"),
    (["--max-restarts", "3"], "mpi.extra_args[0]", "after a rank fails"),
    (["--launch-agent", "orted"], "mpi.extra_args[0]", "set by airflow-mpi"),
    (["--tune", "/etc/mpi/x.conf"], "mpi.extra_args[0]", "from a file"),
    (["-am", "x"], "mpi.extra_args[0]", "from a file"),
    (["--app", "/etc/mpi/appfile"], "mpi.extra_args[0]", "from a file"),
    (["--output-filename", "/tmp/a;b"], "mpi.extra_args[1]", "may hold only"),
    (["--prefix", "$(id)"], "mpi.extra_args[1]", "may hold only"),
]


@pytest.mark.parametrize(("items", "field", "words"), BAD_EXTRA, ids=[" ".join(b[0])[:40] for b in BAD_EXTRA])
def test_extra_args_cannot_say_what_the_product_owns(items: list[str], field: str, words: str) -> None:
    issues = refused(mpi={"extra_args": items})
    assert field in issues, issues
    assert words in issues[field], issues[field]


def test_extra_args_that_only_add_options_are_accepted() -> None:
    items = ["--mca", "btl", "tcp,self", "-x", "PYTHONWARNINGS=ignore::Warning a;b", "--report-bindings",
             "--map-by", "ppr:1:node:PE=2", "--rank-by", "core", "--output-filename", "/tmp/out",
             "-mca", "btl_tcp_if_include", "10.0.0.0/8", "--cpu-set", "0-3"]  # fmt: skip
    assert spec_from(mpi={"extra_args": items}).mpi.extra_args == tuple(items)


@pytest.mark.parametrize(
    ("item", "words"),
    [("NCCL_DEBUG=INFO\nX=1", "on one line"), ("A=\x1b[31m", "on one line"), ("MPI_HOSTS=x", "owned by the platform"),
     ("1BAD", "VAR or VAR=value"), ("A=" + "a" * (128 * 1024), "128 KiB")],
)  # fmt: skip
def test_export_env_values_follow_the_environment_rules(item: str, words: str) -> None:
    issues = refused(mpi={"export_env": ["PATH", item]})
    assert words in issues["mpi.export_env[1]"]


def test_export_env_values_with_spaces_and_symbols_are_fine() -> None:
    """-x values travel in the launch message, not on the workers' command line."""
    spec_from(mpi={"export_env": ["PATH", "PYTHONWARNINGS=ignore::Warning", "X=a b;$(c)"]})


def test_env_values_over_128_kib_are_refused() -> None:
    assert "128 KiB" in refused(env={"BIG": "a" * (128 * 1024)})["env.BIG"]
    spec_from(env={"BIG": "a" * (128 * 1024 - 5)})  # BIG= and the value: just under the limit


MCA_ALPHABET = st.sampled_from(sorted(SHELL_SPECIAL) + list("abz09_.,:/^=+@%-"))


def _argv_of(spec: MPIJobSpec) -> list[str]:
    return build_mpiexec_argv(spec, build_topology(spec, build_job_name(spec.name, IDENTITY)))


def _forwarded(argv: list[str]) -> list[str]:
    """What Open MPI may copy onto a worker daemon's command line: every item but -x values, the
    product's own ssh options and the rank command."""
    end = argv.index("bash")
    out = []
    for index, item in enumerate(argv[:end]):
        if argv[index - 1] in ("-x", "plm_rsh_args"):
            continue
        out.append(item)
    return out


@settings(max_examples=300, deadline=None)
@given(value=st.text(MCA_ALPHABET, min_size=0, max_size=12), door=st.sampled_from(["btl", "mca", "extra", "map_by"]))
def test_no_shell_metacharacter_reaches_the_rendered_argv(value: str, door: str) -> None:
    fields = {
        "btl": {"btl": value},
        "mca": {"mca": {"btl_tcp_if_include": value}},
        "extra": {"extra_args": ["--mca", "btl", value]},
        "map_by": {"map_by": f"slot:{value}"},
    }[door]
    try:
        spec = spec_from(mpi=fields)
    except SpecError:
        assert set(value) & SHELL_SPECIAL or not value
        return
    forwarded = _forwarded(_argv_of(spec))
    assert not any(set(item) & SHELL_SPECIAL for item in forwarded), forwarded
    assert value in forwarded or f"slot:{value}" in forwarded
