"""A stale shard index: ``model.safetensors.index.json`` placing a tensor in a file that does not
hold it (the index and the shards of different checkpoints). Before, with ``strict=False`` such a
tensor only showed in ``report.missing`` (the model kept its own values), or was read from whatever
file held it; now SP0912, naming the tensor, the file the index names and the one that holds it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

HELP = "the index and the shards are of different checkpoints: write the checkpoint again, or rewrite the index " \
       "from the shards' tensors"
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = linear(32, 64, dtype=torch.bfloat16, seed=1)
        self.norm = torch.nn.LayerNorm(32).to(torch.bfloat16)

    def forward(self, x):
        return self.norm(self.proj(x))


def _sharded(path) -> tuple[_Net, dict[str, str], dict[str, np.ndarray]]:
    """A sparsified model written, then split into two shards (the sparse layer in the first, the
    norm in the second) with an index; returns the model, the weight_map and the tensors."""
    model = _Net()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-1, 1)
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, path)
    tensors = st.load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    weight_map = {k: SECOND if k.startswith("norm.") else FIRST for k in tensors}
    for file in (FIRST, SECOND):
        st.save_file({k: v for k, v in tensors.items() if weight_map[k] == file}, path / file)
    return model, weight_map, tensors


def _index(path, weight_map: dict[str, str]) -> None:
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _error(model, path, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(model, path, **kwargs)
    return info.value


def test_a_consistent_index_loads(tmp_path):
    model, weight_map, _ = _sharded(tmp_path)
    _index(tmp_path, weight_map)
    fresh = _Net()
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    assert torch.equal(fresh(x), model(x)) and torch.equal(fresh.norm.bias, model.norm.bias)


@pytest.mark.parametrize("strict", [True, False])
def test_a_tensor_no_file_holds_is_sp0912(tmp_path, strict):
    """The second shard is of an older checkpoint without ``norm.bias``, which the index names
    there: under strict=False the model kept its own bias without a word (only report.missing)."""
    _, weight_map, tensors = _sharded(tmp_path)
    st.save_file({"norm.weight": tensors["norm.weight"]}, tmp_path / SECOND)
    _index(tmp_path, weight_map)
    fresh = _Net()
    before = fresh.norm.bias.clone()
    err = _error(fresh, tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0912", f"{tmp_path / 'model.safetensors.index.json'} places tensor 'norm.bias' in {SECOND}, which does not "
                  "hold it; no file it names does")
    assert err.help == HELP
    assert type(fresh.proj) is torch.nn.Linear and torch.equal(fresh.norm.bias, before)  # (nothing changed)


@pytest.mark.parametrize("strict", [True, False])
def test_two_stale_entries_are_counted(tmp_path, strict):
    """Both norm tensors placed in the first shard: the second is then no file of the index (not
    read), and the message names the first entry and counts the other."""
    _, weight_map, _ = _sharded(tmp_path)
    _index(tmp_path, {**weight_map, "norm.weight": FIRST, "norm.bias": FIRST})
    err = _error(_Net(), tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0912", f"{tmp_path / 'model.safetensors.index.json'} places tensor 'norm.bias' in {FIRST}, which does not "
                  "hold it; no file it names does (1 more such)")


@pytest.mark.parametrize("strict", [True, False])
def test_a_tensor_in_another_file_than_the_index_names_is_sp0912(tmp_path, strict):
    """The index places ``norm.bias`` in the first shard (another checkpoint's index), which lacks
    it; the second shard, which the index names too, holds it. Before: loaded from the second without
    a word."""
    _, weight_map, _ = _sharded(tmp_path)
    _index(tmp_path, {**weight_map, "norm.bias": FIRST})
    err = _error(_Net(), tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0912", f"{tmp_path / 'model.safetensors.index.json'} places tensor 'norm.bias' in {FIRST}, which does not "
                  f"hold it; {SECOND} does")
    assert err.help == HELP
