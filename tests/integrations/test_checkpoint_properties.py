"""Property tests (hypothesis) of the safetensors reader / writer and of sparse-24-bitmask checkpoints.

safetensors (integrations/safetensors.py): random sets of tensors of every dtype (0-d, empty
dimensions, a few larger shapes, big-endian and non-contiguous inputs) and metadata come back bit for
bit, in one file or in shards named by an index; files written by hand from a random header (any
dtype string, shape, offsets, duplicated keys, a wrong header length, truncated data) are either
valid by an independent reading of the format, and then load the bytes the header names, or refused
with SP0910 / SP0911, never a bare exception or another tensor.

sparse-24-bitmask (integrations/sparse24.py, integrations/torch/*checkpoint.py): random 2:4 weights
(ragged in_features, all-zero groups, groups with one nonzero or fewer kept bits, -0.0, NaN and inf)
packed by an independent implementation of compressed-tensors' layout written here, loaded into
SparseLinear layers: to_dense() is the pruned weight exactly and the layer's output matches float64;
sparsile's own writer produces what the independent packing reads back. Mutated layers (a third bit
in a group, padding bits, one compressed value more or less, another .shape, rows of different
counts) load what the independent reading says or are refused with SP0913 / SP0914 naming the layer.
"""

from __future__ import annotations

import json
import math
import struct
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparsile.integrations import safetensors as sft
from sparsile.integrations.errors import IntegrationError
from sparsile.integrations.sparse24 import shards
from sparsile.tests.integrations.torch_helpers import check_against_float64

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

SETTINGS = settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                            HealthCheck.too_slow])

# the format's dtype names and element sizes, written out here (not read from the module under test)
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8,
         "F8_E4M3": 1, "F8_E5M2": 1}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": "<i2", "I32": "<i4", "I64": "<i8", "F16": "<f2",
         "BF16": ml_dtypes.bfloat16, "F32": "<f4", "F64": "<f8", "F8_E4M3": ml_dtypes.float8_e4m3fn,
         "F8_E5M2": ml_dtypes.float8_e5m2}
MAX_DIMS = 64  # numpy 2's limit on dimensions
INTP_MAX = 2 ** 63 - 1


