"""GPU diagnostic of the cudaMallocAsync capture-thread scenario (tests/gpu/test_capture_threads_gpu.py,
``_MALLOC_ASYNC``, mode "relaxed", who "sparsile"): which step frees what, seen from sparsile's side.

    python scripts/diag_capture_free.py            # every variant, each in a fresh process
    python scripts/diag_capture_free.py base keep  # the named variants only

Variants (each a subprocess under ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``):

* ``base``: the failing scenario: eager call, capture of graph g, ``del g``, thread B captures (relaxed) on
  torch.cuda.graph's shared capture stream, this thread's eager call on a side stream meanwhile, B replays;
* ``keep``: g kept alive (the lead's passing control);
* ``noeager``: no sparsile call during B's capture (does B fail without step 3 at all?);
* ``notie``: the capture's record is never tied to g (graph_life.tie refused): it is never released, so
  nothing of it can be freed anywhere; if this still fails, the fault is not a sparsile free;
* ``native``: the native allocator (the lead's passing control).

Each prints, with the thread and whether B's stream captures at that moment: the capture streams noted
(capture_mode), every driver answer about them, every may_drop_records verdict, every RecordCache.release
(with its caller), when g's record is collected, and B's result. torch's own warnings ("Attempting
uncaptured free of a captured allocation", "freeAsync() ... during graph capture") go to stderr, printed
after each run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

VARIANTS = ("base", "keep", "noeager", "notie", "native")

SCRIPT = textwrap.dedent('''
    import gc, sys, threading, traceback, weakref
    import torch
    variant = sys.argv[1]
    import sparsile.torch as spt
    from cuda.bindings import driver
    from sparsile.backend.runtime import capture_mode
    from sparsile.integrations.torch import graph_life
    from sparsile.integrations.torch.record_cache import RecordCache
    from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

    def b_capturing():
        s = torch.cuda.graph.default_capture_stream
        return None if s is None else driver.cuStreamIsCapturing(driver.CUstream(s.cuda_stream))

    def say(*args):
        print(f"[{threading.current_thread().name}] B:{b_capturing()}", *args, flush=True)

    answer = capture_mode._IS_CAPTURING
    def asked(stream):
        got = answer(stream)
        say("cuStreamIsCapturing", hex(stream), "->", got)
        return got
    capture_mode._IS_CAPTURING = asked
    verdict = graph_life.may_drop_records
    def may_drop(in_capture):
        got = verdict(in_capture)
        noted = {hex(k): v for k, v in capture_mode._capture_streams.items()}
        say("may_drop_records", in_capture, "->", got, "noted", noted)
        return got
    graph_life.may_drop_records = may_drop
    release = RecordCache.release
    def released(self, record):
        say("RecordCache.release", record.key, "from", traceback.format_stack(limit=6)[:-1])
        return release(self, record)
    RecordCache.release = released
    if variant == "notie":
        graph_life.tie = lambda cache, record, stream: False

    print("backend", torch.cuda.get_allocator_backend(), "torch", torch.__version__, flush=True)
    x = torch.randn(8, 512, device="cuda").to(torch.bfloat16)
    layer = spt.SparseLinear.from_dense(linear(256, 512, seed=9, device="cuda"), "bf16")
    cache = layer.__dict__["_records"]
    layer(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        layer(x)
    cap = torch.cuda.graph.default_capture_stream
    say("capture stream", hex(cap.cuda_stream), "stream_id", cap.stream_id, "noted",
        {hex(k): v for k, v in capture_mode._capture_streams.items()})
    say("records", list(cache.records), "tied", len(cache.tied), "untied", cache.untied)
    own = [r for k, r in cache.records.items() if isinstance(k[-1], tuple)]
    if own:
        weakref.finalize(own[0], say, "g's record collected")
    del own
    if variant != "keep":
        del g
    gc.collect()
    torch.cuda.synchronize()
    say("after del/gc: released", graph_life.released())
    xa = torch.randn(64, 128, device="cuda")
    began, done, result = threading.Event(), threading.Event(), {}
    def capture():
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="relaxed"):
                ya = torch.tanh(xa) * 3 + xa
                began.set()
                assert done.wait(60)
            say("B ended its capture")
            ya.fill_(float("nan")); graph.replay(); torch.cuda.synchronize()
            result["ya"] = ya.clone()
        except BaseException as exc:
            result["error"] = exc; began.set()
    side = torch.cuda.Stream()
    while side.cuda_stream == cap.cuda_stream:
        side = torch.cuda.Stream()
    t = threading.Thread(target=capture, name="B"); t.start()
    assert began.wait(60)
    if variant != "noeager":
        say("step 3: eager call on the side stream")
        with torch.cuda.stream(side):
            y = layer(x)
        side.synchronize()
        say("step 3 done: records", list(cache.records), "tied", len(cache.tied))
    done.set(); t.join(60)
    print("B RESULT", repr(result.get("error", "ok")), flush=True)
''')


def main(argv: list[str]) -> int:
    failed = 0
    for variant in argv or VARIANTS:
        env = dict(os.environ)
        if variant != "native":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        done = subprocess.run([sys.executable, "-c", SCRIPT, variant], env=env, capture_output=True, text=True,
                              timeout=300)
        print(f"===== {variant}: exit {done.returncode}")
        print(done.stdout)
        print("----- stderr (last 3000 characters)")
        print(done.stderr[-3000:])
        failed += "B RESULT 'ok'" not in done.stdout
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
