"""Where a kernel folds a captured value through its class's own Python code (``if cfg:`` with a
``__bool__``, ``cfg == 1`` with an ``__eq__``, ``len(cfg)``, ``float(cfg)``, ``1 in cfg``, ``-cfg``,
``str(cfg)``), what that code returned is part of every compile cache key, and it runs again at
every check in the process (docs/language.md, "What a kernel captures").

History: a captured frozen dataclass (an enum member, a subclass of ``int``) was keyed by its
fields (its value) and its class's name, not by its class's code: two processes whose ``Cfg`` had
another ``__bool__`` shared one compile cache entry, and the second ran the first's PTX, silently;
in one process, a method reassigned on the class (or a module global the method reads, changed)
kept the kernel's old code. A constant of a subclass of ``int`` or ``float`` reached the IR through
its own ``__int__`` / ``__float__``, while its key holds its plain value.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.class_code import own_code, runs_own_code
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)

CLASS = '''
import dataclasses
import enum

THRESHOLD = 0


@dataclasses.dataclass(frozen=True)
class Cfg:
    a: int

    def {name}(self{args}):
        {body}


class Mode(enum.Enum):
    FAST = 1

    def {name}(self{args}):
        {body}
'''

FACTORY = '''
import sparsile as sp


def make(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        c = {expr}
        sp.store(out + i, sp.load(x + i) * c)

    return k
'''

# (method, its parameters, its body in one code and in another, the kernel's use of `v`, the scales)
CASES = [
    ("__bool__", "", "return THRESHOLD < 1", "return THRESHOLD > 1", "2.0 if v else 3.0", 2.0, 3.0),
    ("__eq__", ", other", "return other == 1", "return other == 2", "2.0 if v == 1 else 3.0", 2.0, 3.0),
    ("__lt__", ", other", "return other > 0", "return other < 0", "2.0 if v < 5 else 3.0", 2.0, 3.0),
    ("__len__", "", "return 1", "return 2", "float(len(v))", 1.0, 2.0),
    ("__contains__", ", other", "return other == 1", "return other == 2", "2.0 if 1 in v else 3.0", 2.0, 3.0),
    ("__float__", "", "return 1.5", "return 2.5", "float(v)", 1.5, 2.5),
    ("__int__", "", "return 2", "return 3", "float(int(v))", 2.0, 3.0),
    ("__neg__", "", "return 1.5", "return 2.5", "-v", 1.5, 2.5),
    ("__add__", ", other", "return other + 1.0", "return other - 1.0", "v + 1.5", 2.5, 0.5),
    ("__str__", "", "return 'fast'", "return 'slow'", "2.0 if str(v) == 'fast' else 3.0", 2.0, 3.0),
    ("__iter__", "", "return iter((1.5,))", "return iter((2.5,))", "tuple(v)[0]", 1.5, 2.5),
]
IDS = [c[0].strip("_") for c in CASES]


def user_module(text: str, folder: Path, file: str) -> ModuleType:
    """``text`` imported as the module ``user_cfg`` (from ``file`` in ``folder``): two such modules
    stand for one module of two processes, its classes of one qualified name."""
    path = folder / file
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("user_cfg", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def class_module(folder: Path, file: str, name: str, args: str, body: str) -> ModuleType:
    """:data:`CLASS` whose ``Cfg`` and ``Mode`` define the method ``name`` as ``body``, as ``user_cfg``."""
    return user_module(CLASS.format(name=name, args=args, body=body), folder, file)


def value_of(module: ModuleType, kind: str) -> object:
    """The captured value of ``kind``: a frozen dataclass instance or an enum member."""
    return module.Cfg(1) if kind == "dataclass" else module.Mode.FAST


@pytest.mark.parametrize("kind", ["dataclass", "enum"])
@pytest.mark.parametrize(("name", "args", "first", "second", "expr", "s1", "s2"), CASES, ids=IDS)
def test_a_method_reassigned_on_the_class_recompiles(tmp_path, kind, name, args, first, second, expr, s1,
                                                      s2) -> None:
    one = class_module(tmp_path, "one.py", name, args, first)
    other = class_module(tmp_path, "other.py", name, args, second)
    kernel = import_source(FACTORY.format(expr=expr), tmp_path, "class_code").make(value_of(one, kind))
    scales_x(kernel, s1)
    cls = type(value_of(one, kind))
    original = vars(cls)[name]
    setattr(cls, name, vars(type(value_of(other, kind)))[name])  # the method edited in place
    scales_x(kernel, s2)
    setattr(cls, name, original)  # and back
    scales_x(kernel, s1)


@pytest.mark.parametrize("kind", ["dataclass", "enum"])
@pytest.mark.parametrize(("name", "args", "first", "second", "expr", "s1", "s2"), CASES, ids=IDS)
def test_two_codes_of_one_class_key_the_compile_cache_apart(tmp_path, fresh_cache, kind, name, args, first, second,
                                                            expr, s1, s2) -> None:
    factory = import_source(FACTORY.format(expr=expr), tmp_path, "class_code_disk")
    kernels = []
    for file, body, scale in (("one.py", first, s1), ("other.py", second, s2)):
        kernels.append(factory.make(value_of(class_module(tmp_path, file, name, args, body), kind)))
        scales_x(kernels[-1], scale)
    assert len(distinct_cached_ptx(kernels)) == 2  # (each checked against an uncached compile)


def test_a_module_global_the_method_reads_is_keyed_by_what_the_method_returned(tmp_path, fresh_cache) -> None:
    name, args, body, _, expr, s_true, s_false = CASES[0]  # `THRESHOLD < 1`
    one = class_module(tmp_path, "one.py", name, args, body)
    factory = import_source(FACTORY.format(expr=expr), tmp_path, "class_code_global")
    kernel = factory.make(one.Cfg(1))
    scales_x(kernel, s_true)
    one.THRESHOLD = 5  # read by `__bool__` only, not by the kernel
    scales_x(kernel, s_false)
    other = class_module(tmp_path, "other.py", name, args, body)
    other.THRESHOLD = 5
    assert len(distinct_cached_ptx([factory.make(one.Cfg(1)), factory.make(other.Cfg(1))])) == 1
    one.THRESHOLD = 0
    assert len(distinct_cached_ptx([factory.make(one.Cfg(1)), factory.make(other.Cfg(1))])) == 2


def test_a_method_that_fails_after_an_edit_is_reported_at_the_next_launch(tmp_path) -> None:
    one = class_module(tmp_path, "one.py", "__float__", "", "return 1.5")
    kernel = import_source(FACTORY.format(expr="float(v)"), tmp_path, "class_code_fails").make(one.Cfg(1))
    scales_x(kernel, 1.5)

    def broken(self):
        raise RuntimeError("no value")

    one.Cfg.__float__ = broken
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        kernel.interpret[(1,)](np.ones(8, np.float32), out)
    assert np.isnan(out).all()
    assert info.value.diagnostics[0].code == "SP0331"
    assert "no value" in info.value.diagnostics[0].message


CONSTEXPR = '''
import sparsile as sp


@sp.jit
def k(x, out, N: sp.constexpr):
    i = sp.arange(0, 8)
    c = 2.0 if N == 4 else 3.0
    sp.store(out + i, sp.load(x + i) * c)
'''

SIZE = '''
class Size(int):
    def __eq__(self, other):
        return {body}

    __hash__ = int.__hash__
'''


def test_a_constexpr_argument_of_a_class_with_its_own_eq_is_keyed_by_what_it_gave(tmp_path, fresh_cache) -> None:
    kernel = import_source(CONSTEXPR, tmp_path, "class_code_constexpr").k
    x = np.random.default_rng(58).uniform(-4.0, 4.0, 8).astype(np.float32)

    def scale_of(n: object) -> float:
        out = np.full(8, np.nan, np.float32)
        kernel.interpret[(1,)](x, out, n)
        return float(out[0] / x[0])

    same = user_module(SIZE.format(body="int(self) == other"), tmp_path, "same.py").Size
    flipped = user_module(SIZE.format(body="int(self) != other"), tmp_path, "flipped.py").Size
    assert scale_of(same(4)) == 2.0
    assert scale_of(flipped(4)) == 3.0  # (one class name, one plain value: one specialization key)
    ptx = []
    for size in (same, flipped):
        signature = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "N": size(4)}
        ptx.append(kernel.compile(signature, stop_after="ptx").ptx)
        assert ptx[-1] == kernel.compile(signature, stop_after="ptx", cache=False).ptx
    assert ptx[0] != ptx[1]
    original = same.__eq__
    same.__eq__ = flipped.__eq__  # in place
    assert scale_of(same(4)) == 3.0
    same.__eq__ = original
    assert scale_of(same(4)) == 2.0


CELL = '''
import enum


class Mode(enum.Enum):
    FAST = 1

    def __bool__(self):
        return {truth}


T = (Mode.FAST, 1)
V = Mode.FAST
'''

CELL_KERNEL = '''
import sparsile as sp


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * (2.0 if {use} else 3.0))
'''


@pytest.mark.parametrize("use", ["T[0]", "V"])
def test_a_class_defined_again_with_other_code_recompiles(tmp_path, use) -> None:
    """A notebook cell run again: a new `Mode` of one qualified name, whose members have the
    fingerprints of the old ones, yet another `__bool__` (in a tuple, the old member's code ran)."""
    module = import_source(CELL.format(truth="True") + CELL_KERNEL.format(use=use), tmp_path, "class_code_cell")
    scales_x(module.k, 2.0)
    exec(CELL.format(truth="False"), vars(module))
    scales_x(module.k, 3.0)


SPK = """
@kernel
def k(x: ptr[f32], out: ptr[f32], N: constexpr):
    i = arange(0, 8)
    c = 2.0 if N == 4 else 3.0
    store(out + i, load(x + i) * c)
"""


def test_a_spk_kernel_given_a_constexpr_of_a_class_with_its_own_eq_keys_what_it_gave(tmp_path, fresh_cache) -> None:
    """A `.spk` kernel captures nothing from Python, and its disk key held no captures: a constexpr
    whose class's `__eq__` changed found the old entry."""
    kernel = sp.loads(SPK, "class_code.spk").k
    same = user_module(SIZE.format(body="int(self) == other"), tmp_path, "same.py").Size
    flipped = user_module(SIZE.format(body="int(self) != other"), tmp_path, "flipped.py").Size
    ptx = []
    for size in (same, flipped):
        signature = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "N": size(4)}
        ptx.append(kernel.compile(signature, stop_after="ptx").ptx)
        assert ptx[-1] == kernel.compile(signature, stop_after="ptx", cache=False).ptx
    assert ptx[0] != ptx[1]
    plain = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "N": 4}
    assert kernel.compile(plain, stop_after="ptx").ptx == ptx[0]


