"""Linear layouts: maps over GF(2) from hardware index bits to logical coordinates.

A :class:`LinearLayout` maps the bits of named *input* (hardware) dimensions to named *output*
(logical) dimensions.  Every input bit has a basis vector (one coordinate per output dim); the
image of an input point is the XOR of the bases of its set bits (Triton's LinearLayout, arXiv
2505.23819, §3).  All dimension sizes are powers of two.

Dimension names used across sparsile (this list is their reference):

- registers: ``reg`` (register index within a thread), ``sub`` (position of a packed sub-word
  inside a 32-bit register, when several elements share one), ``lane``, ``warp``, ``block`` (CTA);
- tensor memory: ``lane`` (TMEM lane), ``col`` (32-bit column), ``sub`` (position of a packed
  16-bit value or 4-bit nibble inside a 32-bit cell), ``cta`` (CTA of a ``cta_group::2`` pair);
- shared memory: ``offset`` (in elements);
- logical dims: any names (``m``, ``n``, ``k``, ``chunk``, ``dim0`` ...).

Replication (several hardware positions holding the same element) is a zero basis.  Hardware
positions that hold nothing (e.g. the unused half of a half-datapath TMEM layout) map to the extra
logical dim ``unused`` (:data:`UNUSED_DIM`) so that the layout stays a bijection; data lives at
``unused == 0``.

**Non-power-of-two logical shapes** are laid out over the next power of two in every dim
(:func:`padded_shape`); positions whose logical coordinate is outside the real shape are padding
that code generation masks (``coord < shape``), exactly as Triton does.  Named constructors accept
any positive extents and pad them.

**Conventions.**  ``reshape_ins``/``reshape_outs``/``merge_ins`` flatten row-major (the last listed
dim varies fastest).  ``a.compose(b)`` is "apply ``a``, then ``b``" (Triton's convention):
``a.compose(b)(x) == b(a(x))``.  Layout-algebra misuse raises :class:`LayoutError` (a
``ValueError`` carrying an ``SP04xx`` code) that passes turn into diagnostics with
:meth:`LayoutError.to_diagnostic`.

The bit arithmetic the algebra is built on (power-of-two extents, :class:`LayoutError`, GF(2)
elimination) is ``gf2.py``; this module re-exports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .gf2 import (
    GF2Span,
    LayoutError,
    bit_list,
    gf2_rank,
    is_power_of_two,
    log2_exact,
    next_power_of_two,
    padded_shape,
)

UNUSED_DIM = "unused"

Dims = tuple[tuple[str, int], ...]


# --------------------------------------------------------------------------------------------
# LinearLayout
# --------------------------------------------------------------------------------------------

def _normalize_dims(dims: Mapping[str, int] | Sequence[tuple[str, int]], kind: str) -> Dims:
    items = list(dims.items()) if isinstance(dims, Mapping) else [tuple(d) for d in dims]
    out = []
    seen = set()
    for item in items:
        if len(item) != 2:
            raise LayoutError("SP0401", f"{kind} dims must be (name, size) pairs, found {item!r}")
        name, size = item
        if not isinstance(name, str) or not name:
            raise LayoutError("SP0401", f"{kind} dim names must be non-empty strings, found {name!r}")
        if name in seen:
            raise LayoutError("SP0401", f"{kind} dim {name!r} is listed twice")
        seen.add(name)
        log2_exact(size, f"size of {kind} dim {name!r}")
        out.append((name, int(size)))
    return tuple(out)


@dataclass(frozen=True)
class LinearLayout:
    """An immutable, hashable linear map from hardware index bits to logical coordinates.

    ``in_dims``/``out_dims`` are ``(name, size)`` pairs; ``bases[i][b]`` is the image of bit ``b``
    of input dim ``i``: a tuple with one coordinate per output dim.  Build one with
    :meth:`from_bases`, :meth:`identity`, :meth:`zeros` or a named constructor.
    """

    in_dims: Dims
    out_dims: Dims
    bases: tuple[tuple[tuple[int, ...], ...], ...]

    def __post_init__(self) -> None:
        in_dims = _normalize_dims(self.in_dims, "input")
        out_dims = _normalize_dims(self.out_dims, "output")
        object.__setattr__(self, "in_dims", in_dims)
        object.__setattr__(self, "out_dims", out_dims)
        if len(self.bases) != len(in_dims):
            raise LayoutError("SP0401", f"{len(self.bases)} basis lists for {len(in_dims)} input dims")
        norm = []
        for (name, size), dim_bases in zip(in_dims, self.bases):
            if len(dim_bases) != log2_exact(size):
                raise LayoutError("SP0401", f"input dim {name!r} of size {size} needs "
                                  f"{log2_exact(size)} bases, found {len(dim_bases)}")
            row = []
            for basis in dim_bases:
                bad = [c for c in basis if not isinstance(c, (int, np.integer)) or isinstance(c, (bool, np.bool_))]
                if bad:  # (int() truncated 1.5 to 1: another layout than the one written)
                    raise LayoutError("SP0401", f"basis {tuple(basis)} of input dim {name!r}: coordinate {bad[0]!r} "
                                      "is not an integer")
                basis = tuple(int(c) for c in basis)
                if len(basis) != len(out_dims):
                    raise LayoutError("SP0401", f"basis {basis} of input dim {name!r} must have one "
                                      f"coordinate per output dim {[d for d, _ in out_dims]}")
                for c, (oname, osize) in zip(basis, out_dims):
                    if not 0 <= c < osize:
                        raise LayoutError("SP0401", f"basis {basis} of input dim {name!r}: coordinate "
                                          f"{c} is outside output dim {oname!r} of size {osize}")
                row.append(basis)
            norm.append(tuple(row))
        object.__setattr__(self, "bases", tuple(norm))

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_bases(cls, bases: Mapping[str, Sequence[Sequence[int] | int]],
                   out_dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> LinearLayout:
        """``bases`` maps each input dim (in order) to its list of basis vectors, one per bit; with
        a single output dim a basis may be written as a plain int."""
        out = _normalize_dims(out_dims, "output")
        in_dims = []
        rows = []
        for name, dim_bases in bases.items():
            row = []
            for b in dim_bases:
                if isinstance(b, (int, np.integer)):
                    if len(out) != 1:
                        raise LayoutError("SP0401", f"basis {b} of {name!r} must be a tuple: the layout "
                                          f"has {len(out)} output dims")
                    b = (int(b),)
                row.append(tuple(b))
            in_dims.append((name, 1 << len(row)))
            rows.append(tuple(row))
        return cls(tuple(in_dims), out, tuple(rows))

    @classmethod
    def identity(cls, in_name: str, size: int, out_name: str | None = None) -> LinearLayout:
        """The 1-D identity ``in_name[i] -> out_name[i]``."""
        n = log2_exact(size)
        return cls(((in_name, size),), ((out_name or in_name, size),), (tuple((1 << b,) for b in range(n)),))

    @classmethod
    def zeros(cls, in_name: str, size: int,
              out_dims: Mapping[str, int] | Sequence[tuple[str, int]] = ()) -> LinearLayout:
        """Every position of ``in_name`` maps to the origin (pure replication / broadcast)."""
        out = _normalize_dims(out_dims, "output")
        n = log2_exact(size)
        return cls(((in_name, size),), out, (tuple(tuple(0 for _ in out) for _ in range(n)),))

    @classmethod
    def empty(cls) -> LinearLayout:
        return cls((), (), ())

    @classmethod
    def _from_columns(cls, in_dims: Dims, out_dims: Dims, columns: Sequence[int]) -> LinearLayout:
        shifts = _offsets(out_dims)
        rows = []
        i = 0
        for _, size in in_dims:
            row = []
            for _ in range(log2_exact(size)):
                c = columns[i]
                i += 1
                row.append(tuple((c >> s) & (osize - 1) for s, (_, osize) in zip(shifts, out_dims)))
            rows.append(tuple(row))
        return cls(in_dims, out_dims, tuple(rows))

    # ---- basic queries ---------------------------------------------------------------------

    @property
    def in_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.in_dims)

    @property
    def out_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.out_dims)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.out_dims)

    def in_size(self, name: str) -> int:
        """Size of input dim ``name`` (1 if the layout does not have it)."""
        return dict(self.in_dims).get(name, 1)

    def out_size(self, name: str) -> int:
        return dict(self.out_dims).get(name, 1)

    def in_bits(self, name: str) -> int:
        return log2_exact(self.in_size(name))

    @property
    def total_in_bits(self) -> int:
        return sum(log2_exact(s) for _, s in self.in_dims)

    @property
    def total_out_bits(self) -> int:
        return sum(log2_exact(s) for _, s in self.out_dims)

    def basis(self, in_name: str, bit: int) -> dict[str, int]:
        """The image of bit ``bit`` of input dim ``in_name`` as ``{out_dim: coord}``."""
        idx = self.in_names.index(in_name)
        return dict(zip(self.out_names, self.bases[idx][bit]))

    @cached_property
    def _columns(self) -> tuple[int, ...]:
        shifts = _offsets(self.out_dims)
        cols = []
        for row in self.bases:
            for basis in row:
                v = 0
                for c, s in zip(basis, shifts):
                    v |= c << s
                cols.append(v)
        return tuple(cols)

    def flat_columns(self) -> tuple[int, ...]:
        """The bases as ints over the flat output encoding (:meth:`encode_out`), one per input bit
        in input-dim order, low bits first."""
        return self._columns

    def in_bit_offsets(self) -> dict[str, int]:
        """Index in :meth:`flat_columns` of bit 0 of each input dim."""
        return dict(zip(self.in_names, _offsets(self.in_dims)))

    def encode_out(self, coords: Mapping[str, int]) -> int:
        """Logical coordinates as one int: output dim ``i`` occupies the bits after dims ``0..i-1``
        (first dim lowest).  Missing dims are 0."""
        v = 0
        for s, (name, size) in zip(_offsets(self.out_dims), self.out_dims):
            c = int(coords.get(name, 0))
            if not 0 <= c < size:
                raise LayoutError("SP0402", f"coordinate {name}={c} is outside 0..{size - 1}")
            v |= c << s
        return v

    def decode_out(self, v: int) -> dict[str, int]:
        """Inverse of :meth:`encode_out`."""
        return self._unflatten_out(v)

    @cached_property
    def _span(self) -> GF2Span:
        return GF2Span(self._columns)

    @property
    def rank(self) -> int:
        return self._span.rank

    def is_injective(self) -> bool:
        return self.rank == self.total_in_bits

    def is_surjective(self) -> bool:
        return self.rank == self.total_out_bits

    def is_bijective(self) -> bool:
        return self.is_injective() and self.is_surjective()

    def num_free_bits(self) -> int:
        """Input bits that do not add information: ``total_in_bits - rank`` (replication)."""
        return self.total_in_bits - self.rank

    def zero_bases(self) -> dict[str, tuple[int, ...]]:
        """For each input dim, the bits whose basis is zero (pure replication)."""
        out = {}
        for (name, _), row in zip(self.in_dims, self.bases):
            out[name] = tuple(b for b, basis in enumerate(row) if not any(basis))
        return out

    # ---- evaluation --------------------------------------------------------------------------

    def _flat_in(self, inputs: Mapping[str, int]) -> int:
        unknown = set(inputs) - set(self.in_names)
        if unknown:
            raise LayoutError("SP0402", f"unknown input dims {sorted(unknown)}; "
                              f"the layout has {list(self.in_names)}")
        flat = 0
        shift = 0
        for name, size in self.in_dims:
            v = int(inputs.get(name, 0))
            if not 0 <= v < size:
                raise LayoutError("SP0402", f"input {name}={v} is outside 0..{size - 1}")
            flat |= v << shift
            shift += log2_exact(size)
        return flat

    def _apply_flat(self, flat: int) -> int:
        out = 0
        for i, col in enumerate(self._columns):
            if flat >> i & 1:
                out ^= col
        return out

    def _unflatten_out(self, v: int) -> dict[str, int]:
        shifts = _offsets(self.out_dims)
        return {name: (v >> s) & (size - 1) for s, (name, size) in zip(shifts, self.out_dims)}

    def apply(self, **inputs: int) -> dict[str, int]:
        """The logical coordinates of a hardware point; missing input dims are 0."""
        return self._unflatten_out(self._apply_flat(self._flat_in(inputs)))

    def __call__(self, **inputs: int) -> dict[str, int]:
        return self.apply(**inputs)

    def table(self) -> np.ndarray:
        """All images at once: an int64 array of shape ``(*in_sizes, len(out_dims))`` indexed by
        the input dims in order."""
        n_out = len(self.out_dims)
        result = np.zeros([s for _, s in self.in_dims] + [n_out], dtype=np.int64)
        for axis, ((_, size), row) in enumerate(zip(self.in_dims, self.bases)):
            contrib = np.zeros((size, n_out), dtype=np.int64)
            for b, basis in enumerate(row):
                half = 1 << b
                contrib[half:2 * half] = contrib[:half] ^ np.asarray(basis, dtype=np.int64)
            shape = [1] * len(self.in_dims) + [n_out]
            shape[axis] = size
            result ^= contrib.reshape(shape)
        return result

    # ---- algebra -----------------------------------------------------------------------------

    def compose(self, outer: LinearLayout) -> LinearLayout:
        """``x -> outer(self(x))``: ``self``'s output dims feed ``outer``'s input dims by name."""
        outer_in = dict(outer.in_dims)
        for name, size in self.out_dims:
            if name not in outer_in:
                raise LayoutError("SP0402", f"cannot compose: output dim {name!r} is not an input dim of "
                                  f"the outer layout {list(outer.in_names)}")
            if size > outer_in[name]:
                raise LayoutError("SP0402", f"cannot compose: output dim {name!r} has size {size} but "
                                  f"the outer layout's input dim has size {outer_in[name]}")
        cols = []
        for col in self._columns:
            coords = self._unflatten_out(col)
            cols.append(outer._apply_flat(outer._flat_in(coords)))
        return LinearLayout._from_columns(self.in_dims, outer.out_dims, cols)

    def invert(self) -> LinearLayout:
        """The inverse of a bijective layout (its input dims become the output dims)."""
        if not self.is_bijective():
            raise LayoutError("SP0403", f"layout is not invertible: {self.total_in_bits} input bits, "
                              f"{self.total_out_bits} output bits, rank {self.rank}",
                              help="use pseudo_invert() for a surjective layout with replication")
        return self.pseudo_invert()

    def pseudo_invert(self) -> LinearLayout:
        """A right inverse ``R`` of a surjective layout ``L``: ``L(R(y)) == y`` for every ``y``.

        Among the hardware points holding ``y``, ``R`` picks the one built only from the earliest
        independent input bits (in input-dim order, low bits first), so replicated bits are 0.
        """
        if not self.is_surjective():
            raise LayoutError("SP0403", f"layout is not surjective (rank {self.rank} < "
                              f"{self.total_out_bits} output bits): some logical elements have no holder")
        span = self._span
        cols = []
        for j in range(self.total_out_bits):
            sol = span.solve(1 << j)
            assert sol is not None
            cols.append(sol)
        return LinearLayout._from_columns(self.out_dims, self.in_dims, cols)

    def product(self, other: LinearLayout) -> LinearLayout:
        """Direct sum (Triton's ``*``): dims only in one factor are kept; a shared input dim gets
        ``self``'s bits low and ``other``'s high; a shared output dim has its sizes multiplied,
        ``self`` in the low part and ``other`` shifted above it."""
        out_dims: list[tuple[str, int]] = list(self.out_dims)
        shift_other = {}
        for name, size in other.out_dims:
            mine = self.out_size(name) if name in self.out_names else None
            if mine is None:
                out_dims.append((name, size))
                shift_other[name] = 1
            else:
                shift_other[name] = mine
                out_dims = [(n, s * size if n == name else s) for n, s in out_dims]
        out_names = [n for n, _ in out_dims]

        def lift(layout: LinearLayout, basis: tuple[int, ...], scale: Mapping[str, int]) -> tuple[int, ...]:
            d = dict(zip(layout.out_names, basis))
            return tuple(d.get(n, 0) * scale.get(n, 1) for n in out_names)

        rows: dict[str, list[tuple[int, ...]]] = {}
        for name, row in zip(self.in_names, self.bases):
            rows[name] = [lift(self, b, {}) for b in row]
        for name, row in zip(other.in_names, other.bases):
            rows.setdefault(name, []).extend(lift(other, b, shift_other) for b in row)
        return LinearLayout.from_bases(rows, out_dims)

    def __mul__(self, other: LinearLayout) -> LinearLayout:
        return self.product(other)

    def sublayout(self, in_names: Iterable[str], out_names: Iterable[str]) -> LinearLayout:
        """Keep only the listed input dims and project onto the listed output dims (kept in this
        layout's order; names it does not have are ignored)."""
        keep_in = set(in_names)
        keep_out = set(out_names)
        out_idx = [i for i, n in enumerate(self.out_names) if n in keep_out]
        out_dims = tuple(self.out_dims[i] for i in out_idx)
        in_dims = []
        rows = []
        for (name, size), row in zip(self.in_dims, self.bases):
            if name in keep_in:
                in_dims.append((name, size))
                rows.append(tuple(tuple(b[i] for i in out_idx) for b in row))
        return LinearLayout(tuple(in_dims), out_dims, tuple(rows))

    def restrict_ins(self, in_names: Iterable[str]) -> LinearLayout:
        return self.sublayout(in_names, self.out_names)

    def transpose_outs(self, order: Sequence[str]) -> LinearLayout:
        """Reorder the output dims (a permutation of their names)."""
        if sorted(order) != sorted(self.out_names):
            raise LayoutError("SP0402", f"{list(order)} is not a permutation of the output dims "
                              f"{list(self.out_names)}")
        idx = [self.out_names.index(n) for n in order]
        return LinearLayout(self.in_dims, tuple(self.out_dims[i] for i in idx),
                            tuple(tuple(tuple(b[i] for i in idx) for b in row) for row in self.bases))

    def transpose_ins(self, order: Sequence[str]) -> LinearLayout:
        """Reorder the input dims (a permutation of their names)."""
        if sorted(order) != sorted(self.in_names):
            raise LayoutError("SP0402", f"{list(order)} is not a permutation of the input dims "
                              f"{list(self.in_names)}")
        idx = [self.in_names.index(n) for n in order]
        return LinearLayout(tuple(self.in_dims[i] for i in idx), self.out_dims,
                            tuple(self.bases[i] for i in idx))

    def rename_ins(self, mapping: Mapping[str, str]) -> LinearLayout:
        return LinearLayout(tuple((mapping.get(n, n), s) for n, s in self.in_dims), self.out_dims, self.bases)

    def rename_outs(self, mapping: Mapping[str, str]) -> LinearLayout:
        return LinearLayout(self.in_dims, tuple((mapping.get(n, n), s) for n, s in self.out_dims), self.bases)

    def reshape_outs(self, new_dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> LinearLayout:
        """Flatten the output dims row-major (last dim fastest) and split the flat index into
        ``new_dims`` row-major."""
        new = _normalize_dims(new_dims, "output")
        if _prod(s for _, s in new) != _prod(self.out_shape):
            raise LayoutError("SP0402", f"cannot reshape outputs {list(self.out_dims)} to {list(new)}: "
                              "sizes differ")
        new_shifts = _row_major_shifts(new)
        old_shifts = _row_major_shifts(self.out_dims)
        rows = []
        for row in self.bases:
            new_row = []
            for b in row:
                flat = sum(c << s for c, s in zip(b, old_shifts))
                new_row.append(tuple((flat >> s) & (size - 1) for s, (_, size) in zip(new_shifts, new)))
            rows.append(tuple(new_row))
        return LinearLayout(self.in_dims, new, tuple(rows))

    def reshape_ins(self, new_dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> LinearLayout:
        """Flatten the input dims row-major (last dim fastest) and split the flat index into
        ``new_dims`` row-major."""
        new = _normalize_dims(new_dims, "input")
        if _prod(s for _, s in new) != _prod(s for _, s in self.in_dims):
            raise LayoutError("SP0402", f"cannot reshape inputs {list(self.in_dims)} to {list(new)}: "
                              "sizes differ")
        flat_bases: list[tuple[int, ...]] = []  # bases in row-major flat bit order (bit 0 first)
        for row in reversed(self.bases):
            flat_bases.extend(row)
        rows = []
        i = 0
        for _, size in reversed(new):
            n = log2_exact(size)
            rows.append(tuple(flat_bases[i:i + n]))
            i += n
        return LinearLayout(new, self.out_dims, tuple(reversed(rows)))

    def merge_ins(self, names: Sequence[str], new_name: str) -> LinearLayout:
        """Merge input dims ``names`` into one dim ``new_name`` (row-major: the last listed name is
        the fastest), placed where the first of them was."""
        for n in names:
            if n not in self.in_names:
                raise LayoutError("SP0402", f"merge_ins: no input dim {n!r} in {list(self.in_names)}")
        merged_bases: list[tuple[int, ...]] = []
        for n in reversed(names):
            merged_bases.extend(self.bases[self.in_names.index(n)])
        in_dims, rows = [], []
        placed = False
        for (name, size), row in zip(self.in_dims, self.bases):
            if name in names:
                if not placed:
                    in_dims.append((new_name, 1 << len(merged_bases)))
                    rows.append(tuple(merged_bases))
                    placed = True
            else:
                in_dims.append((name, size))
                rows.append(row)
        return LinearLayout(tuple(in_dims), self.out_dims, tuple(rows))

    def with_out_dims(self, out_dims: Mapping[str, int] | Sequence[tuple[str, int]]) -> LinearLayout:
        """The same map with output dims resized/extended (new dims get coordinate 0)."""
        new = _normalize_dims(out_dims, "output")
        old = dict(zip(self.out_names, range(len(self.out_dims))))
        rows = tuple(tuple(tuple(b[old[n]] if n in old else 0 for n, _ in new) for b in row)
                     for row in self.bases)
        return LinearLayout(self.in_dims, new, rows)

    # ---- printing ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}:{s}" for n, s in self.in_dims)
        outs = ", ".join(f"{n}:{s}" for n, s in self.out_dims)
        lines = [f"LinearLayout(in=[{ins}] -> out=[{outs}]"]
        for (name, _), row in zip(self.in_dims, self.bases):
            if len(self.out_dims) == 1:
                shown = ", ".join(str(b[0]) for b in row)
            else:
                shown = ", ".join("(" + ",".join(str(c) for c in b) + ")" for b in row)
            lines.append(f"  {name}=[{shown}]")
        return "\n".join(lines) + ")"


def _prod(xs: Iterable[int]) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _offsets(dims: Dims) -> list[int]:
    """Bit offset of each dim in the internal flat encoding (first dim lowest)."""
    out, s = [], 0
    for _, size in dims:
        out.append(s)
        s += log2_exact(size)
    return out


def _row_major_shifts(dims: Dims) -> list[int]:
    """Bit offset of each dim in a row-major flat index (last dim lowest)."""
    out = [0] * len(dims)
    s = 0
    for i in range(len(dims) - 1, -1, -1):
        out[i] = s
        s += log2_exact(dims[i][1])
    return out


def identity_nd(in_name: str, dims: Sequence[tuple[str, int]],
                order: Sequence[int] | None = None) -> LinearLayout:
    """An identity from one input dim onto several output dims: the input's low bits walk
    ``dims[order[0]]`` first, then ``dims[order[1]]`` ... (default: last dim fastest)."""
    dims = _normalize_dims(dims, "output")
    order = list(order) if order is not None else list(range(len(dims) - 1, -1, -1))
    layout = LinearLayout.zeros(in_name, 1, ())
    for i in order:
        name, size = dims[i]
        layout = layout * LinearLayout.identity(in_name, size, name)
    return layout.with_out_dims(dims)


__all__ = [
    "UNUSED_DIM",
    "GF2Span",
    "LayoutError",
    "LinearLayout",
    "bit_list",
    "gf2_rank",
    "identity_nd",
    "is_power_of_two",
    "log2_exact",
    "next_power_of_two",
    "padded_shape",
]
