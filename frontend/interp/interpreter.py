"""The interpreter: runs a kernel's IR on host arrays with numpy, program by program.

It is the CPU reference for every feature: each op's semantics is its OpDef's ``interpret`` hook
(see ``ops_*.py``); structured control flow is walked here. Loads and stores are bounds-checked
against the argument they point into, so an out-of-bounds access is reported with its source line
instead of corrupting memory.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..diagnostics import InternalError
from ..ir.core import Block, Function, Operation, Value
from ..ops.cluster import ClusterRun
from ..ops.opdefs import load_all_ops, op_def
from .values import ANOTHER_FAILED, BUDGET_EXCEEDED, GRID_NOT_CLUSTERS, ZERO_STEP, InterpreterError


@dataclass
class ProgramContext:
    """What an op's interpreter hook can read about the running program."""

    program_id: tuple[int, int, int]
    grid: tuple[int, int, int]
    shared: dict[str, Any]


class Interpreter:
    """Runs ``func``. ``max_ops`` bounds the number of operations executed over the whole grid
    (loops included); exceeding it is an :class:`InterpreterError`, so that a kernel whose loop
    never ends fails instead of hanging (the fuzz tests rely on it)."""

    def __init__(self, func: Function, max_ops: int | None = None):
        load_all_ops()
        self.func = func
        self.max_ops = max_ops
        self.ops_executed = 0

    def run(self, grid: tuple[int, int, int], params: dict[str, Any]) -> None:
        """Run every program of ``grid``; ``params`` maps each run-time parameter name to its value
        (a Buffer-backed PtrVal, a TensorVal, or a numpy scalar)."""
        if self.func.attrs.get("cluster"):  # the CTAs of a cluster run concurrently (ops/cluster.py)
            run_clusters(self, grid, params)
            return
        for pid in itertools.product(*(range(g) for g in grid)):
            ctx = ProgramContext(pid, grid, {})  # type: ignore[arg-type]
            ctx.warps = int(self.func.attrs.get("num_warps", 4))  # type: ignore[attr-defined]
            env: dict[int, Any] = {}
            for p in self.func.runtime_params:
                assert p.value is not None
                env[id(p.value)] = params[p.name]
            self.exec_block(self.func.body.block, env, ctx)

    # ------------------------------------------------------------------------------------------
    def exec_block(self, block: Block, env: dict[int, Any], ctx: ProgramContext) -> list[Any]:
        """Run ``block``; return the operands of its terminator (yield/condition), if any."""
        for op in block.ops:
            name = op.name
            self.ops_executed += 1
            if self.max_ops is not None and self.ops_executed > self.max_ops:
                raise InterpreterError(BUDGET_EXCEEDED, f"the run exceeded its budget of {self.max_ops} operations",
                                       op.span, ctx.program_id,
                                       help="pass a larger max_ops= (None for no bound), or make every loop end")
            if name == "scf.yield" or name == "scf.condition":
                return [env[id(v)] for v in op.operands]
            if name == "scf.for":
                self._for(op, env, ctx)
            elif name == "scf.if":
                self._if(op, env, ctx)
            elif name == "scf.while":
                self._while(op, env, ctx)
            elif name == "warp_specialize":
                self._warp_specialize(op, env, ctx)
            else:
                self._op(op, env, ctx)
        return []

    def _op(self, op: Operation, env: dict[int, Any], ctx: ProgramContext) -> None:
        d = op_def(op.name)
        if not callable(d.interpret):  # None, or none(...) for the ops run by the region walk
            raise InternalError(f"the interpreter has no semantics for `{op.name}`", op.span)
        args = [env[id(v)] for v in op.operands]
        try:
            results = d.interpret(ctx, op, args)
        except InterpreterError:
            raise
        except Exception as e:  # a bug in an op's semantics, not the user's program
            raise InternalError(f"interpreting `{op.name}` failed: {type(e).__name__}: {e}", op.span) from e
        for r, v in zip(op.results, results, strict=True):
            env[id(r)] = v

    def _bind(self, env: dict[int, Any], values: list[Value], data: list[Any]) -> None:
        for v, x in zip(values, data, strict=True):
            env[id(v)] = x

    def _for(self, op: Operation, env: dict[int, Any], ctx: ProgramContext) -> None:
        lb, ub, step = (int(env[id(op.operand(name))]) for name in ("lower", "upper", "step"))
        carried = [env[id(v)] for v in op.operand_group("init")]
        body = op.regions[0].block
        iv_dtype = np.dtype(body.args[0].type.numpy_dtype)  # type: ignore[attr-defined]
        if step == 0:  # Python's range refuses it; the GPU loop would never advance (or not start)
            raise InterpreterError(ZERO_STEP, f"the step of this `range` loop is 0 at run time (from {lb} to {ub})",
                                   op.span, ctx.program_id,
                                   help="Python's `range` refuses a zero step, and on the GPU the loop never "
                                        "advances: make sure the step is not 0 (`assert step != 0`)")
        for i in range(lb, ub, step):
            self._bind(env, body.args, [np.array(i, iv_dtype), *carried])
            carried = self.exec_block(body, env, ctx)
        self._bind(env, op.results, carried)

    def _if(self, op: Operation, env: dict[int, Any], ctx: ProgramContext) -> None:
        region = op.regions[0] if bool(env[id(op.operand("cond"))]) else op.regions[1]
        self._bind(env, op.results, self.exec_block(region.block, env, ctx))

    def _while(self, op: Operation, env: dict[int, Any], ctx: ProgramContext) -> None:
        carried = [env[id(v)] for v in op.operands]
        before, after = op.regions[0].block, op.regions[1].block
        for _ in range(1 << 31):
            self._bind(env, before.args, carried)
            cond, *vals = self.exec_block(before, env, ctx)
            if not bool(cond):
                self._bind(env, op.results, vals)
                return
            self._bind(env, after.args, vals)
            carried = self.exec_block(after, env, ctx)

    def _warp_specialize(self, op: Operation, env: dict[int, Any], ctx: ProgramContext) -> None:
        """Run the partitions concurrently (one Python thread each): they synchronize through
        mbarriers exactly as the warps do on the GPU, so a missing arrival deadlocks here too
        (reported after a timeout) instead of passing by accident."""
        import threading

        errors: list[BaseException] = []
        cond = ctx.shared.setdefault("_cond", threading.Condition())
        ctx.shared["_live"] = len(op.regions)  # partition threads that can still arrive (deadlock check)

        def run(block: Block, warps: int) -> None:
            import dataclasses

            part_ctx = dataclasses.replace(ctx)
            part_ctx.warps = warps  # type: ignore[attr-defined]
            try:
                self.exec_block(block, dict(env), part_ctx)
            except BaseException as e:  # reported in the caller's thread
                errors.append(e)
                ctx.shared["_abort"] = True
            finally:  # one fewer thread can arrive: waiters re-check for a deadlock
                with cond:
                    ctx.shared["_live"] -= 1
                    cond.notify_all()

        threads = [threading.Thread(target=run, args=(r.block, w), daemon=True)
                   for r, w in zip(op.regions, op.attrs["warps"], strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ctx.shared["_live"] = 1
        if errors:
            first = next((e for e in errors if getattr(e, "code", None) != ANOTHER_FAILED), errors[0])
            raise first


def run_clusters(interp: Any, grid: tuple[int, int, int], params: dict[str, Any]) -> None:
    """Run ``interp.func`` over ``grid`` cluster by cluster: the CTAs of one cluster run
    concurrently (one Python thread each) with their own shared state and a common cluster view."""
    func = interp.func
    shape = tuple(func.attrs["cluster"])
    if len(shape) != 3 or not all(isinstance(c, int) and c >= 1 for c in shape):
        raise InterpreterError(GRID_NOT_CLUSTERS, f"cluster={shape} is not 3 positive ints (SP0558)", func.span)
    if any(g % c for g, c in zip(grid, shape, strict=True)):
        raise InterpreterError(GRID_NOT_CLUSTERS,
                               f"the grid {grid} is not a multiple of the cluster {shape} in every dimension",
                               func.span, help="launch a grid whose every dimension is a multiple of the cluster's")
    starts = itertools.product(*(range(0, g, c) for g, c in zip(grid, shape, strict=True)))
    for start in starts:
        members = [(start[0] + x, start[1] + y, start[2] + z)
                   for z in range(shape[2]) for y in range(shape[1]) for x in range(shape[0])]  # rank order
        cond = threading.Condition()
        shareds: list[dict[Any, Any]] = [{"_cond": cond} for _ in members]
        run = ClusterRun(shape, shareds, cond, [0] * len(members))  # type: ignore[arg-type]
        errors: list[BaseException] = []

        def one(rank: int, pid: tuple[int, int, int], run: ClusterRun = run, errors: list = errors) -> None:
            ctx = ProgramContext(pid, grid, run.shared[rank])
            ctx.warps = int(func.attrs.get("num_warps", 4))  # type: ignore[attr-defined]
            ctx.shared["_cluster"] = (run, rank)
            env: dict[int, Any] = {}
            for p in func.runtime_params:
                env[id(p.value)] = params[p.name]
            try:
                interp.exec_block(func.body.block, env, ctx)
            except BaseException as exc:  # reported in the caller's thread
                errors.append(exc)
                run.abort()
            finally:
                with run.cond:
                    run.exited.add(rank)
                    run.complete_if_all_arrived()
                    run.cond.notify_all()

        threads = [threading.Thread(target=one, args=(r, pid), daemon=True) for r, pid in enumerate(members)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            first = next((e for e in errors if getattr(e, "code", None) != ANOTHER_FAILED), errors[0])
            raise first
