"""Rewrite the imports of files written against the flat layout to the layered one (docs/architecture.md).

For a branch that forked before the re-layering: after merging it, run

    python scripts/relayer_imports.py FILE...

on the files it added or changed. Each FILE is given at its path now; a file that the re-layering
moved (git carries a branch's edits into the moved file) has its relative imports read as they were
written at its old path. Every import of a moved module, and every ``sparsile.<module>`` or
``frontend/<file>.py`` mention in strings, comments and docs, is rewritten to the new path; imports
keep their style (relative stays relative). ``--check`` only lists the files it would change.
Afterwards run ``ruff check --fix --select I`` on them (import order).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOVES: dict[str, str] = {
    # modules that branches merged at the same time added at flat paths
    "frontend/check_kernels.py": "frontend/sema/check_kernels.py",
    "frontend/autotune.py": "driver/autotune.py", "frontend/autotune_cache.py": "driver/autotune_cache.py",
    "backend/fast_launch.py": "driver/fast_launch.py", "backend/prepared.py": "driver/prepared.py",
    "backend/cudalib.py": "backend/runtime/cudalib.py", "backend/bench.py": "backend/runtime/bench.py",
    "frontend/ast.py": "frontend/syntax/ast.py", "frontend/ast_builder.py": "frontend/syntax/builder.py",
    "frontend/parser.py": "frontend/syntax/parser.py", "frontend/precedence.py": "frontend/syntax/precedence.py",
    "frontend/syntax_errors.py": "frontend/syntax/errors.py",
    "frontend/ir.py": "frontend/ir/core.py", "frontend/ir_printer.py": "frontend/ir/printer.py",
    "frontend/ir_verify.py": "frontend/ir/verify.py", "frontend/types.py": "frontend/ir/types.py",
    "frontend/axis_info.py": "frontend/ir/axis_info.py",
    "frontend/sema.py": "frontend/sema/core.py", "frontend/sema_expr.py": "frontend/sema/expr.py",
    "frontend/sema_control.py": "frontend/sema/control.py", "frontend/sema_consts.py": "frontend/sema/consts.py",
    "frontend/emitter.py": "frontend/sema/emitter.py", "frontend/builtins.py": "frontend/sema/builtins.py",
    "frontend/type_ctors.py": "frontend/sema/type_ctors.py", "frontend/jit_globals.py": "frontend/sema/jit_globals.py",
    "frontend/captures.py": "frontend/sema/captures.py", "frontend/specialize.py": "frontend/sema/specialize.py",
    "frontend/values.py": "frontend/sema/values.py",
    "frontend/opdefs.py": "frontend/ops/opdefs.py", "frontend/ops_core.py": "frontend/ops/core.py",
    "frontend/ops_shape.py": "frontend/ops/shape.py", "frontend/ops_tensor.py": "frontend/ops/tensor.py",
    "frontend/ops_memory.py": "frontend/ops/memory.py", "frontend/ops_control.py": "frontend/ops/control.py",
    "frontend/ops_dot.py": "frontend/ops/dot.py", "frontend/ops_hopper.py": "frontend/ops/hopper.py",
    "frontend/ops_cluster.py": "frontend/ops/cluster.py", "frontend/ops_blackwell.py": "frontend/ops/blackwell.py",
    "frontend/ops_layout.py": "frontend/ops/layout.py", "frontend/tmem_scales.py": "frontend/ops/tmem_scales.py",
    "frontend/metadata_words.py": "frontend/ops/metadata_words.py",
    "frontend/layouts.py": "frontend/layout/layouts.py", "frontend/layout_derive.py": "frontend/layout/derive.py",
    "frontend/layout_library.py": "frontend/layout/library.py",
    "frontend/layout_pictures.py": "frontend/layout/pictures.py", "frontend/layout_smem.py": "frontend/layout/smem.py",
    "frontend/layout_inference.py": "frontend/layout/inference.py",
    "frontend/tile_layouts.py": "frontend/layout/tile.py",
    "frontend/legality.py": "frontend/legality/core.py", "frontend/legality_cluster.py": "frontend/legality/cluster.py",
    "frontend/legality_layout.py": "frontend/legality/layout.py",
    "frontend/legality_memory.py": "frontend/legality/memory.py",
    "frontend/legality_meta.py": "frontend/legality/meta.py",
    "frontend/legality_mma.py": "frontend/legality/mma.py", "frontend/legality_tmem.py": "frontend/legality/tmem.py",
    "frontend/interpreter.py": "frontend/interp/interpreter.py",
    "frontend/interp_values.py": "frontend/interp/values.py",
    "frontend/interp_blackwell.py": "frontend/interp/blackwell.py",
    "frontend/host_arrays.py": "frontend/interp/host_arrays.py",
    "frontend/kernel.py": "driver/kernel.py", "frontend/module.py": "driver/module.py",
    "backend/compiler.py": "driver/compiler.py", "backend/launch.py": "driver/launch.py",
    "backend/cache.py": "driver/cache.py",
    "backend/targets.py": "target/targets.py", "backend/descriptors.py": "target/descriptors.py",
    "backend/codegen.py": "backend/lower/codegen.py", "backend/llvm_text.py": "backend/lower/llvm_text.py",
    "backend/lower_async.py": "backend/lower/asynchronous.py",
    "backend/lower_blackwell.py": "backend/lower/blackwell.py",
    "backend/lower_blackwell_tile.py": "backend/lower/blackwell_tile.py",
    "backend/lower_cluster.py": "backend/lower/cluster.py", "backend/lower_control.py": "backend/lower/control.py",
    "backend/lower_dot.py": "backend/lower/dot.py", "backend/lower_elementwise.py": "backend/lower/elementwise.py",
    "backend/lower_hopper.py": "backend/lower/hopper.py", "backend/lower_memory.py": "backend/lower/memory.py",
    "backend/lower_mma.py": "backend/lower/mma.py", "backend/lower_reduce.py": "backend/lower/reduce.py",
    "backend/llvm_to_ptx.py": "backend/toolchain/llvm_to_ptx.py", "backend/linker.py": "backend/toolchain/linker.py",
    "backend/nvjitlink.py": "backend/toolchain/nvjitlink.py",
    "backend/runtime.py": "backend/runtime/__init__.py", "backend/arguments.py": "backend/runtime/arguments.py",
    "backend/tensormap.py": "backend/runtime/tensormap.py", "backend/dlpack.py": "backend/runtime/dlpack.py",
}
"""Every file the re-layering moved: old path -> new path (below the package root)."""
NOT_PACKAGE = ("tests/", "benchmarks/", "scripts/")


def dotted(path: str) -> str:
    """The module name below ``sparsile`` of a file path ("" for the package's own __init__)."""
    name = path[:-3].replace("/", ".")
    if name == "__init__":
        return ""
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


MODULES = {dotted(old): dotted(new) for old, new in MOVES.items()}
OLD_MODULES = set(MODULES) | {"frontend", "backend"}
DOTTED = re.compile(r"(?<![\w.])sparsile\.(" + "|".join(map(re.escape, sorted(MODULES, key=len, reverse=True)))
                    + r")(?!\w)")
PATHS = re.compile(r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(MOVES, key=len, reverse=True))) + r")(?!\w)")


