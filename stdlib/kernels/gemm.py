"""``sparse_matmul``: the Hopper 2:4 sparse GEMM of ``sparse_gemm_sm90.spk`` as a Python function
(and, with ``target="sm_100a"`` / sm_103a / sm_110a, the Blackwell kernels of :mod:`.gemm_sm100`).

    C (M x N) = decompress(values, meta) (M x K) @ b.T            b stored N x K

``values`` (M, K/2) and ``meta`` (the "sm90" metadata words of docs/sparse-metadata.md, best as the
tagged :class:`~sparsile.stdlib.sparsity.MetadataBuffer` that ``encode_metadata`` returns) come from
the sparsity toolkit, or from :func:`~.compress_weight.prune_and_compress`. Arrays may be numpy,
torch or cupy: CUDA tensors are used in place, host arrays are copied to the GPU and back by the
launcher. With ``interpret=True`` the same kernel runs in the CPU interpreter (no GPU needed).

What is checked before anything is launched (each a :class:`~sparsile.stdlib.sparsity.SparsityError`
with an SP08xx code): ranks and element types (SP0804), a dtype without a kernel (SP0804), values and
b covering the same K (SP0815: b's K must equal the K a tagged metadata buffer records, and values
may exceed it only by compress()'s padding to a whole chunk; raw metadata words carry no K, so with
them b may be up to a chunk narrower than values: pass the tagged buffer to have K checked exactly),
the metadata's tag, shape and nibbles (``validate_metadata``:
SP0805-SP0812; a device array is checked for shape and element type only, since reading its nibbles
would copy it to the host on every call), an ``out`` of the wrong shape or type (SP0804), a C or
split-K workspace of more than 2^31 elements, which the kernels' 32-bit offsets would wrap (SP0804).

Padding: TMA reads rows whose byte length is a multiple of 16 (docs/hardware.md §5.1, CUDA's
``cuTensorMapEncodeTiled`` stride rule), i.e. K a multiple of 32 / element bytes (16 for 16-bit
operands, 32 for 8-bit, 8 for tf32). Other K are zero-padded here (a copy of values and b); the
kernel reads metadata words past the end of a row as 0x44444444, the "indices 0, 1" chunk, which
paired with zero values adds nothing, so the metadata is never copied.
"""

from __future__ import annotations

import functools
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...driver.recording import recording
from ..sparsity.dtypes import operand_type
from ..sparsity.hostarray import checked_flag
from . import call_cache
from .arrays import (
    array_kind,
    bad_input,
    check_i32_elements,
    check_split_k,
    check_split_workspace,
    deliver_result,
    empty_array,
    fill,
    output_array,
    pad_columns,
    plain_int,
)
from .gemm_choice import (
    KernelChoice,
    check_operand_order,
    checked_out_dtype,
    resolve_kernel_choice,
)
from .gemm_operands import checked_operands, kernel_words
from .plan_device import plan_gpu, plans_on_arrays

KERNEL_FILE = Path(__file__).resolve().parent / "sparse_gemm_sm90.spk"
META_TMA_FILE = Path(__file__).resolve().parent / "sparse_gemm_sm90_mt.spk"
META_TMA_OPERANDS = ("f16", "bf16", "e4m3")
"""Operand types whose sm_90a kernels have a twin in ``sparse_gemm_sm90_mt.spk`` that streams the
metadata by TMA (4-6 % faster at 8192³ on the H200: benchmarks/RESULTS.md, nineteenth session)."""
META_TMA_ENV = "SPARSILE_META_TMA"
META_TMA_SPLIT_K = True
"""Whether split-K plans (SPLIT_K > 1) take the ``_mt`` kernels too. Shares of an odd number of K
steps once started a two-step metadata box 8 bytes into a 16-byte piece, which faulted on the H200;
the kernels start every share at an even step (``k_steps_of_this_cta``'s ALIGN), and the
interpreter reports a box that starts off a 16-byte boundary (SP0789). On since the GPU test of
those share counts and the whole GPU suite passed with it (benchmarks/RESULTS.md, twentieth
session); False keeps split-K plans on the kernels that load their own metadata."""
BM = 128  # rows of C per CTA: two consumer warpgroups of 64 rows (the kernel's default BM)
H200_SMS = 132  # SMs assumed for the split-K choice when no GPU is visible (interpreter, AOT)


