#!/usr/bin/env bash
# The GPU checks and benchmarks, in parts that each fit one call of the GPU machine (< 10 minutes),
# in the order they matter. Run from the repository root on a machine with an NVIDIA GPU, after
# `source scripts/device_env.sh` where the packages are carried as wheels (scripts/fetch_device_wheels.sh):
#
#   bash scripts/gpu_runs.sh a66              # next: on an H200 issue 12's rows (three passes); then the fifty-sixth session's unrun commits (cache keys, autotune key, typed constants) on the GPU
#   bash scripts/gpu_runs.sh a65              # next: a64's unrun rest (decode API) and review56b's merges (training under compiled autograd, FX module state, ml_dtypes capture keys) on the GPU and under the device's torch
#   bash scripts/gpu_runs.sh a64              # (ran at 0359939 on an H100: 482 passed, 3 skipped before the step limit; 95 passed) on an H200 issue 12's rows (three passes), then the fifty-sixth session's merges on the GPU and its CPU torch files under the device's torch
#   bash scripts/gpu_runs.sh a63              # (ran at 71ab3e5 on an H100: 397 passed) on an H200 issue 12's T <= 16 rows in three passes (rows61), then a62's GPU files
#   bash scripts/gpu_runs.sh a62              # torch55c's torch GPU files, then on an H200 issue 12's rows in one pass
#   bash scripts/gpu_runs.sh rows61           # on an H200 only: issue 12's T <= 16 rows (its acceptance)
#   bash scripts/gpu_runs.sh a61              # (ran at 8f26de0 on an H100: 342 passed) a60 plus the fifty-fifth session's GPU files, then on an H200 issue 12's rows
#   bash scripts/gpu_runs.sh a60              # the GPU files not run in the fifty-fourth session, then on an H200 issue 12's rows
#   bash scripts/gpu_runs.sh a59 / a58        # on an H200 issue 12's T <= 16 rows in one pass / three (a58 first reruns streams54's GPU files)
#   bash scripts/gpu_runs.sh a57              # on an H200 issue 12's T <= 16 rows; on an H100 tests-rest
#   bash scripts/gpu_runs.sh a51 / a51b       # a50 split for 600 s calls: on an H200 issue 12's rows first, then the GPU tests; a51b the CPU torch files
#   bash scripts/gpu_runs.sh a50              # (not run yet) the fiftieth session's torch fixes after its H100 run, then issue 12's rows on an H200
#   bash scripts/gpu_runs.sh ab47             # (not run yet) the constant-offset address form (2ce3920) on the GPU: both program fuzzers,
#                                            # then sparse_matmul's kernels A/B against the tree before it (gpu-out/base: see the part)
#   bash scripts/gpu_runs.sh a47              # the fuzzers' fixes of the forty-sixth session on the GPU (bool loads, constants, scalar shapes, helper defaults), the neg-view weight cache, the decode API
#   bash scripts/gpu_runs.sh a46              # the forty-sixth session's torch merges (neg-view weights, act_fn.compile()), torch GPU files, their CPU tests under torch 2.11
#   bash scripts/gpu_runs.sh a45              # the forty-fifth session's last merges: a44's files, the new GPU files, both fuzzers
#   bash scripts/gpu_runs.sh progfuzz45       # 300 random programs (tests/support/program_gen.py) on the GPU against the interpreter
#   bash scripts/gpu_runs.sh progfuzz45s      # 120 random sparse-core programs (tests/support/program_gen_sparse.py) on the GPU against the interpreter
#   bash scripts/gpu_runs.sh wgmma8           # (its steps passed at fb7c8aa, H100) mixed 8-bit sparse_dot on wgmma (e4m3 x e5m2, i8 x u8; BM 64, BN 8/16, BK 64/128), then 40 sparse fuzz programs
#   bash scripts/gpu_runs.sh opdiff45         # the op table: every elementwise op and conversion of every type on edge values, GPU vs interpreter
#   bash scripts/gpu_runs.sh tune-linear      # the torch layer's own table entries, then the layer with and without them
#   bash scripts/gpu_runs.sh e4m3-eager       # the quantizing e4m3 record: GPU tests, host time, layer at T <= 16
#   bash scripts/gpu_runs.sh tma-store        # the TMA-store epilogue kernels: GPU tests, then timed (gemm_variants)
#   bash scripts/gpu_runs.sh b40              # the fortieth session's merges: torch / JAX / tuning GPU tests, the layer with the borrowed table
#   bash scripts/gpu_runs.sh h100-40          # the H200's tuned tables on an H100 against its heuristics (8B bf16 rows, 8192^3)
#   bash scripts/gpu_runs.sh a39              # the thirty-ninth session's merges (torch.func on the ops, re-prune rollback), then tests-rest
#   bash scripts/gpu_runs.sh tests-torch      # the torch and JAX GPU test files; tests-rest: every other GPU test
#   bash scripts/gpu_runs.sh check            # tests-all, then the layer with and without the shipped table
#   bash scripts/gpu_runs.sh host-64          # the host time of an eager call at T = 64, step by step
#   bash scripts/gpu_runs.sh tune-prefill     # tune the tiled kernel for T >= 256 (h200.json), layer at T 64-1024
#   bash scripts/gpu_runs.sh first            # tests-all, the TMA-store epilogue timed, the e4m3 layer at T <= 16
#   bash scripts/gpu_runs.sh pdl              # tests-all (PDL on every launch path), then PDL against plain decode launches
#   bash scripts/gpu_runs.sh tune-e4m3        # the decode table's e4m3 and f16 entries, then the e4m3 layer's targets
#   bash scripts/gpu_runs.sh unrun-11         # what the eleventh session wrote after its GPU time: the whole suite, the last tuned entries
#   bash scripts/gpu_runs.sh tune-gemm-f16-e4m3    # sparse_matmul's f16 / e4m3 table entries, then checked (~9 min)
#   bash scripts/gpu_runs.sh tune-linear-f16-e4m3  # the layer's f16 / e4m3 table entries, then checked (~7 min)
#   bash scripts/gpu_runs.sh decode-route-21   # sparse_matmul at N <= 64 on the decode kernel (C feature-major): GPU tests, the grid's T <= 64
#   bash scripts/gpu_runs.sh streamk-24       # (not run yet) the stream-K sparse GEMM: GPU tests, timed, tuned into h200.json
#   bash scripts/gpu_runs.sh cold-23          # (not run yet) the grid's T <= 64 rows, also from HBM (--l2 cold)
#   bash scripts/gpu_runs.sh c36              # a34's and b36's GPU tests in one call (no model run)
#   bash scripts/gpu_runs.sh b36              # the thirty-sixth session's fixes on the GPU: read-only metadata words, the op's record key, strided single rows, training / JAX checks
#   bash scripts/gpu_runs.sh a34              # the capture fix (graph execs destroyed at a safe point): the graph tests, x's gradient, replaced buffers; the model A/B with logits
#   bash scripts/gpu_runs.sh f33              # e33 within 360 s: the gated GPU tests, the model (dense, sparsile-fused with glu)
#   bash scripts/gpu_runs.sh e33              # a33's failed gated tests after their harness fix; the 32-layer model with glu and without
#   bash scripts/gpu_runs.sh a33              # a32's and b32's GPU tests in one call (the gated epilogue, kernel and torch)
#   bash scripts/gpu_runs.sh b33              # the 32-layer model with glu=True and without in CUDA graphs; the gated epilogue timed
#   bash scripts/gpu_runs.sh c33              # the layer's T <= 16 rows (issue 12's eager target); the model compiled at batch 16
#   bash scripts/gpu_runs.sh d32              # the f16 57344 x 256 x 8192 grid row (0.89x cuSPARSELt) tuned, checked vs float64, timed
#   bash scripts/gpu_runs.sh c32              # the 32-layer model with glu=True: CUDA graphs (with and without), torch.compile batch 16
#   bash scripts/gpu_runs.sh b32              # SwiGLU / GeGLU in sparsile.torch: GPU tests, then the layer's T <= 16 rows
#   bash scripts/gpu_runs.sh a32              # the decode kernel's gated epilogue: GPU tests, timed against kernel + act + mul
#   bash scripts/gpu_runs.sh a31              # where a 32-layer decode step's GPU time goes, batch 1 and 16, dense vs sparsile-fused
#   bash scripts/gpu_runs.sh g31              # the L2-hint GPU tests, the tuner's GPU tests, the 57344 x 256 rows again
#   bash scripts/gpu_runs.sh f31              # the N = 256 prefill rows tuned with L2-hinted configs, checked vs float64, the grid rows
#   bash scripts/gpu_runs.sh e31              # L2 eviction hints on the _mt GEMM's loads (weight evict-first, B evict-last): A/B
#   bash scripts/gpu_runs.sh d31              # the model with the folded GQA attention again in graphs, then under torch.compile
#   bash scripts/gpu_runs.sh c31              # the 32-layer model in CUDA graphs with the folded GQA attention (no repeat_kv), profiled
#   bash scripts/gpu_runs.sh b31              # the torch ops (and shapes) behind the batch-16 step's kernels, eager
#   bash scripts/gpu_runs.sh a30              # SparseLinear.__call__ direct: GPU tests, host A/B, layer T <= 16, tail split call
#   bash scripts/gpu_runs.sh e30              # the 32-layer model decoded eagerly, batch 1, graph replays on / off
#   bash scripts/gpu_runs.sh d30              # host steps with graph replays on / off, the layer's T <= 16 rows again
#   bash scripts/gpu_runs.sh c30              # eager calls replayed as CUDA graphs: GPU tests, host steps, layer T <= 16
#   bash scripts/gpu_runs.sh b30              # graph launch vs two launches (host), e4m3 layer T <= 16, ncu 57344x256x8192
#   bash scripts/gpu_runs.sh d29              # the prefill grid rows c29 left out (70B qkv T 512 / 256, 70B gate_up)
#   bash scripts/gpu_runs.sh c29              # the last 31 GEMM entries vs float64; the prefill grid after the lane exchange
#   bash scripts/gpu_runs.sh b29              # decode INFLIGHT: GPU tests, A/B at T = 16 / 64; the rest of the GEMM entries
#   bash scripts/gpu_runs.sh a29              # every tuned GEMM entry vs float64 (GPU-made operands); the layer at T <= 16, interleaved
#   bash scripts/gpu_runs.sh a28              # the layer's T <= 16 rows with host diagnostics; ncu of e4m3 8192^3 vs peers
#   bash scripts/gpu_runs.sh c28              # the lane-exchanged 16-byte epilogue stores: GPU tests, 8192^3 A/B, vs peers
#   bash scripts/gpu_runs.sh f28              # mid-T rows (e4m3, bf16) against cuSPARSELt and cuBLAS after the lane exchange
#   bash scripts/gpu_runs.sh e28              # the lane exchange on f32 / i32 stores (split-K partials, tf32, s8): tests, split-K A/B
#   bash scripts/gpu_runs.sh d28              # tuned GEMM entries vs float64 after the lane exchange (e4m3, bf16), e4m3 28672x8192x4096
#   bash scripts/gpu_runs.sh b28              # the 32-layer model at batch 1 under torch.compile (dense vs sparsile-fused)
#   bash scripts/gpu_runs.sh g27              # the layer's T <= 16 targets on 8B and 70B, the model at batch 16 compiled
#   bash scripts/gpu_runs.sh f27              # eager e4m3 one launch at T <= 16 on small weights: GPU tests, layer table
#   bash scripts/gpu_runs.sh e27              # eager e4m3 at T = 16: one launch against two, GPU time and calls
#   bash scripts/gpu_runs.sh d27              # native tail-split replays: GPU tests, host-inclusive calls native vs prepared
#   bash scripts/gpu_runs.sh c27              # the rest of the e4m3 entries vs float64, e4m3 mid-T rows timed, layer T <= 16
#   bash scripts/gpu_runs.sh b27              # mid-T entries tuned with INFLIGHT (70B e4m3; bf16/f16 --inflight), swept
#   bash scripts/gpu_runs.sh a27              # the last e4m3 entry vs float64, 8B e4m3 T 256-1024 re-tuned, eager host time
#   bash scripts/gpu_runs.sh sweep-26         # (run 2026-12-04; 9 of 10, 57344x8192x8192 not reached) the last e4m3 entries vs float64
#   bash scripts/gpu_runs.sh final-26         # (run 2026-12-04) this session's GPU tests, every e4m3 GEMM entry vs float64
#   bash scripts/gpu_runs.sh e4m3-26c         # (run 2026-12-04) e4m3 prefill entries re-tuned with INFLIGHT, 8192^3 on them
#   bash scripts/gpu_runs.sh e4m3-26b         # (run 2026-12-04) the e4m3 pair kernel at other BN x BK, STAGES, GROUP_M
#   bash scripts/gpu_runs.sh e4m3-26          # (run 2026-12-04) e4m3 8192^3 kernel variants, INFLIGHT, against cuBLAS fp8
#   bash scripts/gpu_runs.sh host-26          # (run 2026-12-04) a two-launch native replay's host time, profiled
#   bash scripts/gpu_runs.sh pair-26          # (run 2026-12-04 at 5b950be; the kernel was reverted in 23c376c) CTA-pair decode
#   bash scripts/gpu_runs.sh verify-26        # (run 2026-12-04) the call cache after 98671d5: GPU tests (native split-K too), host times
#   bash scripts/gpu_runs.sh ncu-source-26    # (run 2026-12-04) the decode kernel's SASS lines by stall samples, N = 64
#   bash scripts/gpu_runs.sh ncu-decode-24    # (run 2026-12-04) ncu memory tables and warp states of the decode kernel, N = 1 / 64
#   bash scripts/gpu_runs.sh a23              # (run 2026-12-03) sweep-23, the tail split's GPU tests, its 8B prefill rows
#   bash scripts/gpu_runs.sh tail-23b         # (run 2026-12-03) `sparsile tune` with tail splits, bf16 prefill rows; the grid
#   bash scripts/gpu_runs.sh b23              # (run 2026-12-03) ncu-decode-23, then tail-23b in f16
#   (streamk-23, streamk-23b: run 2026-12-03 on the stream-K decode kernel, removed with it; RESULTS.md)
#   bash scripts/gpu_runs.sh sweep-23         # (ran in a23) the re-tuned decode table's entries against float64
#   bash scripts/gpu_runs.sh ncu-decode-23    # (ran in b23) Nsight Compute of the decode kernel at N = 1 and 64, and its peers
#   bash scripts/gpu_runs.sh tail-23          # (ran as a23 / tail-23b) the tail split: GPU tests, the prefill rows with its column
#   bash scripts/gpu_runs.sh slab256-22e      # (run 2026-12-03) the grid's T <= 64 rows (bf16; f16 at 64) with the re-tuned table
#   bash scripts/gpu_runs.sh slab256-22d      # 256-row / persistent GPU tests after the register cap, f16 re-tuned
#   bash scripts/gpu_runs.sh slab256-22       # 256-row slabs and the persistent decode kernel: GPU tests, T = 64 re-tuned
#   bash scripts/gpu_runs.sh slab256-22b      # (its f16 part ran in slab256-22d; the large bf16 weights with the persistent kernel not yet)
#   bash scripts/gpu_runs.sh slab256-22c      # (not run yet) the grid's T <= 64 rows with the re-tuned table
#   bash scripts/gpu_runs.sh decode-route-21c  # the decode table's entries against float64, the grid's f16 T = 64 rows
#   bash scripts/gpu_runs.sh decode-route-21b  # the route's GPU tests, the decode table's 32/64-token tiles, T = 64 with them
#   bash scripts/gpu_runs.sh perwarp-20        # the per-warp stage release: GPU tests, timed at 8192³ and 4096³; T = 64
#   bash scripts/gpu_runs.sh mt-20             # the split-K _mt fix and INFLIGHT on the _mt kernels, on the GPU
#   bash scripts/gpu_runs.sh ncu-mt            # Nsight Compute: the pair kernel with / without the metadata by TMA, cuSPARSELt
#   bash scripts/gpu_runs.sh mt-19b            # the _mt kernels behind sparse_matmul / the layer: GPU tests, 8192³ A/B, the grid
#   bash scripts/gpu_runs.sh mt-19             # the metadata streamed by TMA: GPU tests, gemm_variants --meta-tma at 8192³, 4096³
#   bash scripts/gpu_runs.sh unrun-18          # (not run yet) the whole suite after the eighteenth session, the T <= 16 table twice
#   bash scripts/gpu_runs.sh qx-18b            # the widened one-launch rule and deeper ring: e4m3 GPU tests, the layer's e4m3 rows
#   bash scripts/gpu_runs.sh qx-18             # the one-launch e4m3 decode: one vs two launches, ring depth, the layer's rule
#   bash scripts/gpu_runs.sh unrun-17          # the whole suite after the one-launch e4m3 work, the T <= 16 table twice
#   bash scripts/gpu_runs.sh qx-17             # the e4m3 eager call in one launch: torch GPU tests, the layer at T = 1, 4
#   bash scripts/gpu_runs.sh final-16          # the whole GPU suite at the sixteenth session's last commit, the T rule
#   bash scripts/gpu_runs.sh heuristic-bm      # the untabled decode heuristic (64-row slabs): GPU tests, timed vs 128 rows, the model
#   bash scripts/gpu_runs.sh fast-path         # the layer's last-call fast path: torch GPU tests, host time, the layer at T <= 16
#   bash scripts/gpu_runs.sh host-16           # where an eager call's host time goes at T <= 16, bf16 and e4m3 (profiled)
#   bash scripts/gpu_runs.sh unrun-15          # the whole suite after the fifteenth session's last commits, the e4m3 decode table, T <= 16
#   bash scripts/gpu_runs.sh inflight          # one sparse MMA group in flight: GPU tests, timed; the 64-row decode tests; e4m3 host time
#   bash scripts/gpu_runs.sh decode-bm64       # the decode kernel's 64-row slabs: GPU tests, the bf16 table re-tuned, the layer at T <= 16
#   bash scripts/gpu_runs.sh unrun-14          # the whole suite after the deferred epilogue loads, the layer at T 256-1024 and T <= 16
#   bash scripts/gpu_runs.sh profile-linear    # the layer's epilogue against sparse_matmul at prefill T, timed and under ncu
#   bash scripts/gpu_runs.sh graph-t16         # the layer's CUDA-graph target, bf16 and e4m3 in one table; more table checks
#   bash scripts/gpu_runs.sh unrun-13          # the whole suite after the thirteenth session's codegen changes, the e4m3 layer
#   bash scripts/gpu_runs.sh unrun-12b        # the whole suite, the last f16/e4m3 table entries, the layer with / without them
#   bash scripts/gpu_runs.sh unrun-12         # the torch GPU tests after the padded-copy refresh (twelfth session)
#   bash scripts/gpu_runs.sh pdl-e4m3         # the e4m3 layer's graph target with and without PDL, then the fused model at batch 1
#   bash scripts/gpu_runs.sh pdl-layer        # the layer at T <= 64 (PDL on), the tuned tables' sweep, the model in graph mode
#   bash scripts/gpu_runs.sh fused-b1         # the fused model at batch 1 under torch.compile
#   bash scripts/gpu_runs.sh second           # the sparse GEMM at prefill T against tuned cuSPARSELt, and its variants
#   bash scripts/gpu_runs.sh pingpong         # the ping-pong sparse GEMM: GPU tests, then timed against the default and cuSPARSELt
#   bash scripts/gpu_runs.sh tests-all        # the whole GPU suite, 16 workers (about 3.5 minutes on the H200)
#   bash scripts/gpu_runs.sh tests-launch     # the launch paths (ctypes libcuda, prepared, fast path) first
#   bash scripts/gpu_runs.sh tests-kernels    # every other GPU test of the kernels and toolkits
#   bash scripts/gpu_runs.sh tests-torch      # sparsile.torch, training, sparsile.jax on the GPU
#   bash scripts/gpu_runs.sh bench-layer      # launch overhead and the torch layer against dense / cuSPARSELt
#   bash scripts/gpu_runs.sh bench-llama      # tokens/s of a Llama-3-8B-shaped model, dense vs 2:4
#   bash scripts/gpu_runs.sh bench-kernels    # decode kernel, GPU toolkit, epilogues, output types
#   bash scripts/gpu_runs.sh bench-rest       # e4m3 layer, training step, JAX overhead
#   bash scripts/gpu_runs.sh bench-gemm-8B    # sparse GEMM grid vs default and tuned cuSPARSELt and cuBLAS (+ bench-gemm-70B)
#   bash scripts/gpu_runs.sh tune             # write stdlib/kernels/tuned/h200.json (Llama-3 8B shapes)
#   bash scripts/gpu_runs.sh tune-decode      # write stdlib/kernels/tuned/decode-h200.json (decode kernel, Llama-3 8B)
#   bash scripts/gpu_runs.sh tune-decode-h100 # (on an H100) its own decode table, then the layer's T <= 16 rows with it
#
# Each part writes its log (and JSON where a benchmark has one) under $OUT (default ./gpu-out).
# A part stops at its first failing step only for tests-launch: nothing after it can be trusted
# if a launch is wrong. Launches go through cuda.bindings; SPARSILE_RAW_DRIVER=1 routes them through
# libcuda directly (ctypes), which is opt-in (measured no faster).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:?usage: gpu_runs.sh PART (see the header)}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SPARSILE_CACHE_DIR="${SPARSILE_CACHE_DIR:-/tmp/sparsile-gpu-cache}"
export SPARSILE_COMMIT="${SPARSILE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
log="$out/$part.log"
# every failing test named as it fails (conftest.py): a step stopped at its limit loses pytest's summary
export SPARSILE_FAILURES_LOG="$out/$part.failures"
run() {  # run STEP_SECONDS command...: one step, its output appended to the part's log
    local limit="$1"; shift
    echo "=== $* (limit ${limit} s)" | tee -a "$log"
    local start=$SECONDS
    # SIGINT at the limit: pytest then prints its summary of the tests that ran, a script its traceback
    # (b29 lost a GPU-test summary to the plain SIGTERM); KILL 20 s later if it is still running
    timeout --signal=INT --kill-after=20 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc="${PIPESTATUS[0]}"
    echo "--- exit $rc after $((SECONDS - start)) s$([ "$rc" = 124 ] && echo ' (the step limit)')" | tee -a "$log"
    return "$rc"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$log"

case "$part" in
ab47)  # the constant-offset address form (backend/lower/address_form.py, 2ce3920..13420bc): the decode and layer
      # kernels' PTX is unchanged (57 builds compared on the CPU), but sparse_matmul's _mt / split-K kernels changed
      # (14 fewer or.b32; ptxas registers 166 -> 158 for the _mt tile kernels, 160 -> 166 split-K _mt, 94 -> 99
      # e4m3 split-K; no spills). Five cases timed by the tree before it and by this one, alternating twice, then
      # both program fuzzers on the new code. Before the call, on the CPU:
      #   mkdir -p gpu-out/base && git archive 8dfb544 | tar -x -C gpu-out/base && rm -rf gpu-out/base/tests
      # and carry gpu-out (with .whl and .commit).
    mkdir -p /tmp/pkgb && ln -sfn "$PWD/gpu-out/base" /tmp/pkgb/sparsile
    cases="--case bf16:8192x8192x8192 --case f16:10240x512x8192 --case bf16:1024x2048x512 --case e4m3:4096x128x4096 --case f16:4096x4096x4096"
    for tree in base new base new; do
        if [ "$tree" = base ]; then pp=/tmp/site:/tmp/pkgb; bench=gpu-out/base/benchmarks; else pp=/tmp/site:/tmp/pkg; bench=benchmarks; fi
        echo "### $tree" | tee -a "$log"
        env PYTHONPATH=$pp python -c "import sparsile; print('sparsile from', sparsile.__file__)" 2>&1 | tee -a "$log"
        # shellcheck disable=SC2086
        run 130 env PYTHONPATH=$pp SPARSILE_NO_DISK_CACHE=1 python $bench/bench_sparse_gemm.py $cases --iters 20 --case-timeout 55
    done
    run 200 python -m pytest -q -m gpu --timeout 190 -rfE tests/gpu/test_program_fuzz_gpu.py tests/gpu/test_program_fuzz_sparse_gpu.py
    ;;
