"""docs/diagnostics.md is tested: every diagnostic code used in the source tree has an entry, and
every entry's trigger runs and gives exactly the documented code, message and span.

An entry is a ``### SPxxxx — title`` section with

* a trigger: a ```` ```spk ```` block (a module with a kernel ``k``, or one kernel; the info string
  may add ``target=sm_80`` and ``stage=ir|llvm|ptx|cubin``; run through ``compile_kernel``) or a
  ```` ```python ```` block (statements that raise the error, or whose last expression is a list
  of descriptor ``Problem`` values);
* a ```` ```text ```` block: the first line ``error[SPxxxx]: message`` (or ``warning[...]``),
  and for source diagnostics the `` --> case.spk:line:col`` line of the span;
* a ``**Fix:**`` line.

Issue 5 acceptance 4 asks for at least 40 codes checked this way with their spans.

When a message changes on purpose, rewrite the ```` ```text ```` blocks from what the triggers give
now (and review the diff)::

    SPARSILE_UPDATE_DOCS=1 python -m pytest tests/test_diagnostics_catalog.py
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "diagnostics.md"
CODE = re.compile(r"SP0\d{3}")
HEADING = re.compile(r"^### (SP0\d{3}) — (.+)$", re.M)
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
SOURCE_DIRS = ("frontend", "backend", "driver", "target", "stdlib", "grammar", "integrations")
REGISTRY = ROOT / "frontend" / "codes.py"


@dataclass(frozen=True)
class Entry:
    code: str
    title: str
    kind: str  # "spk", "python" or "" (documented, not run)
    options: dict[str, str]
    trigger: str
    expected: str
    fix: str
    line: int


@dataclass(frozen=True)
class Found:
    code: str
    severity: str
    message: str
    where: str | None  # "case.spk:L:C" for source diagnostics


def entries(text: str | None = None) -> list[Entry]:
    text = DOC.read_text() if text is None else text
    out = []
    heads = list(HEADING.finditer(text))
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        nxt = text.find("\n## ", h.end())
        if 0 <= nxt < end:
            end = nxt
        body = text[h.end():end]
        blocks = [(m.group(1).split(), m.group(2)) for m in FENCE.finditer(body)]
        trig = next(((info, b) for info, b in blocks if info and info[0] in ("spk", "python")), None)
        exp = next((b for info, b in blocks if info and info[0] == "text"), "")
        fix = next((ln for ln in body.splitlines() if ln.startswith("**Fix:**")), "")
        kind = trig[0][0] if trig else ""
        opts = dict(o.split("=", 1) for o in trig[0][1:]) if trig else {}
        out.append(Entry(h.group(1), h.group(2), kind, opts, trig[1] if trig else "", exp, fix,
                         text[:h.start()].count("\n") + 1))
    return out


# ------------------------------------------------------------------------------------------------
# Running a trigger
# ------------------------------------------------------------------------------------------------
def _from_diagnostic(d: Any) -> Found:
    where = f"{d.span.source.name}:{d.span.file_line}:{d.span.file_col}" if d.span.line > 0 else None
    return Found(d.code, d.severity.value, d.message, where)


def _from_exception(e: BaseException, code: str) -> Found | None:
    from sparsile.frontend.diagnostics import CompileError

    if isinstance(e, CompileError):
        match = [d for d in e.diagnostics if d.code == code] or list(e.diagnostics)
        return _from_diagnostic(match[0])
    c = getattr(e, "code", None)
    if isinstance(c, str) and CODE.fullmatch(c):
        message = getattr(e, "message", None)
        if message is None:  # LaunchError: "error[CODE]: message\n = help: ..."
            message = str(e).split("\n", 1)[0].split("]: ", 1)[1]
        return Found(c, "error", message, None)
    return None


def run_spk(source: str, options: dict[str, str], code: str) -> Found | None:
    import sparsile as sp
    from sparsile.driver.compiler import compile_kernel
    from sparsile.frontend.diagnostics import CompileError
    from sparsile.frontend.ir import types as T

    try:
        module = sp.loads(source, "case.spk")
        kernels = module.kernels
        k = kernels.get(options.get("kernel", "k")) or next(iter(kernels.values()))
        sig = {p.name: p.annotation for p in k.params if p.annotation is not T.CONSTEXPR}
        compile_kernel(k, sig, target=options.get("target", "sm_90a"), stop_after=options.get("stage", "ir"))
    except CompileError as e:
        return _from_exception(e, code)
    except Exception as e:  # launch-time errors of signatures, sparsity errors...
        found = _from_exception(e, code)
        if found is None:
            raise
        return found
    return None


def run_python(source: str, code: str) -> Found | None:
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    env: dict[str, Any] = {"__name__": "catalog"}
    try:
        exec(compile(tree, "<catalog>", "exec"), env)
        value = eval(compile(ast.Expression(last.value), "<catalog>", "eval"), env) if last else None
    except Exception as e:
        found = _from_exception(e, code)
        if found is None:
            raise
        return found
    problems = [p for p in (value or []) if getattr(p, "code", None)]
    if problems:
        p = next((p for p in problems if p.code == code), problems[0])
        if hasattr(p, "severity"):
            return _from_diagnostic(p)
        return Found(p.code, "error", p.message, None)
    return None


def run(entry: Entry) -> Found | None:
    if entry.kind == "spk":
        return run_spk(entry.trigger, entry.options, entry.code)
    return run_python(entry.trigger, entry.code)


_RUNS: dict[tuple[str, str, tuple[tuple[str, str], ...], str], Found | None] = {}


def run_once(entry: Entry) -> Found | None:
    """``run(entry)``, once per trigger in this process: ``test_entry`` runs every trigger, and
    ``updated_doc`` (the rewrite test) reads those results instead of compiling every trigger twice
    more (it took as long as all of ``test_entry``). Keyed by what ``run`` reads, so an entry whose
    trigger differs runs anew."""
    key = (entry.kind, entry.trigger, tuple(sorted(entry.options.items())), entry.code)
    if key not in _RUNS:
        _RUNS[key] = run(entry)
    return _RUNS[key]


def expected(entry: Entry) -> Found:
    lines = entry.expected.strip("\n").split("\n")
    m = re.fullmatch(r"(error|warning)\[(SP0\d{3})\]: (.*)", lines[0])
    assert m, f"{entry.code}: the text block must start with `error[{entry.code}]: ...`"
    where = next((ln.split("-->", 1)[1].strip() for ln in lines[1:] if ln.strip().startswith("-->")), None)
    return Found(m.group(2), m.group(1), m.group(3), where)


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------
ENTRIES = entries() if DOC.exists() else []


def source_codes() -> dict[str, str]:
    """Every code written in the source tree (not tests, not docs), with one file using it."""
    found: dict[str, str] = {}
    for d in SOURCE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            if path == REGISTRY:  # the registry names every code: a use is a raise or a constant elsewhere
                continue
            for c in CODE.findall(path.read_text()):
                found.setdefault(c, str(path.relative_to(ROOT)))
    return found


def render_expected(found: Found) -> str:
    text = f"{found.severity}[{found.code}]: {found.message}\n"
    return text + (f" --> {found.where}\n" if found.where else "")


def updated_doc(text: str) -> str:
    """``text`` with every runnable entry's ```` ```text ```` block rewritten from its trigger."""
    heads = list(HEADING.finditer(text))
    out, last = [], 0
    for h, e in zip(heads, entries(text), strict=True):
        if not e.kind:
            continue
        found = run_once(e)
        if found is None:
            continue
        m = re.compile(r"^```text\n(.*?)^```", re.S | re.M).search(text, h.end())
        if m is None:
            continue
        out.append(text[last:m.start(1)])
        out.append(render_expected(found))
        last = m.end(1)
    out.append(text[last:])
    return "".join(out)


