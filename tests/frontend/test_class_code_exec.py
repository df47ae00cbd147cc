"""A special method compiled from text (``exec``, whose code's file is ``"<string>"``: a class a
factory writes, a notebook's generated code) is a user's code like any other: a kernel folding it
keys what it gave and runs it again at every launch check (frontend/sema/class_code.py).

History: class_code took every function of file ``"<string>"`` for one ``@dataclass`` wrote, so
such a ``__float__`` reading a module global was keyed by the object's fields only: the global
changed, the kernel kept the old scale (silently, in the process and through the disk cache); so was
a class ``exec``ed without ``__name__``, whose ``__module__`` is "builtins" (a trusted module). The
functions ``@dataclass`` writes are told apart by the code it compiles them in (``__create_fn__``).
"""

from __future__ import annotations

import dataclasses

import pytest

from sparsile.frontend.sema.class_code import own_code
from sparsile.tests.support.capture_cache import scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import dataclasses

import sparsile as sp

SCALE = [1.5]
_namespace = {"SCALE": SCALE, NAME}
exec(
    "class Cfg:\\n"
    "    a: int\\n"
    "\\n"
    "    def __float__(self):\\n"
    "        return SCALE[0]\\n",
    _namespace,
)
Cfg = dataclasses.dataclass(frozen=True)(_namespace["Cfg"])


def make(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * float(v))

    return k
'''


@pytest.mark.parametrize("name", ['"__name__": __name__', ""], ids=["module_name", "no_name"])
def test_a_method_compiled_from_text_is_keyed(tmp_path, name: str) -> None:
    """Without ``__name__`` in the namespace, the class's ``__module__`` is "builtins"."""
    module = import_source(SOURCE.replace("NAME", name), tmp_path, "class_code_exec")
    assert module.Cfg.__module__ == ("builtins" if not name else module.__name__)
    assert vars(module.Cfg)["__float__"].__code__.co_filename == "<string>"
    assert own_code(module.Cfg)
    kernel = module.make(module.Cfg(1))
    scales_x(kernel, 1.5)
    module.SCALE[0] = 2.5  # what the method reads changed: the launch check sees another result
    scales_x(kernel, 2.5)


def test_the_methods_dataclass_writes_are_not_a_users() -> None:
    @dataclasses.dataclass(frozen=True, order=True)
    class Plain:
        a: int

    assert vars(Plain)["__eq__"].__code__.co_filename == "<string>"
    assert not own_code(Plain)
