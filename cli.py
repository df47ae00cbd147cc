"""The ``sparsile`` command line.

::

    sparsile check FILE.spk [--kernel NAME] [--signature SIG] [--strict]
    sparsile compile FILE.spk --kernel NAME [--signature "x=ptr[f32],n=i32,BLOCK=1024"] --emit ir|llvm|ptx|cubin
                     [--target sm_90a] [-o OUT]
    sparsile demo [--dtype f16|bf16|e4m3] [--size M N K] [--cpu]     (sparsile demo -h)
    sparsile layout "CONSTRUCTOR(args...)" | --list
    sparsile tune SHAPES... [--dtype bf16 --dtype f16] [-o TABLE.json] [--warmup N] [--rep N] [--linear]
                  [--device N]
    sparsile --version                   (``python -m sparsile ...`` works the same)

``compile`` writes text artefacts to stdout unless ``-o`` is given; a cubin (binary) goes to
stdout only when stdout is redirected (a terminal gets a usage error asking for ``-o``). An empty
or unknown ``--target`` is a usage error.

Exit status: 0 success, 1 the source has errors (diagnostics on stderr, rustc style), 2 usage
errors (bad options, unreadable file, malformed signature), 3 a feature this installation does not
have yet (a backend or the demo). A reader that stops early (``sparsile ops | head``) ends the command
quietly, exit status 0.

``check`` parses each file given, builds its module (decorators, constants, imports, parameter
annotations; the ``.spk`` files it imports relative to its folder) and runs sema on every kernel:
run-time parameters take their annotation (or a type in ``--signature``); constexpr parameters
without a default or a ``--signature`` value get representative values, and parameters without a
type are left out of the check (frontend/sema/check_kernels.py). Kernels checked only partially are
warned about, and so is a file without kernels; ``--strict`` makes those exit 1. With several files
(``sparsile check stdlib/kernels/*.spk``) each is checked and reported in turn; the exit status is
the worst of theirs.

A signature is a comma-separated list of ``name=type`` items for run-time parameters
(``x=ptr[f32]``, ``n=i32``, ``t=tensor[f16, 2]``) and ``name=value`` items for constexpr ones (an
integer, float, bool, dtype name or tuple; any constant expression of the language, module
constants included).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from typing import Any, TextIO

from .cli_common import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from .cli_common import Usage as _Usage
from .cli_layout import layout_command
from .cli_parser import build_parser
from .cli_tune import tune_command

__all__ = ["EXIT_DIAGNOSTICS", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "main"]


def main(argv: list[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        # everything after `demo` belongs to the demo, options and -h included (`sparsile demo --dtype e4m3`)
        rest = argv[1:]
        argv = ["demo", "--", *rest] if rest and rest[0] != "--" else argv
    try:
        return _run(parser, argv, out, err)
    except BrokenPipeError:  # the reader stopped early (`sparsile ops | head`): nothing went wrong here
        _silence_stdout(out)
        return EXIT_OK


def _silence_stdout(out: TextIO) -> None:
    """After a broken pipe on the process's stdout, point it at /dev/null, so that the interpreter's
    flush at exit does not print `Exception ignored ... BrokenPipeError` (Python's signal docs)."""
    import os

    if out is not sys.stdout:
        return
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _run(parser: argparse.ArgumentParser, argv: list[str], out: TextIO, err: TextIO) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed its message
        return EXIT_OK if e.code in (0, None) else EXIT_USAGE
    commands = {"check": _check, "compile": _compile, "demo": _demo, "layout": layout_command, "ops": _ops,
                "tune": tune_command}
    from .frontend.diagnostics import CompileError, LaunchError

    try:
        return commands[args.command](args, out, err)
    except _Usage as e:
        print(e.render(), file=err)
        return EXIT_USAGE
    except CompileError as e:
        print(e.render(), file=err)
        _python_note(getattr(args, "file", None), err)
        return EXIT_DIAGNOSTICS
    except LaunchError as e:  # the command line's signature does not fit the kernel
        print(str(e), file=err)
        return EXIT_USAGE


def _python_note(files: str | list[str] | None, err: TextIO) -> None:
    """After the diagnostics of a ``.py`` file: ``check`` and ``compile`` read ``.spk`` source, and
    a Python module's ``@sparsile.jit`` kernels are compiled from Python (its ``main`` was reported
    as kernel code: SP0113 for ``try`` and f-strings)."""
    for file in [files] if isinstance(files, str) else files or []:
        if file.endswith(".py"):
            print(f"note: `{file}` was read as .spk source, the whole file as kernel code; the @sparsile.jit "
                  "kernels of a Python module compile from Python: `kernel.compile(signature, target=...)`, or "
                  "a call `kernel[grid](...)` / `kernel.interpret[grid](...)` (README.md)", file=err)


# ------------------------------------------------------------------------------------------------
def _ops(args: Any, out: TextIO, err: TextIO) -> int:
    """``sparsile ops``: the op registry (driver/op_listing.py)."""
    from .driver.op_listing import op_rows, render

    print(render(op_rows(), verbose=args.verbose), file=out)
    return EXIT_OK


KERNEL_SUFFIXES = (".spk", ".py")
"""The suffixes ``check`` and ``compile`` read (a .py file as .spk source, with a note after its
diagnostics: _python_note); a name without a suffix (``/dev/stdin``) is read too."""


def _read_module(path: str, command: str) -> Any:
    import os

    import sparsile

    from .driver.imports import utf8_source
    from .driver.module import installed_copy_help

    if os.path.isdir(path):
        raise _Usage(f"`{path}` is a folder: give .spk files, e.g. `sparsile check {path.rstrip('/')}/*.spk`")
    suffix = os.path.splitext(path)[1]
    if suffix and suffix.lower() not in KERNEL_SUFFIXES:  # README.md gave nine parse errors of its prose
        raise _Usage(f"`{path}` is not a .spk file: `sparsile {command}` reads kernel source (.spk files), not "
                     f"{suffix} files", code="SP0240",
                     help="give the .spk files that hold the kernels (examples/vector_add.spk is one); the "
                          "@sparsile.jit kernels of a Python module compile from Python: "
                          "`kernel.compile(signature, target=...)` (README.md)")
    try:
        with open(path, "rb") as f:
            text = utf8_source(f.read())  # a UTF-8 byte-order mark is allowed, as sparsile.load allows it
    except OSError as e:
        raise _Usage(f"cannot read `{path}`: {e.strerror}", code="SP0240", help=installed_copy_help(path)) from None
    except UnicodeDecodeError as e:
        raise _Usage(f"cannot read `{path}`: it is not UTF-8 text ({e.reason} at byte {e.start})",
                     code="SP0240") from None
    return sparsile.loads(text, path, path=path)


def _select(module: Any, name: str | None) -> dict[str, Any]:
    if name is None:
        return dict(module.kernels)
    if name not in module.kernels:
        known = ", ".join(sorted(module.kernels)) or "none"
        raise _Usage(f"no kernel `{name}` in {module.__name__} (kernels: {known})")
    return {name: module.kernels[name]}


def _signature(text: str, module: Any) -> dict[str, Any]:
    from .frontend.sema.specialize import parse_signature

    def resolve(name: str) -> Any:
        return module._resolve(name)

    return parse_signature(text, resolve) if text.strip() else {}


def _check_signature_names(signature: dict[str, Any], kernels: dict[str, Any]) -> None:
    """LaunchError SP0702 for a ``--signature`` name that no checked kernel has (a typo would
    otherwise be ignored); kernels whose parameters cannot be read report that themselves."""
    from .frontend.diagnostics import CompileError, LaunchError

    names: set[str] = set()
    for kernel in kernels.values():
        try:
            names |= {p.name for p in kernel.params}
        except CompileError:
            return
    unknown = sorted(set(signature) - names)
    if unknown:
        who = f"`{next(iter(kernels))}` has no" if len(kernels) == 1 else "no kernel checked has a"
        raise LaunchError("SP0702", f"{who} parameter named `{unknown[0]}`",
                          help=f"parameters: {', '.join(sorted(names)) or 'none'}")


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Check each file; the exit status is the worst of theirs (a file's usage error or load-time
    diagnostics do not stop the others)."""
    from .frontend.diagnostics import CompileError, LaunchError

    if len(args.file) == 1:
        return _check_file(args.file[0], args, out, err)
    if args.kernel is not None:
        raise _Usage("--kernel selects a kernel of one file; give only that file")
    status = EXIT_OK
    for file in args.file:
        try:
            code = _check_file(file, args, out, err)
        except _Usage as e:
            print(e.render(), file=err)
            code = EXIT_USAGE
        except CompileError as e:
            print(e.render(), file=err)
            _python_note(file, err)
            code = EXIT_DIAGNOSTICS
        except LaunchError as e:
            print(str(e), file=err)
            code = EXIT_USAGE
        status = max(status, code)
    return status


def _check_file(file: str, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Check every kernel (see frontend/sema/check_kernels.py): errors are exit 1; kernels checked with
    representative constexpr values are named, kernels checked only partially are warned about
    (exit 1 with ``--strict``), and so is a file without kernels (SP0251)."""
    from .frontend.diagnostics import CompileError, Diagnostic
    from .frontend.sema.check_kernels import CHECKED, FAILED, check_kernel, no_kernel_warning

    module = _read_module(file, "check")
    kernels = _select(module, args.kernel)
    signature = _signature(args.signature, module)
    _check_signature_names(signature, kernels)
    if not kernels:
        print(no_kernel_warning(file).render(), file=err)
        return EXIT_DIAGNOSTICS if args.strict else EXIT_OK
    diagnostics: list[Diagnostic] = []
    results = []
    for kernel in kernels.values():
        try:
            own = {k: v for k, v in signature.items() if k in {p.name for p in kernel.params}}
        except CompileError as e:
            diagnostics.extend(e.diagnostics)
            continue
        result = check_kernel(kernel, own)
        diagnostics.extend(result.diagnostics)
        results.append(result)
    notes = [r.describe() for r in results if r.describe()]
    if diagnostics:
        print(CompileError(diagnostics).render(), file=err)
        _python_note(file, err)
        for n in notes:
            print(f"note: {n}", file=err)
        return EXIT_DIAGNOSTICS
    checked = [r.name for r in results if r.status == CHECKED]
    incomplete = [r for r in results if r.status not in (CHECKED, FAILED)]
    plural = "s" if len(checked) != 1 else ""
    if incomplete:
        summary = (f"{file}: no errors found, but only {len(checked)} of {len(results)} kernels fully checked"
                   + (f" ({', '.join(checked)})" if checked else ""))
    else:
        summary = f"{file}: ok ({len(checked)} kernel{plural} checked: {', '.join(checked)})"
    print(summary, file=out)
    for r in results:
        line = r.describe()
        if line:
            print(f"{'warning' if r.status != CHECKED else 'note'}: {line}", file=out)
    return EXIT_DIAGNOSTICS if args.strict and incomplete else EXIT_OK


# ------------------------------------------------------------------------------------------------
def _compile(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not args.dump_after:
        return _compile_now(args, out, err)
    from .driver.compiler import STAGE_NAMES
    from .frontend.dump import dumping

    stages = [name.strip() for given in args.dump_after for name in given.split(",") if name.strip()]
    unknown = [name for name in stages if name not in STAGE_NAMES]
    if unknown:
        raise _Usage(f"--dump-after: no stage named {', '.join(map(repr, unknown))}; the stages are "
                     f"{', '.join(STAGE_NAMES)}")
    with dumping(stages, err):
        return _compile_now(args, out, err)


def _compile_now(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    module = _read_module(args.file, "compile")
    kernel = _select(module, args.kernel)[args.kernel]
    signature = _signature(args.signature, module)
    if args.emit == "ir":
        from .frontend.ir.printer import print_function

        bindings, key = kernel.signature_bindings(signature)
        return _write(print_function(kernel.ir_for(bindings, key)), args.output, out)
    try:
        from .driver.compiler import compile_kernel
    except ImportError as e:
        print(f"error: `--emit {args.emit}` needs the LLVM backend (sparsile.driver.compiler), which this "
              f"installation does not have yet ({e})", file=err)
        return EXIT_UNAVAILABLE
    compiled = compile_kernel(kernel, signature, target=args.target, stop_after=args.emit)
    artefact = getattr(compiled, args.emit, None)
    if artefact is None:
        print(f"error: the compiler produced no {args.emit} for `{args.kernel}`", file=err)
        return EXIT_UNAVAILABLE
    if isinstance(artefact, bytes | bytearray):
        if args.output is None:
            return _write_binary_stdout(bytes(artefact), args.emit, out)
        path = args.output
        try:
            with open(path, "wb") as f:
                f.write(artefact)
        except OSError as e:
            raise _Usage(f"cannot write `{path}`: {e.strerror}") from None
        print(f"wrote {path} ({len(artefact)} bytes)", file=out)
        return EXIT_OK
    return _write(str(artefact), args.output, out)


def _write_binary_stdout(data: bytes, what: str, out: TextIO) -> int:
    """A binary artefact on stdout: only when it is redirected (a terminal gets a usage error)."""
    buffer = getattr(out, "buffer", None)
    if buffer is None or out.isatty():
        raise _Usage(f"`--emit {what}` is binary: give -o FILE, or redirect stdout (`... > k.{what}`)")
    out.flush()
    buffer.write(data)
    buffer.flush()
    return EXIT_OK


def _write(text: str, path: str | None, out: TextIO) -> int:
    if path is None:
        out.write(text if text.endswith("\n") else text + "\n")
        return EXIT_OK
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise _Usage(f"cannot write `{path}`: {e.strerror}") from None
    return EXIT_OK


# ------------------------------------------------------------------------------------------------
def _demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        from .demo import main as demo_main
    except ImportError as e:
        print(f"error: the demo (sparsile.demo) is not part of this installation yet ({e})", file=err)
        return EXIT_UNAVAILABLE
    takes_args = bool(inspect.signature(demo_main).parameters)
    try:
        result = demo_main(list(args.args)) if takes_args else demo_main()
    except SystemExit as e:  # the demo's own argparse: -h, or a bad option (already printed)
        return EXIT_OK if e.code in (0, None) else EXIT_USAGE
    return int(result) if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
