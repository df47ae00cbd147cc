"""README.md's lists are complete: its table of environment variables names every ``SPARSILE_*``
variable the package reads (tests, benchmarks and scripts aside), so that a user looking for the
switch of a behaviour finds it there, and its Documentation section names every page of docs/."""

from __future__ import annotations

import re

from sparsile.tests.support import ROOT

OUTSIDE_THE_PACKAGE = ("tests", "benchmarks", "scripts", ".venv", ".git")
"""Folders whose variables are for the project's own runs (SPARSILE_UPDATE_GOLDEN, SPARSILE_COMMIT, ...)."""


def variables_read() -> set[str]:
    """The ``"SPARSILE_..."`` string literals of the package's modules (conftest.py is the tests')."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in OUTSIDE_THE_PACKAGE or parts == ("conftest.py",):
            continue
        found.update(re.findall(r"[\"'](SPARSILE_[A-Z0-9_]+)[\"']", path.read_text()))
    return found


def readme_table() -> set[str]:
    """The variables of the first column of README.md's "Environment variables" table."""
    section = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(SPARSILE_[A-Z0-9_]+)", row.split("|")[1])}


def test_the_package_reads_variables_and_the_readme_has_a_table() -> None:
    assert {"SPARSILE_CACHE_DIR", "SPARSILE_AUTOTUNE"} <= variables_read()  # the scan finds them
    assert {"SPARSILE_CACHE_DIR", "SPARSILE_AUTOTUNE"} <= readme_table()


def test_readme_lists_every_variable_the_package_reads() -> None:
    missing = sorted(variables_read() - readme_table())
    assert not missing, "README.md, Environment variables: no row for " + ", ".join(missing)


def test_readme_lists_no_variable_the_package_does_not_read() -> None:
    stale = sorted(readme_table() - variables_read())
    assert not stale, "README.md, Environment variables: nothing reads " + ", ".join(stale)


def test_readme_documentation_names_every_page_of_docs() -> None:
    section = (ROOT / "README.md").read_text().split("## Documentation", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^- `(docs/[\w.-]+\.md)`", section, re.M))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert "docs/language.md" in listed  # the pattern reads the list
    assert not pages - listed, "README.md, Documentation: no entry for " + ", ".join(sorted(pages - listed))
    assert not listed - pages, "README.md, Documentation: no such page " + ", ".join(sorted(listed - pages))