GIVES = '''
import dataclasses

import sparsile as sp


class Plain:
    scale = 2.0


@dataclasses.dataclass(frozen=True)
class Cfg:
    a: int

    def __add__(self, other):
        return Plain()


V = Cfg(1)


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * (V + 1).scale)
'''


def test_a_fold_of_a_class_s_own_code_that_gives_an_object_no_key_holds_is_sp0254(tmp_path) -> None:
    module = import_source(GIVES, tmp_path, "class_code_gives")
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](np.ones(8, np.float32), out)
    assert np.isnan(out).all()
    d = info.value.diagnostics[0]
    assert d.code == "SP0254"
    assert d.message == "`+` gives a Python object of type `Plain`, which the compile cache cannot key"
    line = GIVES.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:].startswith("V + 1)")
    assert "read the attributes it needs" in d.help


def test_which_classes_have_code_of_their_own() -> None:
    import dataclasses
    import enum
    import types
    from decimal import Decimal
    from fractions import Fraction
    from typing import NamedTuple

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: int

        @property
        def twice(self) -> int:  # (an attribute read: keyed by what it gives)
            return 2 * self.a

        def method(self) -> int:
            return self.a

    class Pair(NamedTuple):
        a: int

    class Mode(enum.Enum):
        FAST = 1

    class Level(enum.IntEnum):
        LOW = 1

    class Perm(enum.Flag):
        R = 1

    class Size(int):
        pass

    for plain in (int, Size, Frozen, Pair, Mode, Level, Perm, types.SimpleNamespace, Fraction, Decimal, np.float32):
        assert not own_code(plain), plain

    class Truthy(Frozen):
        def __bool__(self) -> bool:
            return False

    class Called:
        def __call__(self, *args: object) -> bool:
            return True

    class Partial(int):
        __eq__ = Called()

    class Shouting(enum.Enum):
        FAST = 1
        __str__ = staticmethod(lambda: "FAST")

    for own in (Truthy, Partial, Shouting):
        assert own_code(own), own
    assert runs_own_code([(1, Frozen(1)), types.SimpleNamespace(a=[Truthy(1)])])
    assert not runs_own_code([(1, Frozen(1)), types.SimpleNamespace(a=[Frozen(1)]), Mode.FAST])