a47)  # what the forty-sixth session fixed and did not run on a GPU: the program fuzzers' fixes (a masked ptr[bool] load
     # with other=, f16 / bf16 constants rounded once, trans / reshape of scalars, a helper's constexpr default, NumPy
     # annotations) against the interpreter; review46's neg-view weight cache fixes (storage swap, inference mode,
     # CUDA-graph capture) and the fused gated MLP; then a46's decode-API step, whose summary a46 never printed
    run 200 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests/gpu/test_fuzz_fixes_gpu.py \
        tests/integrations/test_torch_neg_views.py tests/integrations/test_torch_glu.py \
        tests/integrations/test_torch_op_record_key.py tests/stdlib/test_torch_neg_operands.py \
        tests/gpu/test_interpreter_hw_agreement_gpu.py tests/frontend/test_captures.py
    run 450 python -m pytest -q -m gpu -n 16 --timeout 400 -rfE --durations=0 --junitxml="$out/decode-api.xml" tests/stdlib/test_decode_api.py
    ;;
a46)  # the forty-sixth session's merges on a GPU: the torch layer (neg-view weights resolved once per memory at the
     # ops' Negative key, bias / scales of neg views, act_fn.compile() in the fused gated MLP), every torch GPU file,
     # the neg-operand stdlib tests, the sparsity toolkit on the GPU, the interpreter-hardware agreement
    # (at 61f6b55 on an H100 this step as one took over 420 s: test_decode_api's GPU cases (Llama layer shapes, every
    # decode variant) are the larger part; its progress showed every test passing before the limit cut the session end)
    run 240 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests/gpu/test_torch_*.py tests/stdlib/test_torch_neg_operands.py \
        tests/integrations/test_torch_neg_views.py tests/integrations/test_torch_glu.py tests/integrations/test_torch_op_record_key.py \
        tests/stdlib/test_sparsity_gpu.py tests/stdlib/test_sparsity_gpu_kernels.py tests/stdlib/test_linear_api.py \
        tests/gpu/test_interpreter_hw_agreement_gpu.py tests/gpu/test_core_gpu.py tests/gpu/test_tile_f16_acc_sm100.py \
        tests/test_demo.py
    run 240 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests/stdlib/test_decode_api.py
    # the same torch files' CPU tests under the GPU machine's torch (2.11 there, 2.13 in CI): neg_weights.py registers
    # kernels at torch's Negative dispatch key through torch internals
    run 150 python -m pytest -q -m "not gpu" -n 16 --timeout 120 -rfE tests/integrations/test_torch_neg_views.py \
        tests/integrations/test_torch_glu.py tests/integrations/test_torch_op_record_key.py tests/stdlib/test_torch_neg_operands.py \
        tests/integrations/test_torch_fuse.py tests/integrations/test_torch_ops.py
    ;;
a45)  # the forty-fifth session's last merges on a GPU (its own runs stopped at 0b33022 with the device budget spent):
     # a44's files, then this session's new GPU files (op table, both program fuzzers, neg views, mixed 8-bit
     # sparse_dot), then every other GPU test (tests-rest) in what is left of the call
    run 300 python -m pytest -q -m gpu -n 16 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_argmax_gpu.py tests/backend/test_prepared_gpu.py \
        tests/backend/test_runtime_gpu.py tests/backend/test_host_staging.py tests/gpu/test_core_gpu.py \
        tests/frontend/test_captures.py tests/stdlib/test_gemm_api.py tests/test_demo.py \
        tests/gpu/test_interpreter_hw_agreement_gpu.py tests/gpu/test_dtype_math_gpu.py \
        tests/gpu/test_special_math_gpu.py tests/gpu/test_atomics_gpu.py tests/gpu/test_op_table_gpu.py \
        tests/gpu/test_sparse_dot_8bit_gpu.py tests/gpu/test_op_table_sm80_gpu.py tests/gpu/test_mma_sp_gpu.py
    run 120 python -m pytest -q -m gpu --timeout 100 -rfE tests/gpu/test_program_fuzz_gpu.py \
        tests/gpu/test_program_fuzz_sparse_gpu.py
    ;;
progfuzz45)  # the differential program fuzzer: 300 generated kernels (loops, ifs, masks, reductions, transposes,
            # atomics, dots) compiled in 16 worker processes, run on the GPU with poisoned outputs and compared
            # with the interpreter; every mismatch is listed with its seed and source in one failure message
    run 240 python -m pytest -q -m gpu --timeout 200 -rfE tests/gpu/test_program_fuzz_gpu.py
    ;;
progfuzz45s)  # the sparse-core program fuzzer: 120 generated kernels (sparse_dot K loops of f16/bf16/fp8/8-bit
             # integer operands, masked and tensor-tile operands, epilogues; 3-D tensor tiles at ragged edges)
             # compiled in 16 worker processes, run on the GPU and compared with the interpreter in one report
    run 150 python -m pytest -q -m gpu --timeout 140 -rfE tests/gpu/test_program_fuzz_sparse_gpu.py
    ;;
wgmma8)  # the wgmma instruction named A's type for B (e4m3 x e5m2, i8 x u8 read B in A's format: sparse fuzzer
        # seeds 27 and 31 wrong on an H100): every 8-bit (A, B) pair at BM 64, BN 8 / 16, BK 64 / 128 against
        # float64, then the first 40 sparse fuzz programs (seeds 27 and 31 among them) against the interpreter
    run 40 python -m pytest -q -m gpu --timeout 30 -rfE tests/gpu/test_sparse_dot_8bit_gpu.py
    run 80 env SPARSILE_PROGFUZZ_N=40 python -m pytest -q -m gpu --timeout 70 -rfE tests/gpu/test_program_fuzz_sparse_gpu.py
    ;;
opdiff45)  # the op table (tests/support/op_table_cases.py): every elementwise op of the registry and every conversion
          # between two scalar types, one kernel per (op, type) on edge and random values, the GPU against the
          # interpreter (exact ops bit for bit, approximate math within the PTX ISA's bounds); each (op, type)
          # group lists all its disagreeing elements in one failure message
    run 240 python -m pytest -q -m gpu -n 8 --timeout 200 -rfE tests/gpu/test_op_table_gpu.py
    ;;
multi41)  # on a machine of two GPUs (nvidia-h100-x2 / nvidia-h200-x2): launches follow their arrays' device and restore
     # the thread's context (torch's current device); cupy arrays on cuda:1 (skips without cupy)
    run 300 python -m pytest -q -m gpu -n 4 --timeout 150 -rfEs tests/gpu/test_multi_gpu.py tests/gpu/test_multi_gpu_cupy.py
    ;;
a41c)  # a41b cut to 110 s: argmax against the interpreter, the torch native records / graph replays under the context
      # restore, the one-GPU common path
    run 110 python -m pytest -q -m gpu -n 16 --timeout 80 -rfE tests/gpu/test_argmax_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_multi_gpu.py
    ;;
a41b)  # a41 cut to what the last ~250 s allow: the launch paths changed under context restore (native records, graph
      # replays, prepared launches, the one-GPU common path) and argmax against the interpreter
    run 200 python -m pytest -q -m gpu -n 16 --timeout 100 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/backend/test_prepared_gpu.py tests/backend/test_runtime_gpu.py tests/gpu/test_multi_gpu.py \
        tests/gpu/test_argmax_gpu.py tests/gpu/test_empty_grid_gpu.py
    ;;
a44)  # after the forty-fourth session's merges: a43's files (constexpr kinds SP0723 on every launch path, the launch
     # fuzz's grid / scalar fixes, typed constants) and the interpreter-hardware agreement cases (signed zeros of
     # max / min, sigmoid and f32 atomic flushes, integer -> bf16), the dtype / special-math / atomics GPU files
    run 400 python -m pytest -q -m gpu -n 16 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_argmax_gpu.py tests/gpu/test_multi_gpu.py \
        tests/backend/test_prepared_gpu.py tests/backend/test_runtime_gpu.py tests/backend/test_host_staging.py \
        tests/gpu/test_core_gpu.py tests/frontend/test_captures.py tests/stdlib/test_gemm_api.py tests/test_demo.py \
        tests/gpu/test_interpreter_hw_agreement_gpu.py tests/gpu/test_dtype_math_gpu.py \
        tests/gpu/test_special_math_gpu.py tests/gpu/test_atomics_gpu.py
    ;;
a43b)  # a43 cut to ~120 s: the GPU tests this session fixed or added (empty grids, launch overhead, bad launches,
      # warm_up eager + traced, a fused optimizer's bias step, autotune's benchmarker device, PDL) and the launch paths
    run 120 python -m pytest -q -m gpu -n 16 --timeout 80 -rfE tests/gpu/test_empty_grid_gpu.py \
        tests/backend/test_runtime_gpu.py tests/backend/test_prepared_gpu.py tests/gpu/test_torch_warm_up_gpu.py \
        tests/gpu/test_torch_autograd_gpu.py tests/gpu/test_autotune_gpu.py tests/gpu/test_pdl_gpu.py \
        tests/gpu/test_torch_native_gpu.py
    ;;
a43)  # after the forty-third session's merges: a42's GPU files again (the three test fixes of its first run, the grid
     # function's arguments, bools for numbers, tensor-map names, the tuned GPU current for a custom benchmarker,
     # warm_up's per-GPU targets and timeout, fused optimizers / fuse_projections_ staleness)
    run 330 python -m pytest -q -m gpu -n 16 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_argmax_gpu.py tests/gpu/test_multi_gpu.py \
        tests/backend/test_prepared_gpu.py tests/backend/test_runtime_gpu.py tests/backend/test_host_staging.py \
        tests/gpu/test_core_gpu.py tests/frontend/test_captures.py tests/stdlib/test_gemm_api.py tests/test_demo.py
    ;;
a42c)  # a42b cut to ~130 s: argmax, the native records / graph replays, warm_up, empty grids, the one-GPU common path
    run 130 python -m pytest -q -m gpu -n 16 --timeout 80 -rfE tests/gpu/test_argmax_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_multi_gpu.py tests/gpu/test_torch_warm_up_gpu.py \
        tests/gpu/test_empty_grid_gpu.py
    ;;
a42b)  # a42 cut to ~200 s: the launch paths the context restore and the empty-grid changes touched (native records,
      # graph replays, prepared launches, host staging), argmax, warm_up, the README torch quick starts
    run 200 python -m pytest -q -m gpu -n 16 --timeout 100 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/backend/test_prepared_gpu.py tests/backend/test_runtime_gpu.py tests/gpu/test_multi_gpu.py \
        tests/gpu/test_argmax_gpu.py tests/gpu/test_empty_grid_gpu.py tests/backend/test_host_staging.py \
        tests/gpu/test_torch_warm_up_gpu.py tests/test_demo.py tests/gpu/test_torch_linear_gpu.py
    ;;
a42)  # a41 plus the forty-second session's GPU-facing changes: the README quick starts (test_demo), sparse_matmul's
     # argument-order check on the GPU planning path, empty grids of numpy-integer dimensions, read-only TMA host arrays
    run 330 python -m pytest -q -m gpu -n 16 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_special_math_gpu.py tests/gpu/test_dtype_math_gpu.py \
        tests/gpu/test_argmax_gpu.py tests/gpu/test_multi_gpu.py tests/backend/test_prepared_gpu.py \
        tests/backend/test_runtime_gpu.py tests/backend/test_host_staging.py tests/gpu/test_core_gpu.py \
        tests/frontend/test_captures.py tests/stdlib/test_gemm_api.py tests/test_demo.py tests/gpu/test_torch_warm_up_gpu.py
    JAX_PLATFORMS=cpu run 45 python -m pytest -q -n 14 -p no:cacheprovider tests/integrations -k jax
    ;;
