"""integrations/torch/weight.py: which tensors a launch record watches for in-place writes and how
it tells the weight's own memory from a plan's copies."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparsile.integrations.torch.weight import (  # noqa: E402
    Weight,
    same_bytes,
    same_memory,
    storage_key,
    tracked_tensors,
    weight_versions,
)


def test_the_plans_views_of_the_weight_are_its_bytes_and_copies_are_not():
    meta = torch.arange(12, dtype=torch.int32).reshape(4, 3)
    assert same_bytes(meta.view(torch.uint32), meta)  # the plans read int32 words as uint32
    assert not same_memory(meta.view(torch.uint32), meta)  # another type: not x or y passed through
    assert same_memory(meta.reshape(-1), meta)
    padded = torch.zeros(4, 4, dtype=torch.int32)
    padded[:, :3] = meta
    assert not same_bytes(padded, meta) and not same_bytes(meta[:2], meta) and not same_bytes(0, meta)


def test_views_of_one_block_share_a_storage_key():
    fused = torch.zeros(8, 4)
    assert storage_key(fused[2:4]) == storage_key(fused) != storage_key(fused.clone())


def test_written_weights_bump_the_versions_inference_tensors_are_not_watched():
    w = Weight(torch.zeros(4, 2), torch.zeros(4, 1, dtype=torch.int32), torch.zeros(4), None, None)
    tracked = tracked_tensors(w)
    assert len(tracked) == 3 and weight_versions(tracked) == (0, 0, 0)
    w.bias.add_(1.0)
    w.values.detach()[0].fill_(2.0)  # an alias's write is seen: aliases share the counter
    assert weight_versions(tracked) == (1, 0, 1)
    with torch.inference_mode():
        frozen = torch.zeros(4, 2)
    assert tracked_tensors(Weight(frozen, w.meta, None, None, None)) is None
    assert weight_versions(None) is None
