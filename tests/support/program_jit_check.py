"""The differential check of the two frontends on generated programs: a program as its ``.spk``
text and as a ``@jit`` module (tests/support/program_jit.py) must give the same IR after every
pass (printed without locations) for each target, the same PTX where asked (``.loc`` / ``.file``
lines and comments dropped), the same diagnostic codes where the checks refuse it, and the same
interpreter outputs bit for bit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

import sparsile as sp

from .compile import signature
from .program_check import kernel_of
from .program_jit import JitProgram, load_jit, marked_literals, render

TARGETS = ("sm_90a", "sm_100a")


def rendering(program: Any, seed: int) -> JitProgram:
    """The ``@jit`` form of ``program`` (its first variant's constexpr values as defaults)."""
    shape = getattr(program, "shape", None)
    with marked_literals():
        source = program.source
    return render(source, dict(program.variants()[0].consts), seed, shape if shape else None)


def ptx_text(ptx: str) -> str:
    """PTX without what names the source: ``.file`` / ``.loc`` lines, comments, debug sections."""
    out = []
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith((".file", ".loc", "//")) or not s:
            continue
        out.append(re.sub(r"\s*//.*$", "", line))
    return "\n".join(out)


def _compiled(kern: Any, sig: dict[str, Any], target: str, stop_after: str) -> tuple[Any, str]:
    """(the compiled kernel, "") or (the sorted diagnostic codes, the first message) or (None, the
    error of a crash)."""
    try:
        return kern.compile(sig, target=target, stop_after=stop_after, cache=False), ""
    except sp.CompileError as e:
        return sorted(d.code for d in e.diagnostics), str(e).splitlines()[0]
    except sp.SparsileError as e:
        return [getattr(e, "code", type(e).__name__)], str(e).splitlines()[0]
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def _outcome(result: Any, message: str) -> str:
    return "compiles" if not isinstance(result, list | None) else f"{result or 'crashes'}: {message}"


def jit_constexprs(consts: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The constexpr arguments a launch of the ``@jit`` kernel passes: those without a default
    equal to the value."""
    return {k: v for k, v in consts.items() if k not in defaults or defaults[k] != v}


def compare_compiles(spk: Any, jit: Any, consts: dict[str, Any], defaults: dict[str, Any],
                     targets: tuple[str, ...] = TARGETS, ptx: bool = False) -> list[str]:
    """The differences between compiling the two kernels for ``targets``."""
    out = []
    sig_s = signature(spk, **consts)
    sig_j = signature(jit, **jit_constexprs(consts, defaults))
    for target in targets:
        stage = "ptx" if ptx else "ir"
        a, ma = _compiled(spk, sig_s, target, stage)
        b, mb = _compiled(jit, sig_j, target, stage)
        if isinstance(a, list | None) or isinstance(b, list | None):
            if not (isinstance(a, list) and a == b):  # the same codes; a crash is always reported
                out.append(f"{target}: .spk {_outcome(a, ma)}; @jit {_outcome(b, mb)}")
            continue
        if a.ir != b.ir:
            out.append(f"{target}: the IR differs\n{_first_difference(a.ir, b.ir)}")
        elif ptx and ptx_text(a.ptx) != ptx_text(b.ptx):
            out.append(f"{target}: the PTX differs\n{_first_difference(ptx_text(a.ptx), ptx_text(b.ptx))}")
    return out


def _first_difference(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"  line {i + 1}:\n  .spk: {x}\n  @jit: {y}"
    return f"  lengths {len(la)} and {len(lb)}"


def _outputs(program: Any, kern: Any, seed: int, constexprs: dict[str, Any]) -> dict[str, bytes] | str:
    args = program.inputs(seed)
    runtime = [args[p.name] for p in kern.params if p.name not in program.consts]
    names = list(program.outputs) + (["HIST"] if program.hist_dtype else []) + list(program.atomic_bufs)
    try:
        kern.interpret[program.grid](*runtime, **constexprs)
    except sp.SparsileError as e:
        return f"{type(e).__name__} {getattr(e, 'code', '')}"
    return {n: np.asarray(args[n]).tobytes() for n in names}


def compare_runs(program: Any, spk: Any, jit: Any, defaults: dict[str, Any], seed: int) -> list[str]:
    """The outputs of the two kernels in the interpreter, bit for bit (any difference listed)."""
    a = _outputs(program, spk, seed, dict(program.consts))
    b = _outputs(program, jit, seed, jit_constexprs(program.consts, defaults))
    if isinstance(a, str) or isinstance(b, str):
        return [] if a == b else [f"interpreter: .spk {a if isinstance(a, str) else 'ran'}, "
                                  f"@jit {b if isinstance(b, str) else 'ran'}"]
    return [f"interpreter: output {n} differs" for n in a if a[n] != b[n]]


def differences(program: Any, seed: int, folder: Path, *, targets: tuple[str, ...] = TARGETS,
                ptx: bool = False, run: bool = True) -> tuple[list[str], JitProgram]:
    """Every disagreement of the two frontends on ``program`` (each value of its constexpr ``K``),
    and the rendering compared."""
    jp = rendering(program, seed)
    try:
        jit = load_jit(jp, folder)
    except Exception as e:
        return [f"loading the @jit module: {type(e).__name__}: {e}"], jp
    out = []
    for variant in program.variants():
        spk = kernel_of(variant) if hasattr(variant, "body") else sp.loads(variant.source, "case.spk").kernels["k"]
        tag = f"K={variant.consts.get('K')}: " if "K" in variant.consts else ""
        found = compare_compiles(spk, jit, dict(variant.consts), jp.defaults, targets, ptx)
        if run and not found:
            found = compare_runs(variant, spk, jit, jp.defaults, seed)
        out += [tag + d for d in found]
    return out, jp


def _spk_outcome(source: str, consts: dict[str, Any], target: str) -> tuple[str, Any]:
    """("ir", text) / ("codes", sorted codes) / ("crash", error) of the ``.spk`` text compiled."""
    try:
        kern = sp.loads(source, "case.spk").kernels.get("k")
    except sp.CompileError as e:
        return "codes", sorted(d.code for d in e.diagnostics)
    except Exception as e:
        return "crash", f"{type(e).__name__}: {e}"
    if kern is None:
        return "skip", "no kernel `k`"
    return _compile_outcome(kern, consts, {}, target)


def _compile_outcome(kern: Any, consts: dict[str, Any], defaults: dict[str, Any], target: str) -> tuple[str, Any]:
    try:
        sig = signature_or_none(kern, jit_constexprs(consts, defaults))
    except sp.CompileError as e:  # reading the parameters' annotations
        return "codes", sorted(d.code for d in e.diagnostics)
    return _outcome_of(*_compiled(kern, sig, target, "ir"))


def signature_or_none(kern: Any, consts: dict[str, Any]) -> dict[str, Any]:
    """The test signature of ``kern`` with ``consts`` (a parameter a mutation made unannotated is left
    out: the compile reports it)."""
    return {k: v for k, v in signature(kern, **consts).items() if v is not None}


def _outcome_of(result: Any, message: str) -> tuple[str, Any]:
    if result is None:
        return "crash", message
    if isinstance(result, list):
        return "codes", result
    return "ir", result.ir


def compare_mutant(source: str, consts: dict[str, Any], seed: int, folder: Path,
                   targets: tuple[str, ...] = TARGETS) -> tuple[list[str], str]:
    """A mutated program (``.spk`` text that Python parses) compiled by both frontends: the same IR or
    the same diagnostic codes. A rendering that Python itself refuses to run (a mutated annotation,
    default or decorator evaluated when the function is defined) is not compared. Returns the
    differences and the rendered text."""
    try:
        jp = render(source, consts, seed, respell=False)
    except Exception:
        return [], ""
    try:
        jit = load_jit(jp, folder)
        jit_error = None
    except sp.CompileError as e:
        jit, jit_error = None, ("codes", sorted(d.code for d in e.diagnostics))
    except sp.SparsileError as e:
        jit, jit_error = None, ("codes", [getattr(e, "code", type(e).__name__)])
    except Exception:
        return [], jp.text
    out = []
    for target in targets:
        a = _spk_outcome(source, consts, target)
        if a[0] == "skip":
            return [], jp.text
        if jit_error is not None:
            b = jit_error
        else:  # every constexpr given, as to the .spk kernel (a mutated annotation may make one run-time)
            b = _compile_outcome(jit, consts, {}, target)
        if a[0] == "crash" or b[0] == "crash" or a != b:
            show = [x if x[0] != "ir" else ("ir", "...") for x in (a, b)]
            out.append(f"{target}: .spk {show[0]}; @jit {show[1]}")
    return out, jp.text


def mutant_text(source: str, seed: int) -> str:
    """``source`` after one or two mutations of tests/fuzz/mutate.py drawn from ``seed``."""
    import random

    from ..fuzz.mutate import ast_mutation, token_mutation

    rng = random.Random(f"jitmut:{seed}")
    for _ in range(rng.choice([1, 1, 2])):
        source, _what = (ast_mutation if rng.random() < 0.6 else token_mutation)(rng, source)
    return source


def sweep(gen: str, seeds: range, folder: Path, *, mutants: bool = False, ptx: bool = False) -> list[str]:
    """One line per seed whose program (or its mutant) the two frontends disagree on."""
    import ast

    from .program_gen import generate
    from .program_gen_sparse import generate_sparse

    out = []
    for seed in seeds:
        program = (generate_sparse if gen == "sparse" else generate)(seed)
        if mutants:
            text = mutant_text(program.source, seed)
            try:
                ast.parse(text)
            except SyntaxError:
                continue
            diffs, _ = compare_mutant(text, dict(program.variants()[0].consts), seed, folder)
        else:
            diffs, _ = differences(program, seed, folder, ptx=ptx)
        if diffs:
            out.append(f"{gen} seed {seed}: {diffs[0][:400]}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m sparsile.tests.support.program_jit_check --gen plain --seeds 0:400 [--mutants] [--ptx]``."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gen", choices=("plain", "sparse"), default="plain")
    ap.add_argument("--seeds", default="0:100", help="start:stop")
    ap.add_argument("--mutants", action="store_true", help="compare mutants' diagnostics instead")
    ap.add_argument("--ptx", action="store_true", help="compare the PTX too")
    args = ap.parse_args(argv)
    start, stop = (int(x) for x in args.seeds.split(":"))
    with tempfile.TemporaryDirectory() as folder:
        lines = sweep(args.gen, range(start, stop), Path(folder), mutants=args.mutants, ptx=args.ptx)
    print("\n".join(lines) or f"{args.gen} {args.seeds}: the frontends agree")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
