"""``sparsile demo``: the CPU path end to end, its report and exit status, the Blackwell step with and
without a kernel file, and the GPU branch (with the launch replaced by the interpreter)."""

from __future__ import annotations

import re
import runpy
import shlex
import time
from pathlib import Path

import numpy as np
import pytest

from sparsile import cli, demo
from sparsile.stdlib import kernels


def test_demo_on_the_cpu_reports_and_passes(capsys):
    start = time.perf_counter()
    assert demo.main(["--cpu"]) == 0
    took = time.perf_counter() - start
    out = capsys.readouterr().out
    assert "prune + compress" in out and "A 200x192 f16" in out
    assert "compile sm_90a" in out and "sparse_gemm_f16" in out and "cubin" in out
    assert "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.f16.f16" in out
    assert "interpreter (CPU)" in out and "200x130x192" in out
    assert "result: OK" in out and "interpreter only" in out and "FAILED" not in out
    assert took < 60  # the product owner's limit for the demo on a 2-core machine


def test_sparsile_demo_command(capsys):
    assert cli.main(["demo"]) == 0
    assert "result: OK" in capsys.readouterr().out


def test_demo_options_after_a_separator():
    args = demo.parse_args(["--", "--dtype", "e4m3", "--size", "1", "2", "3", "--cpu"])
    assert (args.dtype, tuple(args.size), args.cpu) == ("e4m3", (1, 2, 3), True)
    assert demo.parse_args([]).dtype == "f16"


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_demo_other_dtypes(capsys, dtype):
    assert demo.main(["--cpu", "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    assert f"sparse_gemm_{dtype}" in out and f"200x130x192 {dtype}" in out


@pytest.mark.parametrize("cpu", [False, True])
def test_size_without_a_gpu_run_says_it_was_not_used(capsys, monkeypatch, cpu):
    """--size sets the GPU run's problem: with no GPU run (none found, or --cpu) it was ignored
    without a word, and the user saw the interpreter's 200x130x192 as if their size had run."""
    monkeypatch.setattr(demo, "gpu_name", lambda: None)
    assert demo.main(["--size", "100", "64", "96", *(["--cpu"] if cpu else [])]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.lstrip().startswith("[") and "GPU run" in x]
    why = "--cpu" if cpu else "no GPU found"
    assert " ".join(line.split()) == (f"[skipped] GPU run 100x64x96: not run ({why}); "
                                      "--size sets the GPU run's problem only")
    assert "result: OK (4 ok, 1 skipped, 0 failed)" in out
    assert demo.main(["--cpu"]) == 0
    assert "--size" not in capsys.readouterr().out  # no --size: the report the README shows


def test_a_failed_check_fails_the_demo(capsys, monkeypatch):
    monkeypatch.setattr(demo, "check", lambda *a, **k: (False, "max |C - ref| 9.9 (forced)"))
    assert demo.main(["--cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "result: FAILED" in out


def test_check_catches_a_wrong_result():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((20, 64)).astype(np.float16)
    b = rng.standard_normal((12, 64)).astype(np.float16)
    exact = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float16)
    assert demo.check(exact, a, b, "f16")[0]
    wrong = exact.copy()
    wrong[3, 4] += np.float16(0.25)
    assert not demo.check(wrong, a, b, "f16")[0]
    unwritten = exact.copy()
    unwritten[0, 0] = np.nan
    ok, detail = demo.check(unwritten, a, b, "f16")
    assert not ok and "unwritten" in detail


def test_blackwell_step_without_the_kernel_file(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "BLACKWELL_FILE", tmp_path / "sparse_gemm_sm100.spk")
    (step,) = demo.step_compile_blackwell("f16")
    assert step.status == "skipped" and "compiled and checked elsewhere" in step.detail


def test_blackwell_step_with_the_shipped_kernel():
    if not demo.BLACKWELL_FILE.exists():
        pytest.skip("no sparse_gemm_sm100.spk in this checkout")
    for dtype in ("f16", "e4m3"):
        (step,) = demo.step_compile_blackwell(dtype)
        assert step.status == "ok", step.detail
        assert f"sparse_gemm_{dtype}" in step.detail and "tcgen05.mma.sp" in step.detail


BLACKWELL_STANDIN = '''
@kernel(num_warps=4)
def sparse_gemm_f16(x: ptr[f16], y: ptr[f16], n: i32, BLOCK: constexpr = 128):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(y + offs, load(x + offs, mask=offs < n), mask=offs < n)


@kernel(num_warps=4)
def sparse_gemm_bf16(x: ptr[bf16], n: i32, BLOCK: constexpr):
    pass


@kernel(num_warps=4)
def sparse_gemm_e4m3(x: ptr[f32], n: i32):
    store(x, n + "text")
'''


def test_blackwell_step_compiles_what_the_file_has(monkeypatch, tmp_path):
    path = tmp_path / "sparse_gemm_sm100.spk"
    path.write_text(BLACKWELL_STANDIN)
    monkeypatch.setattr(demo, "BLACKWELL_FILE", path)
    (ok,) = demo.step_compile_blackwell("f16")
    assert ok.status == "ok" and "sparse_gemm_f16" in ok.detail and "cubin" in ok.detail
    assert "no sparse MMA instruction" in ok.detail  # a vector copy, not a GEMM
    (skipped,) = demo.step_compile_blackwell("bf16")  # BLOCK has no default
    assert skipped.status == "skipped"
    (failed,) = demo.step_compile_blackwell("e4m3")
    assert failed.status == "FAILED" and "CompileError" in failed.detail


def test_gpu_branch_runs_checks_and_reports(capsys, monkeypatch):
    """A machine with a GPU: the big problem goes through sparse_matmul (here the interpreter)."""
    real = kernels.sparse_matmul
    calls = []

    def on_the_interpreter(values, meta, b, interpret=False, **kw):
        calls.append(interpret)
        return real(values, meta, b, interpret=True, **kw)

    monkeypatch.setattr(demo, "gpu_name", lambda: "Stand-in GPU (sm_90)")
    monkeypatch.setattr(kernels, "sparse_matmul", on_the_interpreter)
    assert demo.main(["--size", "150", "70", "96"]) == 0
    out = capsys.readouterr().out
    assert calls == [False, True]  # the GPU run, then the interpreter's
    assert "GPU run" in out and "150x70x96" in out and "on the GPU and in the interpreter" in out


# ------------------------------------------------------------------------------------------------
# README.md: its commands and quick starts are the ones that work (and .ci/run runs the same)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST_COMMANDS = ["pip install -e '.[test]'", "sparsile demo", "python -m pytest -q"]


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands(block: str) -> list[str]:
    """Shell lines of a block, continuations joined and comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def test_readme_opens_with_install_demo_and_test_commands():
    opening = README.split("```", 1)[0] + "```" + README.split("```", 2)[1]
    assert "## " not in opening  # nothing comes before the three commands
    assert commands(code_blocks("sh")[0]) == FIRST_COMMANDS
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in FIRST_COMMANDS:
        assert command in [line.strip() for line in ci], f".ci/run does not run `{command}`"


def test_readme_spk_quick_start_is_the_example_file():
    (spk,) = code_blocks("spk")
    assert spk.strip() in (ROOT / "examples" / "vector_add.spk").read_text()


def test_readme_cli_commands_work(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    # every command of the block but `sparsile tune`, which times kernels on a GPU
    lines = [c for c in commands(code_blocks("sh")[1])
             if c.startswith("sparsile ") and not c.startswith("sparsile tune")]
    assert len(lines) == 2
    for line in lines:
        assert cli.main(shlex.split(line)[1:]) == 0, line
    assert ".target sm_90a" in capsys.readouterr().out


def run_block(block: str, tmp_path: Path, monkeypatch, name: str) -> None:
    monkeypatch.chdir(ROOT)  # the quick starts use paths relative to the checkout
    path = tmp_path / f"{name}.py"
    path.write_text(block)  # a file, so that @jit can read the function's source
    runpy.run_path(str(path), run_name="__main__")


def test_readme_python_quick_starts_run(tmp_path, monkeypatch):
    blocks = [b for b in code_blocks("python") if "torch" not in b]
    assert len(blocks) == 3
    for i, block in enumerate(blocks):
        run_block(block, tmp_path, monkeypatch, f"readme_{i}")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["sparse_matmul", "sparsile.torch"])
def test_readme_torch_quick_starts_run(tmp_path, monkeypatch, which):
    pytest.importorskip("torch")
    (block,) = [b for b in code_blocks("python") if "torch" in b and which in b]
    run_block(block, tmp_path, monkeypatch, "readme_torch")


@pytest.mark.parametrize(("size", "message"), [("0", "sizes must be at least 1, got 0"),
                                               ("-5", "sizes must be at least 1, got -5"),
                                               ("x", "expected a positive integer, got 'x'")])
def test_demo_refuses_sizes_below_one(capsys, size, message):
    # a zero or negative size used to reach numpy on a GPU machine and fail with a traceback
    with pytest.raises(SystemExit) as info:
        demo.parse_args(["--size", "64", size, "64"])
    assert info.value.code == 2
    assert f"argument --size: {message}" in capsys.readouterr().err


def test_demo_refuses_sizes_too_large_for_a_demo(capsys):
    # --size 99999999999 ... was accepted and, on a GPU machine, ended in numpy's ValueError traceback
    for argv in (["--size", "99999999999", "64", "64"], ["demo", "--size", "64", "64", "32769", "--cpu"]):
        if argv[0] == "demo":
            assert cli.main(argv) == cli.EXIT_USAGE
        else:
            with pytest.raises(SystemExit) as info:
                demo.parse_args(argv)
            assert info.value.code == 2
        assert f"argument --size: sizes go up to {demo.MAX_SIZE}, got " in capsys.readouterr().err


def test_gpu_operands_too_large_for_the_host_are_a_failed_step(capsys, monkeypatch):
    # the GPU run's operands are made on the host; a MemoryError there was a traceback
    real = demo.operands

    def operands(dtype, m, n, k, seed):
        if (m, n, k) != demo.INTERPRETER_SIZE:
            raise MemoryError
        return real(dtype, m, n, k, seed)

    monkeypatch.setattr(demo, "gpu_name", lambda: "Stand-in GPU (sm_90)")
    monkeypatch.setattr(demo, "operands", operands)
    real_matmul = kernels.sparse_matmul

    def interpreter_only(values, meta, b, interpret=False, **kw):
        assert interpret, "ran the GPU step"
        return real_matmul(values, meta, b, interpret=True, **kw)

    monkeypatch.setattr(kernels, "sparse_matmul", interpreter_only)
    assert demo.main(["--size", "32768", "32768", "32768"]) == 1
    out = capsys.readouterr().out
    assert "[FAILED ] prune + compress         32768x32768x32768: MemoryError: out of memory" in out
    assert "GPU run" not in out and "result: FAILED" in out