first42)  # the compile time of a sparsified Llama-3-8B's first calls on the GPU host's 16 cores (CPU work: serial,
          # 16 worker processes, 16 threads), then warm_up's GPU test
    run 120 python benchmarks/bench_first_call.py
    run 60 python benchmarks/bench_first_call.py --jobs 16
    run 60 python benchmarks/bench_first_call.py --jobs 16 --threads
    run 90 python -m pytest -q -m gpu -n 4 --timeout 80 -rfE tests/gpu/test_torch_warm_up_gpu.py
    ;;
a41)  # the forty-first session's one call (device time short): b40's test files, argmax, the launch paths that now
     # follow their arrays' device (one GPU: the common path), host staging, prepared launches; then the JAX CPU tests
    run 300 python -m pytest -q -m gpu -n 16 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_special_math_gpu.py tests/gpu/test_dtype_math_gpu.py \
        tests/gpu/test_argmax_gpu.py tests/gpu/test_multi_gpu.py tests/backend/test_prepared_gpu.py \
        tests/backend/test_runtime_gpu.py tests/backend/test_host_staging.py tests/gpu/test_core_gpu.py \
        tests/frontend/test_captures.py tests/stdlib/test_gemm_api.py
    JAX_PLATFORMS=cpu run 45 python -m pytest -q -n 14 -p no:cacheprovider tests/integrations -k jax
    ;;
b40)  # after the fortieth session's merges, in what the last 420 s of device time allow: every torch GPU file and
     # JAX on this machine's torch / jax, the tuning, autotune and Triton-port GPU tests; the JAX CPU tests on this
     # machine's jax; then the layer at T = 256 / 1024 (8B, bf16) without a table and with the borrowed one
    run 200 python -m pytest -q -m gpu -n 14 --timeout 120 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_autotune_gpu.py tests/stdlib/test_gemm_tuning.py tests/stdlib/test_linear_api.py \
        tests/frontend/test_triton_ports.py tests/frontend/test_triton_idioms.py tests/gpu/test_empty_grid_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_special_math_gpu.py tests/gpu/test_dtype_math_gpu.py \
        tests/gpu/test_argmax_gpu.py tests/gpu/test_multi_gpu.py
    JAX_PLATFORMS=cpu run 60 python -m pytest -q -n 14 -p no:cacheprovider tests/integrations -k jax
    SPARSILE_TUNED_TABLE=0 run 70 python benchmarks/bench_linear.py --shapes 8B --dtypes bf16 --tokens 256 1024 \
        --max-seconds 45 --json "$out/linear-heuristic.json"
    run 70 python benchmarks/bench_linear.py --shapes 8B --dtypes bf16 --tokens 256 1024 --max-seconds 45 \
        --json "$out/linear-borrowed.json"
    ;;
h100-40)  # does the H200's tuned table help an H100 (132 SMs too, less HBM bandwidth) over the heuristics? The 8B grid
     # rows (bf16) and 8192^3 without a table, then with h200.json / decode-h200.json copied under the H100's names
     # (this machine's checkout only; nothing is committed)
    gemm_rows() {  # gemm_rows TAG
        run 200 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B --dtypes bf16 --tokens 1 16 256 1024 \
            --json "$out/grid-$1.json"
        run 60 python benchmarks/bench_sparse_gemm.py --case bf16:8192x8192x8192 --json "$out/big-$1.json"
    }
    gemm_rows heuristic
    slug=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/ /-/g')
    cp stdlib/kernels/tuned/h200.json "stdlib/kernels/tuned/$slug.json"
    python - "$slug" <<'PY'
import json, sys
from sparsile.backend import runtime
dev = runtime.current_device()
t = json.load(open("stdlib/kernels/tuned/decode-h200.json"))
t["gpu"], t["sms"] = dev.name, dev.sm_count
t["entries"] = {k.replace("NVIDIA H200/132", f"{dev.name}/{dev.sm_count}"): v for k, v in t["entries"].items()}
json.dump(t, open(f"stdlib/kernels/tuned/decode-{sys.argv[1]}.json", "w"), indent=1)
print("tables copied for", dev.name, dev.sm_count)
PY
    gemm_rows h200-table
    ;;
a39)  # the thirty-ninth session's merges, not run on a GPU (the H100 ran out of device time first): the ops called
     # directly under torch.func (their own Autograd kernels; the GPU twin test), re-prune's rollback and refresh
     # computing both compressions first (training), one-row x of a wider tensor (packed strides), then the
     # other torch / JAX GPU files and the special-values tests after the accumulator bound
    run 420 python -m pytest -q -m gpu -n 12 --timeout 150 -rfE tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_training_gpu.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_jax_gpu.py tests/stdlib/test_special_values.py \
        tests/gpu/test_autotune_gpu.py
    ;;
c38)  # the thirty-eighth session's last merges, not run on a GPU: the quantizer and the decode kernel keep NaN
     # (scaled(), quantize.spk) and relu keeps NaN; the sparse tensor cores skip x at pruned positions (the
     # interpreter's new rule: test_special_values.py's gpu test); the launcher's host TMA copies shared with a
     # CPU torch tensor and copied back on the launch's stream; out= overlap checks. Then the e4m3 rows the
     # quantizer change could move (kernel time: bench_sparse_gemm e4m3, bench_linear e4m3 T <= 16); the whole
     # GPU suite is its own call (tests-all: the steps together pass one call's 600 s)
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/stdlib/test_special_values.py \
        tests/integrations/test_torch_special_values.py tests/backend/test_host_staging.py \
        tests/stdlib/test_out_aliasing.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_autograd_gpu.py
    run 120 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 16 64 --variants graph \
        --json "$out/linear-e4m3-38.json"
    run 120 python benchmarks/bench_sparse_gemm.py --case e4m3:8192x8192x8192 --case e4m3:28672x16x4096 \
        --json "$out/gemm-e4m3-38.json"
    ;;
b38)  # after the thirty-eighth session's merges: vmap rules, the misaligned scale_x copy, the e4m3 op for a
     # compiled x gradient, all-or-nothing model edits (sparsify_, fuse_projections_, loads), autotune cache
     # locks; every torch and JAX GPU file, the autotune GPU tests; then the model (224 swapped, speed as before)
    run 300 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_training_gpu.py tests/gpu/test_jax_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_autotune_gpu.py
    run 150 python benchmarks/bench_llama.py --layers 32 --modes graph --check-tokens 0 \
        --models dense sparsile-fused --json "$out/llama-38b.json"
    ;;
a38)  # the thirty-eighth session's merges: torch.func grad / vjp / jacrev / vmap(grad) through the layer (CUDA),
     # the eager forward_ad refusal, nested jax.vmap and vmap(grad) on the CUDA kernels, @jit kernels as
     # staticmethods; the torch autograd, training, linear and JAX GPU files and the autotune GPU tests
    run 400 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_training_gpu.py tests/gpu/test_jax_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_autotune_gpu.py
    ;;
c37)  # the thirty-seventh session's last merges, not run on a GPU: a bias made an nn.Parameter on a CUDA layer
     # (launch records, gradient), the backward's weight through the op sparsile::dense_weight (decompress_gpu
     # inside a custom op), the layer under torch.func transforms, tied-weight skips; every torch GPU test file,
     # training and JAX
    run 400 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_training_gpu.py tests/gpu/test_jax_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_glu_gpu.py
    ;;
b37)  # after this session's merges: sparsify_ skips linears with hooks or their own forward, state-dict weight checks,
     # the autograd path for a trainable bias, fused groups released for trainable members; jax.grad through
     # sparse_linear; then the model (its report: nothing skipped; speed as in a37)
    run 230 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_jax_gpu.py
    run 120 python benchmarks/bench_llama.py --layers 32 --modes graph --check-tokens 0 \
        --models dense sparsile-fused --json "$out/llama-37b.json"
    ;;
a37)  # c36's four failures after their fixes (a38f235: a size-1 dimension gets the packed stride in every tensor
     # map; the e4m3 capture tests allow a third launch), then a34's model run: glu against no glu, logits checked
    run 200 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_native_gpu.py -k "single_row or e4m3_per_token"
    run 300 python benchmarks/bench_llama.py --layers 32 --modes graph \
        --models dense sparsile-fused sparsile-fused-noglu --json "$out/llama-glu-37.json"
    ;;
c36)  # one call for a34's and b36's GPU tests (no model run): the capture fix, x's gradient, replaced buffers, and
     # this session's fixes (read-only metadata, the op's record key, strided single rows, training / JAX checks)
    run 560 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_glu_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/stdlib/test_decode_glu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_training_gpu.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_sparse_gemm_sm90.py tests/stdlib/test_gemm_api.py tests/stdlib/test_linear_api.py
    ;;
b36)  # the thirty-sixth session (no GPU then): MetadataBuffer words read-only (device copies through copy_like), the
     # op's record key with dtypes and strides, a (1, K) row of any stride, the training mask check and second
     # derivatives, sparsile.jax argument checks; the kernel API's GPU tests that copy metadata to the device
    run 420 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_training_gpu.py tests/gpu/test_jax_gpu.py tests/gpu/test_sparse_gemm_sm90.py \
        tests/stdlib/test_gemm_api.py tests/stdlib/test_linear_api.py
    ;;
a34)  # after f33's two invalidated captures (graph replays' cuGraphExecDestroy now deferred to a safe point, 8c9320c):
     # every gated GPU test and the layer's graph tests again (one worker per file: garbage from earlier
     # tests present); then the model with glu against without it in one process, logits checked
    # (thirty-fifth session: also x's gradient through frozen layers, and buffers replaced without setattr)
    run 320 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/gpu/test_torch_glu_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/stdlib/test_decode_glu.py tests/gpu/test_torch_autograd_gpu.py
    run 250 python benchmarks/bench_llama.py --layers 32 --modes graph \
        --models dense sparsile-fused sparsile-fused-noglu --json "$out/llama-glu-34.json"
    ;;
f33)  # e33 cut to the device time left: the gated tests, then the model with glu against dense (d31's configuration:
     # its sparsile-fused without glu reached 1.41x / 1.31x at batch 1 / 16)
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE tests/gpu/test_torch_glu_gpu.py tests/stdlib/test_decode_glu.py
    run 190 python benchmarks/bench_llama.py --layers 32 --modes graph --check-tokens 0 \
        --models dense sparsile-fused --json "$out/llama-glu-33.json"
    ;;
e33)  # a33's 68 failures were the tests' own (a CUDA tensor given to numpy in check_glu, a MetadataBuffer given to
     # cuda_copy): those tests again; then the 32-layer model with and without glu in CUDA graphs; the epilogue timed
    run 170 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_glu_gpu.py tests/stdlib/test_decode_glu.py
    run 300 python benchmarks/bench_llama.py --layers 32 --modes graph \
        --models dense sparsile-fused sparsile-fused-noglu --json "$out/llama-glu-33.json"
    ;;
a33)  # a32's and b32's GPU tests in one call (the device budget fits fewer starts): the decode kernel's gated
     # epilogue (swiglu, geglu) and the kernels it shares code with, then the torch side (glu.py, gate.py)
    run 520 python -m pytest -q -m gpu -n 8 --timeout 200 -rfE tests/stdlib/test_decode_glu.py \
        tests/stdlib/test_decode_qx.py tests/stdlib/test_decode_api.py tests/gpu/test_torch_glu_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_native_gpu.py
    ;;
b33)  # after a33: the 32-layer model in CUDA graphs with and without the gated forward (glu=True), batch 1 and 16;
     # then the gated epilogue against the unfused kernel + torch's activation + mul
    run 340 python benchmarks/bench_llama.py --layers 32 --modes graph \
        --models dense sparsile-fused sparsile-fused-noglu --json "$out/llama-glu-33.json"
    run 200 python benchmarks/bench_glu.py --activations swiglu geglu
    ;;
a68s)  # a68 within a short budget (about 200 s): the files nearest the staging rework, and the fixed fused-graph test
    run 170 python -m pytest -q -m gpu -n 8 --timeout 100 -rfEs --dist worksteal --junitxml="$out/junit-a68s.xml" \
        tests/gpu/test_partial_overlap_gpu.py tests/gpu/test_torch_fuse_graph_gpu.py tests/gpu/test_host_view_aliasing_gpu.py \
        tests/gpu/test_strided_host_gpu.py tests/gpu/test_byte_order_gpu.py tests/gpu/test_array_protocols_gpu.py \
        tests/gpu/test_empty_grid_gpu.py tests/backend/test_host_staging.py tests/gpu/test_sparse_gemm_tile.py
    ;;
a68)  # after the fifty-ninth session's staging rework (host arrays overlapping in part share one device copy of
     # their union; numpy arrays specialized by address): the GPU files that pass host arrays, the new
     # partial-overlap file, and the fused-graph test fixed after a67 (about 250 s)
    run 240 python -m pytest -q -m gpu -n 8 --timeout 120 -rfEs --dist worksteal --junitxml="$out/junit-a68.xml" \
        tests/gpu/test_partial_overlap_gpu.py tests/gpu/test_torch_fuse_graph_gpu.py tests/gpu/test_host_view_aliasing_gpu.py \
        tests/gpu/test_strided_host_gpu.py tests/gpu/test_byte_order_gpu.py tests/gpu/test_array_protocols_gpu.py \
        tests/gpu/test_empty_grid_gpu.py tests/gpu/test_core_gpu.py tests/gpu/test_numpy_scalar_args_gpu.py \
        tests/gpu/test_interpreter_hw_agreement_gpu.py tests/gpu/test_fuzz_fixes_gpu.py tests/gpu/test_torch_bf16_view_gpu.py \
        tests/gpu/test_torch_neg_views_gpu.py tests/gpu/test_sparse_gemm_sm90.py tests/gpu/test_sparse_gemm_tile.py \
        tests/gpu/test_mma_sp_gpu.py tests/backend/test_host_staging.py tests/stdlib/test_dense_operand_types.py \
        tests/gpu/test_jax_arrays_kernel_grid_gpu.py
    ;;
a67r)  # issue 12's acceptance rows on an H200 (three passes; about 300 s): a call of its own before a67
    run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --passes 3 --json "$out/linear-passes-67.json"
    ;;
a67)  # the GPU files never run (the fifty-seventh session's: byte order, strided host arrays, bool operands, the fused
     # graph replay; the fifty-eighth's: host views sharing a device copy, a released group's padded records), the
     # fifty-sixth session's unrun GPU cases, then the fifty-eighth session's CPU files under the device's torch and
     # jax (GPU backend); about 440 s, one call
    run 170 python -m pytest -q -m gpu -n 8 --timeout 120 -rfEs --dist worksteal --junitxml="$out/junit-a67.xml" \
        tests/gpu/test_byte_order_gpu.py tests/gpu/test_strided_host_gpu.py tests/stdlib/test_dense_operand_types.py \
        tests/gpu/test_torch_fuse_graph_gpu.py tests/gpu/test_host_view_aliasing_gpu.py tests/backend/test_host_staging.py \
        tests/gpu/test_jax_gpu.py tests/stdlib/test_sparsity_gpu.py tests/gpu/test_captures_class_code_gpu.py \
        tests/gpu/test_array_protocols_gpu.py tests/gpu/test_torch_bf16_view_gpu.py
    run 150 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a67b.xml" \
        tests/frontend tests/stdlib/test_out_aliasing.py "tests/stdlib/test_decode_api.py::test_gpu_pdl_reads_what_the_previous_kernel_wrote" \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py
    run 120 python -m pytest -q -n 8 -rfE tests/integrations/test_torch_fuse.py tests/integrations/test_torch_fuse_writes.py \
        tests/integrations/test_torch_fuse_release.py tests/integrations/test_torch_fuse_inference.py \
        tests/integrations/test_torch_fuse_hooks.py tests/integrations/test_torch_noted_streams.py \
        tests/integrations/test_torch_layer_state.py tests/integrations/test_jax_vmap_weight.py \
        tests/integrations/test_jax_disable_jit.py tests/integrations/test_jax_x64_outputs.py \
        tests/integrations/test_jax_operand_kinds.py tests/integrations/test_jax_sharding.py
    ;;
a66t)  # a66s's first step alone (a device budget of about five minutes)
    run 180 python -m pytest -q -m gpu -n 8 --timeout 120 -rfEs --dist worksteal --junitxml="$out/junit-a66t.xml" \
        tests/gpu/test_byte_order_gpu.py tests/gpu/test_strided_host_gpu.py tests/stdlib/test_dense_operand_types.py \
        tests/gpu/test_torch_fuse_graph_gpu.py tests/backend/test_host_staging.py tests/frontend tests/gpu/test_jax_gpu.py
    ;;
a66s)  # a66 within a short budget: on an H200 issue 12's rows alone (three passes); elsewhere a66's two GPU steps
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-66.json"
    else
        run 190 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a66.xml" \
            tests/frontend tests/stdlib/test_out_aliasing.py "tests/stdlib/test_decode_api.py::test_gpu_pdl_reads_what_the_previous_kernel_wrote" \
            tests/gpu/test_byte_order_gpu.py tests/stdlib/test_dense_operand_types.py tests/gpu/test_jax_gpu.py \
            tests/gpu/test_strided_host_gpu.py tests/stdlib/test_sparsity_gpu.py tests/backend/test_host_staging.py
        run 120 python -m pytest -q -m gpu -n 8 --timeout 100 -rfEs --dist worksteal --junitxml="$out/junit-a66b.xml" \
            tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py \
            tests/gpu/test_torch_fuse_graph_gpu.py
    fi
    ;;