def rewrite_text(text: str) -> str:
    """``sparsile.<old module>`` and ``<old file path>`` mentions, rewritten."""
    text = DOTTED.sub(lambda m: "sparsile." + MODULES[m.group(1)], text)
    return PATHS.sub(lambda m: MOVES[m.group(1)], text)


def _package(path: str) -> str:
    name = dotted(path)
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def _resolve(package: str, level: int, module: str | None) -> str | None:
    if level == 0:
        if module == "sparsile":
            return ""
        return module[len("sparsile."):] if module and module.startswith("sparsile.") else None
    parts = package.split(".") if package else []
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(parts + (module.split(".") if module else []))


def _relative(package: str, target: str) -> str:
    a, b = (package.split(".") if package else []), (target.split(".") if target else [])
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    return "." * (len(a) - common + 1) + ".".join(b[common:])


def _import_from(node: ast.ImportFrom, target: str, new_package: str) -> list[str]:
    """``from ... import ...`` statements for ``node`` (whose module is ``target``) after the moves."""
    groups: dict[str, list[str]] = {}
    for alias in node.names:
        full = f"{target}.{alias.name}" if target else alias.name
        if full in OLD_MODULES:  # `from package import module`
            parent, _, leaf = MODULES.get(full, full).rpartition(".")
            name = alias.asname or (alias.name if leaf != alias.name else None)
            groups.setdefault(parent, []).append(leaf + (f" as {name}" if name and name != leaf else ""))
        else:
            groups.setdefault(MODULES.get(target, target), []).append(
                alias.name + (f" as {alias.asname}" if alias.asname else ""))
    spell = (lambda t: _relative(new_package, t)) if node.level else (lambda t: "sparsile" + (f".{t}" if t else ""))
    return [f"from {spell(parent)} import {', '.join(names)}" for parent, names in groups.items()]


def rewrite_python(text: str, new_path: str) -> str:
    """The source of the file now at ``new_path`` with its imports and mentions rewritten."""
    old_path = {new: old for old, new in MOVES.items()}.get(new_path, new_path)
    in_package = not new_path.startswith(NOT_PACKAGE)
    old_package, new_package = _package(old_path) if in_package else "", _package(new_path) if in_package else ""
    tree = ast.parse(text)
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
        source = text[begin:end]
        if isinstance(node, ast.Import):
            edits.append((begin, end, DOTTED.sub(lambda m: "sparsile." + MODULES[m.group(1)], source)))
            continue
        target = _resolve(old_package, node.level, node.module) if in_package or not node.level else None
        if target is None:  # not the package's (a test's relative import of its neighbour stays as written)
            edits.append((begin, end, source))
            continue
        edits.append((begin, end, ("\n" + " " * node.col_offset).join(_import_from(node, target, new_package))))
    out, pos = [], 0
    for begin, end, new in sorted(edits):
        out += [rewrite_text(text[pos:begin]), new]
        pos = end
    out.append(rewrite_text(text[pos:]))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="files at their path now (relative to the package root)")
    parser.add_argument("--check", action="store_true", help="only list the files that would change")
    args = parser.parse_args(argv)
    changed = []
    for name in args.files:
        path = Path(name).resolve()
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        new = rewrite_python(text, relative) if path.suffix == ".py" else rewrite_text(text)
        if new != text:
            changed.append(relative)
            if not args.check:
                path.write_text(new)
    print("\n".join(changed) if changed else "nothing to rewrite")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
