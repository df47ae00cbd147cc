"""Running the code examples of the project's Markdown docs in tests: the fenced blocks of a page,
one block picked by a text it contains, CPU adaptations as checked text replacements (an edited
example fails the test instead of running stale), and execution with the page as the file name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def fenced_blocks(doc: str | Path, kind: str = "python") -> list[str]:
    """The ```` ```kind ```` blocks of ``doc`` (a path, or one relative to the repository root)."""
    return re.findall(rf"^```{kind}\n(.*?)^```", (ROOT / doc).read_text(), re.S | re.M)


def block_with(doc: str | Path, text: str) -> str:
    """The one python block of ``doc`` that contains ``text``."""
    (block,) = [b for b in fenced_blocks(doc) if text in b]
    return block


def adapted(block: str, *replacements: tuple[str, str]) -> str:
    """``block`` with each ``(old, new)`` replaced; ``old`` must be there."""
    for old, new in replacements:
        assert old in block, f"the example no longer has {old!r}"
        block = block.replace(old, new)
    return block


def run_block(block: str, doc: str | Path, **names: Any) -> dict[str, Any]:
    """Execute ``block`` (tracebacks name ``doc``) with ``names`` predefined; its namespace."""
    env: dict[str, Any] = {"__name__": "doc_example", **names}
    exec(compile(block, str(ROOT / doc), "exec"), env)
    return env
