"""Ahead-of-time compiles (issue 15, item 8): the source's annotations are the signature, and
``compile_kernel`` / ``Kernel.compile`` / ``sparsile compile`` go through the compile cache that
``kernel[grid]`` uses."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import sparsile as sp
from sparsile.cli import EXIT_OK, EXIT_USAGE, main
from sparsile.driver import cache as cache_mod
from sparsile.driver import compiler
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.support import cache_fixture

ROOT = Path(sp.__file__).resolve().parent
VECTOR_ADD = ROOT / "examples" / "vector_add.spk"

PARTLY_ANNOTATED = """\
@kernel
def k(x, y: ptr[f32], n: i32, BLOCK: constexpr, R: constexpr = 2):
    i = arange(0, BLOCK)
    store(y + i, load(x + i, mask=i < n) * R, mask=i < n)
"""


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """The kernels compile_function compiled (a spy: cache hits do not appear)."""
    return cache_fixture.spy_compiles(monkeypatch)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------------------ signatures
def test_cli_compiles_an_annotated_kernel_without_a_signature(fresh_cache) -> None:
    code, out, err = run_cli("compile", str(VECTOR_ADD), "--kernel", "vector_add", "--emit", "ptx",
                             "--target", "sm_90a")
    assert code == EXIT_OK and err == ""
    assert ".entry vector_add" in out and ".target sm_90a" in out


def test_annotations_and_defaults_fill_the_signature() -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    implicit = k.signature_bindings({})
    explicit = k.signature_bindings({"x": sp.ptr[sp.f32], "y": sp.ptr[sp.f32], "out": sp.ptr[sp.f32],
                                     "n": sp.i32, "BLOCK": 1024})
    assert implicit == explicit
    assert k.signature_bindings({"BLOCK": 256})[1] != implicit[1]


def test_a_missing_signature_names_every_missing_parameter() -> None:
    k = sp.loads(PARTLY_ANNOTATED, "case.spk").kernels["k"]
    with pytest.raises(LaunchError) as e:
        k.compile(stop_after="ir")
    assert e.value.code == "SP0740"
    assert str(e.value).splitlines()[0] == ("error[SP0740]: the signature of `k` must give `x` (no annotation) "
                                            "and `BLOCK` (constexpr without a default)")
    assert "x=ptr[f32], BLOCK=64" in str(e.value)
    ck = k.compile({"x": sp.ptr[sp.f32], "BLOCK": 32}, stop_after="ir")  # y, n, R from the source
    assert "k" in ck.ir


SCALAR_N = """\
@kernel
def k(x: ptr[f32], n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(x + offs, 1.0, mask=offs < n)
"""

POINTER_THROUGH_A_NAME = """\
@kernel
def k(x, out: ptr[f16], step, BLOCK: constexpr = 32):
    offs = program_id(0) * step + arange(0, BLOCK)
    p = x + offs
    store(out + offs, load(p))
"""

UNUSED = """\
@kernel
def k(x, BLOCK: constexpr):
    pass
"""

MISSING_HELP_TAIL = "; annotated run-time parameters and defaulted constexprs need nothing"


def missing_help(source: str) -> str:
    k = sp.loads(source, "case.spk").kernels["k"]
    with pytest.raises(LaunchError) as e:
        k.compile(stop_after="ir")
    assert e.value.code == "SP0740"
    return e.value.help


def test_the_missing_signature_example_fits_each_parameter() -> None:
    """SP0740's example wrote `n=ptr[f32]` for every run-time parameter: a scalar `n` (compared with
    the offsets) is `n=i32`, a pointer reached through a local name takes the annotated pointers'
    element type, a constexpr a value; the example compiles."""
    assert missing_help(SCALAR_N) == ('give them with --signature (Kernel.compile: signature=), e.g. '
                                      '"n=i32, BLOCK=64"' + MISSING_HELP_TAIL)
    assert missing_help(POINTER_THROUGH_A_NAME) == ('give them with --signature (Kernel.compile: signature=), '
                                                    'e.g. "x=ptr[f16], step=i32"' + MISSING_HELP_TAIL)
    for source, example in ((SCALAR_N, "n=i32, BLOCK=64"), (POINTER_THROUGH_A_NAME, "x=ptr[f16], step=i32")):
        assert "k" in sp.loads(source, "case.spk").kernels["k"].compile(example, stop_after="ir").ir


def test_the_missing_signature_example_says_when_the_kernel_does_not_tell() -> None:
    assert missing_help(UNUSED) == ('give them with --signature (Kernel.compile: signature=), e.g. '
                                    '"x=ptr[f32], BLOCK=64" (`x`: the kernel does not show whether it is a '
                                    'pointer or a scalar; a scalar is written x=i32 or x=f32)' + MISSING_HELP_TAIL)


@sp.jit
def triton_style_add(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n_elements
    sp.store(out_ptr + offs, sp.load(x_ptr + offs, mask=mask) + sp.load(y_ptr + offs, mask=mask), mask=mask)


def test_the_missing_signature_example_of_a_jit_kernel() -> None:
    with pytest.raises(LaunchError) as e:
        triton_style_add.compile(stop_after="ir")
    assert e.value.code == "SP0740"
    example = "x_ptr=ptr[f32], y_ptr=ptr[f32], out_ptr=ptr[f32], n_elements=i32, BLOCK=64"
    assert e.value.help == (f'give them with --signature (Kernel.compile: signature=), e.g. "{example}"'
                            + MISSING_HELP_TAIL)
    assert "triton_style_add" in triton_style_add.compile(example, stop_after="ir").ir


def test_a_type_given_as_text_in_a_dict_says_how_to_give_it() -> None:
    """{"x": "ptr[f32]"} was told that a run-time parameter "needs a type such as `ptr[f32]`": the text
    it had just given. The message says a type object is wanted, and the help shows both forms."""
    k = sp.loads(PARTLY_ANNOTATED, "case.spk").kernels["k"]
    with pytest.raises(LaunchError) as e:
        k.compile({"x": "ptr[f32]", "BLOCK": 32}, stop_after="ir")
    assert e.value.code == "SP0724"
    assert e.value.message == ("the signature gives `x` = 'ptr[f32]', a text; in a dict, a run-time parameter "
                               "needs a type object such as sp.ptr[sp.f32] or sp.i32")
    assert e.value.help == ("write {'x': sp.ptr[sp.f32]}, or give the whole signature as one text: "
                            "k.compile(\"x=ptr[f32], BLOCK=32\")")
    assert k.compile({"x": sp.ptr[sp.f32], "BLOCK": 32}, stop_after="ir").ir == k.compile(
        "x=ptr[f32], BLOCK=32", stop_after="ir").ir  # the two forms the help shows
    with pytest.raises(LaunchError) as e:
        k.compile({"x": 3.5, "BLOCK": 32}, stop_after="ir")  # not a text: the message as before
    assert e.value.message == ("the signature gives `x` = 3.5; a run-time parameter needs a type such as "
                               "`ptr[f32]` or `i32`")


def test_cli_missing_signature_is_a_usage_error(tmp_path) -> None:
    path = tmp_path / "case.spk"
    path.write_text(PARTLY_ANNOTATED)
    code, out, err = run_cli("compile", str(path), "--kernel", "k", "--signature", "BLOCK=64", "--emit", "ptx")
    assert code == EXIT_USAGE and out == ""
    assert "error[SP0740]: the signature of `k` must give `x` (no annotation)\n" in err


# ------------------------------------------------------------------------------------ caching
def test_a_second_aot_compile_is_a_cache_hit(fresh_cache, compiles) -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    first = compiler.compile_kernel(k, None, target="sm_90a", stop_after="ptx")
    assert compiles == ["vector_add"] and fresh_cache.stats.misses == 1
    again = compiler.compile_kernel(sp.load(VECTOR_ADD).kernels["vector_add"], "BLOCK=1024", target="sm_90a",
                                    stop_after="ptx")
    assert compiles == ["vector_add"] and fresh_cache.stats.memory_hits == 1
    assert again.ptx == first.ptx and again.llvm == first.llvm and again.params == first.params
    cache_mod.reset_default_cache()  # a new process: read back from disk
    from_disk = compiler.compile_kernel(k, None, target="sm_90a", stop_after="ptx")
    assert compiles == ["vector_add"] and cache_mod.default_cache().stats.disk_hits == 1
    assert from_disk.ptx == first.ptx


def test_what_the_key_holds(fresh_cache, compiles) -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    compiler.compile_kernel(k, None, target="sm_90a", stop_after="llvm")
    compiler.compile_kernel(k, "BLOCK=256", target="sm_90a", stop_after="llvm")  # another specialization
    compiler.compile_kernel(k, None, target="sm_90a", stop_after="llvm", num_warps=8)  # other options
    compiler.compile_kernel(k, None, target="sm_100a", stop_after="llvm")  # another target
    compiler.compile_kernel(k, None, target="sm_90a", stop_after="llvm", cache=False)  # asked not to
    assert len(compiles) == 5
    compiler.compile_kernel(k, None, target="sm_90a", stop_after="llvm", num_warps=8)
    assert len(compiles) == 5


def test_a_later_stage_carries_a_cached_entry_on(fresh_cache, compiles, monkeypatch) -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    llvm = compiler.compile_kernel(k, None, target="sm_90a", stop_after="llvm")
    assert not llvm.ptx
    ptx = compiler.compile_kernel(k, None, target="sm_90a", stop_after="ptx")
    assert compiles == ["vector_add"] and ptx.llvm == llvm.llvm and ".entry vector_add" in ptx.ptx
    assert fresh_cache.get(next(iter(fresh_cache._memory))).blobs["ptx"].decode() == ptx.ptx


def test_compile_for_and_the_launch_path_share_cache_entries(fresh_cache, compiles) -> None:
    import numpy as np

    from sparsile.target.targets import get_target

    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    x = np.ones(4, np.float32)
    ck = k[(1,)].compile_for("sm_90a", x, x, x, 4)
    hits = fresh_cache.stats.memory_hits
    _, bindings, key = k.bind((x, x, x, 4), {})
    options = {**sp.driver.kernel.KERNEL_OPTIONS, **k.options}
    again = compiler.compile_cached(k, bindings, key, get_target("sm_90a"), options)
    assert compiles == ["vector_add"] and fresh_cache.stats.memory_hits == hits + 1 and again.cubin == ck.cubin
    (entry,) = fresh_cache._memory.values()
    assert sorted(entry.blobs) == ["cubin", "ir", "ptx"]  # the launch path keeps no LLVM IR


def test_aot_entries_keep_the_llvm_ir_compressed(fresh_cache) -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    first = compiler.compile_kernel(k, None, target="sm_90a", stop_after="ptx")
    (entry,) = fresh_cache._memory.values()
    assert sorted(entry.blobs) == ["ir", compiler.LLVM_BLOB, "ptx"]
    assert len(entry.blobs[compiler.LLVM_BLOB]) < len(first.llvm) / 3


@pytest.mark.parametrize("thing", ["vector_add", None, sp.loads("def h(x):\n    return x\n").h])
def test_compile_kernel_of_something_that_is_no_kernel(thing) -> None:
    # a name, None or a helper used to be an AttributeError (no attribute 'signature_bindings')
    with pytest.raises(LaunchError) as info:
        compiler.compile_kernel(thing, None, stop_after="ir")
    assert str(info.value).splitlines()[0] == (f"error[SP0724]: compile_kernel needs a kernel, found "
                                               f"{type(thing).__name__}")


def test_compile_kernel_for_an_empty_target_name() -> None:
    # target="" compiled for sm_90a without a word (the command line refuses an empty --target)
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    for target in ("", "  "):
        with pytest.raises(sp.CompileError) as info:
            k.compile(target=target, stop_after="ptx")
        assert str(info.value).splitlines()[0] == "error[SP0601]: the target name is empty"
