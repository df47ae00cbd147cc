"""A ``SparseLinear`` split over its output features (docs/jax.md, "Several devices"), in one
process: jax rebuilds a layer inside ``shard_map`` or ``pmap`` from the shards of its leaves and the
static fields it flattened, so the same situation is made here with ``tree_unflatten`` and sliced
leaves. A shard of whole 16-row blocks of the sm90 metadata words runs; one that splits a block
(12 of 24 rows: 12 values rows, 16 words rows, shapes a 12-row weight has too) gave wrong numbers
and no error, and is SP0939 now (tests/integrations/test_jax_sharding.py: on two devices)."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear  # noqa: E402
from sparsile.stdlib.kernels import prune_and_compress  # noqa: E402

SHARD_HELP = ("split values, meta, bias and scale_w at a multiple of 16 rows a device, or compress each device's "
              "rows on their own (SparseLinear.from_dense of its slice of the dense weight) and stack those")


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.25, 1.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


class _OldPickle:
    """Pickles as a SparseLinear pickled before out_features existed: the class and its state dict
    (what a frozen dataclass pickles as), without that key."""

    def __init__(self, state: dict[str, Any]):
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return object.__new__, (SparseLinear,), self.state


def _layer(n: int, k: int = 32, dtype: str = "bf16") -> SparseLinear:
    """A layer of n rows with a bias and a scale_w (so every leaf has rows to shard)."""
    base = SparseLinear.from_dense(_rand((n, k), n), dtype, bias=_rand((n,), n + 1))
    return dataclasses.replace(base, scale_w=jnp.asarray(np.abs(_rand((n,), n + 2)) + 0.5))


def _e4m3_layer(n: int, k: int = 64) -> SparseLinear:
    values, meta = prune_and_compress(_rand((n, k), n), "e4m3")
    return SparseLinear(jnp.asarray(values), jnp.asarray(meta.data.view(np.uint32)), in_features=k)


def _shard(layer: SparseLinear, device: int, devices: int) -> SparseLinear:
    """Device ``device``'s rows of ``layer`` split over ``devices`` as shard_map splits every leaf's
    first axis (the words' padded rows too), rebuilt as jax rebuilds it: the layer's static fields."""
    leaves, tree = jax.tree_util.tree_flatten(layer)

    def part(a: Any) -> Any:
        rows = a.shape[0] // devices
        return a[device * rows:(device + 1) * rows]
    return jax.tree_util.tree_unflatten(tree, [part(a) for a in leaves])


def _line() -> int:
    return sys._getframe(1).f_lineno


def _refused(run: Any, message: str, line: int, help: str = SHARD_HELP) -> None:
    """``run()`` raises SP0939 with ``message``, located at this file's ``line``, and ``help``."""
    with pytest.raises(JaxCallError) as info:
        run()
    assert info.value.code == "SP0939"
    assert info.value.message == f"{message} (at test_jax_row_shards.py:{line})", info.value.message
    assert info.value.help == help


def _split_message(rows: int, n: int) -> str:
    return (f"the layer's values hold {rows} of its out_features = {n} rows (a shard of its output features), "
            f"which is not a multiple of 16: the sm90 metadata words are stored in blocks of 16 rows, so a shard "
            f"that splits a block reads the words of other rows")


def test_the_layer_records_its_rows() -> None:
    """from_dense records the weight's rows; a layer made from arrays takes the values' rows (the
    second-last axis, so a stack of layers too); leaves without a shape (a vmap's in_axes) none."""
    layer = _layer(24)
    assert (layer.out_features, layer.in_features) == (24, 32)
    assert SparseLinear(layer.values, layer.meta).out_features == 24
    stack = SparseLinear(jnp.stack([layer.values] * 3), jnp.stack([layer.meta] * 3))
    assert stack.out_features == 24
    assert SparseLinear(0, 0).out_features is None
    assert SparseLinear(layer.values, layer.meta, out_features=48).out_features == 48
    rebuilt = jax.tree_util.tree_map(lambda a: a[:12], layer)  # (jax keeps the static fields it flattened)
    assert rebuilt.out_features == 24 and rebuilt.values.shape == (12, 16)
    again = pickle.loads(pickle.dumps(layer))
    assert (again.out_features, again.in_features) == (24, 32)
    # a layer pickled before out_features existed (its state has no such key) takes its values' rows, as
    # a layer made now does: shard-checked, and of the same pytree structure (one jit cache entry, tree_map)
    old_state = {k: v for k, v in layer.__dict__.items() if k != "out_features"}
    old = pickle.loads(pickle.dumps(_OldPickle(old_state)))
    assert type(old) is SparseLinear and old.out_features == 24
    assert jax.tree_util.tree_structure(old) == jax.tree_util.tree_structure(layer)


@pytest.mark.parametrize(("n", "devices"), [(24, 2), (56, 2), (48, 2), (64, 4)])
def test_a_shard_inside_a_metadata_block_is_refused(n: int, devices: int) -> None:
    """24 and 56 rows over 2 devices (12 and 28 a device) have the shapes of a 12- or 28-row weight
    (the words' padded rows split too): they ran with the words of other rows. 48 over 2 (24 a
    device) is refused too (its words' shape was SP0938 already); 64 over 4 (16 a device, one
    whole block) runs and equals the whole layer's columns and rows."""
    layer, x = _layer(n), _rand((3, 32), 7)
    rows = n // devices
    for device in range(devices):
        shard = _shard(layer, device, devices)
        assert shard.out_features == n and shard.values.shape[0] == rows
        if rows % 16:
            line = _line() + 1
            _refused(lambda shard=shard: shard(x), _split_message(rows, n), line)
            line = _line() + 1
            _refused(lambda shard=shard: jax.jit(lambda l, x: l(x))(shard, x), _split_message(rows, n), line)
            line = _line() + 1
            _refused(lambda shard=shard: shard.dense(), _split_message(rows, n), line)
        else:
            got = np.asarray(jax.jit(lambda l, x: l(x))(shard, x))
            whole = np.asarray(jax.jit(layer)(x))
            np.testing.assert_array_equal(got, whole[:, device * rows:(device + 1) * rows])
            np.testing.assert_array_equal(shard.dense(), layer.dense()[device * rows:(device + 1) * rows])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_whole_block_shards_equal_the_whole_layer_and_float64(dtype: str) -> None:
    """32 rows of 64 a device: the call on a shard equals the whole layer's columns bit for bit and
    float64 (x rounded to the weight's type, the f32 sums' bound)."""
    layer, x = _layer(64, 48, dtype), _rand((5, 48), 3)
    whole = np.asarray(jax.jit(layer)(x))
    xq = np.asarray(jnp.asarray(x).astype(layer.values.dtype)).astype(np.float64)
    for device in range(2):
        shard = _shard(layer, device, 2)
        got = np.full((5, 32), np.nan, np.float32)  # (poisoned: every entry is written below)
        got[:] = np.asarray(jax.jit(lambda l, x: l(x))(shard, x))
        cols = slice(32 * device, 32 * device + 32)
        np.testing.assert_array_equal(got, whole[:, cols])
        w = layer.dense().astype(np.float64)[cols]
        sw, b = np.asarray(layer.scale_w, np.float64)[cols], np.asarray(layer.bias, np.float64)[cols]
        want = (xq @ w.T) * sw + b
        bound = 1.1 * (2 * 48 * 2.0**-24 * (np.abs(xq) @ np.abs(w).T) * sw + 2.0**-22 * np.abs(want)) + 1e-30
        assert (np.abs(got - want) <= bound).all()


def test_e4m3_shards_follow_the_same_block_rule() -> None:
    """e4m3 words are one row's own (no two rows share a word), but they are padded to 16 rows
    too: a 12-row shard of 24 takes words rows 16..31 for values rows 12..23. SP0939 as for f16."""
    layer = _e4m3_layer(24)
    x = jnp.asarray(_rand((2, 64), 5)).astype(jnp.float8_e4m3fn)
    shard = _shard(layer, 1, 2)
    line = _line() + 1
    _refused(lambda: shard(x), _split_message(12, 24), line)


def test_a_stack_of_sharded_layers_is_checked_per_member() -> None:
    """A stack of layers (tree_map stack: a leading member axis) split over its rows: jax.vmap and
    jax.lax.map over the members see each member's shard, and its rows, and refuse it."""
    members = [_layer(24), _layer(24)]
    stack = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *members)
    assert stack.out_features == 24
    leaves, tree = jax.tree_util.tree_flatten(stack)
    shard = jax.tree_util.tree_unflatten(tree, [a[:, :a.shape[1] // 2] for a in leaves])
    x = _rand((2, 3, 32), 9)
    line = _line() + 1
    _refused(lambda: jax.vmap(lambda l, x: l(x))(shard, x), _split_message(12, 24), line)
    line = _line() + 1
    _refused(lambda: jax.lax.map(lambda l: l(x[0]), shard), _split_message(12, 24), line)
    whole = jax.vmap(lambda l, x: l(x))(stack, x)  # the unsplit stack runs as before
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(whole[i]), np.asarray(members[i](x[i])))


def test_more_rows_than_out_features_and_bad_out_features() -> None:
    """A layer whose values hold more rows than its out_features is no shard (SP0939); out_features
    that is no non-negative integer is SP0938 where the layer is made, a traced one SP0932; a layer
    given other values through dataclasses.replace takes their rows with out_features=None."""
    layer, x = _layer(32), _rand((2, 32), 4)
    wrong = SparseLinear(layer.values, layer.meta, out_features=16)
    line = _line() + 1
    _refused(lambda: wrong(x), "the layer's values hold 32 rows, more than its out_features = 16", line,
             "out_features is the weight's row count (from_dense records it): make the layer with "
             "out_features=None to take the values' rows")
    for bad in (-1, 2.5, True, "16"):
        with pytest.raises(JaxCallError) as info:
            SparseLinear(layer.values, layer.meta, out_features=bad)
        assert info.value.code == "SP0938"
        assert info.value.message.startswith(f"out_features must be a non-negative integer, got {bad!r} (at ")
    with pytest.raises(JaxCallError) as info:
        jax.jit(lambda n: SparseLinear(layer.values, layer.meta, out_features=n))(16)
    assert info.value.code == "SP0932"
    assert info.value.message.startswith("out_features of sparse_linear is static, but got a traced value")
    other = _layer(24)
    swapped = dataclasses.replace(layer, values=other.values, meta=other.meta, bias=other.bias,
                                  scale_w=other.scale_w, out_features=None)
    assert swapped.out_features == 24
    np.testing.assert_array_equal(np.asarray(swapped(x)), np.asarray(other(x)))


def test_the_raw_function_sees_only_the_shard_s_shapes() -> None:
    """What ``sparse_linear(x, values, meta)`` of a device's shard can tell (docs/jax.md): 48 rows
    over 2 devices leave 24 words rows for 24 values rows, where a 24-row weight has 32 (SP0938
    already); 24 over 2 leave 12 values rows and 16 words rows, exactly a 12-row weight's shapes,
    so the raw call runs, with the words of rows 0..15 for rows 12..23: not the whole layer's
    columns. Only the layer, which knows its out_features, can refuse it."""
    from sparsile.integrations.jax import sparse_linear

    x = _rand((3, 32), 11)
    shard = _shard(_layer(48), 1, 2)
    with pytest.raises(JaxCallError) as info:
        sparse_linear(x, shard.values, shard.meta)
    assert info.value.code == "SP0938"
    assert info.value.message.startswith("meta must be (32, 1) uint32 sm90 metadata words for a 24 x 32 bf16 weight, "
                                         "got (24, 1) uint32")
    layer = _layer(24)
    shard = _shard(layer, 1, 2)
    got = np.asarray(sparse_linear(x, shard.values, shard.meta, shard.bias, scale_w=shard.scale_w))
    whole = np.asarray(layer(x))
    assert got.shape == (3, 12) and np.isfinite(got).all()
    assert not np.array_equal(got, whole[:, 12:])
