"""Compiling from several threads and in worker processes (driver/compiler.py's ``compile_cached``,
driver/compile_pool.py): one key compiled by two threads at once is compiled once, and
specializations compiled by worker processes are read back from the disk cache as hits, with the
PTX the parent would have compiled itself."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver import cache as cache_mod
from sparsile.driver import compile_pool, compiler
from sparsile.driver.compile_pool import Specialization, compile_specializations
from sparsile.target.targets import get_target
from sparsile.tests.support import cache_fixture

VECTOR_ADD = Path(sp.__file__).resolve().parent / "examples" / "vector_add.spk"


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """The kernels compile_function compiled (a spy that takes its time, so that two threads
    asking for one kernel are both inside compile_cached before either has stored it)."""
    return cache_fixture.spy_compiles(monkeypatch, delay=0.3)


def _arrays(n: int = 64) -> tuple[np.ndarray, ...]:
    return tuple(np.zeros(n, np.float32) for _ in range(3))


def test_two_threads_compiling_one_key_compile_it_once(fresh_cache, compiles) -> None:
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    barrier = threading.Barrier(2)
    results: list = [None, None]

    def compile_it(i: int) -> None:
        barrier.wait()
        results[i] = kernel[(1,)].compile_for("sm_90a", x, y, out, 64, BLOCK=64)

    threads = [threading.Thread(target=compile_it, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiles == ["vector_add"]  # the second thread waited for the first one's entry
    assert results[0].ptx == results[1].ptx and results[0].cubin == results[1].cubin
    assert fresh_cache.stats.misses == 2 and fresh_cache.stats.disk_writes == 1


def test_threads_compiling_different_keys_compile_each(fresh_cache, compiles) -> None:
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128, 256)]
    compile_pool._in_threads(specs, "sm_90a", 3)
    assert sorted(compiles) == ["vector_add"] * 3
    assert fresh_cache.stats.disk_writes == 3


def test_worker_processes_fill_the_disk_cache(fresh_cache, compiles) -> None:
    """Two worker processes compile three specializations; the parent reads each back from the disk
    cache (no compile of its own) and gets the PTX it compiles itself without the cache."""
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128, 256)]
    assert all(spec.portable() is not None for spec in specs)
    taken = compile_specializations(specs, "sm_90a", jobs=2)
    assert len(taken) == 3 and all(t > 0 for t in taken)
    assert compiles == []  # every one compiled by a worker
    assert fresh_cache.stats.disk_hits == 3 and fresh_cache.stats.misses == 0
    assert all(spec.cached("sm_90a") for spec in specs)
    for spec in specs:
        own = compiler.compile_function(kernel.fresh_ir(spec.bindings, spec.options), get_target("sm_90a"),
                                        stop_after="ptx")
        assert spec.compile("sm_90a").ptx == own.ptx


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("targets", [["sm_90a"], ["sm_90a", "sm_90a", "sm_100a"], []])
def test_a_target_list_of_another_length_than_the_specs_is_refused(fresh_cache, compiles, jobs, targets) -> None:
    """One target per specialization, or one name for all: a list of another length compiled some
    specializations for no target (threads), or raised zip's message (one job), before anything was said."""
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
    with pytest.raises(ValueError, match=rf"2 specializations but {len(targets)} target"):
        compile_specializations(specs, targets, jobs=jobs)
    with pytest.raises(ValueError, match=rf"2 specializations but {len(targets)} target"):
        compile_pool._in_threads(specs, targets, jobs)
    assert compiles == [] and fresh_cache.stats.disk_writes == 0  # (refused before any compile)


def test_without_a_disk_cache_the_parent_compiles(monkeypatch, compiles) -> None:
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, "off")
    cache_mod.reset_default_cache()
    try:
        assert not cache_mod.default_cache().disk_enabled
        kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
        x, y, out = _arrays()
        specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
        compile_specializations(specs, "sm_90a", jobs=2)
        assert sorted(compiles) == ["vector_add"] * 2  # in threads of this process
    finally:
        cache_mod.reset_default_cache()