a66)  # the fifty-seventh session's first call: on an H200 issue 12's acceptance (three passes) first; then what the
     # fifty-sixth session left unrun on a GPU (the autotune key after a default change, typed constants from NumPy
     # numbers, cachekey56's compile-cache keys in tests/frontend, a65's last decode-API case) and this session's
     # merges (toolkit57's byte order and bool operands, fuse57's sibling fusion, jax57's eager path); then their CPU
     # files under the device's torch and jax (GPU backend)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-66.json"
    fi
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a66.xml" \
        tests/frontend tests/stdlib/test_out_aliasing.py "tests/stdlib/test_decode_api.py::test_gpu_pdl_reads_what_the_previous_kernel_wrote" \
        tests/gpu/test_byte_order_gpu.py tests/stdlib/test_dense_operand_types.py tests/gpu/test_jax_gpu.py
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfEs --dist worksteal --junitxml="$out/junit-a66b.xml" \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py
    run 120 python -m pytest -q -n 8 -rfE tests/frontend/test_captures_typed_torch.py \
        tests/integrations/test_torch_compiled_autograd.py tests/integrations/test_torch_fuse.py \
        tests/integrations/test_torch_fuse_writes.py tests/integrations/test_torch_noted_streams.py \
        tests/integrations/test_torch_layer_state.py tests/integrations/test_jax_disable_jit.py \
        tests/integrations/test_jax_x64_outputs.py tests/integrations/test_jax_operand_kinds.py
    ;;
a65)  # a64's rest (the step limit stopped it in tests/stdlib/test_decode_api.py) and review56b's merges: SemiSparseLinear
     # under compiled autograd, an FX graph holding its SparseLinear, captured ml_dtypes scalars keyed by value, AOT
     # run-time defaults; their CPU files under the device's torch (2.11)
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfEs --dist worksteal --junitxml="$out/junit-a65.xml" \
        tests/stdlib/test_decode_api.py tests/gpu/test_torch_training_gpu.py tests/frontend/test_captures.py
    run 120 python -m pytest -q -n 8 -rfE tests/integrations/test_torch_training_compiled_autograd.py \
        tests/integrations/test_torch_fx_trace_module_state.py tests/integrations/test_torch_fx_trace.py \
        tests/frontend/test_captures_ml_dtypes.py tests/frontend/test_aot_run_time_defaults.py
    ;;
a64)  # the fifty-sixth session's merges: on an H200 issue 12's acceptance (three passes) first; then defaults56 (Python's
     # default values typed as at a launch, builtin dtypes), streams56 (foreign streams' ids, one cudaMallocAsync hold), torch56 (fullgraph compiled autograd, FX, parametrize
     # guard) and review56 (prepared-launch scalars, safetensors of torch tensors) on the GPU, and torch56's CPU
     # files under the device's torch (its dynamo frame strategy is a private API)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-64.json"
    fi
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a64.xml" \
        tests/gpu/test_torch_autograd_gpu.py tests/gpu/test_torch_training_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_empty_grid_gpu.py tests/gpu/test_fuzz_fixes_gpu.py tests/gpu/test_pdl_gpu.py \
        tests/gpu/test_numpy_scalar_args_gpu.py tests/gpu/test_prepared_scalar_types_gpu.py tests/frontend \
        tests/stdlib/test_sparsity_gpu.py tests/stdlib/test_cupy_devices.py tests/stdlib/test_decode_api.py \
        tests/gpu/test_torch_noted_streams_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_torch_graph_scratch_gpu.py \
        tests/gpu/test_torch_kept_launches_gpu.py
    run 150 python -m pytest -q -n 8 -rfE tests/integrations/test_torch_compiled_autograd.py \
        tests/integrations/test_torch_fx_trace.py tests/integrations/test_torch_parametrize_guard.py \
        tests/integrations/test_torch_autograd_writes.py tests/integrations/test_safetensors.py
    ;;
a63)  # the fifty-sixth session's first call: on an H200 issue 12's acceptance (rows61's three passes) first, then a62's
     # GPU files (torch55c's op changes, tidy55's transposable pruning kernel, prepared scalar types)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-63.json"
    fi
    run 220 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a63.xml" \
        tests/gpu/test_torch_autograd_gpu.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_input_scale_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_training_gpu.py tests/gpu/test_torch_graph_owners_gpu.py \
        tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/stdlib/test_sparsity_gpu.py tests/stdlib/test_cupy_devices.py tests/gpu/test_prepared_scalar_types_gpu.py
    ;;
a62)  # torch55c on the GPU (the op casts a float32 x inside, saves only shapes without an activation, checks
     # bias / scales at trace time; export traces e4m3 as one op) with the torch files that call the op; then on an
     # H200 issue 12's T <= 16 rows in one pass
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --dist worksteal --junitxml="$out/junit-a62.xml" \
        tests/gpu/test_torch_autograd_gpu.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_input_scale_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_training_gpu.py tests/gpu/test_torch_graph_owners_gpu.py \
        tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/stdlib/test_sparsity_gpu.py tests/stdlib/test_cupy_devices.py tests/gpu/test_prepared_scalar_types_gpu.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 170 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --json "$out/linear-62.json"
    fi
    ;;
rows61)  # issue 12's acceptance alone: on an H200 its T <= 16 rows in three passes; on any other card nothing
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-61.json"
    else
        echo "rows61: not an H200; issue 12's rows are recorded for the H100 already" | tee -a "$log"
    fi
    ;;
a61)  # a60's files plus the fifty-fifth session's: prepared launches' scalar types and dtype spellings (prep55), the
     # layer's autograd without x saved and with weight version checks (hunt55b); then on an H200 issue 12's T <= 16 rows
    run 240 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --junitxml="$out/junit-a61.xml" \
        tests/gpu/test_prepared_scalar_types_gpu.py tests/gpu/test_torch_autograd_gpu.py tests/gpu/test_torch_training_gpu.py \
        tests/gpu/test_numpy_scalar_args_gpu.py tests/gpu/test_jax_arrays_kernel_grid_gpu.py \
        tests/gpu/test_torch_noted_streams_gpu.py tests/gpu/test_pdl_weight_write_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_graph_owners_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_jax_gpu.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-61.json"
    fi
    ;;
a60)  # the fifty-fourth session's GPU files that did not run (NumPy scalar arguments, JAX arrays through kernel[grid],
     # review54a's noted-stream ids against this torch) with the torch capture files its last merges touched; then on an
     # H200 issue 12's T <= 16 rows (the acceptance)
    run 240 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --junitxml="$out/junit-a60.xml" \
        tests/gpu/test_numpy_scalar_args_gpu.py tests/gpu/test_jax_arrays_kernel_grid_gpu.py \
        tests/gpu/test_torch_noted_streams_gpu.py tests/gpu/test_pdl_weight_write_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_graph_owners_gpu.py \
        tests/gpu/test_jax_gpu.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-60.json"
    fi
    ;;
a59)  # a short budget's H200 try: issue 12's T <= 16 rows in one pass (not on an H100: its rows are recorded)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 160 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --json "$out/linear-59.json"
    else  # the four GPU tests tests-rest-b's limit cut in a58
        run 120 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE \
            "tests/stdlib/test_decode_api.py::test_gpu_decode_persistent[e4m3-8192-16-8192-None-f32-None-channel-token-None-64-True]" \
            "tests/stdlib/test_decode_api.py::test_gpu_pdl_reads_what_the_previous_kernel_wrote"
    fi
    ;;
a58)  # streams54 (noted stream handles, the GC hook for held records, a PDL record's first launch on a stream) on the
     # GPU, then on an H200 issue 12's T <= 16 rows (the acceptance)
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs --junitxml="$out/junit-a58.xml" \
        tests/gpu/test_torch_noted_streams_gpu.py tests/gpu/test_pdl_weight_write_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_pdl_gpu.py tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_graph_owners_gpu.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-58.json"
    fi
    ;;
a57)  # one call that fits either card: on an H200 issue 12's T <= 16 rows (the acceptance), on an H100 the GPU tests
     # outside the torch and JAX files (tests-rest; last run in the forty-fourth session)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-57.json"
        run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfEs tests/gpu/test_torch_graph_scratch_gpu.py \
            tests/gpu/test_capture_threads_gpu.py tests/gpu/test_pdl_weight_write_gpu.py
    else
        run 560 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests \
            --deselect tests/gpu/test_jax_gpu.py $(for f in tests/gpu/test_torch_*.py; do echo --deselect "$f"; done)
    fi
    ;;
a56)  # after a55 (H100: the capture-thread and PDL files 8 passed, 1 skipped): on an H200 issue 12's T <= 16 rows first
     # (the acceptance), then a54's list (the torch layer files that run capture and PDL records)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-56.json"
    fi
    run 280 python -m pytest -q -m gpu -n 6 --timeout 150 -rfEs --junitxml="$out/junit-a56.xml" \
        tests/gpu/test_pdl_weight_write_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_kept_launches_gpu.py \
        tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_torch_native_gpu.py tests/gpu/test_pdl_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_training_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_graph_scratch_gpu.py
    ;;
a55)  # a54's leftovers on a short budget: on an H200 issue 12's T <= 16 rows first, then the capture-thread file
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-55.json"
    fi
    run 120 python -m pytest -q -m gpu -n 4 --timeout 100 -rfEs --junitxml="$out/junit-a55.xml" \
        tests/gpu/test_capture_threads_gpu.py tests/gpu/test_pdl_weight_write_gpu.py
    ;;
a54)  # on an H200 issue 12's T <= 16 rows first (the acceptance), then the fifty-third session's GPU tests: PDL weight
     # writes without a device synchronize (test_pdl_weight_write_gpu.py), the cudaMallocAsync capture-mode scenarios,
     # and the torch layer files that run PDL records
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-54.json"
    fi
    run 280 python -m pytest -q -m gpu -n 6 --timeout 150 -rfEs --junitxml="$out/junit-a54.xml" \
        tests/gpu/test_pdl_weight_write_gpu.py tests/gpu/test_capture_threads_gpu.py \
        tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_kept_launches_gpu.py \
        tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_torch_native_gpu.py tests/gpu/test_pdl_gpu.py
    ;;
a53)  # after a52 (H100: 518 passed, 3 failed): on an H200 issue 12's T <= 16 rows first (the acceptance), then the
     # three a52 failures' fixes (traced_errors' disabled raise; the cudaMallocAsync tests' baseline / side stream)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-53.json"
    fi
    run 200 python -m pytest -q -m gpu -n 4 --timeout 120 -rfEs --junitxml="$out/junit-a53.xml" \
        tests/gpu/test_capture_threads_gpu.py tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_autotune_streams_gpu.py
    ;;
a52)  # a51 plus the fifty-second session's capture-thread scenarios (tests/gpu/test_capture_threads_gpu.py)
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-52.json"
    fi
    run 280 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a52.xml" \
        tests/gpu/test_capture_threads_gpu.py tests/gpu/test_autotune_streams_gpu.py tests/gpu/test_torch_graph_owners_gpu.py \
        tests/gpu/test_runtime_capture_modes_gpu.py tests/gpu/test_torch_graph_scratch_gpu.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_training_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_kept_launches_gpu.py \
        tests/gpu/test_torch_input_scale_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_api_caches_gpu.py tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_jax_gpu.py
    ;;
a51)  # a50 reordered for a 600 s call: on an H200 issue 12's T <= 16 rows first (the acceptance; c48's command),
     # then the torch layer's GPU files (a50's list); a51b runs a50's CPU torch files under the device's torch
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 280 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-51.json"
    fi
    run 260 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a51.xml" \
        tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_training_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_kept_launches_gpu.py \
        tests/gpu/test_torch_input_scale_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_api_caches_gpu.py tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_jax_gpu.py \
        tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_runtime_capture_modes_gpu.py
    ;;
a51c)  # a51's tests cut to what this session changed (the device budget left fits about five minutes): capture records,
      # capture modes, the layer's graph scratch and launch paths
    run 280 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE --junitxml="$out/junit-a51c.xml" \
        tests/gpu/test_torch_graph_owners_gpu.py tests/gpu/test_runtime_capture_modes_gpu.py \
        tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py
    ;;
a51b)  # a50's second step: this session's CPU torch files under the device's torch (2.11)
    run 200 python -m pytest -q -n 8 -rfE tests/integrations/test_torch_compiled_errors.py \
        tests/integrations/test_torch_compiled_func.py tests/integrations/test_torch_training_vmap.py \
        tests/integrations/test_torch_graph_life.py tests/integrations/test_torch_capture_scratch.py \
        tests/integrations/test_torch_traced_devices.py tests/integrations/test_torch_glu_packed.py \
        tests/integrations/test_torch_compiled_refusals.py
    ;;
a50)  # the fiftieth session's fixes after its H100 run (10 failed there: CUDA graph trees told by the stack, GPU tests
     # moved to the per-capture design, graph-life settling): the torch layer's GPU files, today's CPU torch files
     # under the device's torch (2.11: one run crashed on fake stream handles, since fixed), then on an H200 issue
     # 12's T <= 16 rows (c48's command)
    run 220 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a50.xml" \
        tests/gpu/test_torch_graph_scratch_gpu.py tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_training_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_kept_launches_gpu.py \
        tests/gpu/test_torch_input_scale_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_api_caches_gpu.py tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_jax_gpu.py
    run 150 python -m pytest -q -n 8 -rfE tests/integrations/test_torch_compiled_errors.py \
        tests/integrations/test_torch_compiled_func.py tests/integrations/test_torch_training_vmap.py \
        tests/integrations/test_torch_graph_life.py tests/integrations/test_torch_capture_scratch.py \
        tests/integrations/test_torch_traced_devices.py tests/integrations/test_torch_glu_packed.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-50.json"
    fi
    ;;
a49c)  # static49b's static fp8 input-scale records (a new quantizer kernel, the record path, the fast path),
      # apicache49's metadata-buffer GPU tests, the layer's launch paths; then issue 12's T <= 16 rows (c48's command)
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a49c.xml" \
        tests/gpu/test_torch_input_scale_gpu.py tests/gpu/test_api_caches_gpu.py tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_jax_gpu.py tests/gpu/test_torch_kept_launches_gpu.py
    run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --passes 3 --json "$out/linear-passes-49c.json"
    ;;
a49b)  # the kept-launch file after its padded-shape fix, ckpt49's static input scales, and the torch layer's GPU
      # files whole (the checkpoint, sparsify_, fusion and autograd changes of this session); on an H200 also
      # issue 12's T <= 16 rows (c48's command)
    run 200 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a49b.xml" \
        tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_input_scale_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py \
        tests/gpu/test_torch_warm_up_gpu.py tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_neg_views_gpu.py \
        tests/gpu/test_torch_training_gpu.py
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
            --passes 3 --json "$out/linear-passes-49.json"
    fi
    ;;
h100-49)  # on an H100: a49's GPU tests, then the H100's own decode table (tune-decode-h100's first step); copy the
         # table out of $OUT into stdlib/kernels/tuned/ and run bench_linear's 8B rows with it in the next call
    run 170 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a49.xml" \
        tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py -k "kept or fuse or fused or glu or grad"
    table=stdlib/kernels/tuned/decode-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/ /-/g').json
    run 300 python benchmarks/tune_decode.py --shapes 4096x4096 6144x4096 28672x4096 4096x14336 --tokens 16 4 1 \
        --dtype bf16 e4m3 --max-seconds 280 -v -o "$table"
    cp "$table" "$out/" 2>/dev/null
    ;;
a49)  # review49b's kept-launch GPU tests (x / layer changes after a graph replays; fused members across .data,
     # capture and side streams) with the fused and autograd GPU tests, then issue 12's T <= 16 rows as c48
    run 170 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE --junitxml="$out/junit-a49.xml" \
        tests/gpu/test_torch_kept_launches_gpu.py tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py -k "kept or fuse or fused or glu or grad"
    run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --passes 3 --json "$out/linear-passes-49.json"
    ;;
a48b)  # a48's GPU tests alone (what the last ~180 s of device time allow)
    run 120 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py -k "fuse or fused or glu"
    ;;
a48)  # hooks48's fused projections (members sliced by tensor_split under grad mode, x.requires_grad in the run's
      # stamp) on CUDA, then c48
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE tests/gpu/test_torch_linear_gpu.py \
        tests/gpu/test_torch_glu_gpu.py tests/gpu/test_torch_autograd_gpu.py -k "fuse or fused or glu"
    run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --passes 3 --json "$out/linear-passes-48.json"
    ;;
c48)  # issue 12's T <= 16 rows with the eager blocks timed in three passes over the table (--passes 3: a slow
      # stretch of the shared host took every block of a row in c33's runs, dense's included; the first pass's
      # targets are printed too)
    run 300 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --passes 3 --json "$out/linear-passes-48.json"
    ;;
c33)  # the layer's T <= 16 rows (issue 12's eager target, last measured in d30); the model compiled at batch 16
    run 150 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-33.json"
    run 250 python benchmarks/bench_llama.py --layers 32 --modes compile --check-tokens 0 --batches 16 \
        --models dense sparsile-fused --json "$out/llama-glu-compile16-33.json"
    ;;
decode-route-21)  # sparse_matmul at N <= 64 runs the decode kernel, storing C feature-major (FM=1): its GPU tests and
                  # those of the kernels it shares code with, then the Llama-3 grid at T <= 64 (bf16, then f16)
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/stdlib/test_gemm_decode_route.py \
        tests/stdlib/test_gemm_api.py tests/stdlib/test_decode_api.py tests/stdlib/test_gemm_out_dtype.py
    run 330 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 1 16 64 --dtypes bf16 --iters 10 \
        --case-timeout 40 --json "$out/gemm-t64-bf16.json"
    ;;
slab256-22d)  # the 256-row and persistent decode GPU tests after the 17-warp register cap (maxnreg 96); the f16
              # T = 1 / 16 tiles re-tuned (64-row slabs); the f16 T = 64 tiles slab256-22 left out
    run 150 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE --junitxml="$out/junit-22d.xml" \
        tests/stdlib/test_decode_api.py -k "256 or persistent or 17_warps"
    run 240 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 \
        8192x8192 57344x8192 8192x28672 --tokens 16 1 --dtype f16 --max-seconds 210 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    run 170 python benchmarks/tune_decode.py --shapes 28672x4096 4096x14336 10240x8192 8192x8192 57344x8192 \
        8192x28672 --tokens 64 --dtype f16 --max-seconds 140 -v -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    ;;
