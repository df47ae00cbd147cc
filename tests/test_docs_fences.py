"""Kernel source in the docs sits in ```` ```spk ```` fences, Python in ```` ```python ```` ones: some tests
run a page's python blocks (docs/language.md's all of them), and a reader copies a python block into a
``.py`` file. docs/hopper.md §1.1 showed a kernel fragment (``load``, ``arange``, ``hopper.wgmma``) as
python."""

from __future__ import annotations

import re
from pathlib import Path

from sparsile.tests.support import ROOT

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
KERNEL_OPS = re.compile(r"\b(?:hopper|blackwell|tma|smem|mbarrier|tmem|tcgen05)\.\w+\(|(?<![.\w])(?:load|store|"
                        r"arange|program_id)\(")
PYTHON_PROGRAM = re.compile(r"^\s*(?:import|from)\s|@(?:\w+\.)*(?:jit|kernel)\b", re.M)


def kernel_source_in_python_fences(pages: list[Path]) -> list[str]:
    """``page:line`` of each python block that calls kernel-language ops without being a Python program
    (no import, no ``@jit`` / ``@kernel`` function): kernel source in the wrong fence."""
    found = []
    for page in pages:
        text = page.read_text()
        for m in FENCE.finditer(text):
            body = m.group(2)
            if m.group(1).strip() in ("python", "py") and KERNEL_OPS.search(body) and not PYTHON_PROGRAM.search(body):
                found.append(f"{page.name}:{text[:m.start()].count(chr(10)) + 1}")
    return found


def test_kernel_source_is_in_spk_fences() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert kernel_source_in_python_fences(pages) == []


def test_the_fence_check_sees_a_kernel_fragment(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nacc = hopper.wgmma(a, b_s, acc)\n```\n\n```python\nimport sparsile as sp\n"
                    "sp.arange(0, 4)\n```\n\n```spk\nx = load(X + arange(0, 16))\n```\n\n```python\n"
                    "@sparsile.jit\ndef k(X):\n    x = load(X + arange(0, 16))\n```\n")
    assert kernel_source_in_python_fences([page]) == ["page.md:1"]
