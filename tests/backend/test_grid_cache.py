"""The launch paths remember the last grid they checked (backend/runtime/launcher.py, driver/prepared.py,
the fast path of driver/fast_launch.py), so that a launch with the same grid skips the check. A grid
that only compares equal to the remembered one is not it: ``(4.0,) == (4,)``, and so do a numpy
float, a one-element numpy array or a torch scalar tensor. Each was launched with the remembered
grid where a first launch with it is SP0710, and a numpy array of several elements was numpy's
ValueError ("truth value ... is ambiguous"). ``kernel[None]`` and a grid function returning None
on the fast path launched the grid of the call that filed the entry (None is the prepared grid of
``PreparedLaunch.run``). Each is now the SP0710 of a first launch, nothing launched; integer grids
(numpy's and torch's integer scalars among them, as before) still launch. On the fake device of
test_prepared.py and the emulated GPU of test_runtime.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import arrays, vadd
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)
from sparsile.tests.backend.test_runtime import VADD, EmulatedGpu, make_launcher

torch = pytest.importorskip("torch")

NOT_INTEGERS = {
    "float": (4.0,), "numpy float": (np.float64(4),), "one-element array": (np.array([4]),),
    "torch scalar": (torch.tensor(4),), "two-element array": (np.array([4, 5]),), "list of a float": [4.0],
    "int then float": (4, 1.0), "a nested tuple": ((4,),),
}
INTEGERS = {"int": (4,), "numpy int": (np.int64(4),), "bare int": 4, "list": [4]}


def _refused(launch: Any) -> LaunchError:
    with pytest.raises(LaunchError) as exc:
        launch()
    assert exc.value.code == "SP0710"
    return exc.value


@pytest.mark.parametrize("first", [(4,), 4, [4], (np.int64(4),)])
@pytest.mark.parametrize("name", NOT_INTEGERS)
def test_the_launcher_checks_a_grid_equal_to_the_last_one(monkeypatch: pytest.MonkeyPatch, first: Any,
                                                          name: str) -> None:
    emulated = EmulatedGpu(monkeypatch)
    launcher = make_launcher(emulated, VADD, [8, 8, 8, 4])
    launcher(first, (0x10, 0x20, 0x30, 300))
    grid = NOT_INTEGERS[name]
    _refused(lambda: launcher(grid, (0x10, 0x20, 0x30, 300)))
    _refused(lambda: launcher(lambda meta: grid, (0x10, 0x20, 0x30, 300)))  # a grid function's
    assert len(emulated.launches) == 1


@pytest.mark.parametrize("name", INTEGERS)
def test_the_launcher_still_launches_integer_grids(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    emulated = EmulatedGpu(monkeypatch)
    launcher = make_launcher(emulated, VADD, [8, 8, 8, 4])
    for _ in range(2):  # the second: the remembered grid
        launcher(INTEGERS[name], (0x10, 0x20, 0x30, 300))
    launcher((4,), (0x10, 0x20, 0x30, 300))
    assert [r["grid"] for r in emulated.launches] == [(4, 1, 1)] * 3


@pytest.mark.parametrize("first", [(4,), (np.int64(4),)])
@pytest.mark.parametrize("name", [*NOT_INTEGERS, "None"])
def test_the_fast_path_checks_its_grid(gpu: Any, first: Any, name: str) -> None:
    """``kernel[grid](...)`` after a call of the same arguments (its fast entry, whose prepared
    launch remembers that call's grid): the grid is checked as on the full path."""
    grid = None if name == "None" else NOT_INTEGERS[name]
    k = vadd()
    x, y, out = arrays()
    k[first](x, y, out, 1024, BLOCK=256)
    full = _refused(lambda: vadd()[grid](x, y, out, 1024, BLOCK=256))  # a fresh kernel: the full path
    fast = _refused(lambda: k[grid](x, y, out, 1024, BLOCK=256))
    assert str(fast) == str(full)
    _refused(lambda: k[lambda meta: grid](x, y, out, 1024, BLOCK=256))
    assert len(gpu.launches) == 1


@pytest.mark.parametrize("name", NOT_INTEGERS)
def test_a_prepared_launch_checks_its_grid(gpu: Any, name: str) -> None:
    x, y, out = arrays()
    launch = vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256)
    _refused(lambda: launch(x, y, out, 1024, grid=NOT_INTEGERS[name]))
    launch(x, y, out, 1024, grid=(np.int64(4),))
    launch(x, y, out, 1024)  # None: the prepared grid (driver/prepared.py)
    assert [r["grid"] for r in gpu.launches] == [(4, 1, 1)] * 2


def test_a_list_grid_changed_in_place_is_read_again(gpu: Any) -> None:
    """A list is no grid to remember (the launcher remembers ints and tuples of ints only): the
    prepared launch and the fast path remembered the list itself, so a list changed in place after a
    launch compared equal to itself and launched the old dimensions (4 blocks for 8: half the
    output never written), or a negative one."""
    dims = [4]
    k = vadd()
    x, y, out = arrays(n=2048)
    launch = k[dims]
    launch(x, y, out, 1024, BLOCK=256)  # the full path: files the fast entry
    dims[0] = 8
    launch(x, y, out, 2048, BLOCK=256)  # the fast path
    dims[0] = -1
    _refused(lambda: launch(x, y, out, 2048, BLOCK=256))
    per_call = [2]
    prepared = vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256)
    prepared(x, y, out, 512, grid=per_call)
    per_call[0] = 3
    prepared(x, y, out, 768, grid=per_call)
    assert [r["grid"] for r in gpu.launches] == [(4, 1, 1), (8, 1, 1), (2, 1, 1), (3, 1, 1)]