def test_a_worker_that_dies_leaves_its_compiles_to_the_parent(fresh_cache, compiles, monkeypatch) -> None:
    """Workers that exit at once (a crash in LLVM, a broken installation): the parent compiles every
    specialization itself, and no feeding thread dies with an exception."""
    failures: list = []
    monkeypatch.setattr(threading, "excepthook", lambda info: failures.append(info.exc_type))
    monkeypatch.setattr(compile_pool, "_WORKER", "import sys; sys.exit(3)")

    def send(stream, obj):  # the pipe of a worker that is gone (whether the write fails is a race)
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(compile_pool, "_send", send)
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128, 256)]
    compile_specializations(specs, "sm_90a", jobs=2)
    assert sorted(compiles) == ["vector_add"] * 3 and failures == []


def _compiles_within(specs: list[Specialization], seconds: float) -> bool:
    """Whether ``compile_specializations(specs, "sm_90a", jobs=2)`` returns within ``seconds``."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(compile_specializations(specs, "sm_90a", jobs=2)),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(done)


PRINTING_ADD = '''
@kernel
def printing_add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 64):
    static_print(BLOCK)
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
'''


def test_a_kernel_that_prints_while_compiling_does_not_break_the_workers(fresh_cache, compiles, tmp_path,
                                                                         monkeypatch) -> None:
    """``static_print`` writes to a worker's standard output, which must not be the pipe of its
    replies: the parent read "64\\n" and the reply's first bytes as a reply's length and waited for
    ever (a longer text: a MemoryError that killed the feeding thread)."""
    failures: list = []
    monkeypatch.setattr(threading, "excepthook", lambda info: failures.append(info.exc_type))
    source = tmp_path / "printing_add.spk"
    source.write_text(PRINTING_ADD)
    kernel = sp.load(source).kernels["printing_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
    assert all(spec.portable() is not None for spec in specs)
    assert _compiles_within(specs, 120), "compile_specializations hung"
    assert compiles == [] and fresh_cache.stats.disk_hits == 2 and failures == []  # the workers compiled both


def test_a_worker_that_replies_garbage_leaves_its_compiles_to_the_parent(fresh_cache, compiles, monkeypatch) -> None:
    """A reply that is not one (a worker writing to its reply pipe what it should not): the parent
    neither waits for ever for the length the garbage names nor loses a thread to an exception."""
    failures: list = []
    monkeypatch.setattr(threading, "excepthook", lambda info: failures.append(info.exc_type))
    for garbage in (b"\xff" * 8, b"64\n\x15\x00\x00\x00\x00"):
        worker = f"import sys; sys.stdin.buffer.read(8); sys.stdout.buffer.write({garbage!r}); sys.stdout.flush()"
        monkeypatch.setattr(compile_pool, "_WORKER", worker + "; sys.stdin.buffer.read()")
        kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
        x, y, out = _arrays()
        specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
        assert _compiles_within(specs, 60), f"compile_specializations hung on {garbage!r}"
        cache_mod.reset_default_cache()
    assert sorted(compiles) == ["vector_add"] * 2 and failures == []


def test_workers_import_the_parents_sparsile_not_one_in_the_working_folder(fresh_cache, compiles, tmp_path,
                                                                              monkeypatch) -> None:
    """``python -c`` puts the working folder first on a worker's sys.path: a ``sparsile`` folder
    there (another checkout, a stub) was imported instead of the parent's package, so every worker
    failed (or wrote entries under another compiler version) and the parent compiled everything."""
    other = tmp_path / "cwd" / "sparsile"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise ImportError('not the parent sparsile')\n")
    monkeypatch.chdir(other.parent)
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
    compile_specializations(specs, "sm_90a", jobs=2)
    assert compiles == [] and fresh_cache.stats.disk_hits == 2  # compiled by the workers


def test_the_workers_pipes_are_closed(fresh_cache, compiles) -> None:
    """Each worker's reply pipe is closed once it is done (it was left to the garbage collector:
    a ResourceWarning per worker)."""
    import gc
    import warnings

    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        compile_specializations(specs, "sm_90a", jobs=2)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


HANG_TIMEOUT = 8.0
"""The timeout of the hang tests: long enough for the compiles that do not hang on a loaded 2-core CI machine
(at 1 s a vector_add compile, slow under load, was named hung beside the one that was)."""

HANGING_WORKER = '''
from sparsile.driver import compile_pool
real = compile_pool.compile_cached
def hang_on_block_128(kernel, bindings, key, target, options):
    if getattr(bindings.get("BLOCK"), "value", None) == 128:
        import time
        time.sleep(3600)
    return real(kernel, bindings, key, target, options)
compile_pool.compile_cached = hang_on_block_128
compile_pool.worker_main()
'''


def test_a_worker_that_hangs_is_killed_and_named(fresh_cache, compiles, monkeypatch) -> None:
    """A worker that never replies (here: one compile that sleeps for an hour) is killed after
    ``timeout`` seconds of that compile; the other workers' compiles are kept (read back from the disk
    cache), the hung one is not compiled again here (it would hang here too), and CompileTimeout
    names it. Before: the parent waited for the reply for ever."""
    monkeypatch.setattr(compile_pool, "_WORKER", HANGING_WORKER)
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128, 256)]
    raised: list = []

    def run() -> None:
        try:
            compile_specializations(specs, "sm_90a", jobs=2, timeout=HANG_TIMEOUT)
        except compile_pool.CompileTimeout as e:
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "compile_specializations hung"
    assert len(raised) == 1 and [spec for spec, _ in raised[0].hung] == [specs[1]]
    assert raised[0].hung[0][1] == "sm_90a" and raised[0].timeout == HANG_TIMEOUT
    assert "`vector_add` for sm_90a" in str(raised[0])
    assert compiles == []  # the others compiled by the workers, the hung one by none
    assert specs[0].cached("sm_90a") and specs[2].cached("sm_90a") and not specs[1].cached("sm_90a")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_compile_in_this_process_that_runs_past_the_timeout_is_named(fresh_cache, compiles, monkeypatch,
                                                                         jobs: int) -> None:
    """``jobs=1`` (and, with jobs=2, a kernel no worker can load: here a non-portable one) compiles in
    this process, where ``timeout`` was ignored: a hung compile hung the caller. Each now runs in a
    thread of its own; the one still running after ``timeout`` seconds is left behind and
    CompileTimeout names it, the others compiled."""
    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128, 256)]
    release = threading.Event()
    real = Specialization.compile

    def compile_or_hang(self: Specialization, target: str) -> object:
        if ("BLOCK", "c", ("int", 128)) in self.key:
            release.wait()  # "hangs" until the test ends (its finally: a bounded wait compiled it on a loaded machine)
            # and then compiles nothing: a compile here, after the test, stored this key in whatever default cache
            # was current, the next test's fresh one (jobs=2 found specs[1] cached: once in CI, under load)
            raise RuntimeError("the test that hung this compile has ended")
        return real(self, target)

    monkeypatch.setattr(Specialization, "compile", compile_or_hang)
    monkeypatch.setattr(Specialization, "portable", lambda self: None)  # (jobs=2: compiled here, in threads)
    raised: list = []

    def run() -> None:
        try:
            compile_specializations(specs, "sm_90a", jobs=jobs, timeout=HANG_TIMEOUT)
        except compile_pool.CompileTimeout as e:
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    try:
        assert not thread.is_alive(), "compile_specializations ignored the timeout"
        assert len(raised) == 1 and [spec for spec, _ in raised[0].hung] == [specs[1]]
        assert raised[0].timeout == HANG_TIMEOUT and "`vector_add` for sm_90a" in str(raised[0])
        assert specs[0].cached("sm_90a") and specs[2].cached("sm_90a") and not specs[1].cached("sm_90a")
    finally:
        release.set()


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_a_compile_in_this_process_sees_the_callers_dump_context(fresh_cache, timeout: float | None) -> None:
    """``with sparsile dumping(...)`` (a context variable) around ``compile_specializations(jobs=1)``
    dumps each compile with or without a ``timeout``: the timeout's thread ran the compile without the
    caller's context (no dump, and a cached entry instead of the fresh compile a dump needs)."""
    import io

    from sparsile.frontend.dump import dumping

    kernel = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y, out = _arrays()
    specs = [Specialization.of_launch(kernel, (x, y, out, 64), {"BLOCK": block}) for block in (64, 128)]
    compile_specializations(specs[:1], "sm_90a", jobs=1)  # cached: only a fresh compile dumps it
    stream = io.StringIO()
    with dumping(["ptx"], stream):
        compile_specializations(specs, "sm_90a", jobs=1, timeout=timeout)
    assert stream.getvalue().count("// ---- after ptx: ") == 2, stream.getvalue()[:300]