slab256-22)  # (run 2026-12-03: 3 failures, the 256-row in-kernel reduction's SP0711) the decode kernel's 256-row slabs and persistent kernel: their GPU tests, then the
             # decode table's T = 64 tiles re-tuned with them (bf16, f16; the persistent kernel where slabs > SMs)
    run 150 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/stdlib/test_decode_api.py -k "256 or 64_row or persistent"
    run 330 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 \
        8192x8192 57344x8192 8192x28672 --tokens 64 --dtype bf16 f16 --max-seconds 290 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    ;;
slab256-22b)  # (not run yet) the f16 T = 1 / 16 tiles with 64-row slabs, the large weights' bf16 T = 1 / 16
              # tiles with the persistent kernel
    run 300 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 \
        8192x8192 57344x8192 8192x28672 --tokens 16 1 --dtype f16 --max-seconds 280 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    run 200 python benchmarks/tune_decode.py --shapes 28672x4096 57344x8192 --tokens 16 1 --dtype bf16 \
        --max-seconds 180 -v -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    ;;
a23)  # the twenty-third session's first call: sweep-23, then the tail split's GPU tests, then its 8B prefill rows
    run 240 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind decode --dtype bf16 --dtype f16 --max-seconds 215
    run 130 python -m pytest -q -m gpu -n 4 --timeout 120 -rfE tests/stdlib/test_gemm_tail.py
    run 210 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up \
        --tokens 1024 512 256 --dtypes bf16 --iters 10 --case-timeout 40 --json "$out/gemm-tail-8b.json"
    ;;
tail-23b)  # the tail split in the shipped table: `sparsile tune` (its space has the tail splits) the 8B / 70B qkv
          # and gate_up rows at T = 256, 512, 1024 (bf16), then the grid's rows with the table it wrote
    for w in 6144x4096 28672x4096 10240x8192 57344x8192; do
        [ "$SECONDS" -lt 300 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/tail-shapes.txt
        SPARSILE_AUTOTUNE_PRINT=1 run 150 python -m sparsile tune /tmp/tail-shapes.txt --dtype bf16 \
            --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    done
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    run 230 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 1024 512 256 --dtypes bf16 --iters 10 --case-timeout 40 --json "$out/gemm-tail-bf16.json"
    ;;
b23)  # ncu-decode-23, then tail-23b's tuning and grid in f16
    run 200 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        python benchmarks/profile_decode.py --shape 28672x4096 --tokens 1 64 --dtype bf16
    for w in 6144x4096 28672x4096 10240x8192 57344x8192; do
        [ "$SECONDS" -lt 390 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/tail-shapes.txt
        run 150 python -m sparsile tune /tmp/tail-shapes.txt --dtype f16 --warmup 3 --rep 10 \
            -o stdlib/kernels/tuned/h200.json
    done
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    run 170 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 1024 512 256 --dtypes f16 --iters 10 --case-timeout 40 --json "$out/gemm-tail-f16.json"
    ;;
streamk-24)  # (not run yet) the stream-K sparse GEMM (sparse_gemm_sm90_streamk.spk): its GPU tests, then the prefill
            # rows whose tiles leave SMs idle with its column (bf16), then `sparsile tune` of those rows (its
            # space has stream-K) and the grid again with the table it wrote
    run 120 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_gemm_streamk.py
    run 170 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-o 70B-qkv 70B-o \
        --tokens 512 256 --dtypes bf16 --iters 10 --case-timeout 40 --json "$out/gemm-streamk-bf16.json"
    for w in 6144x4096 4096x4096 10240x8192 8192x8192; do
        [ "$SECONDS" -lt 420 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/sk-shapes.txt
        run 90 python -m sparsile tune /tmp/sk-shapes.txt --dtype bf16 --warmup 3 --rep 10 \
            -o stdlib/kernels/tuned/h200.json
    done
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    ;;
call-24)  # sparse_matmul's call cache (stdlib/kernels/call_cache.py): its GPU tests and those of sparse_matmul, then the
         # host-inclusive time per call planned / cached beside F.linear and cuSPARSELt (bench_matmul_call.py)
    run 220 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/stdlib/test_call_cache.py \
        tests/stdlib/test_gemm_api.py tests/stdlib/test_gemm_decode_route.py
    run 240 python benchmarks/bench_matmul_call.py --shapes 6144x4096 28672x4096 10240x8192 --tokens 16 512
    ;;
b32)  # after a32: the torch side of the gated epilogue (glu.py, gate.py; fuse_projections_(glu=True)): its GPU tests
     # (swiglu and geglu) and the layer's (records size y from the output features now); then the layer's T <= 16 rows
     # (issue 12's eager target, last measured in d30)
    run 300 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/gpu/test_torch_glu_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_native_gpu.py
    run 150 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-32.json"
    ;;
d32)  # issue 13's grid: f16 57344 x 256 x 8192 kept its entry in f31 (the step limit cut it; 0.89x cuSPARSELt in
     # g31, where bf16's re-tuned entry, a CTA-pair head with a tail split of 2, reached 0.96-0.98x): tuned into its
     # own table, checked against float64, merged into h200.json, then the row against cuSPARSELt and cuBLAS
    echo 57344x256x8192 > /tmp/f16-57344.txt
    run 300 python -m sparsile tune /tmp/f16-57344.txt --dtype f16 --warmup 3 --rep 10 -o "$out/f16-57344.json"
    run 100 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --table "$out/f16-57344.json"
    python -c "import json, sys; from pathlib import Path; from sparsile.stdlib.kernels.tuning import merged_table, \
write_json_atomic; p = Path('stdlib/kernels/tuned/h200.json'); \
write_json_atomic(p, merged_table(p, json.loads(Path(sys.argv[1]).read_text())))" "$out/f16-57344.json" && \
        cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 120 python benchmarks/bench_sparse_gemm.py --case f16:57344x256x8192 --case bf16:57344x256x8192 \
        --json "$out/grid-57344x256-32.json"
    ;;
c32)  # after b32: the 32-layer model in CUDA graphs with and without the gated forward (glu=True), batch 1 and 16,
     # then under torch.compile (the traced swiglu op) at batch 16
    run 330 python benchmarks/bench_llama.py --layers 32 --modes graph \
        --models dense sparsile-fused sparsile-fused-noglu --json "$out/llama-glu-32.json"
    run 250 python benchmarks/bench_llama.py --layers 32 --modes compile --check-tokens 0 --batches 16 \
        --models dense sparsile-fused --json "$out/llama-glu-compile16-32.json"
    ;;
a32)  # the decode kernel's gated epilogue (activation="swiglu" and "geglu"): its GPU tests and the decode kernel's
     # (the plan's ldy / workspace stride split), then timed against the unfused kernel + torch's activation + mul on
     # the 8B / 70B gate_up weights
    run 200 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/stdlib/test_decode_glu.py \
        tests/stdlib/test_decode_qx.py tests/stdlib/test_decode_api.py -k "glu or qx or torch_in_place or persistent"
    run 200 python benchmarks/bench_glu.py --activations swiglu geglu
    ;;
a31)  # where a decode step's GPU time goes (issue 12's CUDA-graph model at batch 16 is 1.21x dense): the kernels of
     # 8 graph-replayed steps of the 32-layer model, per name, dense against sparsile-fused, batch 1 and 16
    run 400 python benchmarks/profile_llama_step.py --layers 32 --batches 16 1 --models dense sparsile-fused
    ;;
b31)  # the torch ops behind the batch-16 step's kernels (a31: 2.3 ms of generic elementwise kernels, 6.6 us each)
    run 300 python benchmarks/profile_llama_step.py --layers 32 --batches 16 --models dense sparsile-fused --ops --top 40
    ;;
c31)  # b31: at batch 16 transformers' sdpa attention copies the K / V cache 4x per layer (repeat_kv, 1.6 ms of a 10.2 ms
     # dense step, in both models): the model with the query heads folded instead (--attention sdpa-gqa), then profiled
    run 330 python benchmarks/bench_llama.py --layers 32 --modes graph --attention sdpa-gqa \
        --models dense sparsile sparsile-fused --json "$out/llama-gqa-31.json"
    run 200 python benchmarks/profile_llama_step.py --layers 32 --batches 16 --models dense sparsile-fused \
        --attention sdpa-gqa
    ;;
d31)  # c31's 1.31x at batch 16 (graph, sparsile-fused) again, then the same attention under torch.compile, batch 1 and 16
    run 150 python benchmarks/bench_llama.py --layers 32 --modes graph --attention sdpa-gqa --check-tokens 0 \
        --models dense sparsile-fused --json "$out/llama-gqa-graph-31.json"
    run 200 python benchmarks/bench_llama.py --layers 32 --modes compile --attention sdpa-gqa --check-tokens 0 \
        --models dense sparsile-fused --batches 1 --json "$out/llama-gqa-compile1-31.json"
    run 200 python benchmarks/bench_llama.py --layers 32 --modes compile --attention sdpa-gqa --check-tokens 0 \
        --models dense sparsile-fused --batches 16 --json "$out/llama-gqa-compile16-31.json"
    ;;
e31)  # L2 eviction priorities on the _mt GEMM's TMA loads (b30's ncu: our L2 hit rate 52 % against cuSPARSELt's 72 % on
     # 57344 x 256 x 8192): each _mt kernel without and with hints (A first, B last, both), on the N = 256 rows and 8192^3
    for shape in 57344x256x8192 28672x256x4096 10240x256x8192 57344x512x8192; do
        run 100 python benchmarks/gemm_variants.py --dtypes bf16 --shape $shape --meta-tma --l2-hint --stages 5 \
            --only "metadata by TMA" --iters 20
    done
    run 100 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --l2-hint --stages 4 --only "pair, metadata" \
        --iters 10
    ;;
f31)  # e31: L2 hints 4-6 % faster on 28672 x 256 x 4096 and 10240 x 256 x 8192, 7 % slower on 57344 x 256 x 8192: the
     # tuner now has L2-hinted twins (f16, bf16). The grid's N = 256 rows tuned into their own table, every entry of it
     # against float64, merged into h200.json, then those grid rows against cuSPARSELt and cuBLAS
    printf '6144x256x4096\n28672x256x4096\n10240x256x8192\n57344x256x8192\n' > /tmp/n256.txt
    run 300 python -m sparsile tune /tmp/n256.txt --dtype bf16 --dtype f16 --warmup 3 --rep 10 -o "$out/n256.json"
    run 150 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --table "$out/n256.json"
    python -c "import json, sys; from pathlib import Path; from sparsile.stdlib.kernels.tuning import merged_table, \
write_json_atomic; p = Path('stdlib/kernels/tuned/h200.json'); \
write_json_atomic(p, merged_table(p, json.loads(Path(sys.argv[1]).read_text())))" "$out/n256.json" && \
        cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 200 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 256 --json "$out/grid-n256-31.json"
    ;;
g31)  # after f31 (its grid run stopped at f16 57344 x 256): the L2-hint GPU tests and the tuner's, then both 57344 x 256 rows
    run 200 python -m pytest -q -m gpu -n 4 --timeout 150 -rfE tests/stdlib/test_gemm_meta_tma.py \
        tests/stdlib/test_gemm_tuning.py tests/gpu/test_autotune_gpu.py
    run 150 python benchmarks/bench_sparse_gemm.py --case bf16:57344x256x8192 --case f16:57344x256x8192 \
        --json "$out/grid-57344x256-31.json"
    ;;
a30)  # SparseLinear.__call__ without nn.Module.__call__: the torch layer's GPU tests, the host time of both calls
     # in one process (bench_layer_host), the layer's T <= 16 rows (issue 12's eager targets); then the tail split's
     # cached call: d29 timed 10240 x 512 x 8192 bf16 at 138 us host-inclusive for an 81.8 us kernel (105 for 90 in f27)
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_linear_gpu.py
    run 60 python benchmarks/bench_layer_host.py --shapes 8B_o 8B_qkv --tokens 16
    run 150 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-30.json"
    run 120 python benchmarks/bench_matmul_call.py --shapes 10240x8192 6144x4096 --tokens 256 512 1024 --blocks 7
    ;;
e30)  # the 32-layer Llama-3-8B decoded eagerly at batch 1 (every step through each layer's eager call, where the graph
     # replays apply), dense against sparsile, then sparsile with the replays off
    run 200 python benchmarks/bench_llama.py --layers 32 --modes eager --batches 1 --models dense sparsile \
        --new-tokens 64 --repeats 2 --check-tokens 0 --json "$out/llama-eager-e30.json"
    run 150 env SPARSILE_TORCH_GRAPH_REPLAY=0 python benchmarks/bench_llama.py --layers 32 --modes eager --batches 1 \
        --models sparsile --new-tokens 64 --repeats 2 --check-tokens 0 --json "$out/llama-eager-noreplay-e30.json"
    ;;
d30)  # the host time step by step with graph replays on and off in one process (bf16 8B o / qkv at T = 1 and 16, e4m3
     # 70B o at T = 16: two launches, 8B o at T = 1), then the layer's T <= 16 rows once more
    run 40 python benchmarks/bench_layer_host.py --shapes 8B_o 8B_qkv --tokens 16
    run 40 python benchmarks/bench_layer_host.py --shapes 8B_o 8B_qkv --tokens 1
    run 40 python benchmarks/bench_layer_host.py --shapes 70B_o --tokens 16 --dtype e4m3
    run 40 python benchmarks/bench_layer_host.py --shapes 8B_o --tokens 1 --dtype e4m3
    run 120 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-d30.json"
    ;;
c30)  # repeated eager calls replayed as one CUDA-graph launch (graph_launch.py): the torch layer's GPU tests, the
     # host time step by step (bf16 8B o / qkv, e4m3 70B o at T = 16: two launches), the layer's T <= 16 rows, then
     # the e4m3 rows with the replays off (SPARSILE_TORCH_GRAPH_REPLAY=0) for comparison
    run 170 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_linear_gpu.py
    run 40 python benchmarks/bench_layer_host.py --shapes 8B_o 8B_qkv --tokens 16
    run 40 python benchmarks/bench_layer_host.py --shapes 70B_o --tokens 16 --dtype e4m3
    run 120 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-c30.json"
    run 80 env SPARSILE_TORCH_GRAPH_REPLAY=0 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 \
        --variants graph --json "$out/linear-e4m3-noreplay-c30.json"
    ;;
b30)  # what two launches cost the host against one CUDA-graph launch of them (the two-launch eager e4m3 calls,
     # issue 12's last eager misses); the e4m3 layer rows at T <= 16 again; then the prefill rows still behind
     # cuSPARSELt (c29 / d29: 57344 x 256 x 8192 bf16 0.89x): Nsight Compute of ours and cuSPARSELt's kernels
    run 60 python benchmarks/probe_graph_launch.py
    run 120 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag-e4m3-30.json"
    run 240 ncu --profile-from-start off -k "regex:sparse_gemm_bf16|sm90|xmma|cutlass|nvjet" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        python benchmarks/gemm_variants.py --dtypes bf16 --shape 57344x256x8192 --meta-tma --stages 5 --profile-once
    ;;
d29)  # the prefill grid rows c29's step limits cut: 70B qkv at T = 512 / 256 and 70B gate_up, bf16 then f16
    run 285 python benchmarks/bench_sparse_gemm.py --iters 10 --case-timeout 40 --json "$out/gemm-grid-rest.json" \
        --case bf16:10240x512x8192 --case bf16:10240x256x8192 --case bf16:57344x1024x8192 \
        --case bf16:57344x512x8192 --case bf16:57344x256x8192 --case f16:10240x256x8192 \
        --case f16:57344x1024x8192 --case f16:57344x512x8192 --case f16:57344x256x8192
    ;;
c29)  # the last 31 tuned GEMM entries against float64 (8192 x 28672, 57344 x 8192 and the f16 28672 x 8192 x 4096);
     # then the prefill grid after the lane exchange: 8B / 70B qkv and gate_up at T = 256-1024, bf16 and f16
    run 200 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --skip 89 --max-seconds 170
    run 170 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 1024 512 256 --dtypes bf16 --iters 10 --case-timeout 40 --json "$out/gemm-grid-bf16.json"
    run 170 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 1024 512 256 --dtypes f16 --iters 10 --case-timeout 40 --json "$out/gemm-grid-f16.json"
    ;;
b29)  # the decode kernel with one MMA group in flight (INFLIGHT): its GPU tests (bit-equal to INFLIGHT=0), then an
     # A/B on every Llama weight at T = 16 and 64 (HBM-cold, the table's configs); the rest of the tuned GEMM entries
    run 150 python -m pytest -q -m gpu -n 8 --timeout 120 -rfE tests/stdlib/test_decode_inflight.py \
        tests/stdlib/test_decode_api.py
    run 200 python benchmarks/bench_decode.py --inflight --tokens 16 64 --no-tiled
    run 200 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --skip 54 --max-seconds 170
    ;;
a29)  # every tuned GEMM entry against float64 (C poisoned) with the lane-exchanged epilogue, operands, references
     # and comparisons now made on the GPU (sweep_tuned.py); then the layer's T <= 16 rows, dense and eager timed
     # in alternating blocks (time_calls_interleaved) with the host-speed probe
    run 420 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --max-seconds 390
    run 150 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag.json"
    ;;
