"""docs/contract.md is the contract users can look up: every link into it resolves, its worked
host/NP examples are what the renderer computes, it names every platform and reserved variable,
and no file of the project cites a document the user does not have instead of stating the rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_mpi import contract
from airflow_mpi.job.topology import build_topology, render_mpi_hosts
from airflow_mpi.spec import MPIJobSpec

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "contract.md"
TEXT = DOC.read_text()
# Where code, comments, messages and docs live (tests included: they are read as documentation too).
SOURCES = ["airflow_mpi", "docs", "docker", "dags", "tests", "bench", ".ci", "README.md", "pyproject.toml", "Makefile"]
SUFFIXES = {".py", ".sh", ".md", ".toml", ".yaml", ".txt", ""}
# A citation of a platform document by its file number or platform name, not a rule in words.
CITATION = re.compile(r"\bseeds?\s+0\d\d\b|\bthe seed'?s?\b|\bbai[g]e\b|\bGJ[ -](platform|doc)", re.IGNORECASE)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


ANCHORS = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", TEXT, re.MULTILINE)}


def _project_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = REPO / name
        candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [p for p in candidates if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return files


def test_every_link_into_the_contract_names_an_existing_section() -> None:
    links = []
    for path in _project_files():
        for anchor in re.findall(r"contract\.md#([\w-]+)", path.read_text(errors="replace")):
            links.append((path.relative_to(REPO), anchor))
    links += [(DOC.relative_to(REPO), a) for a in re.findall(r"\]\(#([\w-]+)\)", TEXT)]
    assert len(links) >= 20  # the code, the README and the page itself point into it
    missing = [(str(path), anchor) for path, anchor in links if anchor not in ANCHORS]
    assert not missing, missing


def test_the_sections_the_issue_asks_for_exist() -> None:
    wanted = {
        "platform-variables",
        "reserved-names",
        "host-and-np",
        "hostfile-mode",
        "rank-variables",
        "pod-paths",
        "mpiexec-options",
        "failures-and-fixes",
        "sshd-missing-privilege-separation-directory",
        "sshd-not-running",
        "permission-denied-publickey",
        "running-as-root",
        "nested-launcher",
        "script-without-bash",
        "missing-mpiexec-or-sshd",
    }
    assert wanted <= ANCHORS, wanted - ANCHORS


def test_the_readme_and_the_docs_link_to_the_contract() -> None:
    assert "(docs/contract.md)" in (REPO / "README.md").read_text()
    assert "contract.md#failures-and-fixes" in (REPO / "docs" / "guides" / "operator.md").read_text()


def test_no_file_cites_a_document_the_user_does_not_have() -> None:
    cited = []
    for path in _project_files():
        if path == Path(__file__).resolve():
            continue  # the examples of citations below
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CITATION.search(line):
                cited.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not cited, "\n".join(cited)


def test_the_citation_check_fires() -> None:
    for text in ("as seed 000 does", "(seed 002 FAQ)", "the seed's four cases", "Baige", "the GJ platform"):
        assert CITATION.search(text), text
    for text in ("torch.manual_seed(args.seed)", "--seed", "GJ_TRAINING_ROLE"):
        assert not CITATION.search(text), text


def test_the_doc_names_every_platform_and_reserved_variable() -> None:
    names = {value for key, value in vars(contract).items() if key.startswith("ENV_")}
    names |= contract.RESERVED_ENV_NAMES
    names |= {f"{prefix}*" for prefix in contract.RESERVED_ENV_PREFIXES}
    missing = sorted(name for name in names if f"`{name}" not in TEXT and f" {name}" not in TEXT)
    assert not missing, missing


def _example_rows() -> list[list[str]]:
    section = TEXT.split("## Host and NP", 1)[1].split("\n## ", 1)[0]
    header = "| example | MASTER_CPU | MASTER_GPU | WORKER_REPLICAS | WORKER_CPU | WORKER_GPU | MPI_HOSTS | MPI_NP |"
    table = section.split(header, 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()[1:]]
    return rows


@pytest.mark.parametrize("row", _example_rows(), ids=lambda row: row[0])
def test_worked_host_np_example_is_what_the_renderer_computes(row: list[str]) -> None:
    _, master_cpu, master_gpu, worker_replicas, worker_cpu, worker_gpu, hosts, np = row
    spec = MPIJobSpec.from_dict(
        {
            "name": "train",
            "command": ["python", "/app/train.py"],
            "master": {"cpu": master_cpu, "gpus": int(master_gpu)},
            "workers": {"replicas": int(worker_replicas), "cpu": worker_cpu, "gpus": int(worker_gpu)},
        }
    )
    job = "train-1a2b3c4d"
    topology = build_topology(spec, job)
    short = {f"{job}-master-0.{job}": "m", **{f"{job}-worker-{i}.{job}": f"w{i}" for i in range(4)}}
    rendered = ",".join(
        f"{short[host]}:{slots}"
        for host, slots in (item.rsplit(":", 1) for item in render_mpi_hosts(topology).split(","))
    )
    assert f"`{rendered}`" == hosts
    assert str(topology.np) == np


def test_there_is_a_worked_example_for_each_of_the_four_cases() -> None:
    assert [row[0] for row in _example_rows()] == [
        "CPU only",
        "GPUs on both",
        "master CPU, workers GPU",
        "master GPU, no workers",
    ]
