"""A grid function that looks up a name the call does not have (``meta["N"]`` for a kernel whose
argument is ``n``) is LaunchError SP0710 naming the key and listing what the function is given, on
every launch path: ``kernel.interpret[grid]``, ``kernel[grid]``'s full and fast paths, ``prepare``
and the runtime launcher itself (docs/diagnostics.md, SP0710). The user's KeyError is its cause;
any other exception of the grid function (a KeyError for a name it *was* given among them) is the
user's own and passes through untouched. GPU paths on the fake device of test_prepared.py."""

from __future__ import annotations

import traceback
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import arrays, vadd
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)

GIVEN = "the grid function is given `x`, `y`, `out`, `n`, `BLOCK`"


def bad_grid(meta: dict[str, Any]) -> tuple[int]:
    return (sp.cdiv(meta["N"], meta["BLOCK_SIZE"]),)


def good_grid(meta: dict[str, Any]) -> tuple[int]:
    return (sp.cdiv(meta["n"], meta["BLOCK"]),)


def check_sp0710(exc: pytest.ExceptionInfo[LaunchError]) -> None:
    assert exc.value.code == "SP0710"
    assert exc.value.message == "the grid function of `vector_add` looks up `N`, which is not an argument of the call"
    assert exc.value.help == f"{GIVEN}; did you mean `n`?"
    cause = exc.value.__cause__
    assert isinstance(cause, KeyError) and cause.args == ("N",)
    frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
    assert frames[-1] == "bad_grid"  # the user's line is in the chained traceback


def host_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = np.ones(1000, np.float32), np.full(1000, 2.0, np.float32)
    return x, y, np.full(1000, np.nan, np.float32)


def test_the_interpreter_names_the_missing_key() -> None:
    with pytest.raises(LaunchError) as exc:
        vadd().interpret[bad_grid](*host_arrays(), 1000, BLOCK=256)
    check_sp0710(exc)


def test_the_full_path_names_the_missing_key(gpu: Any) -> None:
    with pytest.raises(LaunchError) as exc:
        vadd()[bad_grid](*arrays(n=4096), 1000, BLOCK=256)
    check_sp0710(exc)
    assert gpu.launches == []


def test_the_fast_path_names_the_missing_key(gpu: Any) -> None:
    k = vadd()
    x, y, out = arrays(n=4096)
    k[good_grid](x, y, out, 1000, BLOCK=256)  # files the fast entry
    assert k.__dict__["_fast_launches"].entries
    with pytest.raises(LaunchError) as exc:
        k[bad_grid](x, y, out, 1000, BLOCK=256)
    check_sp0710(exc)
    assert len(gpu.launches) == 1


def test_prepare_names_the_missing_key(gpu: Any) -> None:
    with pytest.raises(LaunchError) as exc:
        vadd()[bad_grid].prepare(*arrays(n=4096), 1000, BLOCK=256)
    check_sp0710(exc)


def test_the_runtime_launcher_names_the_missing_key(gpu: Any) -> None:
    k = vadd()
    x, y, out = arrays(n=4096)
    k[(4,)](x, y, out, 1000, BLOCK=256)
    (launcher,) = k.__dict__["_launchers"].values()
    launcher(lambda meta: (meta["n"] // 256,), [x, y, out, 1000])
    assert gpu.launches[-1]["grid"] == (3, 1, 1)
    with pytest.raises(LaunchError) as exc:
        launcher(bad_grid, [x, y, out, 1000])
    assert exc.value.code == "SP0710"
    assert exc.value.message == "the grid function of `vector_add` looks up `N`, which is not an argument of the call"
    assert exc.value.help == f"{GIVEN}; did you mean `n`?"
    assert isinstance(exc.value.__cause__, KeyError)


def test_a_key_without_a_close_name_lists_what_is_given() -> None:
    with pytest.raises(LaunchError) as exc:
        vadd().interpret[lambda meta: (meta["rows"],)](*host_arrays(), 1000, BLOCK=256)
    assert exc.value.code == "SP0710"
    assert exc.value.message == ("the grid function of `vector_add` looks up `rows`, which is not an argument of "
                                 "the call")
    assert exc.value.help == GIVEN


class Bug(Exception):
    pass


def test_other_errors_of_the_grid_function_are_the_users_own(gpu: Any) -> None:
    table: dict[str, int] = {}

    def divides_by_zero(meta: dict[str, Any]) -> tuple[int]:
        return (meta["n"] // 0,)

    def raises_its_own(meta: dict[str, Any]) -> tuple[int]:
        raise Bug("the user's bug")

    def reads_its_own_table(meta: dict[str, Any]) -> tuple[int]:
        return (table["n"],)  # a KeyError for a name the function *is* given: not ours to explain

    k = vadd()
    x, y, out = arrays(n=4096)
    k[good_grid](x, y, out, 1000, BLOCK=256)
    for grid, kind in ((divides_by_zero, ZeroDivisionError), (raises_its_own, Bug), (reads_its_own_table, KeyError)):
        for launch in (k[grid], vadd()[grid], vadd().interpret[grid]):  # fast path, full path, interpreter
            arguments = host_arrays() if launch.__class__.__name__ == "_InterpretLaunch" else (x, y, out)
            with pytest.raises(kind) as exc:
                launch(*arguments, 1000, BLOCK=256)
            assert not isinstance(exc.value, LaunchError)
            assert traceback.extract_tb(exc.value.__traceback__)[-1].name == grid.__name__
        with pytest.raises(kind):
            vadd()[grid].prepare(x, y, out, 1000, BLOCK=256)
