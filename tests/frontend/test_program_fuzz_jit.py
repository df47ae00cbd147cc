"""The two frontends agree: each generated program (tests/support/program_gen.py and
program_gen_sparse.py) written as ``.spk`` text and as a ``@sparsile.jit`` Python module
(tests/support/program_jit.py: language names spelled every way, conversions and methods in their
other forms, literals as typed constants and as captured Python values, constexpr defaults, helpers
as ``@jit`` functions of this or another module, the kernel in a factory or a class) compiles to the
same IR after every pass for sm_90a and sm_100a (and the same PTX), and runs in the interpreter to
the same outputs bit for bit. Mutants of the programs (tests/fuzz/mutate.py) get the same
diagnostic codes from both, or the same IR.

A wider sweep: ``python -m sparsile.tests.support.program_jit_check --gen plain --seeds 0:400``
(``--mutants``, ``--ptx``; docs/testing.md)."""

from __future__ import annotations

import ast
import re

import pytest

import sparsile as sp
from sparsile.tests.support.program_gen import generate
from sparsile.tests.support.program_gen_sparse import generate_sparse
from sparsile.tests.support.program_jit import load_jit, render
from sparsile.tests.support.program_jit_check import (
    compare_compiles,
    compare_mutant,
    differences,
    mutant_text,
    rendering,
)

PLAIN_SEEDS = (3, 11, 37, 44, 215)
SPARSE_SEEDS = (0, 1, 58)
MUTANT_SEEDS = (40, 83, 174, 413, 425, 552, 892, 1158)
"""Mutants that gave different codes before the fixes and renderer corrections they found."""
SPARSE_MUTANT_SEEDS = (1225, 1580, 1620)
"""Sparse mutants likewise (1225: a parameter annotated `kernel`, the .spk decorator's name; 1580,
1620: an annotation naming another parameter, `M: BK`, read a renderer's decoy global `BK`)."""


@pytest.mark.parametrize("seed", PLAIN_SEEDS)
def test_a_generated_program_is_the_same_kernel_in_both_frontends(seed: int, tmp_path) -> None:
    program = generate(seed)
    diffs, jp = differences(program, seed, tmp_path)
    assert not diffs, f"seed {seed}:\n" + "\n".join(diffs) + "\n" + jp.text + "\n".join(jp.choices)


@pytest.mark.parametrize("seed", SPARSE_SEEDS)
def test_a_generated_sparse_program_is_the_same_kernel_in_both_frontends(seed: int, tmp_path) -> None:
    program = generate_sparse(seed)
    diffs, jp = differences(program, seed, tmp_path, ptx=seed == 0)
    assert not diffs, f"seed {seed}:\n" + "\n".join(diffs) + "\n" + jp.text + "\n".join(jp.choices)


def test_the_same_ptx_for_both_targets(tmp_path) -> None:
    program = generate(5)
    diffs, jp = differences(program, 5, tmp_path, ptx=True, run=False)
    assert not diffs, "\n".join(diffs) + "\n" + jp.text


@pytest.mark.parametrize(("make", "seed"), [(generate, s) for s in MUTANT_SEEDS]
                         + [(generate_sparse, s) for s in SPARSE_MUTANT_SEEDS],
                         ids=[f"plain-{s}" for s in MUTANT_SEEDS] + [f"sparse-{s}" for s in SPARSE_MUTANT_SEEDS])
def test_a_mutant_gets_the_same_diagnostics_from_both_frontends(make, seed: int, tmp_path) -> None:
    program = make(seed)
    text = mutant_text(program.source, seed)
    ast.parse(text)
    diffs, jit_text = compare_mutant(text, dict(program.variants()[0].consts), seed, tmp_path)
    assert jit_text, "the mutant was not compared"
    assert not diffs, f"seed {seed}:\n" + "\n".join(diffs) + "\n" + text + "\n" + jit_text


