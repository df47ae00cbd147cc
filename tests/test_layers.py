"""The layer order of the package, checked from its own import statements (docs/architecture.md).

A walk over every module's AST (no import is executed) builds the graph file -> imported file for the
package's own modules, then checks:

- no import circle between files of different sub-packages (a circle inside one sub-package is that
  sub-package's own business);
- the layers point one way: nothing in ``frontend`` imports ``backend`` or ``driver``, nothing in
  ``backend`` imports ``driver``, the sparsity toolkit imports nothing above ``grammar``/``target``;
- no module imports another module's ``_private`` names.

Run ``python -m sparsile.tests.test_layers`` for the counts (circles, function-local imports, private
imports) that docs/architecture.md records.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparsile"
NOT_MODULES = {"tests", "benchmarks", "scripts", "docs", "build", "dist", ".venv", ".git"}

# The layers, lowest first: a file may import its own layer and the layers below it, never above.
# A path prefix (module dotted name below `sparsile`) -> its layer number.
LAYERS: dict[str, int] = {
    "grammar": 0,
    "version": 0,
    "install_hints": 0,         # the help lines that install an optional extra (imports nothing)
    "frontend.spans": 0,        # source positions and the error base every layer reports through
    "frontend.diagnostics": 0,  # (public path: sparsile.frontend.diagnostics)
    "target": 1,
    "stdlib.sparsity": 1,
    "frontend": 2,
    "backend": 3,
    "driver": 4,
    "": 5,  # the package face: `import sparsile as sp` is what stdlib kernels and integrations use
    "stdlib": 5,
    "integrations": 5,
    "examples": 6,
    "cli": 6,
    "demo": 6,
}

# Upward imports that are allowed, with why: (importer, module imported, names).
UPWARD_ALLOWED: dict[tuple[str, str, tuple[str, ...]], str] = {}

# Imports of another module's `_private` names that are allowed: (importer, module, name). Empty: the
# 22 that predated the re-layering were paid off (issue 16) by giving each shared helper a public,
# documented name in the module that defines it (e.g. `reduce._storage` -> `reduce.storage_of`).
# Keep it empty: a helper another module needs gets a public name, not an entry here.
PRIVATE_ALLOWED: frozenset[tuple[str, str, str]] = frozenset()


@dataclass(frozen=True)
class Import:
    """One import of a package module by a package module."""

    source: str       # dotted module name below `sparsile` ("frontend.sema.core")
    target: str       # the module imported
    names: tuple[str, ...]  # the names taken (`from m import a, b`); empty for `import m`
    local: bool       # inside a function body
    line: int


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name below `sparsile` -> file ("" is the top __init__)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_MODULES or "__pycache__" in rel.parts:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _package_of(module: str, path: Path) -> str:
    """The package that relative imports in `module` are resolved against."""
    if path.name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _resolve(base: str, level: int, name: str | None) -> str:
    """The dotted name (below `sparsile`) that `from <level dots><name>` means inside package `base`."""
    if level == 0:
        assert name is not None
        return name[len(PACKAGE) + 1:] if name.startswith(PACKAGE + ".") else ("" if name == PACKAGE else "\0")
    parts = base.split(".") if base else []
    parts = parts[:len(parts) - (level - 1)] if level > 1 else parts
    if name:
        parts += name.split(".")
    return ".".join(parts)


def _type_checking_only(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations only, never executed."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it stands inside a function body (``if TYPE_CHECKING:`` blocks skipped)."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, local = stack.pop()
        if _type_checking_only(node):
            continue
        yield node, local
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def imports(modules: dict[str, Path] | None = None) -> list[Import]:
    """Every import of a package module by a package module (module level and function-local)."""
    modules = module_files() if modules is None else modules
    found: list[Import] = []
    for module, path in modules.items():
        base = _package_of(module, path)
        for node, local in _walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(base, 0, alias.name)
                    if target in modules:
                        found.append(Import(module, target, (), local, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(base, node.level, node.module)
                if target == "\0":
                    continue
                plain: list[str] = []
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if target else alias.name
                    if sub in modules:      # `from . import module`
                        found.append(Import(module, sub, (), local, node.lineno))
                    else:
                        plain.append(alias.name)
                if plain and target in modules:
                    found.append(Import(module, target, tuple(plain), local, node.lineno))
    return found


def function_local_imports(modules: dict[str, Path] | None = None) -> int:
    """Import statements inside function bodies (of any module, the package's or not)."""
    modules = module_files() if modules is None else modules
    return sum(1 for path in modules.values() for node, local in _walk(ast.parse(path.read_text()))
               if local and isinstance(node, (ast.Import, ast.ImportFrom)))


def circles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
            graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def subpackage(module: str, packages: frozenset[str] = frozenset()) -> str:
    """The sub-package a module belongs to: a package (an ``__init__.py``) is its own, a plain module
    its dotted name less the last part ("" for top-level)."""
    return module if module in packages else module.rpartition(".")[0]


def packages_of(modules: dict[str, Path]) -> frozenset[str]:
    """The modules that are packages (their file is an ``__init__.py``)."""
    return frozenset(m for m, p in modules.items() if p.name == "__init__.py")


def crossing_circles(modules: dict[str, Path], edges: list[Import]) -> list[list[str]]:
    """The circles whose files belong to more than one sub-package."""
    packages = packages_of(modules)
    return [c for c in circles(edges) if len({subpackage(m, packages) for m in c}) > 1]


def layer(module: str) -> int | None:
    """The layer of a module: the longest prefix of LAYERS that names it."""
    best: tuple[int, int] | None = None
    for prefix, number in LAYERS.items():
        named = module == prefix or (prefix and module.startswith(prefix + "."))
        if named and (best is None or len(prefix) > best[0]):
            best = (len(prefix), number)
    return None if best is None else best[1]


def private_imports(edges: list[Import], allowed: frozenset[tuple[str, str, str]] = PRIVATE_ALLOWED
                    ) -> list[Import]:
    """Imports that take another module's `_private` names (dunders are not private), less ``allowed``."""
    return [e for e in edges if e.source != e.target and any(
        n.startswith("_") and not n.startswith("__") and (e.source, e.target, n) not in allowed
        for n in e.names)]


def test_no_circle_between_subpackages():
    modules = module_files()
    across = crossing_circles(modules, imports(modules))
    assert not across, f"import circles that cross sub-packages: {across}"


def upward_imports(edges: list[Import]) -> list[Import]:
    """Imports from a lower layer into a higher one, less the allowed ones."""
    return [e for e in edges if (a := layer(e.source)) is not None and (b := layer(e.target)) is not None
            and b > a and (e.source, e.target, e.names) not in UPWARD_ALLOWED]


def test_layers_point_one_way():
    upward = [f"{e.source} -> {e.target} (line {e.line})" for e in upward_imports(imports())]
    assert not upward, "imports from a lower layer into a higher one (docs/architecture.md):\n" + "\n".join(upward)


def test_no_import_of_private_names():
    found = [f"{e.source} takes {[n for n in e.names if n.startswith('_')]} from {e.target} (line {e.line})"
             for e in private_imports(imports())]
    assert not found, "imports of another module's private names:\n" + "\n".join(found)


def test_the_walk_sees_the_graph():
    """The walk resolves relative imports and finds a known circle in a tiny synthetic package."""
    edges = [Import("a.x", "a.y", (), False, 1), Import("a.y", "b.z", ("_p",), True, 1),
             Import("b.z", "a.x", (), False, 1), Import("b.z", "b.w", (), False, 1)]
    assert circles(edges) == [["a.x", "a.y", "b.z"]]
    assert [e.source for e in private_imports(edges, frozenset())] == ["a.y"]
    assert _resolve("frontend.sema", 2, "ir") == "frontend.ir"
    assert _resolve("frontend", 1, None) == "frontend"
    assert _resolve("", 0, "sparsile.backend") == "backend"
    assert layer("stdlib.sparsity.prune") == 1 and layer("stdlib.kernels.gemm") == 5
    modules = module_files()
    assert "frontend.diagnostics" in modules or "frontend.diagnostics" in {m.rpartition(".")[0] for m in modules}


def measure() -> dict[str, object]:
    """The counts docs/architecture.md records."""
    modules = module_files()
    edges = imports(modules)
    found = circles(edges)
    return {"modules": len(modules),
            "circles": len(found),
            "files in circles": sum(len(c) for c in found),
            "largest circle": max((len(c) for c in found), default=0),
            "circles across sub-packages": len(crossing_circles(modules, edges)),
            "function-local imports": function_local_imports(modules),
            "function-local imports of package modules": sum(1 for e in edges if e.local),
            "imports of private names": len(private_imports(edges, frozenset())),
            "imports of private names not allowed": len(private_imports(edges)),
            "upward imports": len(upward_imports(edges))}


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key}: {value}")
    for circle in circles(imports()):
        print("circle:", " ".join(circle))
