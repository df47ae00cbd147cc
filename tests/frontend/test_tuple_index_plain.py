"""A constant tuple indexed by a captured value: a subclass of ``int`` by its plain value (its key),
not through its own comparisons; an object that is no integer is SP0333 in words that say so.

History: the bounds check ``-len(seq) <= i < len(seq)`` ran a ``class Size(int)``'s own ``__le__`` /
``__lt__`` (which no key holds); one that said yes to an index out of range let ``seq[i]`` raise an
internal IndexError. An index of another type (a dataclass instance with an ``__index__``) was
"index Cfg(a=1) is out of range for a tuple of 3".
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import dataclasses

import sparsile as sp


class Size(int):
    def __le__(self, other):
        return True

    def __lt__(self, other):
        return True


@dataclasses.dataclass(frozen=True)
class Cfg:
    a: int

    def __index__(self):
        return 1


def make(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        c = (1.5, 2.5, 3.5)[v]
        sp.store(out + i, sp.load(x + i) * c)

    return k
'''


def compile_error(tmp_path, make_value: str) -> sp.CompileError:
    module = import_source(SOURCE, tmp_path, "tuple_index")
    kernel = module.make(eval(make_value, vars(module)))
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        kernel.interpret[(1,)](np.ones(8, np.float32), out)
    assert np.isnan(out).all()
    return info.value


def test_an_int_subclass_index_out_of_range_is_sp0333(tmp_path) -> None:
    d = compile_error(tmp_path, "Size(5)").diagnostics[0]
    assert d.code == "SP0333" and d.message == "index 5 is out of range for a tuple of 3"
    assert (d.span.file_line, d.span.file_col) == (27, 29)  # (the `v` of `c = (1.5, 2.5, 3.5)[v]`)


def test_an_int_subclass_index_in_range_reads_its_element(tmp_path) -> None:
    module = import_source(SOURCE, tmp_path, "tuple_index")
    kernel = module.make(module.Size(2))
    x = np.random.default_rng(58).uniform(-4.0, 4.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    kernel.interpret[(1,)](x, out)
    np.testing.assert_array_equal(out, x * np.float32(3.5))


def test_an_index_of_another_type_is_sp0333(tmp_path) -> None:
    d = compile_error(tmp_path, "Cfg(1)").diagnostics[0]
    assert d.code == "SP0333" and d.message == "a tuple index must be an integer constant, found Cfg(a=1)"
    assert (d.span.file_line, d.span.file_col) == (27, 29)  # (the `v` of `c = (1.5, 2.5, 3.5)[v]`)
