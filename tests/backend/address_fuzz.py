"""Differential fuzzing of emitted addresses over generated programs: every register of every
pointer tile (``addptr``) and of every ``load_tile`` / ``store_tile`` box of a random kernel of
tests/support/program_gen.py or program_gen_sparse.py, for every thread of a few programs, as the
emitted LLVM IR computes it (register_addresses.py), against the interpreter's pointer at that
register's coordinates (for a box: its in-bounds predicate for every lane, and its address where in
bounds). ``--linear-above N`` gives boxes of more than N registers a thread the linear address form
(backend/lower/tile_address.py; 0: every box it applies to, as the generated boxes are small), and
pointer tiles of more than N the opaque per-register addresses and coordinates
(backend/lower/wide_address.py).

Each program is checked for each target under a few *scenarios* of run-time values:

* ``generated``: the generator's arguments, the first two programs along each grid dim;
* ``pid``: program ids next to the i32 wrap of ``program_id(d) * T`` (``2**31 // T - 1``: the largest
  offsets that do not wrap; ``2**31 // T``: offsets that wrap to ``-2**31``), within the grid's
  limits (``y`` and ``z`` below 65535: no wrap there);
* ``stride``: the row stride (``stride``, ``LDA``) near ``2**31`` or ``-2**31`` (multiples of 16, which
  the launch specializes on, and others), the row bound (``nr``, ``M``) 1 so that the rows whose
  offsets wrap are masked off;
* ``scalars``: the plain generator's other integer scalars (``s0``, ...) near the wrap.

Arguments made to wrap can make a masked-on access fall outside its buffer: the interpreter wraps it
into the buffer (counted) and goes on, so that the later pointer tiles are checked too; any other
interpreter fault stops that program, and the pointer tiles it did not reach (and those of branches
not taken, loops of no trips) are counted as unreached, not checked. Pointer tiles
whose offsets the evaluator cannot follow (a loop's ``phi``, a loaded value) are counted as skipped,
by instruction.

``python -m sparsile.tests.backend.address_fuzz --gen sparse --seeds 0:200 [--targets sm_90a,sm_80]
[--linear-above 0]``
prints the counts and each mismatch (exit status 1 where any).
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sparsile as sp
from sparsile.backend.lower import tile_address
from sparsile.tests.backend.register_addresses import check_register_addresses

W = 1 << 31
NEAR_WRAP = (W - 1, W - 16, W - 64, W - 1000, (W >> 1) + 16, -W, -W + 16, -W + 7, (1 << 22) - 1)
"""Run-time values near the i32 wrap: multiples of 16 (specialized by the launch) and others."""
LIMITS = (W - 2, 65534, 65534)
"""The largest program id along each grid dim (a grid of at most 2**31 - 1 by 65535 by 65535)."""
TARGETS = ("sm_90a", "sm_80")
MAX_OPS = 2_000_000


@dataclass
class Tally:
    """Counts of a sweep, and the mismatches (and crashes) found."""

    programs: int = 0
    compiles: int = 0
    refused: int = 0
    tiles: int = 0
    boxes: int = 0
    linear: int = 0
    wide: int = 0
    skipped: int = 0
    unreached: int = 0
    faults: int = 0
    wrapped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line of the counts."""
        why = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        return (f"{self.programs} programs, {self.compiles} compiles ({self.refused} refused by a target), "
                f"{self.tiles} tiles checked ({self.boxes} load_tile / store_tile boxes, {self.linear} compiles with "
                f"linear box addresses, {self.wide} with opaque pointer-tile addresses), "
                f"{self.skipped} skipped ({why or 'none'}), "
                f"{self.unreached} unreached, {self.wrapped} out-of-bounds accesses wrapped, {self.faults} interpreter "
                f"faults, {len(self.failures)} mismatches")


def _program(gen: str, seed: int) -> Any:
    from sparsile.tests.support.program_gen import generate
    from sparsile.tests.support.program_gen_sparse import generate_sparse

    program = (generate_sparse if gen == "sparse" else generate)(seed)
    variants = program.variants()
    return variants[seed % len(variants)]


def _tile_sizes(source: str, consts: dict[str, int]) -> dict[int, int]:
    """Per grid dim d, the constexpr T of ``program_id(d) * T`` in ``source``."""
    out = {}
    for d, name in re.findall(r"program_id\((\d)\) \* (\w+)", source):
        if name in consts:
            out.setdefault(int(d), int(consts[name]))
    return out