def test_every_code_in_the_source_is_documented() -> None:
    documented = {e.code for e in ENTRIES}
    missing = {c: f for c, f in source_codes().items() if c not in documented}
    assert not missing, f"codes used in the source but missing from docs/diagnostics.md: {missing}"


def test_the_code_registry_is_the_catalog() -> None:
    """frontend/codes.py holds one row per documented code, with the section's title, in order."""
    from sparsile.frontend.codes import CODES, title

    assert list(CODES.items()) == [(e.code, e.title) for e in ENTRIES]
    assert title("SP0724") == "malformed signature"


def test_every_documented_code_exists_once() -> None:
    codes = [e.code for e in ENTRIES]
    assert len(codes) == len(set(codes)), "a code is documented twice"
    stale = set(codes) - set(source_codes())
    assert not stale, f"documented codes no longer used anywhere: {sorted(stale)}"


def test_entries_have_a_message_and_a_fix() -> None:
    for e in ENTRIES:
        assert e.fix.strip() != "**Fix:**", e.code
        if e.kind:
            assert expected(e).code == e.code, e.code


def test_at_least_40_codes_are_checked_with_their_span() -> None:
    spanned = [e for e in ENTRIES if e.kind and expected(e).where]
    assert len(spanned) >= 40, len(spanned)


@pytest.mark.skipif(os.environ.get("SPARSILE_UPDATE_DOCS") != "1", reason="only when updating the docs")
def test_update_the_expected_messages() -> None:
    DOC.write_text(updated_doc(DOC.read_text()))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.kind], ids=lambda e: e.code)
def test_entry(entry: Entry) -> None:
    want = expected(entry)
    got = run_once(entry)
    assert got is not None, f"{entry.code} (docs/diagnostics.md line {entry.line}): the trigger raised nothing"
    assert (got.code, got.severity) == (want.code, want.severity), got
    assert got.message == want.message, f"{entry.code}: message differs:\n  doc: {want.message}\n  got: {got.message}"
    assert got.where == want.where, f"{entry.code}: span differs: doc {want.where}, got {got.where}"


def test_updating_rewrites_only_the_text_blocks() -> None:
    doc = DOC.read_text()
    assert updated_doc(doc) == doc  # every documented message is current
    changed = doc.replace("error[SP0202]: unknown name `undefined_thing`", "error[SP0202]: stale words", 1)
    assert updated_doc(changed) == doc


def test_parser_of_the_catalog() -> None:
    text = """\
## SP01xx

### SP0999 — a title

```spk target=sm_80
x = $
```

```text
error[SP0999]: a message
 --> case.spk:1:5
```

**Fix:** do it.

### SP0998 — another

```python
raise ValueError()
```
"""
    a, b = entries(text)
    assert (a.code, a.kind, a.options, a.line, a.fix) == ("SP0999", "spk", {"target": "sm_80"}, 3, "**Fix:** do it.")
    assert expected(a) == Found("SP0999", "error", "a message", "case.spk:1:5")
    assert (b.code, b.kind, b.expected) == ("SP0998", "python", "")
