"""The pure-numpy safetensors reader and writer (integrations/safetensors.py): round trips of every
dtype, the byte layout, and SP0910 / SP0911 for malformed files."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    f = rng.standard_normal((3, 5))
    return {
        "bf16": f.astype(ml_dtypes.bfloat16), "f16": f.astype(np.float16), "f32": f.astype(np.float32),
        "f64": f, "e4m3": f.astype(ml_dtypes.float8_e4m3fn), "e5m2": f.astype(ml_dtypes.float8_e5m2),
        "i8": rng.integers(-128, 127, (4,), dtype=np.int8), "u8": rng.integers(0, 255, (2, 2, 2), dtype=np.uint8),
        "i16": rng.integers(-9, 9, (6,), dtype=np.int16), "i32": rng.integers(-9, 9, (1, 6), dtype=np.int32),
        "i64": np.array([7, -(2 ** 40)], dtype=np.int64), "bool": np.array([True, False]),
        "scalar": np.array(3.5, dtype=np.float32), "empty": np.zeros((0, 4), dtype=np.float16),
    }


def test_round_trip_of_every_dtype(tmp_path):
    arrays = _arrays()
    st.save_file(arrays, tmp_path / "a.safetensors", metadata={"format": "pt"})
    back = st.load_file(tmp_path / "a.safetensors")
    assert set(back) == set(arrays)
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape, name
        assert back[name].tobytes() == array.tobytes(), name
    _, metadata, _ = st.read_header(tmp_path / "a.safetensors")
    assert metadata == {"format": "pt"}
    assert set(st.load_file(tmp_path / "a.safetensors", names={"bf16"})) == {"bf16"}


def test_byte_layout_is_the_format(tmp_path):
    """8-byte little-endian header length, a JSON header padded to 8 bytes, then raw little-endian data."""
    st.save_file({"b": np.array([1, 2], np.int64), "a": np.array([1.5], np.float16)}, tmp_path / "x.safetensors")
    raw = (tmp_path / "x.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["b"] == {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}
    assert header["a"] == {"dtype": "F16", "shape": [1], "data_offsets": [16, 18]}
    assert raw[8 + n:] == np.array([1, 2], "<i8").tobytes() + np.array([1.5], "<f2").tobytes()


def test_big_endian_arrays_are_written_little_endian(tmp_path):
    st.save_file({"x": np.array([1.0, -2.0], dtype=">f4")}, tmp_path / "x.safetensors")
    back = st.load_file(tmp_path / "x.safetensors")["x"]
    assert back.dtype == np.dtype("<f4") and back.tolist() == [1.0, -2.0]


def _write_raw(path, header: bytes, data: bytes = b"", length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


@pytest.mark.parametrize(("header", "data", "length", "message"), [
    (b"{}", b"", 10 ** 9, "x.safetensors: header length 1000000000 exceeds the file (10 bytes)"),
    (b"{nope", b"", None, "x.safetensors: the header is not JSON: Expecting property name enclosed in double "
                          "quotes: line 1 column 2 (char 1)"),
    (b"[1]", b"", None, "x.safetensors: the header is not a JSON object"),
    (b'{"t": {"dtype": "F32", "shape": [2]}}', b"", None, "x.safetensors: tensor 't' lacks dtype, shape or "
                                                         "data_offsets"),
    (b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"1234", None,
     "x.safetensors: tensor 't' has data_offsets [0, 8] outside the 4 data bytes"),
    (b'{"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}', b"12345678", None,
     "x.safetensors: tensor 't' of shape [3] F32 needs 12 bytes, its offsets hold 8"),
    (b'{"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}', b"", None,
     "x.safetensors: tensor 't' has shape [-1], not a list of sizes"),
    (b'{"__metadata__": {"a": 1}}', b"", None, "x.safetensors: __metadata__ must map names to strings"),
    # a bool is not a size (it was a TypeError from reshape); a shape whose byte count overflows int64
    # (it wrapped to 0, matched empty offsets and was a ValueError from reshape)
    (b'{"t": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', b"1234", None,
     "x.safetensors: tensor 't' has shape [True], not a list of sizes"),
    (b'{"t": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}', b"", None,
     "x.safetensors: tensor 't' of shape [4294967296, 4294967296] U8 needs 18446744073709551616 bytes, its offsets "
     "hold 0"),
    # the tensors must tile the data, as the reference reader checks (overlapping tensors read each
    # other's bytes; a gap or trailing bytes are a header that does not describe the file)
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], '
     b'"data_offsets": [0, 4]}}', b"1234", None,
     "x.safetensors: tensor 'b' has data_offsets [0, 4], which overlap those of tensor 'a' [0, 4]"),
    (b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "b": {"dtype": "U8", "shape": [2], '
     b'"data_offsets": [1, 3]}}', b"123", None,
     "x.safetensors: tensor 'b' has data_offsets [1, 3], which overlap those of tensor 'a' [0, 2]"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"12345678", None,
     "x.safetensors: data bytes 0..4 belong to no tensor"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"12345678", None,
     "x.safetensors: data bytes 4..8 belong to no tensor"),
    (b"[" * 100000 + b"]" * 100000, b"", None, "x.safetensors: the header is not JSON: nested too deeply"),
])
def test_malformed_files_are_sp0910(tmp_path, header, data, length, message):
    _write_raw(tmp_path / "x.safetensors", header, data, length)
    with pytest.raises(IntegrationError) as info:
        st.load_file(tmp_path / "x.safetensors")
    assert (info.value.code, info.value.message) == ("SP0910", message)


def test_truncated_file_is_sp0910(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(IntegrationError) as info:
        st.read_header(tmp_path / "x.safetensors")
    assert info.value.code == "SP0910"
    assert info.value.message == "x.safetensors: 2 bytes is too short for a safetensors file (8-byte header length)"


def test_unknown_dtypes_are_sp0911(tmp_path):
    _write_raw(tmp_path / "x.safetensors", b'{"t": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}',
               b"12345678")
    with pytest.raises(IntegrationError) as info:
        st.load_file(tmp_path / "x.safetensors")
    assert (info.value.code, info.value.message) == (
        "SP0911", "x.safetensors: tensor 't' has dtype 'C64', which this reader does not know")
    with pytest.raises(IntegrationError) as info:
        st.save_file({"c": np.zeros(2, np.complex64)}, tmp_path / "y.safetensors")
    assert (info.value.code, info.value.message) == ("SP0911", "safetensors has no dtype for numpy complex64")


@pytest.mark.parametrize("dtype", [b'["F32"]', b'{"F32": 1}', b"4"])
def test_a_dtype_that_is_not_a_name_is_sp0911(tmp_path, dtype):
    """A dtype given as a list or an object was a TypeError (unhashable) from the dict lookup."""
    _write_raw(tmp_path / "x.safetensors", b'{"t": {"dtype": ' + dtype + b', "shape": [1], "data_offsets": [0, 4]}}',
               b"1234")
    with pytest.raises(IntegrationError) as info:
        st.load_file(tmp_path / "x.safetensors")
    assert (info.value.code, info.value.message) == (
        "SP0911", f"x.safetensors: tensor 't' has dtype {json.loads(dtype)!r}, which this reader does not know")


def test_a_bool_tensor_of_bytes_other_than_0_and_1_is_refused(tmp_path):
    """A BOOL tensor's bytes were viewed as numpy bools unchecked: a byte of 2 became a bool that is
    neither True nor False bit for bit (``~x`` of it is True). It is SP0910; 0 and 1 load."""
    path = tmp_path / "b.safetensors"
    st.save_file({"ok": np.array([True, False, True]), "mask": np.zeros(4, np.uint8)}, path)
    assert st.load_file(path)["ok"].tolist() == [True, False, True]
    raw = bytearray(path.read_bytes())
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    header["mask"]["dtype"] = "BOOL"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    body = raw[8 + struct.unpack("<Q", raw[:8])[0]:]
    body[header["mask"]["data_offsets"][0] + 1] = 2
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)
    with pytest.raises(IntegrationError) as info:
        st.load_file(path)
    assert info.value.code == "SP0910"
    assert "BOOL tensor 'mask' holds bytes other than 0 and 1" in info.value.message
    assert st.load_file(path, {"ok"})["ok"].tolist() == [True, False, True]


def test_a_masked_array_with_masked_elements_is_refused(tmp_path):
    """save_file read tensors with np.asarray, which drops a mask: the values under it were written
    to the checkpoint, silently. Refused as the toolkit refuses one (SP0804, plain_array), before
    anything is written; a masked array with nothing masked is its data."""
    from sparsile.stdlib.sparsity import SparsityError

    masked = np.ma.masked_array(np.arange(6, dtype=np.float32).reshape(2, 3), mask=[[0, 1, 0], [0, 0, 1]])
    path = tmp_path / "m.safetensors"
    with pytest.raises(SparsityError) as err:
        st.save_file({"ok": np.ones(2, np.float16), "layer.weight": masked}, path)
    assert err.value.code == "SP0804"
    assert err.value.message == ("tensors['layer.weight'] is a masked array with 2 masked elements; the file "
                                 "would hold the values under the mask")
    assert err.value.help.startswith("pass tensors['layer.weight'].filled(value) (e.g. 0)")
    assert not path.exists() and not path.with_name(path.name + ".partial").exists()
    unmasked = np.ma.masked_array(np.arange(6, dtype=np.float32).reshape(2, 3), mask=False)
    st.save_file({"w": unmasked}, path)
    back = st.load_file(path)["w"]
    assert type(back) is np.ndarray and back.tobytes() == unmasked.data.tobytes()


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_subclasses_and_byte_swapped_arrays_are_written_as_their_values(tmp_path):
    """np.matrix is written as a plain 2-D array, a byte-swapped array as its values (little-endian)."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((3, 4)).astype(np.float32)
    tensors = {"matrix": np.asmatrix(values), "swapped": values.astype(">f4"),
               "swapped_view": values.astype(">f4")[:, ::2]}
    st.save_file(tensors, tmp_path / "s.safetensors")
    back = st.load_file(tmp_path / "s.safetensors")
    np.testing.assert_array_equal(back["matrix"], values)
    np.testing.assert_array_equal(back["swapped"], values)
    np.testing.assert_array_equal(back["swapped_view"], values[:, ::2])
    assert all(type(a) is np.ndarray and a.dtype == np.float32 for a in back.values())