def scenarios(program: Any, seed: int) -> list[tuple[str, dict[str, Any], list[tuple[int, int, int]],
                                                      tuple[int, int, int]]]:
    """(name, argument overrides, program ids, grid) of each scenario of ``program``."""
    rnd = random.Random(f"addrfuzz:{seed}")
    grid = (*program.grid, 1, 1)[:3]
    first = list(itertools.product(*(range(min(g, 2)) for g in grid)))
    out = [("generated", {}, first, grid)]
    sizes = _tile_sizes(program.source, program.consts)
    if sizes:
        pids = []
        for d, t in sizes.items():
            for p in sorted({min(W // t - 1, LIMITS[d]), min(W // t, LIMITS[d])}):
                pid = [0, 0, 0]
                pid[d] = p
                pids.append(tuple(pid))
        big = tuple(max(grid[d], *(p[d] + 1 for p in pids)) for d in range(3))
        out.append(("pid", {}, pids, big))
    scalars = getattr(program, "scalars", None) or {}
    names = set(scalars) | set(program.inputs(seed))
    for stride, rows in (("stride", "nr"), ("LDA", "M")):
        if stride in names and rows in names:
            out.append(("stride", {stride: rnd.choice(NEAR_WRAP), rows: 1}, first, grid))
    plain = [n for n, t in scalars.items() if re.fullmatch(r"s\d+", n) and t in ("i32", "u32", "i64")]
    if plain:
        out.append(("scalars", {n: rnd.choice(NEAR_WRAP) % (1 << 32) if scalars[n] == "u32" else rnd.choice(NEAR_WRAP)
                                for n in plain}, first, grid))
    return out


def check_program(gen: str, seed: int, tally: Tally, targets: tuple[str, ...] = TARGETS,
                  linear_above: int | None = None) -> None:
    """Check generated program ``seed`` of ``gen`` (``plain`` / ``sparse``) under each scenario for
    each target, adding to ``tally``; ``linear_above``: the box size above which the linear address
    form is used (None: the compiler's own, ``tile_address.LINEAR_ABOVE``)."""
    if linear_above is not None:
        own = tile_address.LINEAR_ABOVE
        tile_address.LINEAR_ABOVE = linear_above
        try:
            check_program(gen, seed, tally, targets)
        finally:
            tile_address.LINEAR_ABOVE = own
        return
    program = _program(gen, seed)
    tally.programs += 1
    for target in targets:
        for name, overrides, pids, grid in scenarios(program, seed):
            args = {**program.inputs(seed), **overrides}
            where = f"{gen} seed {seed} {target} {name} {overrides} programs {pids}"
            try:
                c = check_register_addresses(program.source, (), args, target=target, pids=pids, grid=grid,
                                             nested=True, tolerate=True, max_ops=MAX_OPS)
            except sp.CompileError:
                tally.refused += 1
                break  # (the same for every scenario of this target)
            except AssertionError as e:
                tally.failures.append(f"{where}: {str(e).splitlines()[0][:500]}")
                continue
            except Exception as e:
                tally.failures.append(f"{where}: crashed: {type(e).__name__}: {str(e)[:300]}")
                continue
            tally.compiles += 1
            tally.tiles += c.tiles
            tally.boxes += c.boxes
            tally.linear += 'asm "add.s64' in c.llvm
            tally.wide += 'asm "mad.' in c.llvm
            tally.skipped += c.skipped
            tally.unreached += c.unreached
            tally.faults += len(c.errors)
            tally.wrapped += len(c.wrapped)
            tally.reasons.update(c.reasons)


def sweep(gen: str, seeds: range, targets: tuple[str, ...] = TARGETS, verbose: bool = False,
          linear_above: int | None = None) -> Tally:
    """Check every program of ``seeds``; the counts and the mismatches."""
    tally = Tally()
    for seed in seeds:
        before = len(tally.failures)
        check_program(gen, seed, tally, targets, linear_above)
        if verbose:
            print(f"{gen} seed {seed}: " + ("ok" if len(tally.failures) == before else tally.failures[-1]),
                  flush=True)
    return tally


def main(argv: list[str] | None = None) -> int:
    """``python -m sparsile.tests.backend.address_fuzz --gen plain --seeds 0:200``."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gen", choices=("plain", "sparse"), default="plain")
    ap.add_argument("--seeds", default="0:50", help="start:stop")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per seed")
    ap.add_argument("--linear-above", type=int, default=None,
                    help="linear box addresses above this many registers a thread (default: the compiler's)")
    args = ap.parse_args(argv)
    start, stop = (int(x) for x in args.seeds.split(":"))
    tally = sweep(args.gen, range(start, stop), tuple(args.targets.split(",")), args.verbose, args.linear_above)
    print("\n".join(tally.failures))
    print(f"{args.gen} {args.seeds} {args.targets}: {tally.line()}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