a28)  # what moves the eager host time (issue 12): the layer's T <= 16 rows on 8B and 70B, e4m3 then bf16, with a
     # host-speed probe, the timed blocks' CPU share and collections, and a cProfile of each row missing 8 us;
     # then what limits e4m3 8192^3 (issue 13): Nsight Compute of the tuned pair kernel, cuSPARSELt, cuBLAS fp8
    run 200 python benchmarks/bench_linear.py --dtypes e4m3 bf16 --tokens 1 4 16 --variants graph --host-diag \
        --json "$out/linear-diag.json"
    run 200 ncu --profile-from-start off -k "regex:sparse_gemm_e4m3_pair_mt|sm90|xmma|cutlass" \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        python benchmarks/gemm_variants.py --dtypes e4m3 --meta-tma --inflight --stages 5 \
        --only "pair, metadata by TMA, INFLIGHT=1" --profile-once
    run 150 ncu --profile-from-start off -k "regex:sparse_gemm_e4m3_pair_mt" --section SourceCounters \
        --section WarpStateStats -f -o "$out/e4m3-28" python benchmarks/gemm_variants.py --dtypes e4m3 --meta-tma \
        --inflight --stages 5 --only "pair, metadata by TMA, INFLIGHT=1" --profile-once
    run 60 bash -c "ncu -i '$out/e4m3-28.ncu-rep' --page source --print-source sass --csv > '$out/e4m3-28-sass.csv'"
    run 30 python -c "import csv, sys; rows = list(csv.DictReader(open(sys.argv[1]))); \
key = next((k for k in rows[0] if 'Sampling' in k and 'All' in k), None) if rows else None; \
num = lambda v: float((v or '0').replace(',', '') or 0); total = sum(num(r[key]) for r in rows) if key else 0; \
print('samples', total); [print(r.get('Source', r)[:100], r[key]) for r in sorted(rows, key=lambda r: -num(r[key]))[:30]] if key else None" \
        "$out/e4m3-28-sass.csv"
    ;;
c28)  # the GEMM epilogue's stores widened to 16 bytes by a lane exchange (backend/lower/lane_exchange.py): the
     # GPU tests of every kernel whose PTX it changed (float64, C poisoned), then 8192^3 with it off and on in
     # one run against cuSPARSELt and cuBLAS (e4m3: cuBLAS fp8), then sparse_matmul as shipped
    run 240 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_sparse_gemm_sm90.py \
        tests/stdlib/test_gemm_meta_tma.py tests/stdlib/test_gemm_pingpong.py tests/stdlib/test_gemm_streamk.py \
        tests/stdlib/test_gemm_tail.py tests/stdlib/test_gemm_api.py
    for on in 0 1; do
        run 100 env SPARSILE_NO_DISK_CACHE=1 SPARSILE_LANE_EXCHANGE_STORES=$on python benchmarks/gemm_variants.py \
            --dtypes e4m3 bf16 --meta-tma --inflight --stages 5 --only "pair, metadata by TMA" --iters 20
    done
    run 100 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:8192x8192x8192 --case bf16:8192x8192x8192 \
        --case f16:8192x8192x8192 --case e4m3:28672x8192x4096
    ;;
f28)  # issue 13's mid-T rows after the lane exchange: c27's e4m3 cases (cuSPARSELt 10-21 % ahead there before), then
     # the bf16 rows that trailed the searched cuSPARSELt most (10240 x 512 x 8192 0.72x in the issue)
    run 150 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:4096x256x4096 --case e4m3:4096x512x4096 \
        --case e4m3:6144x1024x4096 --case e4m3:28672x1024x4096 --case e4m3:10240x512x8192 --case e4m3:8192x256x8192 \
        --case e4m3:57344x512x8192
    run 90 python benchmarks/bench_sparse_gemm.py --iters 10 --case bf16:10240x512x8192 --case bf16:6144x512x4096 \
        --case bf16:28672x1024x4096 --case f16:10240x512x8192
    ;;
e28)  # the lane exchange widened to 8-byte runs (f32 / i32: split-K partial sums, tf32, s8; one shuffle round): the
     # GPU tests of those kernels, then the table's split-K entries with it off and on (the f16 kernels' C stores do
     # not run in a split-K plan: splitk_reduce writes C)
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_sparse_gemm_sm90.py \
        tests/stdlib/test_gemm_streamk.py tests/stdlib/test_gemm_tail.py tests/stdlib/test_gemm_api.py -k \
        "split or tf32 or s8 or i8 or streamk or tail"
    for on in 0 1; do
        run 150 env SPARSILE_NO_DISK_CACHE=1 SPARSILE_LANE_EXCHANGE_STORES=$on python benchmarks/bench_sparse_gemm.py \
            --iters 10 --case bf16:4096x256x14336 --case bf16:4096x512x14336 --case bf16:8192x256x8192 \
            --case e4m3:4096x256x14336 --case e4m3:8192x256x28672
    done
    ;;
d28)  # the tuned GEMM entries against float64 (C poisoned) with the lane-exchanged epilogue, smallest first, as far
     # as the limits reach (e4m3, then bf16); the e4m3 prefill row c28's step limit cut
    run 230 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --max-seconds 210
    run 230 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype bf16 --max-seconds 210
    run 80 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:28672x8192x4096
    ;;
b28)  # issue 12's model target at batch 1: the 32-layer Llama-3-8B under torch.compile, dense against sparsile-fused;
     # then the other GPU tests of kernels whose stores the lane exchange changed (dense GEMM in training, the call cache)
    run 330 python benchmarks/bench_llama.py --layers 32 --modes compile --models dense sparsile-fused \
        --batches 1 --repeats 2 --json "$out/llama-compile-b1.json"
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_training_gpu.py \
        tests/stdlib/test_call_cache.py tests/stdlib/test_call_native.py tests/stdlib/test_gemm_decode_route.py
    ;;
g27)  # issue 12's layer targets on the 8B and 70B shapes (bf16, e4m3; T = 1, 4, 16) in one run, then the 32-layer
     # model at batch 16 under torch.compile (dense against sparsile-fused), logits checked
    run 110 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph \
        --json "$out/linear-t16.json"
    run 290 python benchmarks/bench_llama.py --layers 32 --modes compile --models dense sparsile-fused \
        --batches 16 --repeats 2 --json "$out/llama-compile-b16.json"
    ;;
f27)  # the widened one-launch rule for eager e4m3 (T <= 16 on weights up to 2^25): GPU tests, the layer's T <= 16
     # table (bf16 and e4m3); sparse_matmul on two tail-split entries, host included, now replayed natively
    run 220 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_linear_gpu.py -k "e4m3 or one_launch or qx"
    run 120 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --shapes 8B --tokens 1 4 16 --variants graph
    run 100 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:10240x512x8192 --case bf16:6144x1024x4096 \
        --case bf16:28672x512x4096
    ;;
e27)  # eager e4m3 at T = 16 in one launch (the kernel quantizing x itself) against two (quantizer, GEMM): the GPU
     # time of both, then the layer's eager calls by the rule and always one launch, twice each, interleaved
    run 120 python benchmarks/bench_decode_qx.py --shapes 6144x4096 4096x4096 4096x14336 28672x4096 --tokens 16 4
    for qx in rule always rule always; do
        run 60 python benchmarks/bench_linear.py --dtypes e4m3 --shapes 8B --tokens 16 --variants graph --eager-qx $qx
    done
    ;;
d27)  # native replays of the tail split (views at an offset): the call cache's GPU tests (a tail-split entry among
     # them) and the tail split's, then host-inclusive calls of the tail-split entries, native and prepared
    run 200 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/stdlib/test_call_cache.py \
        tests/stdlib/test_gemm_tail.py tests/stdlib/test_call_native.py
    run 120 python benchmarks/bench_matmul_call.py --shapes 6144x4096 28672x4096 10240x8192 --tokens 512 1024 --blocks 7
    SPARSILE_CALL_CACHE_NATIVE=1 run 120 python benchmarks/bench_matmul_call.py --shapes 6144x4096 28672x4096 \
        10240x8192 --tokens 512 1024 --blocks 7
    ;;
c27)  # the e4m3 entries b27's sweep did not reach against float64; sparse_matmul e4m3 on re-tuned mid-T entries
     # against cuBLAS fp8 and cuSPARSELt; the layer's T <= 16 targets (bf16 and e4m3, 8B) on this lease
    run 230 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --skip 25 --max-seconds 210
    run 150 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:4096x256x4096 --case e4m3:4096x512x4096 \
        --case e4m3:6144x1024x4096 --case e4m3:28672x1024x4096 --case e4m3:10240x512x8192 --case e4m3:8192x256x8192 \
        --case e4m3:57344x512x8192
    run 150 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --shapes 8B --tokens 1 16 --variants graph
    ;;
b27)  # the 70B e4m3 entries at T = 256-1024 re-tuned with INFLIGHT; bf16 and f16 at T = 256-1024 (8B and 70B) tuned
     # with INFLIGHT twins in the space (--inflight: by default e4m3 only); the smallest entries against float64
    printf '%s\n' 10240x256x8192 10240x512x8192 10240x1024x8192 8192x256x8192 8192x512x8192 8192x1024x8192 \
        57344x256x8192 57344x512x8192 57344x1024x8192 8192x256x28672 8192x512x28672 8192x1024x28672 > /tmp/mid-70b.txt
    printf '%s\n' 6144x256x4096 6144x512x4096 6144x1024x4096 4096x256x4096 4096x512x4096 4096x1024x4096 \
        28672x256x4096 28672x512x4096 28672x1024x4096 4096x256x14336 4096x512x14336 4096x1024x14336 > /tmp/mid-8b.txt
    run 150 python -m sparsile tune /tmp/mid-70b.txt --dtype e4m3 --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    run 150 python -m sparsile tune /tmp/mid-8b.txt --dtype bf16 --dtype f16 --inflight --warmup 3 --rep 10 \
        -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 120 python -m sparsile tune /tmp/mid-70b.txt --dtype bf16 --inflight --warmup 3 --rep 10 \
        -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 100 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --entries 28 --max-seconds 90
    run 100 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype bf16 --entries 28 --max-seconds 90
    ;;
a27)  # the last e4m3 GEMM entry against float64 (57344 x 8192 x 8192, INFLIGHT); the 8B e4m3 entries at T = 256-1024
     # re-tuned with INFLIGHT in the space (written here, copied back); where an eager layer call's host time goes
    run 130 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --skip 39 --max-seconds 110
    printf '%s\n' 6144x256x4096 6144x512x4096 6144x1024x4096 4096x256x4096 4096x512x4096 4096x1024x4096 \
        28672x256x4096 28672x512x4096 28672x1024x4096 4096x256x14336 4096x512x14336 4096x1024x14336 > /tmp/e4m3-8b-mid.txt
    run 280 python -m sparsile tune /tmp/e4m3-8b-mid.txt --dtype e4m3 --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 100 python benchmarks/bench_layer_host.py --shapes 8B_o 8B_qkv --tokens 1 --profile 8B_o
    ;;
sweep-26)  # the e4m3 GEMM entries final-26 did not reach (57344 x N x 8192, 8192 x N x 28672) against float64
    run 130 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --skip 30 --max-seconds 115
    ;;
final-26)  # the GPU tests of this session's changes (INFLIGHT entries, out sharing memory with b, the bad-input
          # review's torch checks), then the e4m3 GEMM entries against float64 with C poisoned (the 16 re-tuned ones)
    run 170 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/stdlib/test_gemm_api.py tests/stdlib/test_gemm_meta_tma.py \
        tests/stdlib/test_call_cache.py tests/integrations tests/gpu/test_torch_linear_gpu.py
    run 150 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype e4m3 --max-seconds 130
    ;;
e4m3-26c)  # the e4m3 prefill entries re-tuned with INFLIGHT in the space (T = 4096, 8192 of the eight Llama-3
          # weights), written into the shipped table here and copied back; then sparse_matmul on it at 8192^3
    printf '%s\n' 6144x4096x4096 6144x8192x4096 4096x4096x4096 4096x8192x4096 28672x4096x4096 28672x8192x4096 \
        4096x4096x14336 4096x8192x14336 > /tmp/e4m3-8b.txt
    printf '%s\n' 10240x4096x8192 10240x8192x8192 8192x4096x8192 8192x8192x8192 57344x4096x8192 57344x8192x8192 \
        8192x4096x28672 8192x8192x28672 > /tmp/e4m3-70b.txt
    run 200 python -m sparsile tune /tmp/e4m3-8b.txt --dtype e4m3 --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/h200-8b.json"
    run 260 python -m sparsile tune /tmp/e4m3-70b.txt --dtype e4m3 --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/h200.json"
    run 120 python benchmarks/bench_sparse_gemm.py --iters 10 --case e4m3:8192x8192x8192 --case e4m3:28672x8192x4096
    ;;
e4m3-26b)  # the fastest e4m3 kernel of e4m3-26 (CTA pairs, metadata by TMA; 562 µs with INFLIGHT at 5 stages, cuSPARSELt
          # searched 520, cuBLAS fp8 768) at other tile shapes: a wider K step halves the per-step waits of MMAs
          # that are half as long as bf16's
    run 400 python benchmarks/gemm_variants.py --dtypes e4m3 --meta-tma --inflight --only "pair, metadata" \
        --bn 256 128 --bk 0 256 --stages 2 3 4 5 6 --group-m 16 8
    ;;
e4m3-26)  # issue 13's e4m3 target (>= 1.5x cuBLAS fp8 at 8192^3): the e4m3 kernels (tile, pair, metadata by TMA)
         # with and without one MMA group in flight, fp8 MMAs being half as long as bf16's per byte of B
    run 400 python benchmarks/gemm_variants.py --dtypes e4m3 --meta-tma --inflight --stages 4 5 --group-m 16
    ;;
host-26)  # where a two-launch native replay's 60 µs go (4096x4096 split-K 4 + reduction, T = 16) against one
         # of 35 µs (4096x14336 T = 16) and one launch (6144x4096); then the layer's eager calls at T <= 16
    run 90 python benchmarks/bench_matmul_call.py --profile --shapes 4096x4096 --tokens 16 --blocks 3
    run 90 python benchmarks/bench_matmul_call.py --profile --shapes 4096x14336 --tokens 16 --blocks 3
    run 60 python benchmarks/bench_matmul_call.py --shapes 6144x4096 4096x4096 4096x14336 --tokens 16 --blocks 5
    run 200 python benchmarks/bench_linear.py --dtypes bf16 --shapes 8B --tokens 1 16 --variants graph
    ;;
pair-26)  # (needs 1c6e06a..1b2f579: reverted) the CTA-pair decode kernel (x multicast in a cluster): its GPU tests, then
         # timed against the plain kernel (bench_decode --pair, HBM-cold) and in the tuner's space (not shipped)
    run 200 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_decode_pair.py tests/stdlib/test_decode_api.py
    run 150 python benchmarks/bench_decode.py --quick --pair
    run 220 python benchmarks/tune_decode.py --shapes 28672x4096 10240x8192 4096x14336 8192x8192 57344x8192 6144x4096 \
        --tokens 64 32 16 --max-seconds 180 -v -o "$out/decode-pair-26.json"
    run 60 python benchmarks/bench_matmul_call.py --shapes 4096x4096 --tokens 16 1 --blocks 5
    ;;
verify-26)  # (not run yet) the call cache's key after 98671d5 (hashed once, torch devices by index, LRU by
           # OrderedDict): its GPU tests, then the host time per call with native and prepared replays
    run 150 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_call_cache.py tests/stdlib/test_gemm_api.py \
        tests/backend/test_prepared_gpu.py
    # the shared RecordLauncher (3d37c16) behind the torch layer's native calls
    run 200 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/integrations tests/gpu/test_torch_linear_gpu.py
    run 200 python benchmarks/bench_matmul_call.py --shapes 6144x4096 28672x4096 10240x8192 --tokens 16 512 --blocks 5
    # the split-K decode entries (8B o and down) with their two launches from native code (then: make "all" the default)
    SPARSILE_CALL_CACHE_NATIVE=all run 150 python benchmarks/bench_matmul_call.py --shapes 4096x4096 4096x14336 \
        --tokens 1 16 --blocks 5
    ;;
verify-25)  # (run 2026-12-04) what the twenty-fourth session left unrun on the GPU: the call cache's GPU tests after its
           # last changes (MetadataBuffers keyed by tag, LRU), which launches a tail-split replay prepares and its
           # host time, and the grid's new host-inclusive table on two weights
    run 150 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_call_cache.py tests/stdlib/test_gemm_api.py
    run 150 python benchmarks/bench_matmul_call.py --shapes 10240x8192 28672x4096 6144x4096 --tokens 512 16 --blocks 5
    run 240 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 70B-qkv --tokens 16 512 --dtypes bf16 \
        --iters 10 --case-timeout 60 --json "$out/gemm-host-25.json"
    ;;
call-24d)  # which launches a cached call replays prepared, on the rows whose table entry is a tail split (3 launches)
    run 150 python benchmarks/bench_matmul_call.py --shapes 10240x8192 28672x4096 6144x4096 --tokens 512 16 --blocks 5
    ;;
call-24c)  # replays through prepared launches (only the arrays per call), the environment read from its mapping
    run 200 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_call_cache.py tests/stdlib/test_gemm_tail.py \
        tests/stdlib/test_gemm_api.py tests/stdlib/test_gemm_decode_route.py
    run 200 python benchmarks/bench_matmul_call.py --profile --shapes 6144x4096 28672x4096 10240x8192 --tokens 16 512
    ;;
call-24b)  # after call-24: the stream recorded as given, row views replayed, refusals remembered; where a replay's host time goes
    run 150 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_call_cache.py tests/stdlib/test_gemm_tail.py
    run 240 python benchmarks/bench_matmul_call.py --profile --shapes 6144x4096 28672x4096 10240x8192 --tokens 16 512
    ;;
ncu-source-26)  # (not run yet) the decode kernel's SASS lines with the most stall samples at N = 64 (the
               # ncu-decode-24 sections print no per-line table): a report, then its source page as CSV
    run 300 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -f -o "$out/decode-26" \
        python benchmarks/profile_decode.py --shape 28672x4096 --tokens 64 --dtype bf16 --no-peers
    run 120 bash -c "ncu -i '$out/decode-26.ncu-rep' --page source --print-source sass --csv > '$out/decode-26-sass.csv'"
    # the 40 lines with the most stall samples (ncu quotes every field; SASS text has commas)
    run 60 python -c "import csv, sys; rows = list(csv.DictReader(open(sys.argv[1]))); \
key = next((k for k in rows[0] if 'Sampling' in k and 'All' in k), None) if rows else None; print('columns:', list(rows[0]) if rows else None); \
num = lambda v: float((v or '0').replace(',', '') or 0); \
[print(r.get('Source', r)[:90], r[key]) for r in sorted(rows, key=lambda r: -num(r[key]))[:40]] if key else None" \
        "$out/decode-26-sass.csv"
    ;;
