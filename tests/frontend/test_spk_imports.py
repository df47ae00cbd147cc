"""Relative imports between ``.spk`` files (driver/imports.py, docs/language.md "Importing from
another .spk file"): what they bind, that a file is loaded once, their diagnostics (SP0243-SP0247),
and that every compile-cache key holds the imported text, so an edited helper recompiles."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver import cache as C
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.sema.fingerprints import fingerprint

HELPERS = """\
SCALE = 3
PAIR = (2, 5)


def twice(x):
    return x * SCALE - x


@kernel
def kk(out: ptr[f32]):
    pass
"""

DEEP = """\
from ..helpers import twice


def four(x):
    return twice(twice(x))
"""

MAIN = """\
from .helpers import twice, SCALE as S
from .sub.deep import four


@kernel
def k(out: ptr[f32], BLOCK: constexpr = 64):
    i = arange(0, BLOCK)
    store(out + i, four(twice(i.to(f32))) + S)
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "helpers.spk").write_text(HELPERS)
    (tmp_path / "sub" / "deep.spk").write_text(DEEP)
    (tmp_path / "main.spk").write_text(MAIN)
    return tmp_path


def only(err: CompileError) -> tuple[str, str]:
    (d,) = err.diagnostics
    return d.code, d.message


def diagnose(text: str, path: Path | None) -> tuple[str, str, str]:
    """(code, message, name:line:col) of the one diagnostic of loading ``text`` as ``case.spk``."""
    with pytest.raises(CompileError) as info:
        sp.loads(text, "case.spk", path=path)
    (d,) = info.value.diagnostics
    return d.code, d.message, f"{d.span.source.name}:{d.span.line}:{d.span.col}"


# ------------------------------------------------------------------------------------------------
def test_sibling_sub_folder_and_parent_imports_run(tree: Path) -> None:
    module = sp.load(tree / "main.spk")
    out = np.full(64, np.nan, np.float32)
    module.k.interpret[(1,)](out)
    i = np.arange(64, dtype=np.float64)
    twice = lambda x: x * 3 - x  # noqa: E731 (the helpers, in float64)
    np.testing.assert_array_equal(out.astype(np.float64), twice(twice(twice(i))) + 3)
    assert module.S == 3 and "twice" in module.exports() and "four" in module.exports()


def test_star_import_and_constants(tree: Path) -> None:
    text = "from .helpers import *\n\n@kernel\ndef k(out: ptr[f32]):\n    store(out, twice(1.0) * PAIR[1])\n"
    module = sp.loads(text, "case.spk", path=tree / "case.spk")
    assert sorted(module.exports()) == ["PAIR", "SCALE", "twice"]  # not the kernel kk
    out = np.full(1, np.nan, np.float32)
    module.k.interpret[(1,)](out)
    assert out[0] == 10.0


def test_an_imported_file_is_loaded_once_per_text(tree: Path) -> None:
    a = sp.load(tree / "main.spk")
    b = sp.loads("from .helpers import twice\n", "other.spk", path=tree / "other.spk")
    assert a.exports()["twice"] is b.exports()["twice"]
    (tree / "helpers.spk").write_text(HELPERS.replace("SCALE = 3", "SCALE = 4"))
    c = sp.loads("from .helpers import twice\n", "other.spk", path=tree / "other.spk")
    assert c.exports()["twice"] is not a.exports()["twice"]


def test_source_key_holds_every_imported_text(tree: Path) -> None:
    plain = sp.loads("@kernel\ndef k(out: ptr[f32]):\n    pass\n", "plain.spk")
    assert plain.k.source_key == plain.k.source.text  # no imports: keys as before imports existed
    k = sp.load(tree / "main.spk").k
    assert k.imports == (HELPERS, DEEP)  # transitively, each file once
    assert all(text in k.source_key for text in (MAIN, HELPERS, DEEP))
    helper_before = fingerprint(sp.load(tree / "sub" / "deep.spk").helpers["four"])
    (tree / "helpers.spk").write_text(HELPERS.replace("SCALE = 3", "SCALE = 4"))
    assert sp.load(tree / "main.spk").k.source_key != k.source_key
    assert fingerprint(sp.load(tree / "sub" / "deep.spk").helpers["four"]) != helper_before  # @jit captures


