"""sparsile.jax on several devices: jax.pmap, shard_map and jax.jit of sharded arrays, on the CPU
with two host devices (XLA_FLAGS=--xla_force_host_platform_device_count=2, which must be set before
jax starts: so in a subprocess). Every result equals the layer on one device bit for bit (the same
kernel, plan and tokens per shard) and float64: x sharded over its tokens, a stack of layers sharded
over its members (pmap, and jax.vmap inside shard_map), and a layer's output features sharded at a
multiple of 16 rows (docs/jax.md, "Several devices"), as arrays of sparse_linear and as a
SparseLinear (shard_map and pmap); a SparseLinear sharded inside a 16-row block of its metadata
words is SP0939 while tracing (test_jax_row_shards.py has the same in one process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sparsile.tests.support import ROOT

pytest.importorskip("jax")

SCRIPT = textwrap.dedent('''
    import inspect
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from sparsile.integrations.jax import JaxCallError, SparseLinear, sparse_linear
    try:
        from jax import shard_map
    except ImportError:  # (older jax)
        from jax.experimental.shard_map import shard_map

    assert len(jax.devices()) == 2, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    rng = np.random.default_rng(0)

    def rand(shape, low=0.25):
        return (rng.uniform(low, 1, shape) * rng.choice([-1, 1], shape)).astype(np.float32)

    def layer_of(n, k, dtype):
        base = SparseLinear.from_dense(rand((n, k)), dtype, bias=rand((n,)))
        return SparseLinear(base.values, base.meta, base.bias, jnp.asarray(rand((n,), 0.5)),
                            in_features=base.in_features)

    def reference(layer, x):
        xq = np.asarray(jnp.asarray(x).astype(layer.values.dtype)).astype(np.float64)
        w = layer.dense().astype(np.float64)
        sw, b = np.asarray(layer.scale_w, np.float64), np.asarray(layer.bias, np.float64)
        want = (xq @ w.T) * sw + b
        bound = 1.1 * (2 * x.shape[-1] * 2.0**-24 * (np.abs(xq) @ np.abs(w).T) * np.abs(sw) + 2.0**-22 * np.abs(want))
        return want, bound + 1e-30

    def same(name, got, layer, x):
        alone = np.asarray(jax.jit(layer)(x))
        np.testing.assert_array_equal(np.asarray(got), alone, err_msg=name)
        want, bound = reference(layer, x)
        assert (np.abs(np.asarray(got, np.float64) - want) <= bound).all(), name
        print("ok", name)

    # (jax 0.4.36's shard_map checks replication with check_rep, which has no rule for sparsile_call and
    # refuses custom_jvp functions with symbolic zeros, such as sparse_linear: docs/jax.md says to pass
    # check_rep=False there; newer releases type it with varying axes instead and need nothing)
    old = {"check_rep": False} if "check_rep" in inspect.signature(shard_map).parameters else {}

    def sharded(f, in_specs, out_specs):
        return jax.jit(shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **old))

    K = 48
    for dtype in ("bf16", "f16"):
        layer = layer_of(64, K, dtype)
        x = rand((2, 3, K))
        y = jax.pmap(layer)(x)
        for i in range(2):
            same(f"{dtype} pmap over x, member {i}", y[i], layer, x[i])
        y = sharded(lambda x: layer(x), P("d"), P("d"))(x.reshape(6, K))
        same(f"{dtype} shard_map over the tokens", y, layer, x.reshape(6, K))
        xs = jax.device_put(x.reshape(6, K), NamedSharding(mesh, P("d")))
        same(f"{dtype} jit of a sharded x", jax.jit(layer)(xs), layer, x.reshape(6, K))
        # the output features, 32 rows a device (a multiple of 16: whole blocks of the metadata words)
        y = sharded(lambda v, e, b, s, x: sparse_linear(x, v, e, b, scale_w=s), (P("d"),) * 4 + (P(),), P(None, "d"))(
            layer.values, layer.meta, layer.bias, layer.scale_w, x[0])
        same(f"{dtype} shard_map over the output features", y, layer, x[0])
        # the same with the layer itself, in shard_map and in pmap (its leaves reshaped to a device axis)
        by_rows = lambda l, x: sharded(lambda l, x: l(x), (P("d"), P()), P(None, "d"))(l, x)
        rows_pmap = lambda l, x: jnp.concatenate(list(jax.pmap(lambda l, x: l(x), in_axes=(0, None))(
            jax.tree_util.tree_map(lambda a: a.reshape(2, -1, *a.shape[1:]), l), x)), -1)
        same(f"{dtype} shard_map of a SparseLinear over its output features", by_rows(layer, x[0]), layer, x[0])
        same(f"{dtype} pmap of a SparseLinear over its output features", rows_pmap(layer, x[0]), layer, x[0])
        # jax.jit of a layer whose leaves are sharded over their rows, inside a block (12 values rows and 16
        # words rows a device): jit traces the layer with its global shapes, and XLA gathers the operands of
        # the kernel call (a custom call it cannot partition), so this is the whole weight's result
        odd = layer_of(24, K, dtype)
        spread = jax.device_put(odd, NamedSharding(mesh, P("d")))
        assert len(spread.values.sharding.device_set) == 2 and spread.values.addressable_shards[0].data.shape[0] == 12
        y = jax.jit(lambda l, x: l(x))(spread, x[0])
        same(f"{dtype} jit of a SparseLinear sharded inside a block", y, odd, x[0])
        # 24 and 56 rows over 2 devices (12 and 28 a device) split a 16-row block of the metadata words:
        # each shard's shapes are those of a 12- or 28-row weight, so it ran with other rows' words
        for n in (24, 56):
            for how, run in (("shard_map", by_rows), ("pmap", rows_pmap)):
                try:
                    np.asarray(run(layer_of(n, K, dtype), x[0]))  # (waited for: a process left running hung)
                except JaxCallError as e:
                    assert e.code == "SP0939", (e.code, e.message)
                    assert e.message.startswith(f"the layer's values hold {n // 2} of its out_features = {n} rows "
                                                "(a shard of its output features), which is not a multiple of 16"), \
                        e.message
                    print("refused", dtype, how, n)
                else:
                    raise AssertionError(f"{dtype} {how}: a SparseLinear of {n} rows over 2 devices ran")

        members = [layer_of(40, K, dtype) for _ in range(2)]  # (40 rows: a member's own padded words)
        stack = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *members)
        y = jax.pmap(lambda l, x: l(x))(stack, x)
        y2 = sharded(lambda l, x: jax.vmap(lambda l, x: l(x))(l, x), (P("d"), P("d")), P("d"))(stack, x)
        for i in range(2):
            same(f"{dtype} pmap over a stack of layers, member {i}", y[i], members[i], x[i])
            same(f"{dtype} shard_map of vmap over a stack of layers, member {i}", y2[i], members[i], x[i])
''')


def test_several_devices_give_the_single_device_results() -> None:
    env = {**os.environ, "PYTHONPATH": ":".join(p for p in sys.path if p), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env=env)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert run.stdout.count("ok ") == 2 * (4 + 4 + 4), run.stdout
    assert run.stdout.count("refused ") == 2 * 2 * 2, run.stdout
