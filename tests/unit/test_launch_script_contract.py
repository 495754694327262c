"""launch.sh and the Python side share one source of truth: the script's ssh failure markers and
hints are readiness's, word for word, and its file list, directories and variables are contract's.
Read from the script's text, so a change on either side fails here until the other follows."""

from __future__ import annotations

import re

from airflow_mpi import contract
from airflow_mpi.observe.readiness import PROBLEM_HINTS, SSH_FAILURE_MARKERS, HostProblem, classify_ssh_result
from airflow_mpi.scripts import launch_script_text

SCRIPT = launch_script_text()


def _function_body(name: str) -> str:
    match = re.search(rf"^{name}\(\) {{.*?^}}$", SCRIPT, re.MULTILINE | re.DOTALL)
    assert match, f"launch.sh has no function {name}"
    return match.group(0)


def script_classification() -> list[tuple[tuple[str, ...], str]]:
    """probe_host's case branches: (the markers of one pattern line, the text it echoes)."""
    body = _function_body("probe_host")
    branches = re.findall(r'^\s+((?:\*"[^"]+"\*(?:\s*\|\s*)?)+)\)\n\s+echo "([^"]*)" ;;$', body, re.MULTILINE)
    return [(tuple(re.findall(r'\*"([^"]+)"\*', patterns)), echoed) for patterns, echoed in branches]


def test_script_matches_exactly_the_readiness_markers_in_the_same_order() -> None:
    script = [markers for markers, _ in script_classification()]
    python = [markers for _, markers in SSH_FAILURE_MARKERS]
    assert script == python


def test_script_prints_the_readiness_problem_and_hint_word_for_word() -> None:
    echoed = [text for _, text in script_classification()]
    expected = [
        f"{problem.value}: {PROBLEM_HINTS[problem].format(host='$host', port='$port')}"
        for problem, _ in SSH_FAILURE_MARKERS
    ]
    assert echoed == expected


def test_every_other_ssh_failure_is_ssh_failed_on_both_sides() -> None:
    body = _function_body("probe_host")
    assert re.search(r'^\s+\*\)\n\s+echo "ssh failed: ', body, re.MULTILINE), body
    assert classify_ssh_result("w", 255, "kex_exchange_identification: Connection closed").problem is (
        HostProblem.SSH_FAILED
    )


def test_every_marker_classifies_as_its_problem() -> None:
    for problem, markers in SSH_FAILURE_MARKERS:
        for marker in markers:
            assert classify_ssh_result("w", 255, f"ssh: {marker}\n").problem is problem, marker


def test_script_installs_exactly_the_contract_ssh_files() -> None:
    match = re.search(r"^SSH_FILES=\(([^)]*)\)$", SCRIPT, re.MULTILINE)
    assert match
    assert match.group(1).split() == [*contract.SSH_SHARED_FILES, contract.SSH_HOST_KEY]


def test_script_directories_and_their_overrides_are_the_contract_paths() -> None:
    paths = contract.DEFAULT_PATHS
    for shell_name, variable, default in (
        ("CONFIG_DIR", contract.ENV_CONFIG_DIR, paths.config_dir),
        ("SECRET_DIR", contract.ENV_SSH_SECRET_DIR, paths.ssh_secret_dir),
        ("RUNTIME_DIR", contract.ENV_RUNTIME_DIR, paths.runtime_dir),
    ):
        assert f'{shell_name}="${{{variable}:-{default}}}"\n' in SCRIPT, shell_name
    assert paths.ssh_dir == f"{paths.runtime_dir}/ssh"
    assert 'SSH_DIR="${RUNTIME_DIR}/ssh"\n' in SCRIPT


def test_script_reads_the_contract_file_names_and_variables() -> None:
    for file_name in (contract.CONFIG_HOSTFILE, contract.CONFIG_ARGS):
        assert f"$CONFIG_DIR/{file_name}" in SCRIPT, file_name
    for variable in (
        contract.ENV_ROLE,
        contract.ENV_JOB_NAME,
        contract.ENV_POD_NAME,
        contract.ENV_MASTER_CPU,
        contract.ENV_MASTER_GPU,
        contract.ENV_MASTER_REPLICAS,
        contract.ENV_WORKER_CPU,
        contract.ENV_WORKER_GPU,
        contract.ENV_WORKER_REPLICAS,
        contract.ENV_MPI_HOST,
        contract.ENV_HOSTS_MODE,
        contract.ENV_SSH_PORT,
        contract.ENV_STARTUP_TIMEOUT,
        contract.ENV_NP_OVERRIDE,
        contract.ENV_DRY_RUN,
    ):
        assert re.search(rf"\b{variable}\b", SCRIPT), variable
    assert f"== {contract.HostsMode.HOSTFILE.value} ]]" in SCRIPT
    assert f"{contract.Role.WORKER.value}) run_worker" in SCRIPT
    assert f"{contract.Role.MASTER.value})" in SCRIPT
