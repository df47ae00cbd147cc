"""Issue 15 item 7, the command line as a new user meets it: ``--target`` checked as usage (exit 2),
``--version`` and ``python -m sparsile``, ``demo -h`` showing the demo's options, ``--emit cubin``
without ``-o`` (stdout only when redirected), a UTF-8 byte-order mark, and one diagnostic per
mistake even when a helper is inlined several times."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

import sparsile
from sparsile.cli import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_USAGE, main

ADD = """\
@kernel
def add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 128):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) + load(y + offs, mask=offs < n), mask=offs < n)
"""

INLINED = """\
@jit
def helper(x: ptr[f32]):
    fence.async_shared()


@kernel
def k(out: ptr[f32]):
    helper(out)
    helper(out)
    helper(out)
"""

ROOT = Path(sparsile.__file__).resolve().parent


def run(*argv: str, stdout: io.TextIOBase | None = None) -> tuple[int, str, str]:
    out, err = stdout or io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue()


def compile_args(path: Path, *more: str) -> list[str]:
    return ["compile", str(path), "--kernel", "add", "--signature", "x=ptr[f32],y=ptr[f32],out=ptr[f32],n=i32",
            *more]


@pytest.mark.parametrize(("target", "message"), [
    ("", "argument --target: the target name is empty (e.g. --target sm_90a)"),
    ("sm_75", "argument --target: unknown target `sm_75`; known targets: sm_80,"),
    ("foo", "argument --target: unknown target `foo`; known targets: sm_80,"),  # (it suggested sm_121f)
    ("sm_90b", "argument --target: unknown target `sm_90b`; did you mean `sm_90"),
    ("  ", "argument --target: the target name is empty"),
])
def test_bad_targets_are_usage_errors(tmp_path, capsys, target, message) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    code, _, _ = run(*compile_args(tmp_path / "add.spk", "--emit", "ptx", "--target", target))
    assert code == EXIT_USAGE
    assert f"sparsile compile: error: {message}" in capsys.readouterr().err


def test_target_aliases_still_work(tmp_path) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    code, out, err = run(*compile_args(tmp_path / "add.spk", "--emit", "ptx", "--target", "sm90a"))
    assert code == EXIT_OK, err
    assert ".target sm_90a" in out


def test_version(capsys) -> None:
    assert run("--version")[0] == EXIT_OK
    assert capsys.readouterr().out == f"sparsile {sparsile.__version__}\n"


def test_python_dash_m_sparsile(tmp_path) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    env_path = str(ROOT.parent)
    ok = subprocess.run([sys.executable, "-m", "sparsile", "check", str(tmp_path / "add.spk")], capture_output=True,
                        text=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, check=False)
    assert ok.returncode == EXIT_OK and ok.stdout.startswith(f"{tmp_path / 'add.spk'}: ok"), ok.stderr
    version = subprocess.run([sys.executable, "-m", "sparsile", "--version"], capture_output=True, text=True,
                             env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, check=False)
    assert version.returncode == EXIT_OK and version.stdout.strip() == f"sparsile {sparsile.__version__}"


def test_demo_help_shows_the_demo_options(capsys) -> None:
    for flag in ("-h", "--help"):
        assert run("demo", flag)[0] == EXIT_OK
        text = capsys.readouterr().out
        assert text.startswith("usage: sparsile demo [-h] [--dtype {f16,bf16,e4m3}] [--size M N K] [--cpu]")
        assert "--cpu" in text and "--size M N K" in text


def test_demo_bad_option_is_usage(capsys) -> None:
    assert run("demo", "--dtype", "f64")[0] == EXIT_USAGE
    assert "argument --dtype: invalid choice: 'f64'" in capsys.readouterr().err


class _Stdout(io.TextIOWrapper):
    def __init__(self, tty: bool):
        super().__init__(io.BytesIO(), encoding="utf-8")
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_cubin_without_output_goes_to_a_redirected_stdout(tmp_path, monkeypatch) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    monkeypatch.chdir(tmp_path)
    redirected = _Stdout(tty=False)
    code, _, err = run(*compile_args(tmp_path / "add.spk", "--emit", "cubin"), stdout=redirected)
    assert code == EXIT_OK, err
    data = redirected.buffer.getvalue()
    assert data[:4] == b"\x7fELF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.spk"]  # no file written


def test_cubin_without_output_to_a_terminal_is_usage(tmp_path, monkeypatch) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(*compile_args(tmp_path / "add.spk", "--emit", "cubin"), stdout=_Stdout(tty=True))
    assert code == EXIT_USAGE
    assert err == "error: `--emit cubin` is binary: give -o FILE, or redirect stdout (`... > k.cubin`)\n"
    code, _, err = run(*compile_args(tmp_path / "add.spk", "--emit", "cubin"))  # a text-only stream
    assert code == EXIT_USAGE and "give -o FILE" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.spk"]


def test_check_accepts_a_utf8_byte_order_mark(tmp_path) -> None:
    (tmp_path / "bom.spk").write_bytes(b"\xef\xbb\xbf" + ADD.encode())
    code, out, err = run("check", str(tmp_path / "bom.spk"))
    assert code == EXIT_OK, err
    assert out.startswith(f"{tmp_path / 'bom.spk'}: ok (1 kernel checked: add)")


def test_check_accepts_a_byte_order_mark_in_an_imported_file(tmp_path) -> None:
    # the file given could start with a mark, a file it imports could not (SP0101, exit 1)
    (tmp_path / "helpers.spk").write_bytes(b"\xef\xbb\xbfdef twice(x):\n    return x * 2\n")
    (tmp_path / "main.spk").write_text("from .helpers import twice\n\n\n@kernel\ndef k(out: ptr[f32]):\n"
                                       "    i = arange(0, 16)\n    store(out + i, twice(i.to(f32)))\n")
    code, out, err = run("check", str(tmp_path / "main.spk"))
    assert code == EXIT_OK, err
    assert out.startswith(f"{tmp_path / 'main.spk'}: ok (1 kernel checked: k)")


def test_check_of_a_file_that_is_not_utf8(tmp_path) -> None:
    (tmp_path / "latin.spk").write_bytes(b"# caf\xe9\n")
    code, _, err = run("check", str(tmp_path / "latin.spk"))
    assert code == EXIT_USAGE
    assert err == (f"error[SP0240]: cannot read `{tmp_path / 'latin.spk'}`: it is not UTF-8 text (invalid "
                   "continuation byte at byte 5)\n")


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_readme_path_outside_the_checkout_gets_sp0240_and_the_installed_copy(tmp_path, monkeypatch,
                                                                               command) -> None:
    # README's `sparsile check examples/vector_add.spk` run from another folder: "error: cannot read ...", no code
    monkeypatch.chdir(tmp_path)
    installed = Path(sparsile.__file__).resolve().parent / "examples" / "vector_add.spk"
    kernel = ["--kernel", "vector_add"] if command == "compile" else []
    code, out, err = run(command, "examples/vector_add.spk", *kernel)
    assert code == EXIT_USAGE and out == ""
    assert err == ("error[SP0240]: cannot read `examples/vector_add.spk`: No such file or directory\n"
                   f" = help: the path is relative to the current folder, {tmp_path}; the file of that name installed "
                   f"with sparsile is {installed}\n")


def test_a_mistake_in_an_inlined_helper_is_reported_once(tmp_path) -> None:
    (tmp_path / "inl.spk").write_text(INLINED)
    code, _, err = run("compile", str(tmp_path / "inl.spk"), "--kernel", "k", "--signature", "out=ptr[f32]",
                       "--emit", "ptx", "--target", "sm_80")
    assert code == EXIT_DIAGNOSTICS
    assert err.count("error[SP0602]") == 1
    assert err.startswith("error[SP0602]: `fence.async_shared` (fence.proxy.async) is not available on sm_80\n"
                          f" --> {tmp_path / 'inl.spk'}:3:5")
    assert "aborting due to" not in err


def test_compile_error_keeps_one_of_each_identical_diagnostic() -> None:
    from sparsile.frontend.diagnostics import CompileError, Diagnostic
    from sparsile.frontend.spans import SourceFile, Span

    src = SourceFile("f.spk", "a\nb\nc\nd = x\n")
    a = Diagnostic("SP0602", "`x` is not available", Span(src, 3, 5, 3, 9))
    b = Diagnostic("SP0602", "`x` is not available", Span(src, 4, 5, 4, 9))  # another place: kept
    c = Diagnostic("SP0501", "`x` is not available", Span(src, 3, 5, 3, 9))  # another code: kept
    assert CompileError([a, a, b, a, c, b]).diagnostics == (a, b, c)


@pytest.mark.parametrize("argv", [["layout", "wgmma_accumulator(256)"], ["ops", "-v"]])
def test_a_reader_that_stops_early_gets_no_traceback(argv) -> None:
    # `sparsile layout ... | head -1` used to end in a BrokenPipeError traceback (exit 1)
    proc = subprocess.Popen([sys.executable, "-m", "sparsile", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(Path(sparsile.__file__).parent.parent), "PATH": "/usr/bin:/bin"})
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == EXIT_OK, err
    assert err == ""


# ------------------------------------------------------------------------------------------------
# The help and the messages a new user meets first, on a machine without a GPU (user audit).


def test_top_level_help_points_at_examples_and_exit_statuses(capsys) -> None:
    assert run("--help")[0] == EXIT_OK
    text = capsys.readouterr().out
    assert "sparsile check examples/vector_add.spk" in text and "sparsile demo" in text
    assert "exit status" in text and "README.md" in text


def test_demo_help_has_no_docstring_markup(capsys) -> None:
    assert run("demo", "--help")[0] == EXIT_OK
    text = capsys.readouterr().out
    assert "``" not in text
    assert "interpreter" in text and "exit status 0" in text.lower()


def test_tune_and_compile_help_state_their_defaults(capsys) -> None:
    assert run("tune", "--help")[0] == EXIT_OK
    text = " ".join(capsys.readouterr().out.split())
    assert "default 10" in text and "default 50" in text  # --warmup, --rep
    assert "with --linear: bf16" in text                   # the torch layer's kernel tunes bf16 only
    assert run("compile", "--help")[0] == EXIT_OK
    assert "else sm_90a" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("command", "words"), [
    ("check", ["report the diagnostics of .spk files", "exit status 0"]),
    ("compile", ["compile one kernel of a .spk file", "no GPU needed"]),
    ("layout", ["draw a named layout", "sparsile layout --list"]),
    ("ops", ["list every IR op"]),
    ("tune", ["needs an NVIDIA GPU", "exit status 3", "docs/autotune.md"]),
])
def test_each_command_help_says_what_it_does(capsys, command: str, words: list[str]) -> None:
    # `sparsile COMMAND -h` printed only the usage and options: what the command does (and that tune
    # needs a GPU) was only in `sparsile --help`'s list
    assert run(command, "--help")[0] == EXIT_OK
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    description = " ".join(rest.split("\n\n")[0].split())
    assert not description.startswith(("positional arguments", "options")), usage
    for word in words:
        assert word in description, description


def test_tune_without_a_gpu_says_what_to_do_instead(monkeypatch) -> None:
    from sparsile.backend import runtime

    monkeypatch.setattr(runtime, "has_gpu", lambda: False)
    code, _, err = run("tune", "4096x512x4096")
    assert code == 3
    # with its code, as `@autotune` without a GPU and every other diagnostic of the command (it had none)
    assert err.startswith("error[SP0731]: sparsile tune times kernels on the GPU: no NVIDIA GPU is available\n")
    assert "help:" in err and "stdlib/kernels/tuned/" in err


def test_check_of_a_folder_names_the_files_to_give(tmp_path) -> None:
    code, _, err = run("check", str(tmp_path))
    assert code == EXIT_USAGE
    assert err == f"error: `{tmp_path}` is a folder: give .spk files, e.g. `sparsile check {tmp_path}/*.spk`\n"


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_python_module_given_as_spk_gets_a_note(tmp_path, command) -> None:
    # `sparsile check examples/vector_add.py` reported its main()'s f-string as kernel code, and nothing more
    module = tmp_path / "kernels.py"
    module.write_text('import sparsile as sp\n\n\ndef main():\n    print(f"{1}")\n')
    argv = [command, str(module)] + (["--kernel", "k"] if command == "compile" else [])
    code, _, err = run(*argv)
    assert code == EXIT_DIAGNOSTICS and "SP0113" in err
    assert f"note: `{module}` was read as .spk source" in err and "kernel.compile(signature" in err
    (tmp_path / "k.spk").write_text(ADD)
    both = run("check", str(tmp_path / "k.spk"), str(module))[2]  # one note, for the .py file only
    assert both.count("note: `") == 1 and f"note: `{module}`" in both


@pytest.mark.parametrize(("argv", "usage"), [
    (["ops", "--bogus"], "usage: sparsile ops "),
    (["ops", "extra"], "usage: sparsile ops "),
    (["check", "--bogus", "a.spk"], "usage: sparsile check "),
    (["compile", "a.spk", "--kernel", "k", "--emmit", "ptx"], "usage: sparsile compile "),
    (["tune", "--bogus", "1x2x3"], "usage: sparsile tune "),
    (["layout", "--lst"], "usage: sparsile layout "),
])
def test_an_unknown_option_of_a_command_shows_that_commands_usage(capsys, argv, usage) -> None:
    # argparse left a subcommand's unrecognized arguments to the top-level parser, which printed
    # `usage: sparsile [-h] [--version] COMMAND ...`: nothing about the command's own options
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"sparsile {argv[0]}: error: unrecognized arguments: {argv[-2] if argv[0] == 'compile' else argv[1]}" \
        in err, err


# ------------------------------------------------------------------------------------ files of another kind
SP0240_HELP = (" = help: give the .spk files that hold the kernels (examples/vector_add.spk is one); the @sparsile.jit "
               "kernels of a Python module compile from Python: `kernel.compile(signature, target=...)` (README.md)\n")


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_file_that_is_no_kernel_source_is_refused_before_it_is_parsed(tmp_path, command) -> None:
    # `sparsile check README.md` parsed the Markdown as .spk source: nine diagnostics of its prose
    notes = tmp_path / "NOTES.md"
    notes.write_text("# Notes\n\nSome prose, `code` and a list:\n\n- one\n")
    argv = [command, str(notes)] + (["--kernel", "k"] if command == "compile" else [])
    code, out, err = run(*argv)
    assert code == EXIT_USAGE and out == ""
    assert err == (f"error[SP0240]: `{notes}` is not a .spk file: `sparsile {command}` reads kernel source (.spk "
                   "files), not .md files\n" + SP0240_HELP)


def test_check_of_spk_files_beside_a_refused_one_goes_on(tmp_path) -> None:
    (tmp_path / "add.spk").write_text(ADD)
    (tmp_path / "no_suffix").write_text(ADD)  # a name without a suffix is read as .spk source (/dev/stdin)
    code, out, err = run("check", str(tmp_path / "add.spk"), str(tmp_path / "README.md"), str(tmp_path / "no_suffix"))
    assert code == EXIT_USAGE
    assert out == (f"{tmp_path / 'add.spk'}: ok (1 kernel checked: add)\n"
                   f"{tmp_path / 'no_suffix'}: ok (1 kernel checked: add)\n")
    assert err.startswith(f"error[SP0240]: `{tmp_path / 'README.md'}` is not a .spk file") and err.count("error") == 1


LAYOUT_CONSTRUCTORS = ("blocked, layout_from_bases, mma_sp_fragment, smem_core_matrices, smem_from_address_map, "
                       "smem_from_strides, smem_tile, tcgen05_atom, tmem_accumulator, tmem_sparse_metadata, "
                       "wgmma_a_fragment, wgmma_accumulator, wgmma_sparse_metadata")


@pytest.mark.parametrize(("expr", "message", "guess"), [
    ("bogus(3)", "`bogus` is not a layout constructor", ""),
    ("blockd(3)", "`blockd` is not a layout constructor", "did you mean `blocked`? "),
    ("swizzle_name(128)", "`swizzle_name` does not build a layout", ""),  # a library function of another kind
])
def test_a_name_that_builds_no_layout_has_a_code_and_lists_the_constructors(expr, message, guess) -> None:
    code, out, err = run("layout", expr)
    assert code == EXIT_USAGE and out == ""
    assert err == (f"error[SP0423]: {message}\n = help: {guess}the layout constructors: {LAYOUT_CONSTRUCTORS} "
                   "(`sparsile layout --list` shows their arguments)\n")


def test_layout_list_names_the_layout_constructors_only() -> None:
    # `--list` ("list the layout constructors") also listed operand_class, swizzle_address, swizzle_name and
    # tcgen05_regs_per_num, which return a str or an int: `sparsile layout "swizzle_name(128)"` is SP0423
    code, out, err = run("layout", "--list")
    assert code == EXIT_OK and err == ""
    listed = [line.split("(", 1)[0] for line in out.splitlines() if not line.startswith(" ")]
    assert ", ".join(listed) == LAYOUT_CONSTRUCTORS
    assert all(line.endswith("-> 'LinearLayout'") for line in out.splitlines() if not line.startswith(" "))