SUBCLASS = '''
class Size(int):
    def __int__(self):
        return 7

    def __index__(self):
        return 7


class Scale(float):
    def __float__(self):
        return 7.0
'''


@pytest.mark.parametrize("expr", ["v", "sp.f32(v)", "sp.f32(sp.i32(v))", "v / 1", "v // 1", "v % 5"])
@pytest.mark.parametrize("value", ["Size(2)", "Scale(2.0)"])
def test_a_subclass_of_int_or_float_reaches_the_code_as_its_plain_value(tmp_path, fresh_cache, value, expr) -> None:
    """Its key holds 2 (fingerprints._PLAIN), and so does its code: the language's conversions and
    its own `/`, `//` and `%` of integers (C's) read the plain value (they called its `__float__` /
    `__int__`, 7, which no key held; Python's `Size(2) / 1` is 2.0 too)."""
    module = user_module(SUBCLASS, tmp_path, "numbers.py")
    factory = import_source(FACTORY.format(expr=expr), tmp_path, "plain_number")
    kernel = factory.make(eval(value, vars(module)))
    scales_x(kernel, 2.0)
    assert len(distinct_cached_ptx([kernel, factory.make(2.0)])) == 1


CHILD = '''
import os
import sys

sys.path.insert(0, os.environ["USER_DIR"])

import sparsile as sp
from sparsile.driver import cache
from user_cfg import Cfg

V = Cfg(1)


@sp.jit
def k(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * (2.0 if V else 3.0))


ptx = k.compile({"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}, stop_after="ptx").ptx
stats = cache.default_cache().stats
print("hits", stats.disk_hits, "misses", stats.misses)
print(ptx)
'''


def test_a_new_process_with_another_method_compiles_anew(tmp_path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(sp.__file__).resolve().parents[1]

    def child(body: str) -> tuple[str, str]:
        folder = tmp_path / "user"
        folder.mkdir(exist_ok=True)
        (folder / "user_cfg.py").write_text(CLASS.format(name="__bool__", args="", body=body))
        env = {**os.environ, "USER_DIR": str(folder), "SPARSILE_CACHE_DIR": str(tmp_path / "cache"),
               "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        stats, _, ptx = done.stdout.partition("\n")
        return stats, ptx

    first = child("return self.a > 0")
    assert first[0] == "hits 0 misses 1"
    other = child("return self.a < 0")
    assert other[0] == "hits 0 misses 1" and other[1] != first[1]
    assert child("return self.a > 0") == ("hits 1 misses 0", first[1])
