"""Operand types: names, aliases, classes and the per-class constants of docs/hardware.md §1.2/§1.4."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.sparsity import OPERAND_TYPES, SparsityError, operand_type
from sparsile.stdlib.sparsity.dtypes import class_members, operand_type_of_array
from sparsile.stdlib.sparsity.errors import ALL_CODES


@pytest.mark.parametrize("name, width_class, pattern, instr_k, atom_k", [
    ("f16", "16-bit", "2:4", 32, 128), ("bf16", "16-bit", "2:4", 32, 128),
    ("tf32", "tf32", "1:2", 16, 64), ("f32", "tf32", "1:2", 16, 64),
    ("e4m3", "8-bit", "2:4", 64, 128), ("e5m2", "8-bit", "2:4", 64, 128),
    ("s8", "8-bit", "2:4", 64, 128), ("u8", "8-bit", "2:4", 64, 128),
    ("e2m1", "4-bit", "4:8 in pairs", 128, 256),
])
def test_operand_table(name, width_class, pattern, instr_k, atom_k):
    op = operand_type(name)
    assert (op.width_class, op.pattern.name, op.instr_k, op.atom_k) == (width_class, pattern, instr_k, atom_k)
    # one compressed A row per instruction is 32 bytes of K (docs/hardware.md §1.2)
    bits = {"16-bit": 16, "tf32": 32, "8-bit": 8, "4-bit": 4}[width_class]
    assert op.instr_k // 2 * bits == 256
    assert op.chunks_per_atom == 32  # 4 columns x 8 nibbles


def test_aliases_and_errors():
    assert operand_type("F32") is operand_type("tf32")
    assert operand_type(operand_type("f16")) is operand_type("f16")
    with pytest.raises(SparsityError) as info:
        operand_type("fp8")
    assert info.value.code == "SP0801" and "'e4m3'" in info.value.help
    with pytest.raises(SparsityError):
        operand_type(16)


def test_host_dtype_lookup_and_classes():
    assert operand_type_of_array(np.zeros(1, np.float32)).name == "tf32"
    assert operand_type_of_array(np.zeros(1, np.float64)) is None
    assert class_members("8-bit") == ("e4m3", "e5m2", "s8", "u8")
    assert len(OPERAND_TYPES) == 8


def test_codes_are_unique_and_in_range():
    assert all(code.startswith("SP08") for code in ALL_CODES)
    assert len(set(ALL_CODES)) == len(ALL_CODES) == 17
