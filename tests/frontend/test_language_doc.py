"""``docs/language.md`` is tested: every ``python`` block runs (in the interpreter), every ``spk``
block compiles, every ``spk fails`` block gives exactly the diagnostics of the ``text`` block after
it, and the generated sections equal what the compiler's registry says today.

When the registry changes (a builtin is added or its docstring edited), regenerate the sections::

    SPARSILE_UPDATE_DOCS=1 python -m pytest tests/frontend/test_language_doc.py
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re

import pytest

import sparsile as sp
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.builtins import METHODS, PROPERTIES, ROOT, builtin_reference, scalar_type_table
from sparsile.frontend.sema.values import Builtin, Namespace
from sparsile.tests.support import load_script

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "language.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
GENERATED = {"scalar-types": scalar_type_table, "builtins": builtin_reference}


def blocks(kind: str) -> list[tuple[int, str]]:
    """(line, body) of the fenced blocks whose info string is ``kind``."""
    text = DOC.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1).strip() == kind]


def section(text: str, name: str) -> tuple[int, int]:
    begin = f"<!-- BEGIN GENERATED: {name} -->\n"
    start = text.index(begin) + len(begin)
    return start, text.index(f"<!-- END GENERATED: {name} -->", start)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_sections_match_the_registry(name: str) -> None:
    text = DOC.read_text()
    start, end = section(text, name)
    want = GENERATED[name]()
    if os.environ.get("SPARSILE_UPDATE_DOCS") == "1":
        DOC.write_text(text[:start] + want + text[end:])
        return
    assert text[start:end] == want, (f"docs/language.md section `{name}` is out of date; regenerate it with "
                                     "SPARSILE_UPDATE_DOCS=1 python -m pytest tests/frontend/test_language_doc.py")


def test_every_builtin_is_documented() -> None:
    seen: list[Builtin] = []

    def walk(ns: Namespace) -> None:
        for m in ns.members.values():
            if isinstance(m, Builtin):
                seen.append(m)
            elif isinstance(m, Namespace):
                walk(m)

    walk(ROOT)
    seen += [b for table in (METHODS, PROPERTIES) for members in table.values() for b in members.values()]
    undocumented = sorted({b.name for b in seen if not b.doc.strip()})
    assert not undocumented, f"builtins without a docstring: {undocumented}"


PYTHON_BLOCKS = blocks("python")


@pytest.mark.parametrize(("line", "body"), PYTHON_BLOCKS, ids=[f"line{ln}" for ln, _ in PYTHON_BLOCKS])
def test_python_examples_run(line: int, body: str, tmp_path) -> None:
    path = tmp_path / f"language_doc_line{line}.py"  # @jit reads its source from a real file
    path.write_text(body)
    load_script(path)


SPK_BLOCKS = blocks("spk")


@pytest.mark.parametrize(("line", "body"), SPK_BLOCKS, ids=[f"line{ln}" for ln, _ in SPK_BLOCKS])
def test_spk_examples_compile(line: int, body: str) -> None:
    module = sp.loads(body, f"language.md:{line}")
    assert module.kernels
    for kernel in module.kernels.values():
        signature = {p.name: p.annotation for p in kernel.params if p.annotation is not T.CONSTEXPR}
        bindings, key = kernel.signature_bindings(signature)
        kernel.ir_for(bindings, key)


def failing_examples() -> list[tuple[int, str, str]]:
    text = DOC.read_text()
    found = list(FENCE.finditer(text))
    out = []
    for m, nxt in itertools.pairwise(found):
        if m.group(1).strip() == "spk fails":
            assert nxt.group(1).strip() == "text", "a `spk fails` block must be followed by a `text` block"
            out.append((text[:m.start()].count("\n") + 1, m.group(2), nxt.group(2)))
    return out


FAILING = failing_examples()


@pytest.mark.parametrize(("line", "body", "expected"), FAILING, ids=[f"line{ln}" for ln, _, _ in FAILING])
def test_failing_examples_render_as_shown(line: int, body: str, expected: str) -> None:
    module = sp.loads(body, "example.spk")
    with pytest.raises(sp.CompileError) as info:
        for kernel in module.kernels.values():
            signature = {p.name: p.annotation for p in kernel.params if p.annotation is not T.CONSTEXPR}
            kernel.ir_for(*kernel.signature_bindings(signature))
    assert info.value.render() + "\n" == expected


def test_the_document_has_examples_of_each_kind() -> None:
    assert len(PYTHON_BLOCKS) >= 5 and len(SPK_BLOCKS) >= 3 and len(FAILING) >= 1
