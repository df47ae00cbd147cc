"""Registers emitted at their first use (backend/lower/deferred.py): the containers, the order in
which pending tiles are forced, and, on kernels, that a broadcast load is interleaved with the
arithmetic that consumes it but never moved past a store or into a loop."""

from __future__ import annotations

import re

from sparsile.backend.lower.deferred import Deferred, DeferredRegs, Pending, is_deferred, raw_regs, value_of
from sparsile.backend.lower.llvm_text import LLValue
from sparsile.tests.support import compile_src


def _value(name: str, log: list[str]) -> Deferred:
    def emit() -> LLValue:
        log.append(name)
        return LLValue(f"%{name}", "float")
    return Deferred(emit)


def test_a_deferred_value_is_emitted_once_at_its_first_read():
    log: list[str] = []
    d = _value("a", log)
    assert log == []
    assert value_of(d).ref == "%a" and value_of(d).ref == "%a" and log == ["a"]
    assert value_of(LLValue("%b", "float")).ref == "%b"


def test_reading_registers_emits_them_in_place_and_raw_does_not():
    log: list[str] = []
    shared = _value("x", log)
    regs = DeferredRegs([shared, _value("y", log), shared])
    assert is_deferred(regs) and raw_regs(regs)[0] is shared and log == []
    assert regs[2].ref == "%x" and log == ["x"]
    assert [v.ref for v in regs] == ["%x", "%y", "%x"] and log == ["x", "y"]
    assert not is_deferred(regs) and all(isinstance(v, LLValue) for v in raw_regs(regs))
    assert [v.ref for v in DeferredRegs([_value("z", log)])[0:1]] == ["%z"]
    assert not is_deferred([LLValue("%c", "float")])


def test_a_long_chain_is_forced_in_operand_order_without_recursion():
    log: list[str] = []
    a, b = _value("a", log), _value("b", log)
    chain = Deferred(lambda: (log.append("op0"), LLValue("%op0", "float"))[1], [a, b])
    for i in range(1, 5000):
        prev = chain
        chain = Deferred(lambda i=i, prev=prev: (value_of(prev), log.append(f"op{i}"), LLValue(f"%op{i}", "float"))[2],
                         [prev])
    assert chain.force().ref == "%op4999"
    assert log[:3] == ["a", "b", "op0"] and log[-1] == "op4999" and len(log) == 5002


def test_pending_tiles_are_forced_latest_first_register_by_register():
    """A load tile and the multiply that reads it: forcing emits load r, then multiply r, for each
    register r (the order that keeps one loaded value live at a time); a tile nothing reads is
    still emitted."""
    log: list[str] = []
    pending = Pending()
    loads = pending.add([_value(f"load{r}", log) for r in range(3)])
    other = pending.add([_value("unread", log)])

    def mul(r: int) -> Deferred:
        return Deferred(lambda: (value_of(loads[r]), log.append(f"mul{r}"), LLValue(f"%m{r}", "float"))[2])

    pending.add([mul(r) for r in range(3)])
    pending.force()
    assert log == ["load0", "mul0", "load1", "mul1", "load2", "mul2", "unread"]
    assert pending.tiles == [] and not is_deferred(loads) and not is_deferred(other)


EPILOGUE = """
@kernel(num_warps=4)
def k(A: ptr[f16], B: ptr[f16], V: ptr[f32], Y: ptr[f32], n: i32, BM: constexpr, BN: constexpr, BK: constexpr,
      CASE: constexpr):
    rows = arange(0, BM)
    cols = arange(0, BN)
    ks = arange(0, BK)
    acc = dot(load(A + rows[:, None] * BK + ks[None, :]), load(B + ks[:, None] * BN + cols[None, :]))
    vp = V + cols[None, :]
    vm = cols[None, :] < n
    z = zeros((1, BN), f32)
    v = load(vp, mask=vm, other=0.0)  # a broadcast vector of the MMA layout
    if CASE == "store":
        store(vp, z, mask=vm)  # nothing computed in between: v must be read before this store
    if CASE == "loop":
        y = zeros((BM, BN), f32)
        for i in range(0, n):
            y = y + acc * v
    elif CASE == "chain":  # 600 deferred ops on each register: forced without recursion
        y = acc
        for i in static_range(300):
            y = y * v + 1.0
    else:
        y = acc * v + 1.0
    store(Y + rows[:, None] * BN + cols[None, :], y)
"""


def _epilogue_llvm(case: str) -> list[str]:
    llvm = compile_src(EPILOGUE, "sm_90a", "llvm", BM=64, BN=64, BK=32, CASE=case).llvm
    body = [line.strip() for line in llvm.splitlines()]
    last_mma = max(i for i, line in enumerate(body) if "wgmma.wait_group" in line)
    return body[last_mma + 1:]


def _v_loads(body: list[str]) -> list[int]:
    return [i for i, line in enumerate(body) if "ld.global" in line]


def _stores(body: list[str]) -> list[int]:
    return [i for i, line in enumerate(body) if "st.global" in line or line.startswith("store ")]


def test_a_broadcast_load_is_interleaved_with_the_arithmetic_that_reads_it():
    body = _epilogue_llvm("plain")
    loads = _v_loads(body)
    assert len(loads) == 16  # 16 distinct columns per thread of the 64 x 64 wgmma accumulator
    muls = [i for i, line in enumerate(body) if re.search(r"= fmul float", line)]
    between = [i for i in muls if loads[0] < i < loads[-1]]
    assert between, "every load of v was emitted before the first multiply"
    assert loads[-1] < min(_stores(body))


def test_a_broadcast_load_is_never_moved_past_a_store():
    body = _epilogue_llvm("store")
    first_store = min(_stores(body))
    assert _v_loads(body) and max(_v_loads(body)) < first_store


def test_a_broadcast_load_is_never_moved_into_a_loop():
    body = _epilogue_llvm("loop")
    first_label = min(i for i, line in enumerate(body) if re.match(r"^[\w.]+:", line))
    assert _v_loads(body) and max(_v_loads(body)) < first_label


def test_a_chain_of_hundreds_of_ops_on_a_broadcast_load_compiles():
    """Forcing walks a chain without recursion: 300 multiply-adds on each register reading v (it
    raised RecursionError past about 250 deferred ops)."""
    body = _epilogue_llvm("chain")
    assert len(_v_loads(body)) == 16
    assert sum(1 for line in body if re.search(r"= fmul float", line)) >= 300 * 16
