"""The ``sparsile`` command line's argument parser: the commands, their options and help texts, and
the argparse types that check option values (cli.py runs what it parses)."""

from __future__ import annotations

import argparse
import functools
from typing import Any

EMIT_KINDS = ("ir", "llvm", "ptx", "cubin")
MAX_PICTURE_ROWS = 4096
EPILOG = """\
examples (from a checkout; `sparsile COMMAND -h` for a command's options):
  sparsile demo                                  the 2:4 sparse GEMM end to end (GPU if present, else the interpreter)
  sparsile check examples/vector_add.spk         diagnostics of a .spk file
  sparsile compile examples/vector_add.spk --kernel vector_add --target sm_90a --emit ptx
  sparsile layout --list                         the layout constructors

exit status: 0 success, 1 the source has errors (diagnostics on stderr), 2 a usage error,
3 a feature this machine lacks (e.g. `tune` without a GPU). Docs: README.md and docs/ of the checkout."""


class CommandParser(argparse.ArgumentParser):
    """A command's parser: arguments it does not know are its usage error, with its own usage line
    (argparse leaves them to the top-level parser, whose usage names no option of the command)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``sparsile [--version] COMMAND ...`` (``sparsile -h``)."""
    from . import __version__

    p = argparse.ArgumentParser(prog="sparsile", description="sparsile kernel language tools",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"sparsile {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    sub.required = True

    c = sub.add_parser("check", help="report the diagnostics of .spk files",
                       description="report the diagnostics of .spk files, rustc style, on stderr (no GPU needed); "
                                   "exit status 0 when clean, 1 with diagnostics, 2 for a usage error")
    c.add_argument("file", nargs="+", help="one or more .spk source files")
    c.add_argument("--kernel", help="check only this kernel (of the one file given)")
    c.add_argument("--signature", default="", help='types and constexpr values, e.g. "x=ptr[f32],BLOCK=128"')
    c.add_argument("--strict", action="store_true",
                   help="exit 1 unless every kernel was fully checked (none only partially, at least one "
                        "kernel in the file)")

    k = sub.add_parser("compile", help="compile one kernel of a .spk file for a signature",
                       description="compile one kernel of a .spk file for a signature to IR, LLVM, PTX or a cubin "
                                   "(no GPU needed); exit status 1 when the source has errors")
    k.add_argument("file", help="a .spk source file")
    k.add_argument("--kernel", required=True, help="the kernel to compile")
    k.add_argument("--signature", default="",
                   help='types of unannotated parameters and constexpr values, e.g. "n=i32,BLOCK=1024" '
                        "(annotated parameters and defaulted constexprs need none)")
    k.add_argument("--emit", choices=EMIT_KINDS, default="ir", help="what to produce (default: ir)")
    k.add_argument("--target", default=None, type=target_name,
                   help="GPU target of --emit llvm, ptx and cubin, e.g. sm_90a or sm_100a (default: the kernel's "
                        "own target= option, else sm_90a; no GPU needed)")
    k.add_argument("-o", "--output", default=None,
                   help="write here instead of stdout (a cubin goes to stdout only when it is not a terminal)")
    k.add_argument("--dump-after", action="append", default=[], metavar="STAGE",
                   help="print the program to stderr after this pipeline stage (parse, build, ..., cubin: "
                        "docs/architecture.md); repeatable or comma-separated")

    d = sub.add_parser("demo", help="run the sparse matmul demo (sparsile demo -h: its options)", add_help=False)
    d.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the demo")

    la = sub.add_parser("layout", help="draw a named layout, e.g. \"wgmma_accumulator(64)\"",
                        description="draw a named layout: where each element lives (thread and register, TMEM lane and "
                                    "column, shared-memory offset), e.g. "
                                    "sparsile layout \"wgmma_accumulator(64)\"; sparsile layout --list names the "
                                    "constructors and their arguments")
    la.add_argument("expr", nargs="?", help="a call of a layout constructor with literal arguments")
    la.add_argument("--list", action="store_true", help="list the layout constructors")
    la.add_argument("--max-rows", type=picture_rows, default=64,
                    help=f"rows of the picture to print (1 to {MAX_PICTURE_ROWS}, default 64)")

    o = sub.add_parser("ops", help="list every IR op with its targets and the parts of its definition",
                       description="list every IR op with its targets and the parts of its definition "
                                   "(docs/architecture.md: how to add an op)")
    o.add_argument("-v", "--verbose", action="store_true", help="also show operand names and why a part is none")

    t = sub.add_parser("tune", help="pre-tune the sparse GEMM for a list of shapes and write a table",
                       description="time the sparse GEMM's configs for each shape and write the fastest to a "
                                   "table (docs/autotune.md); needs an NVIDIA GPU (exit status 3 without one); "
                                   "nothing needs a table to run")
    t.add_argument("shapes", nargs="+", help="MxNxK shapes (M out features, N tokens, K in features), or files "
                                             "with one shape per line")
    t.add_argument("--dtype", action="append", choices=("f16", "bf16", "e4m3", "s8", "tf32"),
                   help="operand types to tune (repeatable; default bf16 and f16, with --linear: bf16)")
    t.add_argument("-o", "--output", default=None, help="write the table here (e.g. stdlib/kernels/tuned/h200.json)")
    t.add_argument("--warmup", type=functools.partial(integer_at_least, least=0), default=10,
                   help="launches before timing each config (default 10)")
    t.add_argument("--rep", type=functools.partial(integer_at_least, least=1), default=50,
                   help="timed launches per config, the median kept (default 50)")
    t.add_argument("--linear", action="store_true",
                   help="tune the torch layer's kernel (sparse_linear, T > 64) instead of sparse_matmul; its "
                        "entries (linear-<dtype>) go to the same table")
    t.add_argument("--device", type=functools.partial(integer_at_least, least=0), default=None,
                   help="the GPU to tune on and name the table after (default: sparsile's current one, cuda:0)")
    t.add_argument("--inflight", action="store_true",
                   help="also time every operand type's configs with one MMA group in flight (INFLIGHT=1; "
                        "by default only e4m3's, docs/autotune.md)")
    return p



def picture_rows(text: str) -> int:
    """An argparse type: a row count for ``layout --max-rows``."""
    try:
        rows = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= rows <= MAX_PICTURE_ROWS:
        raise argparse.ArgumentTypeError(f"the picture has 1 to {MAX_PICTURE_ROWS} rows, got {rows}")
    return rows


def integer_at_least(text: str, least: int) -> int:
    """An argparse type: an integer of at least ``least`` (``tune --rep 0`` was timed once, silently)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected at least {least}, got {value}")
    return value


def target_name(text: str) -> str:
    """An argparse type: a known target name (an empty or unknown one is a usage error, exit 2)."""
    from .frontend.diagnostics import CompileError
    from .target.targets import get_target

    if not text.strip():
        raise argparse.ArgumentTypeError("the target name is empty (e.g. --target sm_90a)")
    try:
        return get_target(text).name
    except CompileError as e:
        d = e.diagnostics[0]
        raise argparse.ArgumentTypeError(f"{d.message}; {d.help}" if d.help else d.message) from None


__all__ = ["EMIT_KINDS", "EPILOG", "MAX_PICTURE_ROWS", "CommandParser", "build_parser", "integer_at_least",
           "picture_rows", "target_name"]