def choose_split_k(m: int, n: int, k: int, bn: int, choice: KernelChoice, sms: int) -> int:
    """Split K when C has too few tiles to occupy the GPU: enough shares to give every SM a CTA,
    at most 8, and at least 4 K steps per share (each share pays a pipeline fill and an f32
    workspace write and read). 1 when the tiles already cover half of the SMs."""
    tiles = -(-m // BM) * -(-n // bn)
    steps = -(-k // choice.block_k)
    if tiles == 0 or tiles * 2 > sms:
        return 1
    return max(1, min(sms // tiles, steps // 4, 8))


@functools.cache
def kernel_module() -> Any:
    """The loaded ``sparse_gemm_sm90.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(KERNEL_FILE)


@functools.cache
def meta_tma_module() -> Any:
    """The loaded ``sparse_gemm_sm90_mt.spk`` module (the ``_mt`` kernels; parsed once per process)."""
    from ...driver.module import load

    return load(META_TMA_FILE)


def metadata_by_tma(operand: str, words: Any) -> bool:
    """Whether the ``_mt`` kernels can read the metadata words ``words`` by TMA: an operand type that
    has them, a 2-D array whose rows are a multiple of 16 bytes (4 words: ceil(K / 32) a multiple of 4)
    and, on the GPU, start 16-byte aligned (a TMA tensor's base and row stride). numpy (the
    interpreter, or copied to the GPU by the launch), torch and cupy arrays; others (JAX's) keep
    the kernels that load the words themselves. ``SPARSILE_META_TMA=0`` turns them off (A/B timing)."""
    if os.environ.get(META_TMA_ENV) == "0":
        return False
    if operand not in META_TMA_OPERANDS or len(getattr(words, "shape", ())) != 2 or int(words.shape[1]) % 4:
        return False
    kind = array_kind(words)
    if kind == "torch":
        return words.data_ptr() % 16 == 0
    if kind == "cupy":
        return words.data.ptr % 16 == 0
    return kind in ("numpy", "torch-cpu")


def sm90_kernel(name: str, operand: str, words: Any, split_k: int) -> Any:
    """Kernel ``name`` of ``sparse_gemm_sm90.spk``, or its ``_mt`` twin where the metadata ``words``
    can go by TMA (:func:`metadata_by_tma`; split-K plans only with :data:`META_TMA_SPLIT_K`)."""
    if (split_k == 1 or META_TMA_SPLIT_K) and metadata_by_tma(operand, words):
        return getattr(meta_tma_module(), f"{name}_mt")
    return getattr(kernel_module(), name)


# ------------------------------------------------------------------------------------------------
# the prepared launch


@dataclass(frozen=True, eq=False)
class SparseMatmul:
    """One prepared launch of the sparse GEMM: checked, padded arguments, the kernel and the grid.

    :meth:`run` launches it (or interprets it), :meth:`compile` compiles the specialization it would
    launch for any target without a GPU.
    """

    choice: KernelChoice
    m: int
    n: int
    k: int            # K of b before padding
    k_padded: int     # K the kernel is launched with (a multiple of choice.k_align)
    values: Any
    meta: Any
    b: Any
    out: Any
    bn: int
    split_k: int = 1
    workspace: Any = None  # (split_k, M, N) partial sums when split_k > 1 or C is stored by splitk_reduce
    pair_ctas: int = 0     # > 0: the CTA-pair kernel (B multicast) on that many CTAs (persistent)
    out_dtype: str = ""    # numpy name of C's element type ("": the kernel's own, choice.out_dtype)
    pingpong_ctas: int = 0  # > 0: the ping-pong kernel (gemm_schedule.py) on that many CTAs (persistent)

    @property
    def partials(self) -> bool:
        """Whether the ``_splitk`` kernel runs: K is split, or C is not the kernel's own store type
        (the f32 partial sums then go to C itself when it is f32, else through ``splitk_reduce``,
        which converts on its store)."""
        return self.split_k > 1 or self.out_dtype not in ("", self.choice.out_dtype)

    @property
    def grid(self) -> tuple[int, int]:
        """One CTA per BM x BN tile of C and per share of K (split-K); the pair kernel: its
        persistent grid of ``pair_ctas`` CTAs; the ping-pong kernel: ``pingpong_ctas``."""
        if self.pair_ctas or self.pingpong_ctas:
            return (self.pair_ctas or self.pingpong_ctas, 1)
        return (-(-self.m // BM) * -(-self.n // self.bn), self.split_k)

    @property
    def kernel(self) -> Any:
        """The kernel launched: the ping-pong kernel, or ``sparse_gemm_<t>`` (``_splitk`` for partial
        sums, ``_pair`` for CTA pairs), its ``_mt`` twin where the metadata can go by TMA
        (:func:`metadata_by_tma`)."""
        if self.pingpong_ctas:
            from .gemm_schedule import pingpong_module

            return getattr(pingpong_module(), f"{self.choice.kernel}_pingpong")
        name = f"{self.choice.kernel}_splitk" if self.partials else self.choice.kernel
        return sm90_kernel(f"{name}_pair" if self.pair_ctas else name, self.choice.operand, self.meta, self.split_k)

    def arguments(self) -> tuple[Any, ...]:
        lde = int(self.meta.shape[1])
        c = self.out if self.workspace is None else self.workspace
        return (self.values, self.meta, self.b, c, self.m, self.n, self.k_padded, lde, self.n)

    def compile(self, target: str = "sm_90a") -> Any:
        """Compile (through the compile cache) for ``target``; returns the CompiledKernel."""
        return self.kernel[self.grid].compile_for(target, *self.arguments(), **self._constexprs())

    def _constexprs(self) -> dict[str, int]:
        return {"BN": self.bn, "SPLIT_K": self.split_k} if self.partials else {"BN": self.bn}

    def run(self, interpret: bool = False, **constexprs: Any) -> Any:
        """Launch on the current GPU (or run in the interpreter) and return ``out``. ``constexprs``
        (STAGES, GROUP_M: a tuned config's) go to the GEMM launches, not to ``splitk_reduce``."""
        if self.m and self.n:
            launch = self.kernel.interpret[self.grid] if interpret else self.kernel[self.grid]
            launch(*self.arguments(), **self._constexprs(), **constexprs)
            if self.workspace is not None:
                reduce = kernel_module().splitk_reduce
                grid = (-(-self.m * self.n // 1024),)
                (reduce.interpret[grid] if interpret else reduce[grid])(
                    self.workspace, self.out, self.m * self.n, SPLIT_K=self.split_k)
        return self.out


def matmul_output(out: Any, m: int, n: int, choice: KernelChoice, home: Any, interpret: bool,
                  dtype: str | None = None, reads: tuple[Any, ...] = ()) -> Any:
    """The C array the kernel writes (numpy dtype name ``dtype``, default the kernel's own): ``out``
    itself when the launch can write it in place, else a new array (a torch/cupy array on
    ``home``'s device for a GPU launch, numpy otherwise)."""
    dtype = dtype or choice.out_dtype
    rule = (f"{choice.operand} operands produce {dtype} C" if dtype == choice.out_dtype
            else f"C is out_dtype={dtype}")
    return output_array(out, (m, n), dtype, rule, home, interpret, reads)


def plan_target(target: str | None, interpret: bool) -> str:
    """The target a launch is planned for: ``target``, else the current GPU's Blackwell target, else
    sm_90a (the Hopper kernel; also in the interpreter when no target is named)."""
    from .gemm_sm100 import BLACKWELL_TARGETS, device_target

    checked_flag(interpret, "interpret")
    if target is None:
        return (None if interpret else device_target()) or "sm_90a"
    target = _canonical_target(target)
    if target != "sm_90a" and target not in BLACKWELL_TARGETS:
        from ...target.targets import target_suggestion

        hint = target_suggestion(target, ("sm_90a", *BLACKWELL_TARGETS))
        raise bad_input(f"there is no sparse GEMM kernel for target {target!r}",
                        help=f"{hint}use sm_90a (Hopper) or one of {', '.join(BLACKWELL_TARGETS)} (Blackwell)")
    return target


def _canonical_target(target: object) -> object:
    """``target`` as the target table names it where ``get_target`` (SP0601) takes the spelling
    (``"SM_90A"``, ``"90a"``, ``"sm-100a"``: the spellings every other entry point takes), else as given
    (the caller's SP0804 names it and suggests a target)."""
    from ...frontend.diagnostics import CompileError
    from ...target.targets import get_target

    if not isinstance(target, str):
        return target
    try:
        return get_target(target).name
    except CompileError:
        return target


@plans_on_arrays
def plan_sparse_matmul(values: Any, meta: Any, b: Any, *, out: Any = None, dtype: str | None = None,
                       interpret: bool = False, target: str | None = None, persistent: bool = True,
                       num_sms: int | None = None, split_k: int | None = None, out_dtype: Any = None,
                       schedule: str | None = None, kernel: str | None = None) -> Any:
    """Check and pad the arguments of :func:`sparse_matmul` and pick the kernel, without launching:
    a :class:`SparseMatmul` for sm_90a, a :class:`~.decode.SparseDecodePlan` (feature-major) where
    the decode kernel takes N <= 64 on sm_90a (:func:`takes_decode`), a
    :class:`~.gemm_sm100.SparseMatmulSm100` for Blackwell. ``schedule``: see :mod:`.gemm_schedule`
    (SP0865). The plan's C is ``out`` where the kernel can write it in place; else (a
    non-contiguous out, or one sharing device memory with b or the weight) a new array, which
    :func:`sparse_matmul` copies into out after the launch and ``plan.run()`` returns as it is.

    The plan holds the operands it launches with: the caller's arrays where the kernel reads them
    in place, else copies made now (cast to the operand type, K zero-padded to 16-byte rows). A
    ``run()`` after an operand was edited in place therefore sees the edit only where the plan
    holds the caller's array (an aligned K of the operand type: it reads the new values; a padded
    or cast copy: the old ones): plan again for new operand values."""
    from .decode import check_kernel_choice
    from .gemm_schedule import checked_schedule, pingpong_block_n, pingpong_ctas

    check_operand_order(values, meta, b, "sparse_matmul", "b")
    split_k, num_sms = plain_int(split_k), plain_int(num_sms)  # numpy integers are integers
    tgt = plan_target(target, interpret)
    checked_flag(persistent, "persistent")
    check_kernel_choice(kernel, "sparse_matmul")  # SP0860 for a kernel choice there is not, whatever the target
    if schedule is not None:
        choice = resolve_kernel_choice(values, meta, dtype)
        schedule = checked_schedule(schedule, choice.operand, tgt, split_k,
                                    checked_out_dtype(out_dtype, choice) != choice.out_dtype, persistent)
    if num_sms is not None and not (isinstance(num_sms, numbers.Integral) and not isinstance(num_sms, bool)
                                    and num_sms >= 1):
        raise bad_input(f"num_sms must be a positive integer, got {num_sms!r}",
                        help="leave it unset for the GPU's SM count, or pass how many SMs the kernel may use")
    if tgt != "sm_90a":
        from .gemm_sm100 import plan_sparse_matmul_sm100

        check_split_k(split_k)  # no Blackwell kernel splits K, but a bad value is not ignored

        if out_dtype is not None:
            choice = resolve_kernel_choice(values, meta, dtype)
            if checked_out_dtype(out_dtype, choice) != choice.out_dtype:
                raise bad_input(f"out_dtype={out_dtype} is not available on {tgt}: the Blackwell kernels store "
                                f"{choice.out_dtype} C", help="leave out_dtype unset, or plan for target='sm_90a'")

        return plan_sparse_matmul_sm100(values, meta, b, target=tgt, out=out, dtype=dtype, interpret=interpret,
                                        persistent=persistent, num_sms=num_sms)
    choice = resolve_kernel_choice(values, meta, dtype)
    c_dtype = checked_out_dtype(out_dtype, choice)
    op = operand_type(choice.operand)
    home = b
    values, b, m, n, k, k_values = checked_operands(values, b, choice, op, interpret)
    check_i32_elements((m, n), "C", help="compute C in parts: call sparse_matmul on blocks of b's rows (N) "
                       "and join the (M, block) results along N")
    words = kernel_words(meta, values, op, m, k_values, k, interpret)
    if c_dtype == "bfloat16" and not interpret and "cupy" in (array_kind(home), array_kind(out)):
        raise bad_input("cupy has no bfloat16 arrays for C", help="pass torch tensors, or out_dtype='float32'")
    c = matmul_output(out, m, n, choice, home, interpret, c_dtype, (values, words))
    if takes_decode(kernel, choice, m, n, k_values, tgt, split_k, schedule):
        from .decode import plan_sparse_decode

        # the checked words and operands (cast to the operand type, which then names the kernel)
        return plan_sparse_decode(values, words, b, out=c, out_dtype=c_dtype, interpret=interpret, split_k=split_k,
                                  num_sms=None if num_sms is None else int(num_sms), feature_major=True)
    k_padded = -(-k_values // choice.k_align) * choice.k_align
    values = pad_columns(values, k_padded // 2)
    b = pad_columns(b, k_padded)
    bn = choice.block_n(n)
    if schedule == "pingpong":  # checked above: f16/bf16, float16 C, no split-K
        bn = pingpong_block_n(bn)
        return SparseMatmul(choice, m, n, k, k_padded, values, words, b, c, bn, out_dtype=c_dtype,
                            pingpong_ctas=pingpong_ctas(m, n, bn, num_sms or gpu_sm_count(interpret)))
    split = split_k if split_k is not None else choose_split_k(m, n, k_padded, bn, choice,
                                                               num_sms or gpu_sm_count(interpret))
    check_split_k(split)
    check_split_workspace(split, m, n, "compute C in blocks of b's rows")
    converts = c_dtype != choice.out_dtype  # the _splitk kernel's f32 partials, then C's type on the reduce
    needs_workspace = split > 1 or (converts and c_dtype != choice.partial_dtype)
    workspace = empty_array(home, (split, m, n), choice.partial_dtype, interpret) if needs_workspace else None
    pair = 0 if converts else pair_ctas(m, n, bn, choice, split, persistent, num_sms or gpu_sm_count(interpret))
    return SparseMatmul(choice, m, n, k, k_padded, values, words, b, c, bn, split, workspace, pair, c_dtype)


def takes_decode(kernel: str | None, choice: KernelChoice, m: int, n: int, k: int, target: str,
                 split_k: int | None, schedule: str | None) -> bool:
    """Whether sparse_matmul runs the decode kernel (sparse_decode_sm90.spk, feature-major C):
    as for ``sparse_linear`` (:func:`~.decode.wants_decode`: ``kernel`` None / "auto" / "decode",
    N <= 64 tokens, sm_90a, unless SPARSILE_DECODE_KERNEL=0), for f16, bf16 and e4m3 operands,
    the default schedule, a non-empty problem, and an explicit ``split_k`` the decode kernel takes
    (1 to 16; others go to the tiled kernels, which split up to 64 and refuse the rest, unless
    ``kernel="decode"`` asks, whose plan refuses them). On
    the H200 it is faster than the tiled kernel with split-K at N <= 64 (benchmarks/RESULTS.md)."""
    from .decode import MAX_SPLIT, wants_decode

    if not wants_decode(kernel, n, target) or schedule not in (None, "default"):
        return False
    if choice.operand not in ("f16", "bf16", "e4m3") or not (m and n and k):
        return False
    return kernel == "decode" or split_k is None or (type(split_k) is int and 1 <= split_k <= MAX_SPLIT)


PAIR_MIN_TILES_PER_SM = 4


def pair_ctas(m: int, n: int, bn: int, choice: KernelChoice, split_k: int, persistent: bool, sms: int) -> int:
    """How many CTAs the CTA-pair kernel (``sparse_gemm_<t>_pair``: clusters of two CTAs that share
    each B panel through TMA multicast) runs on, persistent; 0 for the one-CTA kernel. It is chosen
    for large C without split-K: at least PAIR_MIN_TILES_PER_SM tiles per SM. On the H200 it ran
    3-7% faster there (f16 8192³ 1060 against 1120 µs, 16384³ 9543 against 10200 µs; one shape,
    28672 x 4096 x 8192, 3% slower: benchmarks/RESULTS.md)."""
    tiles = -(-m // BM) * -(-n // bn)
    if not persistent or split_k != 1 or sms < 2 or tiles < PAIR_MIN_TILES_PER_SM * sms:
        return 0
    if not has_pair_kernel(choice):
        return 0
    return pair_grid(m, n, bn, sms)


def has_pair_kernel(choice: KernelChoice) -> bool:
    """Whether the operand type has a CTA-pair kernel (``sparse_gemm_<t>_pair``: f16, bf16, e4m3)."""
    return hasattr(kernel_module(), f"{choice.kernel}_pair")


def pair_grid(m: int, n: int, bn: int, sms: int) -> int:
    """CTAs of the persistent CTA-pair kernel for an M x N output in BM x ``bn`` tiles: one per
    tile, at most the SMs (an even count: the CTAs run in clusters of two, each cluster computing
    2 BM x ``bn`` tiles)."""
    return min(2 * -(-m // (2 * BM)) * -(-n // bn), sms - sms % 2)


def gpu_sm_count(interpret: bool) -> int:
    """The SM count of the GPU being planned for (:func:`~.plan_device.plan_gpu`: the arrays'
    device, else the current one; H200's 132 without a GPU or in the interpreter)."""
    if interpret:
        return H200_SMS
    from ...backend import runtime

    return plan_gpu().sm_count if runtime.has_gpu() else H200_SMS


def sparse_matmul(values: Any, meta: Any, b: Any, *, out: Any = None, dtype: str | None = None,
                  interpret: bool = False, target: str | None = None, persistent: bool = True,
                  num_sms: int | None = None, split_k: int | None = None, out_dtype: Any = None,
                  schedule: str | None = None, kernel: str | None = None) -> Any:
    """``decompress(values, meta) @ b.T`` with the Hopper or the Blackwell sparse GEMM.

    ``target``: "sm_90a" (the Hopper kernels of ``sparse_gemm_sm90.spk``: one CTA per tile, or, for
    a large C, CTA pairs sharing B by TMA multicast on a persistent grid, see :func:`pair_ctas`;
    ``persistent=False`` keeps one CTA per tile), or "sm_100a" / "sm_103a" /
    "sm_110a" (Blackwell, :mod:`.gemm_sm100`: the persistent kernel, or the one-tile-per-program
    kernel with ``persistent=False``; ``num_sms`` bounds the persistent grid, default the GPU's SM
    count, 148 without one); default: the current GPU's Blackwell target if it is one, else sm_90a.
    On Blackwell the metadata may be in any format (re-encoded to "tcgen05" once) and C of f16,
    bf16, e4m3 and tf32 operands is float16.

    values: (M, K/2) compressed operand (f16, bf16, e4m3, s8 or f32-as-tf32); meta: its "sm90"
    metadata (a MetadataBuffer from ``encode_metadata``, or the raw (M16, W) uint32/int32 words);
    b: (N, K) dense operand. ``dtype`` names the operand type (default: a MetadataBuffer's tag,
    else values' element type; f16 / bf16 / e4m3 / s8 values with a buffer tagged for another type
    are refused, SP0804, as are integer values for a floating-point type, the bits of a compressed
    weight viewed as integers, and bool values for any type, a keep mask); values and b are cast to
    it (a bool or complex b is refused, SP0804: ``np.matmul`` of bools is a logical product).
    C is (M, N) float16 (int32 for s8, float32 for tf32), or
    ``out_dtype`` ("bfloat16" or "float32", any spelling torch or numpy uses; f16, bf16, e4m3 and
    tf32 operands, Hopper only): float16 C overflows to inf beyond ±65504, bfloat16 and float32 C
    hold any f32 accumulator (the ``_splitk`` kernel stores the f32 sums, ``splitk_reduce`` converts
    them; no CTA-pair kernel). C is returned in ``out`` when given, else as a new array of b's kind (a
    torch/cupy array on b's device, or numpy). ``interpret=True`` runs the same kernel in the CPU
    interpreter. Without a GPU (and without ``interpret``) it raises LaunchError SP0731. ``split_k``
    (Hopper): shares of K computed by separate CTAs into an f32 (s8: i32) workspace, then added
    (``splitk_reduce``); default :func:`choose_split_k`, which splits only when C has fewer tiles than
    half the SMs. On a GPU with a shipped table of tuned choices (``tuned/<gpu>.json``,
    docs/autotune.md), a shape it lists (same M and K, a tuned N at least the call's and less than
    twice it) runs with its BN, STAGES, split-K and CTA-pair choice unless ``split_k`` or ``num_sms``
    is given. ``schedule="pingpong"`` (sm_90a; f16, bf16; float16 C; no
    split-K) runs the ping-pong kernel of ``sparse_gemm_sm90_pingpong.spk`` on a persistent grid
    (:mod:`.gemm_schedule`; not yet timed on a GPU); None or "default" the kernels above (SP0865
    for another value). ``kernel``: for N <= 64 on sm_90a (f16, bf16, e4m3 operands) the decode
    kernel of ``sparse_linear`` runs by default, storing C feature-major (:func:`takes_decode`;
    its split-K and ring from the decode table, docs/autotune.md); "gemm" (or
    SPARSILE_DECODE_KERNEL=0) keeps the tiled kernels, "decode" asks for it (SP0860 for another
    value).
    """
    options = (dtype, target, persistent, num_sms, split_k, out_dtype, schedule, kernel)
    key = call_cache.call_key(values, meta, b, out, interpret, options)
    if key is not None:  # the launches of an earlier call like this one (which found the GPU)
        result = call_cache.replay(key, values, meta, b, out)
        if result is not call_cache.MISS:
            return result
    if not interpret:
        from ...backend import runtime
        from ...frontend.diagnostics import LaunchError

        if not runtime.has_gpu():
            raise LaunchError("SP0731", "sparse_matmul cannot run: no NVIDIA GPU is available",
                              help="pass interpret=True to run the same kernel in the CPU interpreter")
    # not cached, or an earlier call like this one read a copy: plan every time
    if key is None or call_cache.lookup(key) is call_cache.FULL_PATH:
        return _planned_call(values, meta, b, out, interpret, *options)[0]
    with recording() as rec:
        result, source = _planned_call(values, meta, b, out, interpret, *options)
    call_cache.remember(key, rec, values, meta, b, out, source, interpret)  # source None: not kept
    return result


def _planned_call(values: Any, meta: Any, b: Any, out: Any, interpret: bool, dtype: str | None, target: str | None,
                  persistent: bool, num_sms: int | None, split_k: int | None, out_dtype: Any, schedule: str | None,
                  kernel: str | None) -> tuple[Any, Any]:
    """:func:`sparse_matmul` planned and launched: (its result, the array C was delivered from, or
    None where the call cache must not keep the call: an empty K, Blackwell)."""
    plan = plan_sparse_matmul(values, meta, b, out=out, dtype=dtype, interpret=interpret, target=target,
                              persistent=persistent, num_sms=num_sms, split_k=split_k, out_dtype=out_dtype,
                              schedule=schedule, kernel=kernel)
    from .decode import SparseDecodePlan

    if isinstance(plan, SparseDecodePlan):
        plan.run(interpret)
        return deliver_result(plan.out, out, b), plan.out
    if isinstance(plan, SparseMatmul):
        if plan.k_padded == 0:  # an empty K: C = 0 (a zero-sized TMA box cannot be encoded)
            fill(plan.out, 0)
            return deliver_result(plan.out, out, b), None
        if (interpret or split_k is not None or num_sms is not None or plan.out_dtype != plan.choice.out_dtype
                or plan.pingpong_ctas or not _run_tuned(plan, persistent)):  # the table: the default kernel, own C
            plan.run(interpret)
        return deliver_result(plan.out, out, b), plan.out
    if plan.k_launch == 0:
        fill(plan.out, 0)
    else:
        plan.run(interpret)
    return deliver_result(plan.result(), out, b), None


def _run_tuned(plan: SparseMatmul, persistent: bool) -> bool:
    """Launch with the shipped table's choice for this shape (``tuned/<gpu>.json``, written by
    ``sparsile tune``: docs/autotune.md); False when there is none."""
    from .tuning import run_with_table

    return run_with_table(plan, persistent=persistent)