def _raw_bytes(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random bits of ``dtype`` (NaN payloads, -0.0, infinities included); booleans are 0 or 1."""
    n = math.prod(shape) * SIZES[dtype]
    raw = rng.integers(0, 256, n, dtype=np.uint8)
    if dtype == "BOOL":
        raw %= 2
    return raw.view(NUMPY[dtype]).reshape(shape)


names = st.text(st.characters(codec="utf-8"), max_size=12).filter(lambda s: s != "__metadata__")
shapes = st.one_of(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
                   st.sampled_from([(257, 129), (1, 4099), (33, 0, 7), (0,), ()]))


@st.composite
def tensor_sets(draw: st.DrawFn) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    out = {}
    for name in draw(st.lists(names, max_size=6, unique=True)):
        dtype = draw(st.sampled_from(sorted(SIZES)))
        array = _raw_bytes(rng, dtype, draw(shapes))
        form = draw(st.sampled_from(["plain", "big-endian", "transposed"]))
        if form == "big-endian" and array.dtype.kind in "iuf" and array.dtype.itemsize > 1:
            array = array.astype(array.dtype.newbyteorder(">"))
        elif form == "transposed" and array.ndim >= 2:
            array = np.ascontiguousarray(array.T).T  # the same values, in Fortran order
        out[name] = array
    return out


metadata = st.one_of(st.none(), st.dictionaries(names, st.text(max_size=8), max_size=3))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    little = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
    return (b.dtype == little.dtype and b.shape == a.shape
            and np.ascontiguousarray(little).tobytes() == np.ascontiguousarray(b).tobytes())


@SETTINGS
@given(tensors=tensor_sets(), meta=metadata)
def test_write_then_read_is_the_identity(tmp_path, tensors, meta):
    path = tmp_path / "x.safetensors"
    sft.save_file(tensors, path, metadata=meta)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8 + n - 1:8 + n] in (b"}", b" ")  # padded with spaces to 8 bytes
    _, got_meta, start = sft.read_header(path)
    assert start == 8 + n and got_meta == (meta or {})
    back = sft.load_file(path)
    assert list(back) == list(tensors)
    for name, array in tensors.items():
        assert _same_bits(array, back[name]), name
        assert not back[name].flags.writeable or back[name].size == 0


@SETTINGS
@given(tensors=tensor_sets(), parts=st.integers(1, 4), seed=st.integers(0, 99))
def test_shards_named_by_an_index_give_every_tensor_back(tmp_path, tensors, parts, seed):
    order = list(tensors)
    np.random.default_rng(seed).shuffle(order)
    files = {f"model-{i + 1:05d}-of-{parts:05d}.safetensors": order[i::parts] for i in range(parts)}
    for file, keys in files.items():
        sft.save_file({k: tensors[k] for k in keys}, tmp_path / file)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, keys in files.items() for k in keys}}))
    back: dict[str, np.ndarray] = {}
    for shard in shards(tmp_path):
        part = sft.load_file(shard)
        assert not set(part) & set(back)
        back.update(part)
    named = {f for f, keys in files.items() if keys}
    assert {p.name for p in shards(tmp_path)} == named
    assert set(back) == set(tensors)
    for name, array in tensors.items():
        assert _same_bits(array, back[name]), name


# ------------------------------------------------------------------------------------------------
# files written by hand: an independent reading of the format decides what must load


def _expected(entries: list[tuple[str, dict]], data: bytes, duplicated: bool) -> dict[str, tuple] | None:
    """name -> (dtype, shape, bytes) of a well-formed file, or None for a malformed one."""
    if duplicated:
        return None
    out, spans = {}, []
    for name, info in entries:
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            return None
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in SIZES:
            return None
        ints = lambda v: isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)  # noqa: E731
        if not ints(shape) or len(shape) > MAX_DIMS or not ints(offsets) or len(offsets) != 2:
            return None
        if math.prod(s for s in shape if s) * SIZES[dtype] > INTP_MAX:
            return None
        begin, end = offsets
        if not begin <= end <= len(data) or end - begin != math.prod(shape) * SIZES[dtype]:
            return None
        if dtype == "BOOL" and any(b > 1 for b in data[begin:end]):  # a bool of 2..255: refused (SP0910)
            return None
        out[name] = (dtype, tuple(shape), data[begin:end])
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            return None
        position = end
    return out if position == len(data) else None


dtype_strings = st.one_of(st.sampled_from(sorted(SIZES)), st.sampled_from(["C64", "U16", "f32", "F8", "", "BOOL "]),
                          st.integers(0, 3), st.lists(st.just("F32"), max_size=1))
dims = st.one_of(st.integers(0, 6), st.sampled_from([-1, 2 ** 31, 2 ** 62, 2 ** 64, 2 ** 70]), st.just(True),
                 st.just(1.0))


@st.composite
def raw_files(draw: st.DrawFn) -> tuple[bytes, bytes, list, bool]:
    """(header bytes, data bytes, entries, duplicated): mostly near-valid headers, some broken."""
    count = draw(st.integers(0, 4))
    entries, offset = [], 0
    for i in range(count):
        dtype = draw(st.sampled_from(sorted(SIZES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = math.prod(shape) * SIZES[dtype]
        entries.append((f"t{i}", {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}))
        offset += size
    data = bytes(draw(st.binary(min_size=offset, max_size=offset)))
    for _ in range(draw(st.integers(0, 2))):  # mutations
        kind = draw(st.sampled_from(["dtype", "shape", "offsets", "data", "many_dims", "duplicate", "drop_key"]))
        if kind == "data":
            cut = draw(st.integers(-3, 3))
            data = data[:len(data) + cut] if cut < 0 else data + b"\0" * cut
            continue
        if not entries:
            continue
        i = draw(st.integers(0, len(entries) - 1))
        name, info = entries[i]
        info = dict(info)
        if kind == "dtype":
            info["dtype"] = draw(dtype_strings)
        elif kind == "shape":
            info["shape"] = draw(st.lists(dims, max_size=4))
        elif kind == "many_dims":
            info["shape"] = [1] * draw(st.integers(60, 70)) + info.get("shape", [])  # (an earlier drop_key)
        elif kind == "offsets":
            info["data_offsets"] = [draw(st.integers(0, len(data) + 2)), draw(st.integers(0, len(data) + 2))]
        elif kind == "drop_key":
            info.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)  # (dropped before: no-op)
        entries[i] = (name, info)
        if kind == "duplicate":
            entries.append((name, draw(st.sampled_from([info, entries[-1][1]]))))
    duplicated = len({n for n, _ in entries}) != len(entries)
    meta = draw(st.sampled_from([None, {"format": "pt"}]))
    items = ([("__metadata__", meta)] if meta is not None else []) + entries
    text = "{" + ",".join(f"{json.dumps(n)}:{json.dumps(v)}" for n, v in items) + "}"
    header = text.encode()
    header += b" " * draw(st.integers(0, 9))
    return header, data, entries, duplicated


def _diagnosed(path) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        sft.load_file(path)
    assert info.value.code in ("SP0910", "SP0911") and info.value.message.startswith(path.name + ":")
    return info.value


@SETTINGS
@given(case=raw_files())
def test_a_file_loads_as_the_format_says_or_is_refused(tmp_path, case):
    header, data, entries, duplicated = case
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    want = _expected(entries, data, duplicated)
    if want is None:
        _diagnosed(path)
        return
    back = sft.load_file(path)
    assert set(back) == set(want)
    for name, (dtype, shape, raw) in want.items():
        got = back[name]
        assert got.dtype == np.dtype(NUMPY[dtype]) and got.shape == shape and got.tobytes() == raw, name


@SETTINGS
@given(tensors=tensor_sets(), meta=metadata, how=st.sampled_from(["truncate", "length", "non_utf8", "grow"]),
       where=st.integers(0, 2 ** 16))
def test_a_damaged_file_is_refused(tmp_path, tensors, meta, how, where):
    """Any change of the header length, bytes cut off the end, bytes that are no UTF-8 in the
    header, or a header length past the limit: SP0910, never a bare exception or a tensor."""
    path = tmp_path / "x.safetensors"
    sft.save_file(tensors, path, metadata=meta)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    if how == "truncate":
        raw = raw[:where % len(raw)]
    elif how == "length":
        other = where % (len(raw) + 16)
        assume(other != n)
        raw = struct.pack("<Q", other) + raw[8:]
    elif how == "non_utf8":
        at = 8 + where % n
        raw = raw[:at] + b"\xff" + raw[at + 1:]
    else:
        raw = struct.pack("<Q", sft.MAX_HEADER + 8 + where) + raw[8:]
    path.write_bytes(raw)
    _diagnosed(path)


@pytest.mark.parametrize(("header", "data", "message"), [
    # duplicate names: json keeps the last one, and the file loaded the second tensor's dtype over the
    # first's bytes (or the second of two metadata values) without a word
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}',
     b"\0\0\x80\x3f", "x.safetensors: the header names 'a' twice"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"dtype":"I32"}}', b"1234",
     "x.safetensors: the header names 'dtype' twice"),
    (b'{"__metadata__":{"k":"v","k":"w"}}', b"", "x.safetensors: the header names 'k' twice"),
    # a __metadata__ that is no object but is falsy was taken as no metadata
    (b'{"__metadata__":[]}', b"", "x.safetensors: __metadata__ must map names to strings"),
    (b'{"__metadata__":""}', b"", "x.safetensors: __metadata__ must map names to strings"),
    # shapes numpy cannot make were ValueErrors from reshape
    (b'{"a":{"dtype":"F32","shape":[0,1180591620717411303424],"data_offsets":[0,0]}}', b"",
     "x.safetensors: tensor 'a' has shape [0, 1180591620717411303424], larger than numpy can hold"),
    (b'{"a":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}', b"",
     "x.safetensors: tensor 'a' has shape [0, 1099511627776, 1099511627776], larger than numpy can hold"),
    (b'{"a":{"dtype":"F32","shape":' + json.dumps([1] * 65).encode() + b',"data_offsets":[0,4]}}', b"1234",
     "x.safetensors: tensor 'a' has 65 dimensions, more than numpy's 64"),
    # an integer of more than 4300 digits was Python's ValueError from int()
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,' + b"1" * 5000 + b"]}}", b"1234",
     "x.safetensors: the header is not JSON: Exceeds the limit (4300 digits) for integer string conversion: "
     "value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit"),
])
def test_headers_that_loaded_wrongly_or_raised(tmp_path, header, data, message):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    assert _diagnosed(path).message == message


def test_a_header_past_the_limit_says_so(tmp_path):
    """A header length inside the file but over the 100 MiB limit was "exceeds the file"."""
    path = tmp_path / "x.safetensors"
    n = sft.MAX_HEADER + 8
    path.write_bytes(struct.pack("<Q", n) + b" " * n)
    assert _diagnosed(path).message == (f"x.safetensors: header length {n} exceeds the limit of {sft.MAX_HEADER} "
                                        "bytes")


@pytest.mark.parametrize(("tensors", "message"), [
    # a tensor named __metadata__ replaced the metadata (or was taken for it): a file no reader takes
    ({"__metadata__": np.zeros(2, np.float32)}, "cannot write a tensor named '__metadata__' (the header's "
                                                "metadata key)"),
    # names that are no strings: 1 and "1" were both written as "1", a header with a name twice
    ({1: np.zeros(1, np.float32), "1": np.ones(1, np.float32)}, "tensor names must be strings, got int 1"),
])
def test_the_writer_refuses_names_the_header_cannot_hold(tmp_path, tensors, message):
    with pytest.raises(IntegrationError) as info:
        sft.save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt"})
    assert (info.value.code, info.value.message) == ("SP0910", message)
    assert not (tmp_path / "x.safetensors").exists()


# ------------------------------------------------------------------------------------------------
# sparse-24-bitmask: an independent packing of compressed-tensors' layout


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """(rows, ceil(cols/8)) uint8: bit i of byte j is element 8j + i of the row, padding bits zero."""
    rows, cols = mask.shape
    out = np.zeros((rows, -(-cols // 8)), np.uint8)
    for r in range(rows):
        for c in range(cols):
            if mask[r, c]:
                out[r, c // 8] |= 1 << (c % 8)
    return out


def unpack_bits(bits: np.ndarray, cols: int) -> np.ndarray:
    rows = bits.shape[0]
    return np.array([[bool(bits[r, c // 8] >> (c % 8) & 1) for c in range(cols)] for r in range(rows)],
                    bool).reshape(rows, cols)


def pack_layer(dense: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """compressed (each row's kept values in order), bitmask, shape."""
    rows, cols = dense.shape
    kept = [dense[r][mask[r]] for r in range(rows)]
    compressed = np.array(kept, dtype=dense.dtype).reshape(rows, -1) if rows else np.zeros((0, 0), dense.dtype)
    return {"compressed": compressed, "bitmask": pack_bits(mask), "shape": np.array([rows, cols], np.int64)}


VALUE_KINDS = ("normal", "normal", "normal", "zero", "negzero", "tiny")
SPECIAL = ("nan", "inf", "-inf")
DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.bfloat16}


@st.composite
def sparse_weights(draw: st.DrawFn, special: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(pruned dense weight, kept mask): the same number of kept bits per group column in every row
    (0, 1 or 2: a writer keeping fewer than two), the kept values random, -0.0 or zero."""
    dtype = draw(st.sampled_from(sorted(DT)))
    rows, cols = draw(st.integers(1, 9)), draw(st.one_of(st.integers(1, 40), st.sampled_from([8, 16, 64])))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    groups = -(-cols // 4)
    counts = [min(draw(st.sampled_from((2, 2, 2, 1, 0))), min(4, cols - 4 * g)) for g in range(groups)]
    kinds = VALUE_KINDS + (SPECIAL if special else ())
    dense = np.zeros((rows, cols), np.float64)
    mask = np.zeros((rows, cols), bool)
    for r in range(rows):
        for g, count in enumerate(counts):
            width = min(4, cols - 4 * g)
            for c in sorted(rng.choice(width, count, replace=False)):
                mask[r, 4 * g + c] = True
                kind = kinds[rng.integers(len(kinds))]
                dense[r, 4 * g + c] = {"normal": rng.standard_normal() * 4, "zero": 0.0, "negzero": -0.0,
                                       "tiny": 2.0 ** -9 * rng.integers(1, 4), "nan": np.nan, "inf": np.inf,
                                       "-inf": -np.inf}[kind]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cast = dense.astype(DT[dtype])
    return cast, mask


def _write_checkpoint(path, layer: dict[str, np.ndarray], bias: np.ndarray | None = None,
                      scale: np.ndarray | None = None) -> None:
    tensors = {f"proj.weight.{k}": v for k, v in layer.items()}
    if bias is not None:
        tensors["proj.bias"] = bias
    if scale is not None:
        tensors["proj.weight_scale"] = scale
    sft.save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"quantization_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))


def _model(rows: int, cols: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """A model whose ``proj`` is an nn.Linear in ``dtype`` (the stored 16-bit type: the loader converts
    values of the other one to the model's, test_torch_checkpoint_dtype.py)."""
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(cols, rows, bias=bias).to(dtype)
    return model


def _stored(dense: np.ndarray) -> torch.dtype:
    """The model type that keeps ``dense``'s 16-bit values as stored (f16 for f16, else bf16)."""
    return torch.float16 if dense.dtype == np.float16 else torch.bfloat16


def _load(path, dense: np.ndarray, mask: np.ndarray, bias: bool):
    layer = pack_layer(dense, mask)
    scale = None
    if dense.dtype == ml_dtypes.float8_e4m3fn:  # fp8: int8 bits and a per-channel scale
        layer["compressed"] = layer["compressed"].view(np.int8)
        scale = (2.0 ** np.arange(-2, dense.shape[0] - 2) % 4).astype(np.float32).reshape(-1, 1)
        scale[scale == 0] = 0.25
    b = np.linspace(-1, 1, dense.shape[0]).astype(np.float32) if bias else None
    _write_checkpoint(path, layer, b, scale)
    model = _model(*dense.shape, bias, _stored(dense))
    report = spt.load_sparse24_checkpoint(model, path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    want = dense.astype(np.float32) * (1 if scale is None else scale)
    return model.proj, want


@SETTINGS
@given(weight=sparse_weights(special=True), bias=st.booleans())
def test_a_packed_layer_loads_as_the_pruned_weight(tmp_path, weight, bias):
    dense, mask = weight
    layer, want = _load(tmp_path, dense, mask, bias)
    got = layer.to_dense().float().numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN where NaN, inf where inf
    nonzero = want != 0
    assert (np.signbit(got) == np.signbit(want))[nonzero].all()


@SETTINGS
@given(weight=sparse_weights(), bias=st.booleans(), tokens=st.sampled_from([1, 3, 17]), seed=st.integers(0, 99))
def test_a_loaded_layer_matches_float64(tmp_path, weight, bias, tokens, seed):
    dense, mask = weight
    layer, want = _load(tmp_path, dense, mask, bias)
    x = torch.randn(tokens, dense.shape[1], generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    check_against_float64(layer, x, y)
    np.testing.assert_array_equal(layer.to_dense().float().numpy(), want)


# (shapes vLLM cannot load, 4 or 7 outputs, are written with a VLLMShapeWarning: not this test's subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
@SETTINGS
@given(weight=sparse_weights(), bias=st.booleans())
def test_the_writer_s_file_is_the_independent_layout(tmp_path, weight, bias):
    """A loaded layer saved again: the file unpacked by this module's reader keeps at most two per
    group, every nonzero of the weight, padding bits zero, and compressed holds the kept values."""
    dense, mask = weight
    assume(dense.shape[1] % 4 == 0)  # (the format stores whole groups: the writer refuses others, SP0915)
    layer, want = _load(tmp_path, dense, mask, bias)
    model = torch.nn.Module()
    model.proj = layer
    out = tmp_path / "again"
    spt.save_sparse24_checkpoint(model, out)
    tensors = sft.load_file(out / "model.safetensors")
    rows, cols = dense.shape
    assert tensors["proj.shape"].tolist() == [[rows], [cols]]  # (2, 1), as compressed-tensors writes it
    bits = tensors["proj.bitmask"]
    assert bits.dtype == np.uint8 and bits.shape == (rows, -(-cols // 8))
    kept = unpack_bits(bits, -(-cols // 8) * 8)
    assert not kept[:, cols:].any()
    kept = kept[:, :cols]
    assert (kept.reshape(rows, -1, 4).sum(axis=2) <= 2).all()
    assert kept[dense.astype(np.float32) != 0].all()
    compressed = tensors["proj.compressed"]
    assert compressed.dtype == dense.dtype  # (fp8 as F8_E4M3: int8 bits were read there as int8 numbers)
    values = np.asarray(compressed).astype(np.float32)
    assert values.shape == (rows, kept.sum() // rows)
    dense_back = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        dense_back[r][kept[r]] = values[r]
    np.testing.assert_array_equal(dense_back, dense.astype(np.float32))
    fresh = _model(rows, cols, bias, _stored(dense))
    spt.load_sparse24_checkpoint(fresh, out)
    np.testing.assert_array_equal(fresh.proj.to_dense().float().numpy(), want)


# ------------------------------------------------------------------------------------------------
# layers whose tensors do not fit together


def _reading(layer: dict[str, np.ndarray], rows: int, cols: int) -> np.ndarray | None:
    """The dense weight an independent reader takes from ``layer`` for a model of (rows, cols), or
    None where the tensors disagree with each other or with the model."""
    shape, bits, values = layer["shape"], layer["bitmask"], layer["compressed"]
    if shape.tolist() != [rows, cols] or bits.shape != (rows, -(-cols // 8)) or values.ndim != 2 \
            or values.shape[0] != rows:
        return None
    kept = unpack_bits(bits, bits.shape[1] * 8)
    if kept[:, cols:].any():
        return None
    kept = np.pad(kept[:, :cols], ((0, 0), (0, -cols % 4)))
    if (kept.reshape(rows, -1, 4).sum(axis=2) > 2).any() or (kept.sum(axis=1) != values.shape[1]).any():
        return None
    dense = np.zeros((rows, kept.shape[1]), values.dtype)
    for r in range(rows):
        dense[r][kept[r]] = values[r]
    return dense[:, :cols]


@st.composite
def broken_layers(draw: st.DrawFn):
    dense, mask = draw(sparse_weights())
    assume(dense.dtype != ml_dtypes.float8_e4m3fn)
    rows, cols = dense.shape
    layer = pack_layer(dense, mask)
    kind = draw(st.sampled_from(["third_bit", "padding_bit", "extra_value", "missing_value", "shape", "swap_rows"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    if kind == "third_bit":
        free = np.argwhere(~mask)
        assume(len(free))
        r, c = free[rng.integers(len(free))]
        mask = mask.copy()
        mask[r, c] = True
        layer["bitmask"] = pack_bits(mask)
    elif kind == "padding_bit":
        assume(cols % 8)
        layer["bitmask"] = layer["bitmask"].copy()
        layer["bitmask"][rng.integers(rows), -1] |= np.uint8(0x80)
    elif kind in ("extra_value", "missing_value"):
        flat = layer["compressed"].reshape(-1)
        flat = np.append(flat, flat[:1] if flat.size else np.zeros(1, flat.dtype)) if kind == "extra_value" \
            else flat[:-1]
        assume(flat.size % rows == 0 or kind == "missing_value")
        layer["compressed"] = flat.reshape(rows, -1) if flat.size % rows == 0 else flat.reshape(1, -1)
    elif kind == "shape":
        layer["shape"] = np.array([rows, cols + draw(st.sampled_from([-3, -2, -1, 1, 2, 5]))], np.int64)
        assume(layer["shape"][1] >= 0)
    else:  # rows of different counts, the total the same: one row's value moved to another row
        counts = mask.sum(axis=1)
        assume(rows >= 2 and counts[0] >= 1)
        free = [c for c in np.argwhere(~mask[1]).reshape(-1)
                if mask[1, 4 * (c // 4):4 * (c // 4) + 4].sum() < 2]
        assume(free)
        mask = mask.copy()
        mask[0, np.argwhere(mask[0]).reshape(-1)[0]] = False
        mask[1, free[0]] = True
        layer["bitmask"] = pack_bits(mask)
    return dense, layer, kind


@SETTINGS
@given(case=broken_layers())
def test_a_layer_that_does_not_fit_together_is_refused_naming_it(tmp_path, case):
    dense, layer, kind = case
    rows = dense.shape[0]
    model_cols = int(layer["shape"][1])  # a model as the .shape says: its own check cannot catch it
    want = _reading(layer, rows, model_cols)
    _write_checkpoint(tmp_path, layer)
    model = _model(rows, model_cols, bias=False, dtype=_stored(dense))
    if want is not None:
        spt.load_sparse24_checkpoint(model, tmp_path)
        np.testing.assert_array_equal(model.proj.to_dense().float().numpy(), want.astype(np.float32))
        return
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(model, tmp_path)
    assert info.value.code in ("SP0913", "SP0914") and "proj" in info.value.message, kind
    assert type(model.proj) is torch.nn.Linear


def test_rows_of_different_counts_are_refused():
    """compressed (2, 3) with a bitmask keeping 4 elements of row 0 and 2 of row 1: the scatter of the
    flattened values gave row 0 the first value of row 1 without a word."""
    from sparsile.integrations.sparse24 import dense_from_bitmask

    mask = np.array([[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]], bool)
    values = np.arange(1, 7, dtype=np.float16).reshape(2, 3)
    with pytest.raises(IntegrationError) as info:
        dense_from_bitmask(values, pack_bits(mask), np.array([2, 8]), "proj")
    assert (info.value.code, info.value.message) == (
        "SP0913", "layer proj: the bitmask keeps 4 elements of row 0 but compressed holds 3 per row")


def test_padding_bits_are_refused():
    """Bits set beyond the last column: a .shape narrower than the weight the bitmask was packed for."""
    from sparsile.integrations.sparse24 import dense_from_bitmask

    bits = np.array([[0b01000011]], np.uint8)  # columns 0, 1 and 6 of a 6-column row
    with pytest.raises(IntegrationError) as info:
        dense_from_bitmask(np.ones((1, 2), np.float16), bits, np.array([1, 6]), "proj")
    assert (info.value.code, info.value.message) == (
        "SP0913", "layer proj: the bitmask keeps elements beyond column 6 (row 0); the .shape [1, 6] is narrower "
                  "than the weight it was packed from")
