"""A generated ``.spk`` program (tests/support/program_gen.py, program_gen_sparse.py) rendered as an
equivalent ``@sparsile.jit`` Python module, for the differential test of the two frontends
(tests/frontend/test_program_fuzz_jit.py).

The ``.spk`` text is parsed with Python's ``ast`` (the language's syntax is Python's) and rewritten
with choices drawn from the seed, each one meaning the same program under docs/language.md:

* language names spelled ``sp.name``, ``spx.name`` (a second alias of the module), imported
  (``from sparsile import name``, or ``... as alias``) or bare (a name the module does not define
  falls back to the language's builtins); dtypes also as their other spellings (``sp.float32``),
  and NumPy / ml_dtypes dtypes (``np.float32``) where they are compile-time values;
* conversions as ``x.to(T)``, ``to(x, T)`` or ``T(x)`` (rule 8);
* number literals moved into captured Python values: module globals (plain, NumPy scalars,
  elements of a tuple, attributes of a namespace or a class) and closure values of a factory the
  kernel is defined in; shape tuples into global tuples or ``m.shape`` (the mask of the main shape);
* ``constexpr`` parameters given defaults (literals or globals), omitted at the launch;
* helpers of the module as ``@jit`` functions (in the same module or a second one, imported) or
  nested in the kernel, and nested helpers that read nothing of the kernel hoisted to ``@jit``
  functions;
* the kernel at module level, in a factory (closure) or in a class body (``@staticmethod``), under
  ``@sp.jit``, ``@sp.jit(...)``, ``@sp.kernel`` or an imported ``jit``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import itertools
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import sparsile as sp
from sparsile.frontend.sema.builtins import ROOT

from .program_gen import Lit

DTYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "tf32",
          "e4m3", "e5m2")
NUMPY_NAMES = {"bool": "np.bool_", "i8": "np.int8", "i16": "np.int16", "i32": "np.int32", "i64": "np.int64",
               "u8": "np.uint8", "u16": "np.uint16", "u32": "np.uint32", "u64": "np.uint64", "f16": "np.float16",
               "f32": "np.float32", "f64": "np.float64", "bf16": "ml_dtypes.bfloat16",
               "e4m3": "ml_dtypes.float8_e4m3fn", "e5m2": "ml_dtypes.float8_e5m2"}
"""The NumPy-side dtype of each scalar type that has one (a captured value inside a kernel)."""
NOT_IMPORTABLE = frozenset({"range", "static_range"})
"""Language names that are no attributes of the Python module (sema knows them by their spelling)."""


def is_language_name(name: str) -> bool:
    """Whether ``name`` is a name of the kernel language (``sp.name`` in a ``@jit`` kernel), not
    only an attribute of the Python module: ``kernel``, ``jit`` or ``CompileError`` are sparsile's
    Python API, and unknown names in a ``.spk`` kernel (a mutant may use the decorator's name)."""
    return name in NOT_IMPORTABLE or name in ROOT.members

_counter = itertools.count()
LIT_MARK = "__typed_literal__"
"""A literal of the generator's AST rendered by :func:`marked_literals`: ``__typed_literal__(3, 'u8')``."""


@contextlib.contextmanager
def marked_literals() -> Iterator[None]:
    """While active, the generator's number literals render with the type they take (rule 1: the
    type of the other operand), so that the ``@jit`` form may write them as typed constants."""
    plain = Lit.src

    def src(self: Lit) -> str:
        return plain(self) if isinstance(self.value, str) else f"{LIT_MARK}({self.value!r}, {self.dtype!r})"

    Lit.src = src  # type: ignore[method-assign]
    try:
        yield
    finally:
        Lit.src = plain  # type: ignore[method-assign]


def dtype_spellings() -> dict[str, list[str]]:
    """Each scalar type -> the names of ``sparsile`` that are it (``f32``, ``float32``)."""
    out: dict[str, list[str]] = {d: [] for d in DTYPES}
    for name in dir(sp):
        if name.startswith("_"):
            continue
        value = getattr(sp, name, None)
        for d in DTYPES:
            if value is getattr(sp, d):
                out[d].append(name)
    return out


SPELLINGS = dtype_spellings()


@dataclass
class JitProgram:
    """The rendered module: its text (and that of a helper module, if any), the constexpr defaults
    the kernel was given, and the choices made (for a failure's message)."""

    text: str
    helper_text: str = ""
    helper_module: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    choices: list[str] = field(default_factory=list)


class _Renderer:
    def __init__(self, source: str, consts: dict[str, Any], shape: tuple[int, ...] | None, seed: int,
                 respell: bool = True) -> None:
        self.r = random.Random(seed * 7919 + 17)
        self.respell = respell
        self.tree = ast.parse(source)
        self.consts = consts
        self.shape = shape
        self.globals: list[str] = []  # module-level definitions of captured values
        self.helper_globals: list[str] = []
        self.closure: list[str] = []
        self.typed_globals: list[str] = []
        self.introduced: set[str] = set()  # names of captured values defined by the renderer
        self.imports: set[str] = set()
        self.choices: list[str] = []
        self.n = 0
        self.kernel = next(f for f in self.tree.body if isinstance(f, ast.FunctionDef) and f.decorator_list)
        deco = self.kernel.decorator_list
        name = deco[0].func if len(deco) == 1 and isinstance(deco[0], ast.Call) else deco[0]
        if len(deco) != 1 or not (isinstance(name, ast.Name) and name.id in ("kernel", "jit")):
            raise ValueError("the kernel's decorator is not `@kernel` or `@jit`")
        self.placement = self.r.choice(("module", "module", "factory", "class"))
        self.future = self.r.random() < 0.3
        self.choices.append(f"placement={self.placement} future_annotations={self.future}")

    def fresh(self, prefix: str) -> str:
        self.n += 1
        self.introduced.add(f"{prefix}_{self.n}")
        return f"{prefix}_{self.n}"

    # -- names -----------------------------------------------------------------------------------
    def bound_names(self) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef):
                out.add(node.name)
                out |= {a.arg for a in node.args.args + node.args.kwonlyargs}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
        return out

    def spell_names(self) -> None:
        """Language names: sp./spx. qualified, imported (maybe under an alias) or bare."""
        bound = self.bound_names() | self.introduced
        free = sorted({n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and n.id not in bound
                       and (n.id in NOT_IMPORTABLE or hasattr(sp, n.id))})
        imported: dict[str, str] = {}
        for name in free:
            if name in NOT_IMPORTABLE:
                continue
            pick = self.r.random()
            if pick < 0.2:
                imported[name] = name
            elif pick < 0.4:
                imported[name] = f"L_{name}"
            if name in imported and is_language_name(name):  # not sparsile's Python API (`kernel`)
                self.imports.add(f"from sparsile import {name}" + (f" as {imported[name]}" if pick >= 0.2 else ""))
        self.choices.append(f"imported={imported}")
        annotations = {id(n) for f in ast.walk(self.tree) if isinstance(f, ast.FunctionDef)
                       for a in f.args.args if a.annotation is not None for n in ast.walk(a.annotation)}
        loops = {id(f.iter.func) for f in ast.walk(self.tree)
                 if isinstance(f, ast.For) and isinstance(f.iter, ast.Call)}
        for node in list(ast.walk(self.tree)):
            for fld, value in ast.iter_fields(node):
                if isinstance(value, list):
                    for i, v in enumerate(value):
                        if isinstance(v, ast.Name) and v.id in free and (v.id not in NOT_IMPORTABLE or id(v) in loops):
                            value[i] = self.spelling(v, imported, id(v) in annotations)
                elif isinstance(value, ast.Name) and value.id in free and (
                        value.id not in NOT_IMPORTABLE or id(value) in loops):
                    setattr(node, fld, self.spelling(value, imported, id(value) in annotations))

    def spelling(self, name: ast.Name, imported: dict[str, str], in_annotation: bool) -> ast.expr:
        n = name.id
        options = ["sp", "spx"]
        if n in imported:
            options += [imported[n]] * 2
        elif not in_annotation or self.future:
            options += ["bare", "bare"]  # not evaluated by Python (a kernel body, a postponed annotation)
        if n in DTYPES:
            options += ["alias"] if len(SPELLINGS[n]) > 1 else []
            options += ["numpy"] if n in NUMPY_NAMES and not in_annotation else []
        how = self.r.choice(options)
        if how == "bare" or not is_language_name(n):  # Python API (`kernel`): as unknown as in the .spk
            return ast.Name(n, ast.Load())
        if how == "numpy":
            mod, attr = NUMPY_NAMES[n].split(".")
            self.imports.add("import ml_dtypes" if mod == "ml_dtypes" else "import numpy as np")
            return ast.Attribute(ast.Name(mod, ast.Load()), attr, ast.Load())
        if how == "alias":
            return ast.Attribute(ast.Name(self.r.choice(("sp", "spx")), ast.Load()),
                                 self.r.choice([s for s in SPELLINGS[n] if s != n]), ast.Load())
        if how in ("sp", "spx"):
            return ast.Attribute(ast.Name(how, ast.Load()), n, ast.Load())
        return ast.Name(how, ast.Load())

    # -- equivalent spellings of conversions ----------------------------------------------------------
    def respell_casts(self) -> None:
        tree = self.tree
        r = self.r

        class Casts(ast.NodeTransformer):
            def visit_Call(self, node: ast.Call) -> ast.expr:
                self.generic_visit(node)
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr == "to" and len(node.args) == 1 and not node.keywords:
                    x, t = f.value, node.args[0]
                elif isinstance(f, ast.Name) and f.id == "to" and len(node.args) == 2 and not node.keywords:
                    x, t = node.args
                else:
                    return node
                if not (isinstance(t, ast.Name) and t.id in DTYPES):
                    return node
                if isinstance(x, ast.Constant):
                    return node  # `(3).to(T)` and `to(3, T)` are the typed constant `T(3)` too, but keep the text
                form = r.choice(("method", "function", "ctor"))
                if form == "method":
                    return ast.Call(ast.Attribute(x, "to", ast.Load()), [t], [])
                if form == "function":
                    return ast.Call(ast.Name("to", ast.Load()), [x, t], [])
                return ast.Call(ast.Name(t.id, ast.Load()), [x], [])

        self.tree = Casts().visit(tree)

    def respell_methods(self) -> None:
        """Builtins that are also methods of their first operand (docs/language.md, builtin
        reference): ``sum(x, axis=0)`` / ``x.sum(axis=0)``, ``trans(x)`` / ``x.T``,
        ``load_tile(t, ...)`` / ``t.load_tile(...)``."""
        r = self.r
        methods = ("sum", "max", "min", "argmax", "argmin", "load_tile", "store_tile")

        class Methods(ast.NodeTransformer):
            def visit_Call(self, node: ast.Call) -> ast.expr:
                self.generic_visit(node)
                f = node.func
                if r.random() < 0.5:
                    return node
                reduction = (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") \
                    not in ("load_tile", "store_tile")
                if isinstance(f, ast.Name) and f.id in methods and node.args and not (
                        isinstance(node.args[0], ast.Constant | ast.Tuple) or (reduction and len(node.args) > 1)):
                    return ast.Call(ast.Attribute(node.args[0], f.id, ast.Load()), node.args[1:], node.keywords)
                if isinstance(f, ast.Attribute) and f.attr in methods and not (reduction and node.args) and \
                        not (isinstance(f.value, ast.Name) and f.value.id in ("sp", "spx")):
                    return ast.Call(ast.Name(f.attr, ast.Load()), [f.value, *node.args], node.keywords)
                if isinstance(f, ast.Name) and f.id == "trans" and len(node.args) == 1 and not node.keywords:
                    return ast.Attribute(node.args[0], "T", ast.Load())
                return node

            def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
                self.generic_visit(node)
                if node.attr == "T" and isinstance(node.ctx, ast.Load) and r.random() < 0.5:
                    return ast.Call(ast.Name("trans", ast.Load()), [node.value], [])
                return node

        self.tree = Methods().visit(self.tree)

    # -- literals of a known type ----------------------------------------------------------------------
    def typed_literals(self) -> None:
        """``__typed_literal__(v, T)`` -> the literal ``v``, or the typed constant ``T(v)`` (inline or
        captured as ``sp.T(v)``): the same value of the type the literal takes (rule 1)."""
        renderer = self

        class Typed(ast.NodeTransformer):
            def visit_Call(self, node: ast.Call) -> ast.expr:
                self.generic_visit(node)
                if not (isinstance(node.func, ast.Name) and node.func.id == LIT_MARK):
                    return node
                value, dtype = ast.literal_eval(node.args[0]), node.args[1].value
                pick = renderer.r.random()
                if pick < 0.6:
                    return ast.parse(repr(value), mode="eval").body
                renderer.choices.append(f"typed literal {dtype}({value!r})")
                if pick < 0.8:
                    return ast.Call(ast.Name(dtype, ast.Load()), [ast.parse(repr(value), mode="eval").body], [])
                name = renderer.fresh("TYPED")
                renderer.typed_globals.append(f"{name} = sp.{dtype}({value!r})")
                return ast.Name(name, ast.Load())

        self.tree = Typed().visit(self.tree)

    # -- captured values --------------------------------------------------------------------------------
    def capture_literals(self) -> None:
        """Number literals (outside annotations and decorators) -> captured Python values."""
        renderer = self
        kernel_nodes = {id(n) for n in ast.walk(self.kernel)}
        skip = {id(n) for f in ast.walk(self.tree) if isinstance(f, ast.FunctionDef)
                for part in [*(a.annotation for a in f.args.args), *f.decorator_list] if part is not None
                for n in ast.walk(part)}

        class Literals(ast.NodeTransformer):
            def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
                node.body = [self.visit(s) for s in node.body]  # not the annotations, defaults, decorators
                return node

            def visit_Tuple(self, node: ast.Tuple) -> ast.expr:
                if id(node) not in skip and isinstance(node.ctx, ast.Load) and node.elts and all(
                        isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
                    value = tuple(e.value for e in node.elts)
                    in_kernel = id(node) in kernel_nodes
                    if renderer.shape is not None and value == renderer.shape and in_kernel and \
                            renderer.r.random() < 0.3:
                        renderer.choices.append(f"{value} -> m.shape")
                        return ast.Attribute(ast.Name("m", ast.Load()), "shape", ast.Load())
                    if renderer.r.random() < 0.3:
                        return renderer.capture(value, in_kernel)
                self.generic_visit(node)
                return node

            def visit_Constant(self, node: ast.Constant) -> ast.expr:
                if id(node) in skip or type(node.value) not in (int, float) or renderer.r.random() >= 0.35:
                    return node
                return renderer.capture(node.value, id(node) in kernel_nodes)

        self.tree = Literals().visit(self.tree)

    def capture(self, value: Any, in_kernel: bool) -> ast.expr:
        """An expression reading ``value`` from a captured Python object (its definition recorded)."""
        kinds = ["global", "numpy", "tuple", "list", "namespace", "class"]
        if type(value) is int:
            kinds.append("enum")
        if in_kernel and self.placement == "factory":
            kinds += ["closure", "closure"]
        kind = self.r.choice(kinds)
        if kind == "numpy":
            if isinstance(value, int) and -2**63 <= value < 2**63:
                ctor = "np.int32" if -2**31 <= value < 2**31 and self.r.random() < 0.5 else "np.int64"
            elif isinstance(value, float):
                with np.errstate(over="ignore"):
                    exact = [c for c in ("np.float16", "np.float32") if float(getattr(np, c[3:])(value)) == value]
                ctor = self.r.choice([*exact, "np.float64"])
            else:
                ctor = None
            kind = "global" if ctor is None or isinstance(value, tuple) else kind
        name = self.fresh("CAP")
        self.choices.append(f"{name} = {value!r} ({kind})")
        target = self.closure if kind == "closure" else self.globals if in_kernel else self.helper_globals
        if kind in ("global", "closure"):
            target.append(f"{name} = {value!r}")
            return ast.Name(name, ast.Load())
        if kind == "numpy":
            self.imports.add("import numpy as np")
            target.append(f"{name} = {ctor}({value!r})")
            return ast.Name(name, ast.Load())
        if kind in ("tuple", "list"):
            pad = self.r.randint(0, 2)
            items = [*(['pad'] * pad), value]
            target.append(f"{name} = {tuple(items) if kind == 'tuple' else items!r}")
            return ast.Subscript(ast.Name(name, ast.Load()), ast.Constant(pad), ast.Load())
        if kind == "enum":
            self.imports.add("import enum")
            target.append(f"class {name}(enum.IntEnum):\n    V = {value!r}")
            return ast.Attribute(ast.Name(name, ast.Load()), "V", ast.Load())
        if kind == "namespace":
            self.imports.add("import types")
            target.append(f"{name} = types.SimpleNamespace(value={value!r})")
        else:
            target.append(f"class {name}:\n    value = {value!r}")
        return ast.Attribute(ast.Name(name, ast.Load()), "value", ast.Load())

    # -- constexpr defaults ------------------------------------------------------------------------------
    def constexpr_defaults(self) -> dict[str, Any]:
        args = self.kernel.args
        names = [a.arg for a in args.args]
        consts = [n for n in names if n in self.consts]
        if not consts or consts != names[len(names) - len(consts):]:
            return {}
        cut = self.r.randint(0, len(consts))
        given = consts[cut:]
        defaults: list[ast.expr] = []
        for n in given:
            v = self.consts[n]
            if self.r.random() < 0.5:
                g = self.fresh(f"DEFAULT_{n}")
                self.globals.append(f"{g} = {v!r}")
                defaults.append(ast.Name(g, ast.Load()))
            else:
                defaults.append(ast.Constant(v))
        args.defaults = defaults
        self.choices.append(f"defaults={given}")
        return {n: self.consts[n] for n in given}

    # -- helpers -----------------------------------------------------------------------------------------
    def place_helpers(self) -> tuple[list[ast.FunctionDef], list[ast.FunctionDef], list[ast.FunctionDef]]:
        """(helpers of this module, of the second module, of the factory's closure), all ``@jit``; some
        moved into the kernel, some of the kernel's nested ones hoisted."""
        mine: list[ast.FunctionDef] = []
        other: list[ast.FunctionDef] = []
        closure: list[ast.FunctionDef] = []
        module_helpers = [f for f in self.tree.body if isinstance(f, ast.FunctionDef) and f is not self.kernel]
        kernel_locals = {a.arg for a in self.kernel.args.args} | {
            n.id for n in ast.walk(self.kernel) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for f in [s for s in self.kernel.body if isinstance(s, ast.FunctionDef)]:
            reads = {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} - {a.arg for a in f.args.args}
            if not reads & kernel_locals and self.r.random() < 0.5:
                self.kernel.body.remove(f)
                module_helpers.append(f)
                self.choices.append(f"hoisted {f.name}")
        for f in module_helpers:
            where = self.r.choice(("module", "module", "other", "nested",
                                   *(("closure",) if self.placement == "factory" else ())))
            self.choices.append(f"helper {f.name}: {where}")
            if where == "nested":
                self.kernel.body.insert(0, f)
                continue
            f.decorator_list = [self.decorator(helper=True)]
            {"module": mine, "other": other, "closure": closure}[where].append(f)
        return mine, other, closure

    def signature_reads(self) -> set[str]:
        """The names the kernel's annotations, defaults and decorators read (in the module's scope)."""
        a = self.kernel.args
        parts = [*(x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.annotation is not None),
                 *a.defaults, *(d for d in a.kw_defaults if d is not None), *self.kernel.decorator_list]
        if self.kernel.returns is not None:
            parts.append(self.kernel.returns)
        return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}

    def decoys(self) -> list[str]:
        """Module globals named as the kernel's parameters and locals (a function's own names shadow
        its module's, as in Python), but not as names a module-level helper reads from its module,
        nor as names the kernel's signature or decorators read (annotations and defaults are
        evaluated in the module, where a decoy is found, as a .spk module's constant would be: a
        mutant's ``M: BK`` read the decoy ``BK = (3, 5)``, which the .spk text does not have),
        nor as language names (a module global shadows those, a mutant may use one as a local)."""
        kernel_names = {a.arg for a in self.kernel.args.args} | {
            n.id for n in ast.walk(self.kernel) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        read_by_helpers: set[str] = set()
        for f in self.tree.body:
            if isinstance(f, ast.FunctionDef) and f is not self.kernel:
                read_by_helpers |= {n.id for n in ast.walk(f) if isinstance(n, ast.Name)}
        skip = {"k", *(f.name for f in ast.walk(self.tree) if isinstance(f, ast.FunctionDef))}
        skip |= self.signature_reads()
        skip |= {n for n in kernel_names if n in NOT_IMPORTABLE or hasattr(sp, n)}  # a global would shadow it
        out = []
        for name in sorted(kernel_names - read_by_helpers - skip - self.introduced):
            if self.r.random() < 0.3:
                value = self.r.choice((99, -7, 2.5, (3, 5), 0))
                out.append(f"{name} = {value!r}")
        if out:
            self.choices.append(f"decoys: {out}")
        return out

    def qualify_other(self, other: list[ast.FunctionDef], module: str) -> None:
        """Calls of the second module's helpers as ``HM.name(...)`` (a captured module's attribute)."""
        names = {f.name for f in other}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                node.func = ast.Attribute(ast.Name("HM", ast.Load()), node.func.id, ast.Load())

    def decorator(self, helper: bool = False) -> ast.expr:
        kernel_deco = self.kernel.decorator_list[0]
        options = kernel_deco.keywords if isinstance(kernel_deco, ast.Call) and not helper else []
        base = self.r.choice(("sp.jit", "spx.jit", "sp.kernel", "jit"))
        if base == "jit":
            self.imports.add("from sparsile import jit")
        func = ast.parse(base, mode="eval").body
        if options or self.r.random() < 0.3:
            return ast.Call(func, [], options)
        return func

    # -- the module -------------------------------------------------------------------------------------
    def render(self) -> JitProgram:
        self.typed_literals()
        if self.respell:
            self.respell_methods()
            self.respell_casts()
        self.spell_names()
        defaults = self.constexpr_defaults()
        decoys = self.decoys()
        mine, other, closure = self.place_helpers()
        self.capture_literals()
        deco = self.decorator()
        late = self.placement == "module" and self.r.random() < 0.3  # `k = sp.jit(k)` after the def
        self.kernel.decorator_list = [] if late else [deco]
        self.kernel.name = "k"
        helper_module = f"jitprog_helpers_{next(_counter)}"
        head = ["from __future__ import annotations"] if self.future else []
        head += ["import sparsile as sp", "import sparsile as spx", *sorted(self.imports)]
        other_text = ""
        if other:
            if self.r.random() < 0.5:
                head.append(f"import {helper_module} as HM")
                self.qualify_other(other, helper_module)
            else:
                head.append(f"from {helper_module} import {', '.join(f.name for f in other)}")
            other_text = "\n".join(["import sparsile as sp", "import sparsile as spx", *sorted(self.imports),
                                    *decoys, *self.typed_globals, *self.helper_globals, "",
                                    *(ast.unparse(f) + "\n" for f in other)])
        body = [*head, *decoys, *self.typed_globals, *self.globals, *self.helper_globals, ""]
        body += [ast.unparse(f) + "\n" for f in mine]
        kern = ast.unparse(self.kernel)
        if self.placement == "module":
            body.append(kern)
            if late:
                self.choices.append("k = jit(k)")
                body.append(f"\nk = {ast.unparse(deco)}(k)")
        elif self.placement == "factory":
            helpers = [ln for f in closure for ln in ast.unparse(f).splitlines()]
            inner = "\n".join("    " + line for line in [*self.closure, *helpers, *kern.splitlines(), "return k"])
            body += ["def make():", inner, "", "k = make()"]
        else:
            lines = kern.splitlines()
            stat = self.r.randint(0, 1)  # @staticmethod above or below @jit
            lines.insert(stat, "@staticmethod")
            body += ["class Holder:", *("    " + ln for ln in lines), "", "k = Holder.k"]
        self.choices.append(f"helper module: {helper_module}" if other else "")
        return JitProgram("\n".join(body) + "\n", other_text, helper_module if other else "", defaults,
                          [c for c in self.choices if c])


def render(source: str, consts: dict[str, Any], seed: int, shape: tuple[int, ...] | None = None,
           respell: bool = True) -> JitProgram:
    """The ``.spk`` program ``source`` (its constexpr values ``consts``; ``shape``: the shape of its
    mask ``m`` if it has one) as a ``@jit`` module, with choices drawn from ``seed``. ``respell``:
    conversions and methods written in their other forms too (equivalent for values; a mutant may
    apply them to something else, which each form reports in its own words)."""
    return _Renderer(source, consts, shape, seed, respell).render()


def load_jit(jp: JitProgram, folder: Path) -> Any:
    """The kernel ``k`` of the rendered module, written to ``folder`` and imported (so that
    ``inspect.getsource`` reads it)."""
    uid = next(_counter)
    name = f"jitprog_{uid}"
    path = folder / f"{name}.py"
    path.write_text(jp.text)
    if jp.helper_module:
        (folder / f"{jp.helper_module}.py").write_text(jp.helper_text)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module.k