def test_torch_tensors_are_written_as_the_toolkit_reads_them(tmp_path):
    """save_file read a tensor with np.asarray: a torch bfloat16 or float8 tensor stopped at torch's
    TypeError ("Got unsupported ScalarType BFloat16"), one that requires grad or a negated view at
    its RuntimeError, internal tracebacks. Objects with ``__dlpack__`` are now read by
    ``as_host_array`` (the toolkit's reader, which ``save_sparse24_checkpoint`` already uses)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    f = rng.standard_normal((3, 4)).astype(np.float32)
    tensors = {"bf16": torch.tensor(f).bfloat16(), "e4m3": torch.tensor(f).to(torch.float8_e4m3fn),
               "grad": torch.tensor(f, requires_grad=True), "neg": torch._neg_view(torch.tensor(f)),
               "strided": torch.tensor(f).T[::2], "i64": torch.arange(5)}
    st.save_file(tensors, tmp_path / "t.safetensors")
    back = st.load_file(tmp_path / "t.safetensors")
    header, _, _ = st.read_header(tmp_path / "t.safetensors")
    assert {n: header[n]["dtype"] for n in tensors} == {"bf16": "BF16", "e4m3": "F8_E4M3", "grad": "F32", "neg": "F32",
                                                        "strided": "F32", "i64": "I64"}
    bf16_bits = tensors["bf16"].view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(back["bf16"].view(np.uint16), bf16_bits)
    np.testing.assert_array_equal(back["e4m3"].view(np.uint8), tensors["e4m3"].view(torch.uint8).numpy())
    np.testing.assert_array_equal(back["grad"], f)
    np.testing.assert_array_equal(back["neg"], -f)
    np.testing.assert_array_equal(back["strided"], f.T[::2])
    np.testing.assert_array_equal(back["i64"], np.arange(5))
