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
