"""``.spk`` modules and ``@jit`` (driver/module.py): bad sources, paths and decorator options
get SP02xx diagnostics, not Python errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError


def only(err: CompileError) -> tuple[str, str]:
    (d,) = err.diagnostics
    return d.code, d.message


@pytest.mark.parametrize("text", [None, 5, ["@kernel"]])
def test_loads_needs_text(text: object) -> None:
    with pytest.raises(CompileError) as info:
        sp.loads(text)  # type: ignore[arg-type]
    assert only(info.value) == ("SP0240", f"sparsile.loads needs the source text as a str, found {type(text).__name__}")


def test_loads_reads_utf8_bytes() -> None:
    module = sp.loads(b"@kernel\ndef k(x: ptr[f32]):\n    store(x, 1.0)\n", "case.spk")
    assert list(module.kernels) == ["k"]


def test_loads_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(CompileError) as info:
        sp.loads(b"\xff\xfe@kernel", "case.spk")
    assert only(info.value) == ("SP0240", "cannot read `case.spk`: it is not UTF-8 text (invalid start byte at byte 0)")


@pytest.mark.parametrize("path", [None, 5])
def test_load_needs_a_path(path: object) -> None:
    with pytest.raises(CompileError) as info:
        sp.load(path)  # type: ignore[arg-type]
    assert only(info.value) == ("SP0240", "sparsile.load needs a file path (str or os.PathLike), found "
                                f"{type(path).__name__}")


def test_load_refuses_a_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.spk"
    path.write_bytes(b"@kernel\ndef k():\n    pass\n\x80")
    with pytest.raises(CompileError) as info:
        sp.load(path)
    assert only(info.value) == ("SP0240", f"cannot read `{path}`: it is not UTF-8 text (invalid start byte at byte 26)")


def test_load_accepts_a_utf8_byte_order_mark(tmp_path: Path) -> None:
    # `sparsile check` accepted the mark while sparsile.load said SP0101 (invalid character U+FEFF)
    path = tmp_path / "bom.spk"
    path.write_bytes(b"\xef\xbb\xbf@kernel\ndef k(x: ptr[f32]):\n    store(x, 1.0)\n")
    assert list(sp.load(path).kernels) == ["k"]
    assert list(sp.loads(path.read_bytes(), "bom.spk").kernels) == ["k"]
    path.write_bytes(b"\xef\xbb\xbf# caf\xe9\n")  # the byte counted in the file, the mark included
    with pytest.raises(CompileError) as info:
        sp.load(path)
    assert only(info.value) == ("SP0240", f"cannot read `{path}`: it is not UTF-8 text (invalid continuation byte "
                                          "at byte 8)")


def test_load_of_a_path_with_a_nul_character() -> None:
    # used to raise ValueError: embedded null byte
    with pytest.raises(CompileError) as info:
        sp.load("kernels\x00.spk")
    assert only(info.value) == ("SP0240", "cannot read 'kernels\\x00.spk': a file path cannot hold a NUL character")


def test_load_of_a_readme_path_outside_the_checkout_names_the_installed_copy(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # README's `sparsile.load("examples/vector_add.spk")` run from another folder said only "No such file"
    monkeypatch.chdir(tmp_path)
    installed = Path(sp.__file__).resolve().parent / "examples" / "vector_add.spk"
    with pytest.raises(CompileError) as info:
        sp.load("examples/vector_add.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0240", "cannot read `examples/vector_add.spk`: No such file or directory")
    assert d.help == (f"the path is relative to the current folder, {tmp_path}; the file of that name installed with "
                      f"sparsile is {installed}")
    with pytest.raises(CompileError) as info:
        sp.load("examples/no_such_example.spk")  # no installed copy: no help
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.help) == ("SP0240", "cannot read `examples/no_such_example.spk`: No such file or "
                                                     "directory", None)


def test_a_misspelled_kernel_of_a_module_names_the_kernels() -> None:
    # `module.vector_ad` said only "has no kernel or constant `vector_ad`"
    module = sp.loads("@kernel\ndef vector_add(x: ptr[f32]):\n    store(x, 1.0)\n\n\n"
                      "@kernel\ndef scale(x: ptr[f32]):\n    store(x, 2.0)\n", "two.spk")
    with pytest.raises(AttributeError) as info:
        module.vector_ad  # noqa: B018
    assert str(info.value) == ("module `two.spk` has no kernel or constant `vector_ad`: did you mean `vector_add`? "
                               "(kernels: scale, vector_add)")
    with pytest.raises(AttributeError) as info:
        module.zzz  # noqa: B018
    assert str(info.value) == "module `two.spk` has no kernel or constant `zzz` (kernels: scale, vector_add)"
    assert not hasattr(module, "zzz") and getattr(module, "zzz", None) is None  # still an AttributeError


def test_load_keeps_windows_newlines_working(tmp_path: Path) -> None:
    path = tmp_path / "crlf.spk"
    path.write_bytes(b"@kernel\r\ndef k(x: ptr[f32]):\r\n    store(x, 1.0)\r\n")
    assert list(sp.load(path).kernels) == ["k"]


def test_bad_decorator_option_points_at_the_option() -> None:
    source = "@kernel(num_stages=2, num_warps=-1)\ndef k(x: ptr[f32]):\n    pass\n"
    with pytest.raises(CompileError) as info:
        sp.loads(source, "case.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0242", "num_warps must be a positive integer, found -1")
    assert (str(d.span), d.span.end_col) == ("case.spk:1:23", 35)
    assert d.help == "use the number of warps per CTA, e.g. num_warps=4 (one warpgroup)"


def test_bad_jit_option_points_at_the_decorator_keyword(tmp_path: Path) -> None:
    path = tmp_path / "jitted.py"
    path.write_text("import sparsile as sp\n\n\n@sp.jit(maxnreg=8)\ndef k(x: sp.ptr[sp.f32]):\n    pass\n")
    namespace: dict = {}
    with pytest.raises(CompileError) as info:
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0242", "maxnreg must be an integer from 24 to 255 registers per thread, found 8")
    assert str(d.span) == f"{path}:4:9"


def test_bad_jit_option_without_a_decorator_has_no_span(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("import sparsile as sp\n\n\ndef k(x: sp.ptr[sp.f32]):\n    pass\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    with pytest.raises(CompileError) as info:
        sp.jit(namespace["k"], num_ctas=0)
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.span.line) == ("SP0242", "num_ctas must be a positive integer, found 0", 0)