ncu-decode-24)  # (run 2026-12-04) where the decode kernel's 13 % of bandwidth between N = 1 and N = 64 goes, after
               # stream-K ruled out the part-full wave: ncu's memory tables (sectors per request against the
               # bytes it must read) and the SASS lines with the most stall samples, 8B gate_up bf16
    run 300 ncu --profile-from-start off --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
        --section SourceCounters --print-details all python benchmarks/profile_decode.py --shape 28672x4096 --tokens 1 64 --dtype bf16 \
        --no-peers
    ;;
decode-24)  # the decode kernel at N = 1 against N = 64 (8B gate_up bf16) in Nsight Compute: DRAM and L2 bytes and
           # throughputs (x is re-read by every CTA: at N = 64 and 128-row slabs its bytes equal the weight's), the
           # stall reasons and the SASS lines with the most stall samples; then the N = 64 grid from HBM (--l2 cold)
    run 240 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SourceCounters \
        --metrics dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed \
        python benchmarks/profile_decode.py --shape 28672x4096 --tokens 1 64 --dtype bf16 --no-peers \
        > "$out/ncu-decode-24.txt" 2>&1
    grep -E "^  [a-z_0-9]+ \(|^decode|Duration|DRAM Throughput|dram__bytes|lts__t_bytes|lts__t_sectors_srcunit|lts__throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles Per Issued|Stall " \
        "$out/ncu-decode-24.txt" | head -60 | tee -a "$log"
    run 300 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 64 --dtypes bf16 --iters 10 \
        --case-timeout 60 --l2 cold --json "$out/gemm-t64-bf16-cold.json"
    ;;
cold-23)  # (not run yet) the grid's T <= 64 rows with every contender also timed from HBM (--l2 cold: weights
         # rotated over copies of at least 3 x L2), as a model's decode step reads them; bf16
    run 540 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 1 16 64 --dtypes bf16 --iters 10 \
        --case-timeout 60 --l2 cold --json "$out/gemm-t64-bf16-cold.json"
    ;;
sweep-23)  # (not run yet) every bf16 / f16 decode-table entry against float64 with poisoned outputs, after the
          # twenty-second session's re-tuning (256-row and persistent entries among them)
    run 260 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind decode --dtype bf16 --dtype f16 --max-seconds 230
    ;;
ncu-decode-23)  # (not run yet) where the decode kernel's bandwidth goes between N = 1 and N = 64: Nsight Compute of
               # one call each (8B gate_up bf16), and of cuBLAS and tuned cuSPARSELt at N = 64
    run 240 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy \
        python benchmarks/profile_decode.py --shape 28672x4096 --tokens 1 64 --dtype bf16
    ;;
tail-23)  # (not run yet) the tail split (gemm_tail.py): its GPU tests, then the prefill rows whose last wave is
         # part-full with the tail column (the best tail split of the config sparse_matmul runs), bf16
    run 150 python -m pytest -q -m gpu -n 4 --timeout 120 -rfE tests/stdlib/test_gemm_tail.py
    run 400 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B-qkv 8B-gate_up 70B-qkv 70B-gate_up \
        --tokens 1024 512 256 --dtypes bf16 --iters 10 --case-timeout 60 --json "$out/gemm-tail-bf16.json"
    ;;
slab256-22e)  # the grid's T <= 64 rows with the re-tuned decode table: bf16 at T = 1, 16, 64, f16 at T = 64
    run 290 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 1 16 64 --dtypes bf16 --iters 10 \
        --case-timeout 30 --json "$out/gemm-t64-bf16.json"
    run 140 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 64 --dtypes f16 --iters 10 \
        --case-timeout 30 --json "$out/gemm-t64-f16.json"
    ;;
slab256-22c)  # (not run yet) the grid's T <= 64 rows with the re-tuned decode table (commit it first), then the
              # layer at T = 64, which reads the same table entries (bf16, HBM-cold graph replays)
    run 330 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 1 16 64 --dtypes bf16 --iters 10 \
        --case-timeout 30 --json "$out/gemm-t64-bf16.json"
    run 180 python benchmarks/bench_linear.py --dtypes bf16 --tokens 64 --variants graph --l2 cold \
        --max-seconds 150 --json "$out/linear-t64.json"
    ;;
decode-route-21c)  # the decode table's new entries against float64 (poisoned), then the grid's f16 T = 64 rows
    run 230 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind decode --dtype bf16 --dtype f16 --max-seconds 200
    run 150 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 64 --dtypes f16 --iters 10 \
        --case-timeout 40 --json "$out/gemm-t64-f16-tuned.json"
    ;;
decode-route-21b)  # the route's GPU tests alone; the decode table's 32- and 64-token tiles (bf16, f16) for the
                   # Llama-3 8B and 70B weights (merged into decode-h200.json); the grid's T = 64 rows with them
    run 150 python -m pytest -q -m gpu -n 4 --timeout 100 -rfE tests/stdlib/test_gemm_decode_route.py
    run 330 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 \
        8192x8192 57344x8192 8192x28672 --tokens 64 32 --dtype bf16 f16 --max-seconds 290 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    run 150 python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 64 --dtypes bf16 --iters 10 \
        --case-timeout 40 --json "$out/gemm-t64-bf16-tuned.json"
    ;;
perwarp-20)  # each consumer warp releasing a stage itself (PER="warp", no named barrier per warpgroup): its GPU
             # tests, then timed against the per-warpgroup release at 8192³ and 4096³ (bf16, f16)
    run 120 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/stdlib/test_gemm_meta_tma.py
    run 170 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --per-warp --group-m 8 --iters 30
    run 120 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --per-warp --group-m 8 --size 4096 --iters 50
    # T = 64 after the table lookup's nearby rule (no N = 256 entry for N = 64)
    run 100 python benchmarks/bench_sparse_gemm.py --case bf16:6144x64x4096 --case bf16:4096x64x4096 \
        --case bf16:28672x64x4096 --case bf16:4096x64x14336 --iters 10 --case-timeout 30 --json "$out/gemm-t64.json"
    ;;
mt-20)  # (run 2026-12-03) the split-K _mt kernels with the share counts that faulted before 726edb5 (then set
        # gemm.META_TMA_SPLIT_K = True if they pass), the _mt kernels' INFLIGHT = 1 on the GPU and timed, the T <= 16 table
    run 150 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/stdlib/test_gemm_meta_tma.py
    run 150 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --inflight --group-m 16 8 --iters 30
    run 60 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 50 \
        --json "$out/linear_t16.json"
    ;;
ncu-mt)  # what limits the sparse GEMM with the metadata by TMA: Nsight Compute of one bf16 8192³ call each of the
         # pair kernel with and without it and of cuSPARSELt (SpeedOfLight, compute pipes, warp stalls)
    run 280 ncu --profile-from-start off -k "regex:sparse_gemm_bf16_pair|xmma_sparse" --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
        python benchmarks/gemm_variants.py --dtypes bf16 --meta-tma --profile-once
    ;;
mt-19b)  # the _mt kernels behind sparse_matmul and the layer: GPU tests of what launches them, then 8192³ and the
         # 8B grid at prefill T with the metadata by TMA and without (SPARSILE_META_TMA=0), against tuned cuSPARSELt
    run 200 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests/stdlib/test_gemm_meta_tma.py \
        tests/stdlib/test_gemm_api.py tests/stdlib/test_linear_api.py tests/gpu/test_sparse_gemm_sm90.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_native_gpu.py
    for mt in 1 0; do
        SPARSILE_META_TMA=$mt run 70 python benchmarks/bench_sparse_gemm.py --case bf16:8192x8192x8192 \
            --case f16:8192x8192x8192 --iters 10 --case-timeout 30 --json "$out/gemm-8192-mt$mt.json"
    done
    run 150 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B --tokens 256 1024 --dtypes bf16 \
        --iters 10 --case-timeout 30 --json "$out/gemm-llama-bf16-mt.json"
    ;;
mt-19)  # the sparse GEMM with its metadata streamed by TMA (sparse_gemm_sm90_mt.spk): GPU tests, then timed at
        # 8192³ and 4096³ against the shipped kernels, cuSPARSELt (default and searched) and cuBLAS
    run 120 python -m pytest -q -m gpu -rfE tests/stdlib/test_gemm_meta_tma.py tests/gpu/test_sparse_gemm_sm90.py \
        -k "meta_tma or gpu_matches or pair or persistent"
    run 150 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --iters 30
    run 100 python benchmarks/gemm_variants.py --dtypes bf16 f16 --meta-tma --size 4096 --iters 50
    ;;
tune-linear)  # the torch layer's own entries of the table (T >= 256, bf16), then the layer with and without them
    for w in 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 8192x8192 57344x8192 8192x28672; do
        [ "$SECONDS" -lt 200 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024 4096; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/linear-shapes.txt
        SPARSILE_AUTOTUNE_PRINT=1 run 100 python -m sparsile tune --linear /tmp/linear-shapes.txt --dtype bf16 \
            --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    done
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    for table in 0 1; do
        SPARSILE_TUNED_TABLE=$table run 80 python benchmarks/bench_linear.py --dtypes bf16 --tokens 256 1024 \
            --variants graph --l2 cold --max-seconds 70 --json "$out/linear_table$table.json"
    done
    ;;
e4m3-eager)  # the e4m3 record that quantizes x in its first launch: its GPU tests, host time, the layer at T <= 16
    run 40 python benchmarks/bench_layer_host.py --dtype e4m3 --shapes 8B_o 8B_gate_up 70B_down
    run 110 python -m pytest -q -m gpu -n 16 -rfE tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_linear_gpu.py \
        -k e4m3
    ;;
tma-store)  # the TMA-store epilogue kernels: GPU tests, then timed against the shipped kernels and cuSPARSELt
    run 120 python -m pytest -q -m gpu -rfE tests/gpu/test_sparse_gemm_sm90.py -k tma_store
    run 200 python benchmarks/gemm_variants.py --dtypes bf16 f16 --stages 4 --group-m 16 --tma-store
    ;;
check)  # the whole GPU suite, then the shipped table against the heuristics in the layer (8B qkv and o, back to back)
    run 330 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    for table in 0 1; do
        SPARSILE_TUNED_TABLE=$table run 60 python benchmarks/bench_linear.py --dtypes bf16 --shapes 8B:qkv 8B:o \
            --tokens 64 256 1024 --variants graph --l2 cold --json "$out/linear_table$table.json"
    done
    ;;
host-64)  # where the host time of an eager call at T = 64 goes (split-K plans of two launches)
    run 90 python benchmarks/bench_layer_host.py --tokens 64 --shapes 8B_qkv 8B_o 8B_gate_up 70B_down --profile 8B_o
    ;;
tune-prefill)  # the shipped table for T >= 256 (bf16, then f16), the tests of what reads it, and the layer at T 64-1024
    run 120 python -m pytest -q -m gpu -n 8 -rfE tests/gpu/test_torch_native_gpu.py tests/stdlib/test_linear_api.py
    # one weight shape per run (each run merges its entries into the table), until 330 s have passed
    for w in 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 8192x8192 57344x8192 8192x28672; do
        [ "$SECONDS" -lt 330 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024 4096 8192; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/prefill-shapes.txt
        SPARSILE_AUTOTUNE_PRINT=1 run 150 python -m sparsile tune /tmp/prefill-shapes.txt --dtype bf16 \
            --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
    done
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    run 150 python benchmarks/bench_linear.py --dtypes bf16 --tokens 64 256 1024 --variants graph --l2 cold \
        --max-seconds 130 --json "$out/linear_bf16_t64-1024.json"
    ;;
first)  # the whole suite at the current commit (the tenth session's unrun GPU tests among it), then the TMA-store
        # epilogue timed, then the e4m3 layer's targets with the quantizing record
    run 320 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 150 python benchmarks/gemm_variants.py --dtypes bf16 f16 --stages 4 --group-m 16 --tma-store
    run 100 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants graph --max-seconds 90 \
        --json "$out/linear_e4m3.json"
    ;;
pdl)  # programmatic dependent launch: the whole GPU suite (the launch paths changed), then the decode kernel with it
    run 300 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 200 python benchmarks/bench_pdl.py --tokens 1 16 64 --warmup 10 --rep 30 --max-seconds 150
    ;;
tune-e4m3)  # the PDL GPU test (its harness fixed), the decode table's e4m3 / f16 entries, the e4m3 layer with them
    run 90 python -m pytest -q -m gpu -rfE tests/stdlib/test_decode_api.py -k pdl
    run 230 python benchmarks/tune_decode.py --dtype e4m3 f16 --tokens 16 1 --shapes 4096x4096 6144x4096 \
        28672x4096 4096x14336 8192x8192 10240x8192 8192x28672 57344x8192 --max-seconds 200 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    run 60 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants graph --max-seconds 50 \
        --json "$out/linear_e4m3_tuned.json"
    run 50 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 4 --shapes 8B_o 8B_qkv --profile 8B_o
    run 80 python benchmarks/sweep_sparse_gemm.py --tuned-only --max-seconds 60
    ;;
unrun-11)  # the eleventh session's last changes (records replaced after an in-place weight write), then the
           # tuned tables' last 14 entries
    run 320 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 200 python benchmarks/sweep_sparse_gemm.py --tuned-only --skip 110 --max-seconds 180
    ;;
unrun-18)  # what the eighteenth session wrote after its GPU time: the whole suite (the array helpers moved out
          # of gemm.py, the widened one-launch rule, the deeper ring; run only in part on the GPU), then the
          # layer's T <= 16 table, bf16 and e4m3, twice
    run 420 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    for pass in a b; do
        run 60 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 50 \
            --json "$out/linear_t16_$pass.json"
    done
    ;;
qx-18b)  # the eighteenth session's rule and ring change: the one-launch and torch e4m3 GPU tests, the one
        # launch against two on the weights whose ring deepened, then the layer's T <= 16 e4m3 rows twice
    run 150 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/stdlib/test_decode_qx.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_linear_gpu.py -k "e4m3 or qx or one_launch"
    run 60 python benchmarks/bench_decode_qx.py --shapes 28672x4096 4096x14336 --tokens 1 4 --stages
    for pass in a b; do
        run 45 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants graph --max-seconds 35 \
            --json "$out/linear_e4m3_$pass.json"
    done
    ;;
qx-18)  # the eighteenth session's first look at the one-launch e4m3 decode: the capture test whose count
       # the qx eager launch changed, the one launch against two and its ring depth (graph replay from
       # HBM), then the layer's eager e4m3 calls with the one launch always / never / by the rule
    run 60 python -m pytest -q -m gpu -n 4 --timeout 50 -rfE tests/gpu/test_torch_linear_gpu.py -k capture_and_replay
    run 220 python benchmarks/bench_decode_qx.py --stages 4 8
    for mode in always never rule; do
        run 45 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants eager --eager-qx $mode \
            --max-seconds 35 --json "$out/linear_qx_$mode.json"
    done
    ;;
unrun-17)  # what the seventeenth session wrote after its GPU time: the whole suite (the one-launch e4m3 GPU
          # tests at T = 8-64 and 6144x4096 T = 4 among them), then the layer's T <= 16 table, bf16 and e4m3,
          # twice (this host's eager times move by several µs between runs), then an eager e4m3 call's host time
    run 420 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 60 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 50 \
        --json "$out/linear_t16_a.json"
    run 60 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 50 \
        --json "$out/linear_t16_b.json"
    run 60 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 1 --shapes 8B_qkv 8B_o 70B_o
    ;;
qx-17)  # the seventeenth session's one GPU call left: the e4m3 eager call in one launch (the kernel quantizes x),
       # its torch GPU tests, then the layer at T = 1 and 4 (bf16: the fast path's trims; e4m3: one launch)
    run 110 python -m pytest -q -m gpu -n 8 --timeout 100 -rfE tests/gpu/test_torch_native_gpu.py -k "e4m3 or last_call"
    run 120 python benchmarks/bench_linear.py --dtypes e4m3 bf16 --shapes 8B 70B:o --tokens 1 4 --variants graph \
        --max-seconds 100 --json "$out/linear_qx.json"
    ;;
final-16)  # the sixteenth session's last GPU call: the whole suite (the fast path and its review fixes, the
           # untabled heuristic's 64-row slabs up to T = 16), then the heuristic where the T rule changed it
    run 500 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 60 python benchmarks/bench_decode_heuristic.py --shapes 5120x13824 3584x18944 6144x4096 --tokens 32 64
    ;;
heuristic-bm)  # the untabled decode heuristic's 64-row slabs (sixteenth session): the decode, linear and torch GPU
              # tests, the heuristic against 128-row slabs off the table (Qwen2.5 shapes, Llama-3-8B at T = 64),
              # then the model's tokens/s in graph mode at batch 16 (the issue's unmet row)
    run 270 python -m pytest -q -m gpu -n 12 --timeout 150 -rfE tests/stdlib/test_decode_api.py \
        tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_linear_gpu.py tests/stdlib/test_linear_api.py
    run 100 python benchmarks/bench_decode_heuristic.py --tokens 1 16 64
    run 60 python benchmarks/bench_decode_heuristic.py --shapes 4096x4096 6144x4096 4096x14336 28672x4096 --tokens 32 64
    run 200 python benchmarks/bench_llama.py --layers 32 --modes graph --batches 16 --models dense sparsile \
        sparsile-fused --repeats 2 --check-tokens 0 --json "$out/llama-graph16.json"
    ;;
fast-path)  # the eager call's fast path (a layer's last call, sixteenth session): the torch GPU tests, where the
           # host time goes now (bf16 T = 1, e4m3 T = 4), then the issue's T <= 16 table, bf16 and e4m3
    run 240 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_linear_gpu.py
    run 60 python benchmarks/bench_layer_host.py --tokens 1 --shapes 8B_qkv 8B_o 70B_o --profile 8B_qkv
    run 60 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 4 --shapes 8B_qkv 8B_o 70B_o
    run 100 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 90 \
        --json "$out/linear_t16.json"
    ;;
