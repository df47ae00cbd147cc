"""The ``sparsile`` command line: exit codes and output of ``check``, ``compile``, ``demo``, ``layout``."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys

import pytest

from sparsile.cli import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main

GOOD = """\
\"\"\"Two kernels.\"\"\"
BLOCK_DEFAULT = 128


@kernel
def add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = BLOCK_DEFAULT):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)


@kernel
def scale(x, n, S: constexpr):
    i = arange(0, S)
    store(x + i, load(x + i, mask=i < n) * 2, mask=i < n)
"""

BAD = """\
@kernel
def add(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 128):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    v = load(x + offs, mask=offs < n) + undefined_name
    w = zeros((3,), f32)
"""


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def files(tmp_path):
    (tmp_path / "good.spk").write_text(GOOD)
    (tmp_path / "bad.spk").write_text(BAD)
    (tmp_path / "syntax.spk").write_text("@kernel\ndef k(x:\n    pass\n")
    return tmp_path


# ------------------------------------------------------------------------------------ check
def test_check_clean_file(files) -> None:
    code, out, err = run("check", str(files / "good.spk"))
    assert code == EXIT_OK and err == ""
    assert "good.spk: no errors found, but only 1 of 2 kernels fully checked (add)" in out
    assert ("warning: `scale` was checked partially (with representative values S=16): `x`, `n` have no type, so "
            "what depends on them was not checked; give them with --signature") in out


def test_check_with_a_signature_specializes_more_kernels(files) -> None:
    code, out, _ = run("check", str(files / "good.spk"), "--kernel", "scale", "--signature", "x=ptr[f16],n=i32,S=64")
    assert code == EXIT_OK and "ok (1 kernel checked: scale)" in out


def test_check_reports_every_diagnostic_rustc_style(files) -> None:
    code, out, err = run("check", str(files / "bad.spk"))
    assert code == EXIT_DIAGNOSTICS and out == ""
    path = str(files / "bad.spk")
    assert "error[SP0202]: unknown name `undefined_name`" in err and f"--> {path}:4:41" in err
    assert "error[SP0301]" in err and f"--> {path}:5:15" in err
    assert "4 |     v = load(x + offs, mask=offs < n) + undefined_name" in err
    assert "aborting due to 2 previous errors" in err


def test_check_reports_syntax_errors(files) -> None:
    code, _, err = run("check", str(files / "syntax.spk"))
    assert code == EXIT_DIAGNOSTICS and "error[SP01" in err


def test_check_constexpr_errors_with_signature(files) -> None:
    code, _, err = run("check", str(files / "good.spk"), "--kernel", "add", "--signature", "BLOCK=100")
    assert code == EXIT_DIAGNOSTICS and "error[SP0301]" in err and "found 100" in err


@pytest.mark.parametrize("argv", [
    [],                                                       # no command
    ["frobnicate"],                                           # unknown command
    ["check"],                                                # no file
    ["check", "/definitely/not/here.spk"],                    # unreadable file
    ["compile", "FILE"],                                      # --kernel is required
    ["compile", "FILE", "--kernel", "nope"],                  # unknown kernel
    ["compile", "FILE", "--kernel", "add", "--signature", "x=ptr[f32],,n"],   # malformed signature
    ["compile", "FILE", "--kernel", "scale", "--signature", "S=64"],          # incomplete signature (x, n)
    ["compile", "FILE", "--kernel", "add", "--emit", "sass"],                 # unknown emit kind
])
def test_usage_errors_exit_2(files, argv, capsys) -> None:
    argv = [str(files / "good.spk") if a == "FILE" else a for a in argv]
    code, _, err = run(*argv)
    assert code == EXIT_USAGE
    captured = capsys.readouterr()  # argparse writes its own usage message to sys.stderr
    assert err or captured.err


def test_signature_type_errors_point_into_the_signature(files) -> None:
    code, _, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                       "x=ptr[f32],y=ptr[f32],out=ptr[f32],n=i33")
    assert code == EXIT_DIAGNOSTICS
    assert "unknown name `i33`" in err and "<signature>:1:38" in err and "did you mean `i32`?" in err


def test_signature_items_may_have_blanks_around_the_equals_sign(files) -> None:
    # `n = i32` used to be error[SP0103] "unexpected indentation" (the blank after `=` parsed as an indent)
    code, out, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                         "x = ptr[f32], y= ptr[f32], out =ptr[f32], n =\ti32, BLOCK = 64")
    assert code == EXIT_OK, err
    assert out.startswith("kernel @add(%x: ptr[f32], %y: ptr[f32], %out: ptr[f32], %n: i32) [BLOCK=64")
    code, _, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                       "x=ptr[f32], y=ptr[f32], out=ptr[f32], n =  i33")
    assert code == EXIT_DIAGNOSTICS  # still pointing at the name, after the blanks
    assert "unknown name `i33`" in err and "<signature>:1:44" in err


# ------------------------------------------------------------------------------------ compile
def test_compile_emits_ir(files) -> None:
    code, out, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                         "x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32, BLOCK=2*512", "--emit", "ir")
    assert code == EXIT_OK and err == ""
    assert out.startswith("kernel @add(%x: ptr[f32], %y: ptr[f32], %out: ptr[f32], %n: i32) [BLOCK=1024")
    assert "arange {end=1024, start=0} : tile<1024xi32>" in out and out.count("load ") == 2


def test_compile_writes_to_a_file(files) -> None:
    target = files / "add.ir"
    code, out, _ = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                       "x=ptr[f32],y=ptr[f32],out=ptr[f32],n=i32", "-o", str(target))
    assert code == EXIT_OK and out == ""
    assert "[BLOCK=128" in target.read_text()  # the module constant default


def test_compile_ptx_uses_the_backend_or_says_it_is_missing(files) -> None:
    code, out, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature",
                         "x=ptr[f32],y=ptr[f32],out=ptr[f32],n=i32,BLOCK=256", "--emit", "ptx", "--target", "sm_90a")
    if importlib.util.find_spec("sparsile.driver.compiler") is None:
        assert code == EXIT_UNAVAILABLE and "backend" in err
    else:
        assert code == EXIT_OK, err
        assert ".entry add" in out and ".target sm_90a" in out


# ------------------------------------------------------------------------------------ demo, layout
def test_demo_runs_or_says_it_is_missing() -> None:
    if importlib.util.find_spec("sparsile.demo") is not None:
        pytest.skip("the demo exists; it is tested with the demo")
    code, _, err = run("demo")
    assert code == EXIT_UNAVAILABLE and "sparsile.demo" in err


def test_layout_picture_and_list() -> None:
    if importlib.util.find_spec("sparsile.frontend.layout.pictures") is None:
        code, _, err = run("layout", "--list")
        assert code == EXIT_UNAVAILABLE and "layout" in err
        return
    code, out, _ = run("layout", "--list")
    assert code == EXIT_OK and "wgmma_accumulator" in out
    code, out, _ = run("layout", "wgmma_accumulator(64)", "--max-rows", "2")
    assert code == EXIT_OK and out.startswith("wgmma_accumulator(64)") and "t0:r0" in out
    assert run("layout", "no_such_layout(1)")[0] == EXIT_USAGE
    assert run("layout", "wgmma_accumulator(__import__('os'))")[0] == EXIT_USAGE  # literals only
    assert run("layout")[0] == EXIT_USAGE
    code, _, err = run("layout", "wgmma_accumulator('a')")  # an argument of the wrong kind
    assert code == EXIT_DIAGNOSTICS and "Traceback" not in err
    assert err.startswith("error: wgmma_accumulator('a'): ")
    assert "the constructor is wgmma_accumulator(n: 'int'" in err


@pytest.mark.parametrize(("expr", "message"), [
    ("wgmma_accumulator(64.5)", "`n` takes an integer, found 64.5"),
    ("wgmma_accumulator(64, packed='no')", "`packed` takes True or False, found 'no'"),
    ("tmem_accumulator(128, n=64.0)", "`n` takes an integer, found 64.0"),
])
def test_layout_arguments_of_the_wrong_type(expr, message) -> None:
    # these used to draw the picture of n=64 / of packed=True, exit 0
    code, out, err = run("layout", expr)
    assert (code, out) == (EXIT_DIAGNOSTICS, "")
    assert err.startswith(f"error: {expr}: {message}\n  the constructor is ")


def test_a_constructor_diagnostic_is_rendered_once() -> None:
    # a constructor's own coded error used to print as "error: EXPR: error[SP0401]: ..." (two prefixes)
    code, out, err = run("layout", "wgmma_accumulator(63)")
    assert (code, out) == (EXIT_DIAGNOSTICS, "")
    first, *rest = err.splitlines()
    assert first == "error[SP0401]: wgmma accumulator: N must be a multiple of 8 (wgmma's m64nNk shapes), found 63"
    assert rest[-1].startswith(" = note: in `wgmma_accumulator(63)`; the constructor is wgmma_accumulator(n: 'int'")
    assert err.count("error") == 1


# ------------------------------------------------------------------------------------ entry point
def test_module_entry_point_exit_codes(files) -> None:
    ok = subprocess.run([sys.executable, "-m", "sparsile.cli", "check", str(files / "good.spk")],
                        capture_output=True, text=True)
    bad = subprocess.run([sys.executable, "-m", "sparsile.cli", "check", str(files / "bad.spk")],
                         capture_output=True, text=True)
    usage = subprocess.run([sys.executable, "-m", "sparsile.cli"], capture_output=True, text=True)
    assert (ok.returncode, bad.returncode, usage.returncode) == (0, 1, 2)
    assert "1 of 2 kernels fully checked (add)" in ok.stdout
    assert "error[SP0202]" in bad.stderr and "usage:" in usage.stderr


def test_signature_with_tensor_types_and_expressions(tmp_path) -> None:
    path = tmp_path / "t.spk"
    path.write_text("TILE = 16\n\n@kernel\ndef copy(t: tensor[f16, 2], o: tensor[f16, 2], B: constexpr):\n"
                    "    o.store_tile((0, 0), t.load_tile((0, 0), (B, B)))\n")
    code, out, err = run("compile", str(path), "--kernel", "copy", "--signature",
                         "t=tensor[f16, 2], o=tensor[f16,2], B=TILE * 2")
    assert code == EXIT_OK, err
    assert out.startswith("kernel @copy(%t: tensor[f16, 2], %o: tensor[f16, 2]) [B=32")
    assert "tensor.load_tile" in out and "tile<32x32xf16>" in out


def test_check_refuses_a_signature_name_no_kernel_has(files):
    # a typo in --signature used to be ignored and the check passed
    code, _, err = run("check", str(files / "good.spk"), "--kernel", "add", "--signature", "BLOKC=64")
    assert code == EXIT_USAGE
    assert err.splitlines() == ["error[SP0702]: `add` has no parameter named `BLOKC`",
                                " = help: parameters: BLOCK, n, out, x, y"]
    code, _, err = run("check", str(files / "good.spk"), "--signature", "nope=1")
    assert code == EXIT_USAGE
    assert err.splitlines()[0] == "error[SP0702]: no kernel checked has a parameter named `nope`"


def test_compile_cubin_to_an_unwritable_path_is_a_usage_error(files, tmp_path):
    # writing the cubin used to raise FileNotFoundError / IsADirectoryError with a traceback
    sig = "x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32"
    for target in (str(tmp_path / "missing" / "add.cubin"), str(tmp_path)):
        code, _, err = run("compile", str(files / "good.spk"), "--kernel", "add", "--signature", sig,
                           "--emit", "cubin", "-o", target)
        assert code == EXIT_USAGE
        assert err.startswith(f"error: cannot write `{target}`: ")