def test_only_language_names_are_spelled_as_sparsile_attributes() -> None:
    """A free name that is sparsile's Python API rather than a name of the kernel language (the
    decorator `kernel`, `CompileError`) is what an unknown name is in a .spk kernel: it stays a bare,
    undefined name in the @jit rendering (as `sp.kernel` it was another diagnostic, SP0204)."""
    source = ("@kernel\ndef k(X: ptr[f32], M: kernel, n: i32):\n"
              "    e = CompileError\n    store(X + arange(0, 16), zeros((16,), f32), mask=arange(0, 16) < n)\n")
    for seed in range(20):
        tree = ast.parse(render(source, {}, seed, respell=False).text)
        kern = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "k")
        inside = [n for part in (kern.args, *kern.body) for n in ast.walk(part)]  # not the decorator
        attrs = {a.attr for a in inside if isinstance(a, ast.Attribute)}
        assert "kernel" not in attrs and "CompileError" not in attrs, ast.unparse(kern)
        assert {"kernel", "CompileError"} <= {n.id for n in inside if isinstance(n, ast.Name)}
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not {"kernel", "CompileError"} & imported


def test_no_decoy_global_is_named_as_a_name_the_signature_reads() -> None:
    """The renderer's decoys (module globals named as the kernel's parameters and locals, which the
    kernel must not read) are never named as a name that the kernel's annotations or defaults read:
    those are evaluated in the module, where the decoy would be found (`M: BK` read `BK = (3, 5)`
    and gave SP0302 where the .spk text, which has no `BK` there, gives SP0202)."""
    source = ("@kernel\ndef k(X: ptr[f32], M: BK, n: i32, s: ptr[n], BK: constexpr, R: constexpr = BK):\n"
              "    t = arange(0, 16)\n    store(X + t, zeros((16,), f32), mask=t < n)\n")
    decoyed = set()
    for seed in range(60):
        tree = ast.parse(render(source, {"BK": 16}, seed, respell=False).text)
        module_names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                        if isinstance(t, ast.Name)}
        assert not {"BK", "n"} & module_names, seed
        decoyed |= module_names & {"X", "t", "s", "R"}
    assert decoyed, "no decoy was drawn: the check above tested nothing"


def test_a_different_kernel_is_reported(tmp_path) -> None:
    """The comparison is not vacuous: the @jit rendering with one captured float changed (a module
    global ``CAP_n = 2.0``) compiles to other IR."""
    pattern = re.compile(r"^(CAP_\d+ = )(-?\d+\.\d+)$", re.M)
    seed = next(s for s in range(50) if pattern.search(rendering(generate(s), s).text))
    program = generate(seed)
    jp = rendering(program, seed)
    consts = dict(program.variants()[0].consts)
    spk = sp.loads(program.source, "case.spk").kernels["k"]
    assert compare_compiles(spk, load_jit(jp, tmp_path), consts, jp.defaults, ("sm_90a",)) == []
    changed = pattern.sub(lambda m: f"{m[1]}{float(m[2]) + 0.25!r}", jp.text, count=1)
    jp_changed = type(jp)(changed, jp.helper_text, jp.helper_module, jp.defaults, jp.choices)
    found = compare_compiles(spk, load_jit(jp_changed, tmp_path), consts, jp.defaults, ("sm_90a",))
    assert len(found) == 1 and "the IR differs" in found[0], found


FEATURES = ("enum.IntEnum", "np.float16(", "np.int32(", "types.SimpleNamespace", "= [", "class Holder",
            "def make()", "from jitprog_helpers", "import jitprog_helpers", "HM.", "@staticmethod\n    @", ".T",
            "trans(", "load_tile(", ".load_tile(", "TYPED_", "np.float32", "ml_dtypes.", "m.shape",
            "from __future__", "constexpr=", ".sum(", "sp.jit()", "sp.kernel", "@jit", "float8e4nv", "L_",
            "k = sp", "spx.", "= 99")


def test_the_renderings_reach_every_choice() -> None:
    texts = []
    for seed in range(120):
        for program in (generate(seed), generate_sparse(seed)):
            jp = rendering(program, seed)
            texts.append(jp.text + jp.helper_text)
    missing = [f for f in FEATURES if not any(f in t for t in texts)]
    assert not missing, missing
    assert rendering(generate(7), 7).text == rendering(generate(7), 7).text