def test_editing_an_imported_helper_recompiles(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 1 for imports: the same SPARSILE_CACHE_DIR, the helper edited between two
    loads (each with a fresh process-wide cache, as in a new process): the PTX must change."""
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tree / "cache"))
    monkeypatch.delenv("SPARSILE_NO_DISK_CACHE", raising=False)

    def ptx() -> str:
        C.reset_default_cache()  # memory empty: what a second process sees is the disk
        return sp.load(tree / "main.spk").k.compile("out=ptr[f32]", target="sm_90a", stop_after="ptx").ptx

    try:
        first = ptx()
        (tree / "helpers.spk").write_text(HELPERS.replace("x * SCALE - x", "x * SCALE + x"))
        second = ptx()
        entries = sorted((tree / "cache").rglob("*.entry"))
        third = ptx()  # unchanged files: a hit, no new entry
        assert sorted((tree / "cache").rglob("*.entry")) == entries
    finally:
        C.reset_default_cache()
    assert first != second and second == third and len(entries) == 2


# ------------------------------------------------------------------------------------------------
def test_missing_file(tree: Path) -> None:
    assert diagnose("from .nothing_here import f\n", tree / "case.spk") == (
        "SP0243", "cannot import `.nothing_here`: no readable file `nothing_here.spk` (No such file or directory)",
        "case.spk:1:1")
    assert diagnose("from ..sub.none import f\n", tree / "sub" / "case.spk")[:2] == (
        "SP0243", "cannot import `..sub.none`: no readable file `../sub/none.spk` (No such file or directory)")


def test_a_module_name_is_needed(tree: Path) -> None:
    assert diagnose("from . import twice\n", tree / "case.spk")[:2] == (
        "SP0243", "`from . import ...` names no file")


def test_an_imported_file_that_is_not_utf8(tree: Path) -> None:
    (tree / "latin.spk").write_bytes(b"# caf\xe9\n")
    assert diagnose("from .latin import f\n", tree / "case.spk")[:2] == (
        "SP0243", "cannot import `.latin`: `latin.spk` is not UTF-8 text (invalid continuation byte at byte 5)")


def test_an_imported_file_with_a_byte_order_mark(tree: Path) -> None:
    # the file given to `sparsile check` may start with a UTF-8 byte-order mark; a file it imported
    # could not (SP0101: invalid non-printable character U+FEFF)
    (tree / "marked.spk").write_bytes(b"\xef\xbb\xbfdef three(x):\n    return x * 3\n")
    module = sp.loads("from .marked import three\n\n\n@kernel\ndef k(out: ptr[f32]):\n"
                      "    i = arange(0, 16)\n    store(out + i, three(i.to(f32)))\n", "case.spk",
                      path=tree / "case.spk")
    out = np.zeros(16, np.float32)
    module.k.interpret[(1,)](out)
    assert out.tolist() == [3.0 * i for i in range(16)]
    (tree / "marked.spk").write_bytes(b"\xef\xbb\xbf# caf\xe9\n")
    assert diagnose("from .marked import f\n", tree / "case.spk")[:2] == (
        "SP0243", "cannot import `.marked`: `marked.spk` is not UTF-8 text (invalid continuation byte at byte 8)")


def test_missing_name(tree: Path) -> None:
    assert diagnose("from .helpers import nope\n", tree / "case.spk") == (
        "SP0244", "`helpers.spk` has no helper or constant `nope`", "case.spk:1:1")


def test_kernels_are_not_importable(tree: Path) -> None:
    assert diagnose("from .helpers import kk\n", tree / "case.spk")[:2] == (
        "SP0247", "`kk` is a kernel of `helpers.spk`; only helper functions and constants can be imported")


def test_circular_imports(tree: Path) -> None:
    assert diagnose("from .case import f\n", tree / "case.spk")[:2] == (
        "SP0245", "circular import: case.spk -> case.spk")
    (tree / "a.spk").write_text("from .b import g\n\ndef f(x):\n    return x\n")
    (tree / "b.spk").write_text("\nfrom .a import f\n\ndef g(x):\n    return x\n")
    with pytest.raises(CompileError) as info:
        sp.load(tree / "a.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.span.source.name, d.span.line) == (
        "SP0245", "circular import: a.spk -> b.spk -> a.spk", str(tree / "b.spk"), 2)


def test_text_without_a_folder(tree: Path) -> None:
    assert diagnose("from .helpers import twice\n", None) == (
        "SP0246", "`case.spk` has no folder to import `.helpers` from", "case.spk:1:1")
    with pytest.raises(CompileError) as info:
        sp.loads("", "case.spk", path=5)  # type: ignore[arg-type]
    assert only(info.value) == ("SP0240", "sparsile.loads: path= needs a file path (str or os.PathLike), found int")


def test_errors_in_an_imported_file_point_into_it(tree: Path) -> None:
    (tree / "broken.spk").write_text("def f(x):\n    return x\n\nfor i in range(3):\n    pass\n")
    with pytest.raises(CompileError) as info:
        sp.loads("from .broken import f\n", "case.spk", path=tree / "case.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.span.source.name, d.span.line) == ("SP0234", str(tree / "broken.spk"), 4)


def test_absolute_sparsile_imports_still_work(tree: Path) -> None:
    text = "import sparsile as sp\nfrom sparsile import cdiv\nfrom .helpers import SCALE\n\n" \
           "@kernel\ndef k(out: ptr[f32]):\n    store(out, sp.cdiv(7, SCALE) + cdiv(1, 1))\n"
    out = np.full(1, np.nan, np.float32)
    sp.loads(text, "case.spk", path=tree / "case.spk").k.interpret[(1,)](out)
    assert out[0] == 4.0


# ------------------------------------------------------------------------------------------------
def test_check_takes_several_files_and_the_blackwell_linear_kernels(tree: Path) -> None:
    from sparsile.cli import main

    root = Path(sp.__file__).resolve().parent / "stdlib" / "kernels"
    out, err = io.StringIO(), io.StringIO()
    code = main(["check", str(tree / "main.spk"), str(tree / "helpers.spk")], stdout=out, stderr=err)
    assert code == 0 and err.getvalue() == ""
    assert f"{tree / 'main.spk'}: ok (1 kernel checked: k)" in out.getvalue()
    assert f"{tree / 'helpers.spk'}: ok (1 kernel checked: kk)" in out.getvalue()
    out = io.StringIO()
    code = main(["check", str(root / "sparse_gemm_sm100_persistent.spk"), "--kernel", "sparse_linear_f16",
                 "--signature", "Y=ptr[f16],Bias=ptr[f32],SW=ptr[f32],SX=ptr[f32]"], stdout=out, stderr=err)
    assert code == 0 and "ok (1 kernel checked: sparse_linear_f16)" in out.getvalue(), err.getvalue()
    code = main(["check", str(tree / "main.spk"), str(tree / "nowhere.spk")], stdout=out, stderr=err)
    assert code == 2 and f"error[SP0240]: cannot read `{tree / 'nowhere.spk'}`" in err.getvalue()
