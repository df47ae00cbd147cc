"""Docs and comments cite only what a user has: no tracked file refers to the design notes kept
outside the repository, and every ``docs/hardware.md §N`` citation names a section (and every
``§0 item N`` an item) that page has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sparsile.tests.support import ROOT

# Spelled in pieces so that this file does not match itself.
EXTERNAL = [
    "hardware" + "-facts",
    "jax-mosaic" + "-sparse",
    "DESIGN" + ".md",
    "docs/clusters" + ".md",
    "../" + "shared",
    "peers" + ".md",
    "anchors" + ".md",
]
TEXT_SUFFIXES = {".py", ".md", ".spk", ".lark", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ""}
HARDWARE = ROOT / "docs" / "hardware.md"
CITATION = re.compile(r"docs/hardware\.md`*((?:(?:,| and|/|;)? ?§[\d.\-]+(?: items? \d+(?:(?:,| and) \d+)*)?)+)")


def tracked_files() -> list[Path]:
    """The repository's tracked text files (every text file under the root outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [p for p in paths if p.suffix in TEXT_SUFFIXES and p.is_file()]


def external_references(paths: list[Path]) -> list[str]:
    """``file:line: name`` of every mention of a document outside the repository."""
    found = []
    for path in paths:
        text = path.read_text(errors="replace")
        for name in EXTERNAL:
            for m in re.finditer(re.escape(name), text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {name}")
    return found


def test_no_file_refers_to_documents_users_do_not_have() -> None:
    found = external_references(tracked_files())
    assert not found, "move the fact into docs/ and cite it there:\n" + "\n".join(found)


def sections() -> tuple[set[str], int]:
    """The section numbers of docs/hardware.md and the number of items of its §0."""
    text = HARDWARE.read_text()
    heads = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))
    part0 = text.split("\n## 0.", 1)[1].split("\n## 1.", 1)[0]
    return heads, len(re.findall(r"^\d+\. \*\*", part0, re.M))


def citations(paths: list[Path]) -> list[tuple[str, str]]:
    """Every (file:line, cited section or item) of ``docs/hardware.md`` in ``paths``."""
    out = []
    for path in paths:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in CITATION.finditer(line):
                where = f"{path.name}:{n}"
                for sec, items in re.findall(r"§([\d.\-]*\d)((?: items? \d+(?:(?:,| and) \d+)*)?)", m.group(1)):
                    out.extend((where, part) for part in sec.split("-"))
                    out.extend((where, f"0 item {i}") for i in re.findall(r"\d+", items))
    return out


def bad_citations(cited: list[tuple[str, str]]) -> list[str]:
    heads, items = sections()
    return [f"{where}: §{sec}" for where, sec in cited
            if (sec.startswith("0 item ") and not 1 <= int(sec.split()[-1]) <= items)
            or (not sec.startswith("0 item ") and sec not in heads)]


def test_hardware_citations_name_existing_sections() -> None:
    cited = citations(tracked_files())
    assert len(cited) > 100  # the code cites the page throughout
    bad = bad_citations(cited)
    assert not bad, "no such section in docs/hardware.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", EXTERNAL)
def test_the_checks_see_a_bad_reference(name: str, tmp_path: Path) -> None:
    """A stray external reference and citations of missing sections or items are reported."""
    f = tmp_path / "note.py"
    page = "docs/hardware" + ".md"  # in pieces, so that the scan of this file does not see these citations
    f.write_text(f"# see {name} §1\n# {page} §1.4, §3 and §0 item 6\n# {page} §1.9; {page} §0 item 11\n")
    assert external_references([f]) == [f"{f}:1: {name}"]
    cited = citations([f])
    assert cited == [("note.py:2", "1.4"), ("note.py:2", "3"), ("note.py:2", "0"), ("note.py:2", "0 item 6"),
                     ("note.py:3", "1.9"), ("note.py:3", "0"), ("note.py:3", "0 item 11")]
    assert bad_citations(cited) == ["note.py:3: §1.9", "note.py:3: §0 item 11"]


# The repository's top-level folders, as docs cite them: `backend/lower/blackwell_mma.py`, or a
# module's function `backend/lower/blackwell_mma.mma_plan`.
FOLDERS = ("backend", "benchmarks", "docs", "driver", "examples", "frontend", "grammar", "integrations", "scripts",
           "stdlib", "target", "tests", ".ci")
CITED_PATH = re.compile(r"`((?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[\w./-]*\w)`")


def cites(path: str, root: Path = ROOT) -> bool:
    """Whether ``path`` names a file or folder under ``root``, or ``module.name`` a module there
    that defines ``name`` (a def, a class or an assignment at the start of a line)."""
    if (root / path).exists():
        return True
    module, _, name = path.rpartition(".")
    source = root / f"{module}.py" if (root / f"{module}.py").is_file() else root / module / "__init__.py"
    return bool(module and name) and source.is_file() and re.search(
        rf"^\s*(?:def|class) {re.escape(name)}\b|^{re.escape(name)}\s*[:=]", source.read_text(), re.M) is not None


def missing_citations(pages: list[Path], root: Path = ROOT) -> list[str]:
    """``page:line: path`` of every path in backticks on ``pages`` that names nothing under ``root``."""
    return [f"{page.name}:{n}: {m.group(1)}" for page in pages
            for n, line in enumerate(page.read_text().splitlines(), 1)
            for m in CITED_PATH.finditer(line) if not cites(m.group(1).rstrip("."), root)]


def test_docs_cite_files_and_functions_that_exist() -> None:
    """docs/blackwell.md named `backend/descriptors.encode_idesc` and `frontend/ops_blackwell...`,
    modules moved long before (to target/idesc.py and frontend/ops/blackwell_operands.py)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert sum(len(CITED_PATH.findall(p.read_text())) for p in pages) > 50  # the docs cite paths throughout
    missing = missing_citations(pages)
    assert not missing, "no such file, or no such name in the module:\n" + "\n".join(missing)


def test_the_path_check_sees_a_bad_citation(tmp_path: Path) -> None:
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "mod.py").write_text("def real():\n    pass\n\n\nLIMIT = 3\n")
    page = tmp_path / "page.md"
    page.write_text("`backend/mod.py`, `backend/mod.real`, `backend/mod.LIMIT`, `backend/`\n"
                    "`backend/gone.py`, `backend/mod.fake`, `backend/gone.real`\n")
    assert missing_citations([page], tmp_path) == ["page.md:2: backend/gone.py", "page.md:2: backend/mod.fake",
                                                   "page.md:2: backend/gone.real"]
