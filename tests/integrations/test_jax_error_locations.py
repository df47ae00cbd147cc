"""The place a ``sparsile.jax`` diagnostic names (``(at file:line)``): the user's line, never a
frame Python generated for sparsile (a dataclass's ``__init__``, whose file is ``<string>``)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear  # noqa: E402
from sparsile.stdlib.kernels import prune_and_compress  # noqa: E402


def _weight() -> tuple[np.ndarray, object]:
    rng = np.random.default_rng(0)
    w = (rng.uniform(0.25, 1.0, (16, 32)) * rng.choice([-1, 1], (16, 32))).astype(np.float32)
    return w, prune_and_compress(w, "bf16")


def _line() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def test_a_layer_s_constructor_diagnostic_names_the_user_s_line() -> None:
    """SparseLinear's checks run in ``__post_init__``, called by the ``__init__`` that dataclasses
    generates (file ``<string>``): the diagnostics said ``(at <string>:11)``."""
    w, (values, meta) = _weight()
    words = jnp.asarray(meta.data.view(np.uint32))
    cases = []
    try:
        line = _line() + 1
        SparseLinear(jnp.asarray(values), words, in_features=0)
    except JaxCallError as exc:
        cases.append((exc, "in_features must be a positive integer, got 0", line))
    try:
        line = _line() + 1
        SparseLinear(jnp.asarray(values), meta, in_features=30)
    except JaxCallError as exc:
        cases.append((exc, "in_features = 30 was given, but the metadata was encoded for K = 32", line))
    layer = SparseLinear.from_dense(w, "bf16")
    try:
        line = _line() + 1
        dataclasses.replace(layer, in_features=-1)
    except JaxCallError as exc:
        cases.append((exc, "in_features must be a positive integer, got -1", line))
    assert len(cases) == 3
    for exc, message, line in cases:
        assert exc.code == "SP0938"
        assert exc.message == f"{message} (at test_jax_error_locations.py:{line})", exc.message


ACTIVATION_HELP = "activation is None, 'relu', 'silu' or 'gelu_tanh'"
OUT_DTYPE_HELP = "out_dtype is float16, bfloat16 or float32"


def test_a_layer_s_bad_activation_or_out_dtype_is_refused_where_the_layer_is_made() -> None:
    """A bad ``activation`` or ``out_dtype`` was SP0850 only at the layer's first call, far from the
    line that made it: from_dense, the constructor and dataclasses.replace now refuse it there."""
    w, (values, meta) = _weight()
    words = jnp.asarray(meta.data.view(np.uint32))
    layer = SparseLinear.from_dense(w, "bf16")
    cases = []
    try:
        line = _line() + 1
        SparseLinear.from_dense(w, "bf16", activation="gelu")
    except JaxCallError as exc:
        cases.append((exc, "unknown activation 'gelu'", ACTIVATION_HELP, line))
    try:
        line = _line() + 1
        SparseLinear(jnp.asarray(values), words, out_dtype="int8")
    except JaxCallError as exc:
        cases.append((exc, "sparse_linear has no int8 output", OUT_DTYPE_HELP, line))
    try:
        line = _line() + 1
        dataclasses.replace(layer, activation="swiglu")
    except JaxCallError as exc:
        cases.append((exc, "activation 'swiglu' is fused by the decode kernel only, which this call does not run",
                      "pass activation=None and compute silu(y[:, :F]) * y[:, F:] of the (T, 2F) result", line))
    try:
        line = _line() + 1
        dataclasses.replace(layer, out_dtype=np.float64)
    except JaxCallError as exc:
        cases.append((exc, "sparse_linear has no float64 output", OUT_DTYPE_HELP, line))
    assert len(cases) == 4
    for exc, message, help, line in cases:
        assert (exc.code, exc.message, exc.help) == ("SP0850", f"{message} (at test_jax_error_locations.py:{line})",
                                                     help)


def test_a_layer_built_without_its_constructor_is_still_checked_at_the_call() -> None:
    """A layer whose fields were set without ``__init__`` (object.__setattr__ on a made layer) keeps
    the call-time check: SP0850 at the call, as before."""
    from sparsile.stdlib.sparsity import SparsityError

    w, _ = _weight()
    layer = SparseLinear.from_dense(w, "bf16")
    object.__setattr__(layer, "activation", "gelu")
    with pytest.raises(SparsityError) as info:
        layer(np.random.default_rng(1).uniform(-1, 1, (2, 32)).astype(np.float32))
    assert (info.value.code, info.value.message) == ("SP0850", "unknown activation 'gelu'")


def test_a_rebuilt_layer_keeps_its_options() -> None:
    """jax rebuilds the layer (tree_map, jit's arguments) through its constructor: a checked
    activation and out_dtype pass again, the leaves replaced."""
    w, _ = _weight()
    layer = SparseLinear.from_dense(w, "bf16", activation="relu", out_dtype=jnp.float32)
    rebuilt = jax.tree_util.tree_map(lambda a: a, layer)
    assert (rebuilt.activation, rebuilt.out_dtype) == ("relu", jnp.float32)
    leaves, tree = jax.tree_util.tree_flatten(layer)
    assert jax.tree_util.tree_unflatten(tree, [object()] * len(leaves)).activation == "relu"
