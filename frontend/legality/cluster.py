"""Legality rules of thread-block clusters (``ops_cluster.py``) and of CTA-pair tcgen05 ops.

* clusters exist from sm_90 on (``Feature.CLUSTER``): ``cluster.*`` ops and cluster TMA loads, and
  a kernel that declares a cluster shape, need it (SP0602 at the op / the kernel);
* a declared shape is 1 to 3 positive ints of at most 8 CTAs in all, the portable limit (SP0558);
* ``cluster.sync()`` is ``barrier.cluster ... .aligned`` which every non-exited thread of the
  cluster must reach: not inside a ``warp_specialize`` partition, whose warps run other code
  (SP0553; PTX ISA 9.7.13.3);
* all tcgen05 ops of a kernel use one ``cta_group`` (ptxas rejects a kernel mixing ``::1`` and
  ``::2``, docs/hardware.md §1.1; PTX ISA 9.7.16.9.2, 9.7.16.12.1): SP0556 at the first op of the
  minority group.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...target.targets import Feature, feature_problem
from ..diagnostics import Diagnostic
from ..ir.core import Function, Operation
from .core import Context, function_rule, require_feature, rule

SP_CLUSTER_REQUIRED = "SP0552"
"""A cluster op (or a multicast / peer-barrier / cta_group=2 form) in a kernel without a cluster."""
SP_CLUSTER_SYNC_PARTITION = "SP0553"
"""``cluster.sync()`` inside a ``warp_specialize`` partition."""
SP_CLUSTER_RANK = "SP0554"
"""A multicast mask or CTA rank outside the cluster."""
SP_CTA_PAIR_SHAPE = "SP0555"
"""A cta_group=2 MMA whose per-CTA operands do not form an M = 256 pair MMA."""
SP_CTA_GROUP_MIX = "SP0556"
"""tcgen05 ops of one kernel with different ``cta_group``."""
SP_CTA_PAIR_CLUSTER = "SP0557"
"""A CTA-pair op in a cluster with an odd number of CTAs."""
SP_CLUSTER_SHAPE = "SP0558"
"""A cluster shape that is not 1-3 positive ints of at most 8 CTAs."""

MAX_PORTABLE_CLUSTER = 8

require_feature("CLUSTER", "`{op}` (thread-block clusters)", "cluster.rank", "cluster.sync")


@rule("cluster.sync")
def cluster_sync_whole_cta(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    if ctx.in_partition:
        yield Diagnostic(SP_CLUSTER_SYNC_PARTITION, "cluster.sync() must be reached by every thread of every CTA of "
                         "the cluster; inside a warp_specialize partition the other partitions' warps never arrive",
                         op.span, help="call cluster.sync() before or after warp_specialize, at the kernel's level")


@rule("tma.load_cluster")
def cluster_tma_target(op: Operation, ctx: Context) -> Iterator[Diagnostic]:

    d = feature_problem(ctx.target, Feature.CLUSTER, op.span, what="a multicast / peer-barrier TMA load")
    if d is None and op.attrs.get("peer_bar"):
        d = feature_problem(ctx.target, Feature.TMA_CTA_GROUP, op.span,
                            what="a TMA load counted on a peer CTA's mbarrier (`.cta_group::2`)")
    if d is not None:
        yield d


@function_rule()
def cluster_shape(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    shape = func.attrs.get("cluster")
    if not shape:
        return
    ok = len(shape) == 3 and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in shape)
    size = shape[0] * shape[1] * shape[2] if ok else 0
    if not ok or size > MAX_PORTABLE_CLUSTER:
        yield Diagnostic(SP_CLUSTER_SHAPE, f"a cluster is 1 to 3 positive ints of at most {MAX_PORTABLE_CLUSTER} "
                         f"CTAs in all, found cluster={tuple(shape)}", func.span,
                         help="e.g. cluster=(2, 1, 1); 8 CTAs is the portable limit")
        return

    d = feature_problem(ctx.target, Feature.CLUSTER, func.span, what=f"a kernel declaring cluster={tuple(shape)}")
    if d is not None:
        yield d


@function_rule()
def one_cta_group(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    ops = [op for op in func.walk() if op.name.startswith("tcgen05.") and "cta_group" in op.attrs]
    groups = {op.attrs["cta_group"] for op in ops}
    if len(groups) < 2:
        return
    first = {g: next(op for op in ops if op.attrs["cta_group"] == g) for g in groups}
    count = {g: sum(op.attrs["cta_group"] == g for op in ops) for g in groups}
    minority = min(groups, key=lambda g: (count[g], -g))
    other = next(g for g in groups if g != minority)
    yield Diagnostic(SP_CTA_GROUP_MIX, f"all tcgen05 operations of a kernel use one cta_group, but this one uses "
                     f"cta_group={minority} and another uses cta_group={other}", first[minority].span,
                     help=f"write cta_group={other} on every tcgen05.mma / copy / commit of the kernel "
                          "(ptxas rejects a kernel that mixes them)")
