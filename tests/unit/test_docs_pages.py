"""The documentation reads in the repository as in the site: the generated reference pages are
committed and current, and every relative link of the README, the docs and the image's README
leads to a file that exists (and to a heading of it, where it names one)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "docker" / "README.md", *(REPO / "docs").rglob("*.md")]
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def test_the_generated_pages_are_committed_and_current() -> None:
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(REPO / "docs"))
    assert hooks.stale_pages() == [], "run `make reference` and commit the pages"


def heading_ids(page: Path) -> set[str]:
    """What a link may name after ``#``: GitHub's slug of each heading, or an explicit ``{#id}``."""
    ids = set()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        explicit = re.search(r"\{#([^}]+)\}\s*$", heading)
        if explicit:
            ids.add(explicit.group(1))
            heading = heading[: explicit.start()]
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))  # no code
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("mailto:"):
            continue  # a URL
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists():
            broken.append(f"{target}: no {found.relative_to(REPO) if REPO in found.parents else found}")
        elif anchor and found.suffix == ".md" and anchor not in heading_ids(found):
            broken.append(f"{target}: no heading #{anchor} in {found.relative_to(REPO)}")
    assert broken == []


def test_the_install_page_shows_the_airflow_recipe_as_it_is() -> None:
    """The Dockerfile users add to their Airflow image is the one the tests build, line for line."""
    recipe = (REPO / "docker" / "airflow" / "Dockerfile").read_text().splitlines()
    steps = [line for line in recipe if line.strip() and not line.startswith("#")]
    shown = re.findall(r"```dockerfile\n(.*?)```", (REPO / "docs" / "guides" / "install.md").read_text(), re.S)
    assert "\n".join(steps) + "\n" in shown
