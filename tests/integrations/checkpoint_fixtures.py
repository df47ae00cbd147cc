"""Checkpoint fixtures laid out as compressed-tensors writes them (our own writer, for the loader's tests)."""

from __future__ import annotations

import numpy as np


def compressed_tensors_layer(dense: np.ndarray, name: str = "proj") -> dict[str, np.ndarray]:
    """Layer ``name`` as compressed-tensors' ``Sparse24BitMaskTensor.dict`` writes it: names without
    ``.weight``; ``compressed`` (out, in/2) in the weight's own dtype (fp8 as F8_E4M3), the top-2
    magnitudes of each group of 4 (ties to the lower index); ``bitmask`` the keep mask packed
    little-endian (out, ceil(in/8)); ``shape`` (2, 1) int64 (``torch.tensor(shape).reshape(-1, 1)``)."""
    rows, cols = dense.shape
    order = np.argsort(-np.abs(dense.astype(np.float32).reshape(rows, -1, 4)), axis=2, kind="stable")[:, :, :2]
    mask = np.zeros((rows, cols // 4, 4), bool)
    np.put_along_axis(mask, order, True, axis=2)
    mask = mask.reshape(rows, cols)
    return {f"{name}.compressed": dense[mask].reshape(rows, cols // 2),
            f"{name}.bitmask": np.packbits(mask, axis=1, bitorder="little"),
            f"{name}.shape": np.array([rows, cols], np.int64).reshape(-1, 1)}
