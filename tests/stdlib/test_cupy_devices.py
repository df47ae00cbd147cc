"""cupy arrays on another GPU than cupy's current one: what the sparse kernels' helpers and the GPU
sparsity toolkit make or compute for them lives on *their* device, as the launches that read them
run there (docs/language.md, "Specialization and launching"). cupy creates and computes on its
current device (0 unless the program chose another), and refuses, without peer access, an
operation on an array of another device: tests/support/fake_cupy.py stands in for it, as strict.
Before, a cupy weight on cuda:1 got its padded copy, scratch and outputs on cuda:0: its launch
mixed devices (SP0707), or cupy refused the cast."""

from __future__ import annotations

import types

import numpy as np
import pytest

from sparsile.backend.runtime import devices
from sparsile.stdlib.kernels import arrays, decode, gemm_choice, sparsity_gpu
from sparsile.tests.support import fake_cupy


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch):
    return fake_cupy.install(monkeypatch)


def _device(x: object) -> int:
    assert isinstance(x, fake_cupy.ndarray), type(x)
    return x.device.id


def test_the_fake_is_as_strict_as_cupy(cupy) -> None:
    x = fake_cupy.on(1, np.ones((2, 3), np.float32))
    with pytest.raises(fake_cupy.PeerAccessError):
        x.astype(np.float16)  # cupy's current device is 0
    with x.device:
        assert _device(x.astype(np.float16)) == 1 and _device(cupy.zeros((2,))) == 1
    assert fake_cupy.CURRENT == [0]


def test_kernel_helpers_make_arrays_on_the_device_of_the_cupy_array(cupy) -> None:
    x = fake_cupy.on(1, np.arange(12, dtype=np.float16).reshape(3, 4))
    padded = arrays.pad_columns(x, 8)  # zero columns: a new array
    assert _device(padded) == 1 and padded.shape == (3, 8)
    assert np.array_equal(padded._a[:, :4], x._a) and not padded._a[:, 4:].any()
    assert _device(arrays.pad_columns(x[:, :2], 2)) == 1  # a strided slice: a contiguous copy
    words = fake_cupy.on(1, np.arange(8, dtype=np.int32).reshape(4, 2))
    assert _device(arrays.as_u32_words(words.transpose(1, 0))) == 1  # a copy of the transposed words
    wide = fake_cupy.on(1, np.ones((2, 4), np.float32))
    cast = arrays.cast_operand(wide, gemm_choice.KERNELS["f16"], "b")
    assert _device(cast) == 1 and cast.dtype == np.float16
    zeros = arrays.zeros_array(x, (2, 5), "float32", False)
    assert _device(zeros) == 1 and not zeros._a.any()
    out = fake_cupy.on(1, np.full((2, 2), 7, np.float16))
    assert arrays.deliver_result(np.ones((2, 2), np.float16), out, x) is out and (out._a == 1).all()
    grown = decode.padded_to(words, 8, 4, fill=5)
    assert _device(grown) == 1 and grown.shape == (8, 4) and (grown._a[4:] == 5).all()
    tiled = decode.tile_for_decode(fake_cupy.on(1, np.arange(32, dtype=np.float16).reshape(4, 8)), 2, 4)
    assert _device(tiled) == 1 and tiled.shape == (8, 4)
    assert fake_cupy.CURRENT == [0]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[int]]]:
    """The GPU sparsity kernels' launches, faked: (kernel, the devices of its array arguments)."""
    seen: list[tuple[str, list[int]]] = []

    def launch(name, grid, interpret, *args, **constexprs):
        seen.append((name, [a.device.id for a in args if isinstance(a, fake_cupy.ndarray)]))

    class Transposable:  # (prune_transposable_gpu launches its kernel itself)
        def __getitem__(self, grid):
            return lambda *args, **constexprs: launch("prune_transposable", grid, False, *args)

    monkeypatch.setattr(devices, "_has_gpu", True)
    monkeypatch.setattr(sparsity_gpu, "_launch", launch)
    monkeypatch.setattr(sparsity_gpu, "transposable_module",
                        lambda: types.SimpleNamespace(prune_transposable=Transposable()))
    return seen


def test_the_gpu_sparsity_toolkit_works_where_the_cupy_weight_lives(cupy, launches) -> None:
    w = fake_cupy.on(1, np.random.default_rng(0).standard_normal((16, 6)).astype(np.float32))  # K padded to 8
    values, meta = sparsity_gpu.compress_gpu(w, "f16", "sm90")
    assert _device(values) == 1 and _device(meta.data) == 1
    pruned = sparsity_gpu.prune_gpu(w, "f16")
    assert _device(pruned) == 1
    dense = sparsity_gpu.decompress_gpu(values, meta)  # validates the words first (a count summed)
    assert _device(dense) == 1
    checked = sparsity_gpu.validate_metadata_gpu(meta.data, "sm90", "f16", 16, 6)
    assert _device(checked.data) == 1
    assert _device(sparsity_gpu.prune_transposable_gpu(fake_cupy.on(1, np.ones((8, 8), np.float16)))) == 1
    names = [name for name, _ in launches]
    assert names == ["prune_compress", "prune_dense", "validate", "decompress", "validate", "prune_transposable"]
    assert all(devs and set(devs) == {1} for _, devs in launches), launches
    assert fake_cupy.CURRENT == [0]


def test_a_cupy_operand_cast_to_an_integer_type_refuses_what_it_cannot_hold(cupy) -> None:
    """cast_operand casts a cupy b by the host's rules, as numpy and torch operands (sparse-metadata.md:
    s8 refuses values beyond its range, SP0804); a plain ``astype`` wrapped 300 to 44 silently."""
    from sparsile.stdlib.sparsity import SparsityError

    b = fake_cupy.on(1, np.array([[1.0, 300.0, -2.5, 7.9]], np.float32))
    with pytest.raises(SparsityError) as exc:
        arrays.cast_operand(b, gemm_choice.KERNELS["s8"], "b")
    assert exc.value.code == "SP0804" and "b" in str(exc.value)
    fits = arrays.cast_operand(fake_cupy.on(1, np.array([[1.0, -128.0, -2.5, 7.9]], np.float32)),
                               gemm_choice.KERNELS["s8"], "b")
    assert _device(fits) == 1 and fits._a.tolist() == [[1, -128, -2, 7]]  # truncated, as the host
    assert fake_cupy.CURRENT == [0]


def test_fill_writes_a_cupy_array_on_its_own_device(cupy) -> None:
    """An empty K's C = 0 (sparse_matmul, sparse_matmul_tuned) is written with arrays.fill: a plain
    ``out[...] = 0`` on a cupy out of another device than cupy's current one is refused."""
    out = fake_cupy.on(1, np.full((2, 3), 7, np.float16))
    with pytest.raises(fake_cupy.PeerAccessError):
        out[...] = 0
    arrays.fill(out, 0)
    assert not out._a.any() and fake_cupy.CURRENT == [0]