host-16)  # where the host time of an eager call goes at T <= 16 (sixteenth session): bf16 T = 1, e4m3 T = 4 and 1
    run 60 python benchmarks/bench_layer_host.py --tokens 1 --shapes 8B_qkv 8B_o 70B_o --profile 8B_qkv
    run 60 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 4 --shapes 8B_qkv 8B_o 70B_o --profile 8B_qkv
    run 60 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 1 --shapes 8B_qkv 8B_o 70B_o
    ;;
unrun-15)  # what the fifteenth session wrote after its GPU time: the whole suite (the sweep check of 64-row
          # entries, the PTX-level SP0370 check, metadata padded to 128-row slabs), then the e4m3 decode table
          # re-tuned with 64-row slabs, then the layer's graph target at T <= 16, bf16 and e4m3 in one table
    run 420 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 150 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 4096x14336 8192x8192 10240x8192 \
        8192x28672 --tokens 16 1 --dtype e4m3 --max-seconds 130 -v -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/decode-h200.json"
    run 90 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 80 \
        --json "$out/linear_t16.json"
    ;;
inflight)  # one sparse MMA group in flight (INFLIGHT=1, fifteenth session): GPU tests, then timed against the
          # default kernels and cuSPARSELt; the 64-row decode slabs' GPU tests; where an eager e4m3 call's host time goes
    run 150 python -m pytest -q -m gpu -n 8 -rfE tests/gpu/test_sparse_gemm_sm90.py -k "inflight or INFLIGHT"
    run 120 python -m pytest -q -m gpu -n 8 -rfE tests/stdlib/test_decode_api.py -k 64_row
    run 150 python benchmarks/gemm_variants.py --dtypes bf16 f16 --stages 4 --group-m 16 --inflight
    run 60 python benchmarks/gemm_variants.py --dtypes bf16 --size 4096 --stages 4 --group-m 16 --inflight
    SPARSILE_PTXAS="$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)" run 100 \
        python benchmarks/gemm_variants.py --dtypes bf16 --stages 4 --group-m 16 --inflight --pingpong
    run 60 python benchmarks/bench_layer_host.py --dtype e4m3 --tokens 4 --shapes 8B_o 70B_qkv 70B_o
    ;;
decode-bm64)  # the decode kernel's 64-row slabs (fifteenth session): GPU tests, the bf16 table re-tuned with them
             # for the weights of fewer 128-row slabs than SMs (T 16 and 1), then the layer's graph target
    run 150 python -m pytest -q -m gpu -n 8 -rfE tests/stdlib/test_decode_api.py tests/stdlib/test_decode_tuning.py
    cp stdlib/kernels/tuned/decode-h200.json /tmp/decode-before.json
    run 200 python benchmarks/tune_decode.py --shapes 6144x4096 4096x4096 1024x4096 4096x14336 8192x8192 \
        10240x8192 8192x28672 14336x4096 --tokens 16 1 --dtype bf16 --max-seconds 170 -v \
        -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/decode-h200.json"
    run 70 python benchmarks/bench_linear.py --dtypes bf16 --tokens 1 4 16 --variants graph --max-seconds 60 \
        --json "$out/linear_t16_bf16.json"
    ;;
unrun-14)  # the fourteenth session's deferred epilogue loads (03e1b4c): the whole suite (it ran out of time there),
          # the e4m3 layer at prefill T (quantizer + kernel, now without the per-token-scale spill), and the
          # graph target at T <= 16 (the decode kernel's epilogue is reordered too), bf16 and e4m3
    run 520 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 70 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --shapes 8B:qkv 8B:o --tokens 256 1024 \
        --variants graph --l2 cold --max-seconds 60 --json "$out/linear_prefill.json"
    run 80 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 70 \
        --json "$out/linear_t16.json"
    ;;
profile-linear)  # where the layer's kernel loses to sparse_matmul at prefill T: epilogue and transposed store
                # against the plain GEMM (bf16 and e4m3, 8B o and qkv), timed; the staged epilogue (STAGE_Y)
                # checked and timed; then under Nsight Compute
    run 150 python -m pytest -q -m gpu -n 8 -rfE tests/stdlib/test_linear_api.py tests/backend/test_smem_access.py
    for table in 1 0; do  # the shipped configs, then both contenders on the same heuristic config
        SPARSILE_TUNED_TABLE=$table run 90 python benchmarks/bench_linear_epilogue.py --shapes o qkv --tokens 256 1024
    done
    # the epilogue staged through shared memory (STAGE_Y), first against float64 on the GPU, then timed
    SPARSILE_LINEAR_STAGE_Y=1 run 90 python benchmarks/bench_linear_epilogue.py --shapes o qkv --tokens 256 1024
    for stage in 0 1; do
        SPARSILE_LINEAR_STAGE_Y=$stage run 70 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --shapes 8B:qkv 8B:o \
            --tokens 256 1024 --variants graph --l2 cold --max-seconds 60 --json "$out/linear_stage_y$stage.json"
    done
    SPARSILE_TUNED_TABLE=0 run 200 ncu --profile-from-start off --kernel-name regex:"sparse_(linear|gemm)_(bf16|e4m3)" \
        --section SpeedOfLight --metrics smsp__inst_executed_op_global_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum \
        python benchmarks/bench_linear_epilogue.py --shapes o --tokens 1024 --profile-once
    ;;
graph-t16)  # the layer's graph target in one table (bf16 and e4m3, T 1-16, eight shapes), then the next sparse_matmul
           # f16/e4m3 table entries against float64
    run 80 python benchmarks/bench_linear.py --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph --max-seconds 70 \
        --json "$out/linear_t16.json"
    run 130 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype f16 --dtype e4m3 --skip 54 \
        --max-seconds 110
    ;;
unrun-13)  # the thirteenth session: the whole suite (axis analysis of loops that yield nothing, one load per
          # repeated element, the one-pass quantizer, capture ids), then the e4m3 layer at decode and prefill T
    run 330 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 100 python benchmarks/bench_linear.py --dtypes e4m3 --tokens 1 4 16 --variants graph --max-seconds 90 \
        --json "$out/linear_e4m3.json"
    run 70 python benchmarks/bench_linear.py --dtypes e4m3 --shapes 8B:qkv 8B:o --tokens 256 512 1024 \
        --variants graph --l2 cold --max-seconds 60 --json "$out/linear_e4m3_prefill.json"
    ;;
unrun-12b)  # what the twelfth session left unrun: the whole suite, the last 5 f16/e4m3 entries, the f16 and e4m3 layer with them
    run 330 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    run 120 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind linear --dtype f16 --dtype e4m3 --skip 59
    for table in 0 1; do
        SPARSILE_TUNED_TABLE=$table run 90 python benchmarks/bench_linear.py --dtypes f16 e4m3 --shapes 8B:qkv 8B:o \
            --tokens 256 512 1024 --variants graph --l2 cold --max-seconds 80 --json "$out/linear_f16_e4m3_table$table.json"
    done
    ;;
tune-gemm-f16-e4m3)  # sparse_matmul's f16 and e4m3 entries (T 256-8192, 8B weights first), then checked against float64
    for w in 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 8192x8192 57344x8192 8192x28672; do
        [ "$SECONDS" -lt 300 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024 4096 8192; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/gemm-shapes.txt
        SPARSILE_AUTOTUNE_PRINT=1 run 150 python -m sparsile tune /tmp/gemm-shapes.txt --dtype f16 --dtype e4m3 \
            --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
        cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    done
    run 200 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind gemm --dtype f16 --dtype e4m3 --max-seconds 170
    ;;
tune-linear-f16-e4m3)  # the layer's f16 and e4m3 entries (T >= 256), 8B weights first, then checked against float64
    for w in 6144x4096 4096x4096 28672x4096 4096x14336 10240x8192 8192x8192 57344x8192 8192x28672; do
        [ "$SECONDS" -lt 220 ] || { echo "=== tuning stopped before $w (time)" | tee -a "$log"; break; }
        for t in 256 512 1024 4096; do echo "${w%x*}x${t}x${w#*x}"; done > /tmp/linear-shapes.txt
        SPARSILE_AUTOTUNE_PRINT=1 run 120 python -m sparsile tune --linear /tmp/linear-shapes.txt --dtype f16 \
            --dtype e4m3 --warmup 3 --rep 10 -o stdlib/kernels/tuned/h200.json
        cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    done
    run 140 python benchmarks/sweep_sparse_gemm.py --tuned-only --kind linear --dtype f16 --dtype e4m3 \
        --max-seconds 100
    ;;
unrun-12)  # the twelfth session's padded copies refreshed in place: the torch GPU tests
    run 300 python -m pytest -q -m gpu -n 8 --timeout 150 -rfE tests/gpu/test_torch_native_gpu.py \
        tests/gpu/test_torch_linear_gpu.py tests/gpu/test_torch_training_gpu.py
    ;;
pdl-e4m3)  # the quantizer lets the PDL GEMM start at once: e4m3 and bf16 layers in graphs, PDL off then on; fused-b1
    for p in 0 1; do
        SPARSILE_PDL=$p run 60 python benchmarks/bench_linear.py --dtypes e4m3 bf16 --shapes 8B:qkv 8B:o 8B:down \
            --tokens 1 4 16 --variants graph --max-seconds 50 --json "$out/linear_pdl$p.json"
    done
    run 150 python -m pytest -q -m gpu -n 8 -rfE tests/gpu/test_torch_native_gpu.py tests/gpu/test_torch_linear_gpu.py \
        -k "pdl or e4m3"
    run 240 python benchmarks/bench_llama.py --layers 32 --modes compile --models dense sparsile-fused \
        --batches 1 --check-tokens 0 --repeats 2 --json "$out/llama-compile-b1-fused.json"
    ;;
pdl-layer)  # the layer's graph and eager targets with PDL, the tuned tables checked, the model in graph mode
    run 90 python benchmarks/bench_linear.py --dtypes bf16 --tokens 1 4 16 64 --variants graph --max-seconds 80 \
        --json "$out/linear_bf16_pdl.json"
    run 110 python benchmarks/sweep_sparse_gemm.py --tuned-only --max-seconds 75
    run 300 python benchmarks/bench_llama.py --layers 32 --modes graph --models dense sparsile sparsile-fused \
        --check-tokens 0 --json "$out/llama-graph-pdl.json"
    ;;
fused-b1)  # the one model number the ninth session could not finish (about 4 minutes)
    run 240 python benchmarks/bench_llama.py --layers 32 --modes compile --models dense sparsile-fused \
        --batches 1 --check-tokens 0 --repeats 2 --json "$out/llama-compile-b1-fused.json"
    ;;
second)  # issue 13: the GEMM grid (bf16, the tuned table's prefill T) and 8192^3 against tuned cuSPARSELt
    run 330 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes 8B 70B --tokens 256 1024 --dtypes bf16 \
        --iters 10 --case-timeout 60 --json "$out/gemm-llama-bf16.json"
    run 120 python benchmarks/bench_sparse_gemm.py --case bf16:8192x8192x8192 --case f16:8192x8192x8192 --iters 10 \
        --case-timeout 60 --json "$out/gemm-8192.json"
    ;;
pingpong)  # the ping-pong schedule of the sparse GEMM (measured 0.78x the default kernel in the eighth session)
    export SPARSILE_PTXAS="${SPARSILE_PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}"
    run 150 python -m pytest -q -m gpu -rfE tests/gpu/test_sparse_gemm_sm90.py -k pingpong
    run 200 python benchmarks/bench_sparse_gemm.py --schedule pingpong --case bf16:8192x8192x8192 \
        --case f16:8192x8192x8192 --pingpong-config 64x256x64x5 --pingpong-config 128x128x128x4 \
        --pingpong-config 128x128x64x8 --json "$out/pingpong-8192.json"
    ;;
tests-all)  # the whole GPU suite (~990 tests): 520 s did not finish it on an H100 (thirty-ninth session); the two
            # halves below fit one call each
    run 520 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests
    ;;
tests-torch)  # the torch and JAX GPU files (~390 tests; about 150 s at -n 8)
    run 400 python -m pytest -q -m gpu -n 12 --timeout 150 -rfE tests/gpu/test_torch_*.py tests/gpu/test_jax_gpu.py
    ;;
tests-rest-a)  # tests-rest in two calls (a57: 560 s ran 1067 of its ~1130 tests on an H100): the files under tests/gpu
    run 560 python -m pytest -q -m gpu -n 16 --dist worksteal --timeout 150 -rfE --junitxml="$out/junit-rest-a.xml" tests/gpu \
        --deselect tests/gpu/test_jax_gpu.py $(for f in tests/gpu/test_torch_*.py; do echo --deselect "$f"; done)
    ;;
tests-rest-b)  # (a58, H100, limit 360 s: 292 of 295 ran, the rest of test_decode_api.py, which --dist loadfile gave one
              # worker, was cut; worksteal spreads a file's tests) the other half: GPU tests under tests/stdlib, tests/backend, tests/frontend and the top level
    run 560 python -m pytest -q -m gpu -n 16 --dist worksteal --timeout 150 -rfE --junitxml="$out/junit-rest-b.xml" \
        tests/stdlib tests/backend tests/frontend tests/test_demo.py tests/test_sweep_tuned.py
    ;;
tests-rest)  # every other GPU test (~1130 tests: no longer fits one call; tests-rest-a and -b do)
    run 540 python -m pytest -q -m gpu -n 16 --timeout 150 -rfE tests \
        --deselect tests/gpu/test_jax_gpu.py $(for f in tests/gpu/test_torch_*.py; do echo --deselect "$f"; done)
    ;;
tests-launch)
    run 300 python -m pytest -q -x -m gpu tests/backend/test_prepared_gpu.py tests/backend/test_runtime_gpu.py \
        tests/backend/test_host_staging.py tests/gpu/test_core_gpu.py tests/frontend/test_captures.py || exit 1
    run 240 python -m pytest -q -m gpu tests/gpu/test_sparse_gemm_sm90.py tests/stdlib/test_gemm_api.py
    ;;
tests-kernels)
    run 560 python -m pytest -q -m gpu tests/gpu/test_mma_sp_gpu.py tests/gpu/test_cluster_gpu.py \
        tests/gpu/test_sparse_gemm_tile.py tests/gpu/test_wgmma_register_a.py tests/gpu/test_autotune_gpu.py \
        tests/stdlib tests/frontend tests/backend
    ;;
bench-layer)
    run 120 python benchmarks/bench_launch.py
    run 420 python benchmarks/bench_linear.py --dtypes bf16 --quick --max-seconds 300 --json "$out/linear_bf16.json"
    ;;
bench-llama)
    run 420 python benchmarks/bench_llama.py --layers 32 --modes graph compile --json "$out/llama.json"
    SPARSILE_DECODE_REDUCE=kernel run 200 python benchmarks/bench_llama.py --layers 32 --json "$out/llama-reduce.json"
    run 120 python examples/llama_sparse.py --layers 4
    ;;
bench-kernels)
    run 200 python benchmarks/bench_decode.py
    SPARSILE_DECODE_REDUCE=kernel run 150 python benchmarks/bench_decode.py --quick  # split-K reduced in the kernel
    run 120 python benchmarks/bench_sparsity_gpu.py
    run 120 python benchmarks/bench_linear_epilogue.py --quick
    run 100 python benchmarks/bench_gemm_out_dtype.py
    ;;
bench-rest)
    run 200 python benchmarks/bench_linear.py --dtypes e4m3 --shapes 8B --max-seconds 150 --json "$out/linear_e4m3.json"
    run 150 python benchmarks/bench_training.py --json "$out/training.json"
    run 120 python benchmarks/bench_jax.py --quick
    ;;
bench-gemm-8B|bench-gemm-70B)
    model="${part#bench-gemm-}"
    run 560 python benchmarks/bench_sparse_gemm.py --grid llama3 --shapes "$model" --iters 10 --case-timeout 60 \
        --json "$out/gemm-$model.json"
    python benchmarks/plot_gemm.py "$out"/gemm-*.json --out "$out" 2>&1 | tee -a "$log"
    ;;
tune)
    sed -n 3,38p stdlib/kernels/tuned/llama3-shapes.txt > /tmp/llama3-8b-shapes.txt
    run 560 python -m sparsile tune /tmp/llama3-8b-shapes.txt --dtype bf16 --dtype f16 --warmup 3 --rep 10 \
        -o stdlib/kernels/tuned/h200.json
    cp stdlib/kernels/tuned/h200.json "$out/" 2>/dev/null
    ;;
tune-decode-h100)  # (not run yet) the decode table for the H100, where none ships (decode-h200.json's entries name the
                  # H200: on an H100 the decode kernel takes its heuristics, and c48's graph rows 8B o bf16 T = 4 / 16
                  # were 1.38x / 1.32x dense against >= 1.5x on the H200). Llama-3-8B shapes first (the misses), then
                  # the layer's T <= 16 rows again with the new table. Copy the table out of $OUT into
                  # stdlib/kernels/tuned/ afterwards (its name follows the GPU's: decode-h100-80gb-hbm3.json).
    table=stdlib/kernels/tuned/decode-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/ /-/g').json
    run 300 python benchmarks/tune_decode.py --shapes 4096x4096 6144x4096 28672x4096 4096x14336 --tokens 16 4 1 \
        --dtype bf16 e4m3 --max-seconds 280 -v -o "$table"
    cp "$table" "$out/" 2>/dev/null
    run 200 python benchmarks/bench_linear.py --shapes 8B --dtypes bf16 e4m3 --tokens 1 4 16 --variants graph \
        --passes 2 --json "$out/linear-h100-table.json"
    ;;
tune-decode)  # the decode kernel's table (split-K, STAGES, reduction) for the Llama-3-8B shapes, ~2 minutes
    run 200 python benchmarks/tune_decode.py --max-seconds 150 -v -o stdlib/kernels/tuned/decode-h200.json
    cp stdlib/kernels/tuned/decode-h200.json "$out/" 2>/dev/null
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
