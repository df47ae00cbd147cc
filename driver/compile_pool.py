"""Compiling many kernel specializations at once, in worker processes (``sparsile.torch.warm_up``).

Threads overlap little: llvmlite serializes every call into LLVM behind one process-wide lock
(``llvmlite.binding.ffi.lib``), and LLVM's O3 pipeline and NVPTX emission are most of a compile
(benchmarks/RESULTS.md, "First calls"); only the Python passes and nvJitLink run beside it. Worker
processes each have their own LLVM: :func:`compile_specializations` starts ``jobs`` of them
(``python -c``, importing only the compiler, not torch), hands each specialization of a ``.spk``
kernel to the next free one, and each writes its result into the shared disk cache
(``SPARSILE_CACHE_DIR``, driver/cache.py); the parent then reads every entry back through
:func:`~.compiler.compile_cached` (a disk hit, kept in memory), so a launch finds it. Without a
disk cache, for ``@jit`` kernels or with ``jobs=1`` the specializations compile here, in threads
(with a ``timeout``: each in a thread of its own, left behind and named once it runs past it).
"""

from __future__ import annotations

import contextvars
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..target.targets import get_target
from .cache import default_cache
from .compiler import cache_key, compile_cached
from .kernel_options import KERNEL_OPTIONS


@dataclass(frozen=True)
class Specialization:
    """One compile: the kernel, its sema bindings and specialization key (``kernel.bind``) and the
    compile options, as :meth:`~.launch.GpuLaunch.compile_for` passes them to ``compile_cached``."""

    kernel: Any
    bindings: dict[str, Any]
    key: tuple
    options: dict[str, Any]

    @classmethod
    def of_launch(cls, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Specialization:
        """What ``kernel[grid].compile_for(target, *args, **kwargs)`` compiles."""
        _, bindings, key = kernel.bind(args, dict(kwargs))
        options = {**KERNEL_OPTIONS, **kernel.options,
                   **{k: kwargs[k] for k in kwargs if k in KERNEL_OPTIONS and k not in bindings}}
        return cls(kernel, bindings, key, options)

    def compile(self, target: str) -> Any:
        return compile_cached(self.kernel, self.bindings, self.key, get_target(target), self.options)

    def cached(self, target: str) -> bool:
        """Whether the compile cache (memory or disk) holds this specialization's kernel for ``target``."""
        ckey = cache_key(self.kernel, self.bindings, self.key, get_target(target), self.options)
        return default_cache().get(ckey, count=False) is not None

    def portable(self) -> tuple[str, str, str, dict[str, Any], tuple, dict[str, Any]] | None:
        """(source text, source name, kernel name, bindings, key, options) for a worker process, or
        None for a kernel a worker cannot load again from its text (a ``@jit`` function)."""
        kernel = self.kernel
        if not getattr(kernel, "is_closed", False) or (kernel.imports and not os.path.isfile(kernel.source.name)):
            return None  # (a worker reads the imports of a file's module from its folder)
        try:
            job = (kernel.source.text, kernel.source.name, kernel.name, self.bindings, self.key, self.options)
            pickle.dumps(job)
        except Exception:
            return None
        return job


class CompileTimeout(TimeoutError):
    """Worker processes that did not reply within ``timeout`` seconds of being handed a
    specialization (``hung``, with the target of each): each was killed; every other
    specialization was compiled (in the cache) before this was raised."""

    def __init__(self, hung: list[tuple[Specialization, str]], timeout: float):
        self.hung, self.timeout = hung, timeout
        names = ", ".join(f"`{spec.kernel.name}` for {target}" for spec, target in hung)
        super().__init__(f"no reply within {timeout:g} s compiling {names}")


WORKER_START_MOST_S = 120.0
"""The most seconds a worker process may take to start (import the compiler) and say so, where a
``timeout`` is given and is shorter: a start is not a compile."""


def compile_specializations(specs: list[Specialization], target: str | Sequence[str], jobs: int = 1,
                            timeout: float | None = None) -> list[float]:
    """Compile each of ``specs`` for ``target`` (one name, or one per spec: a sequence of another
    length is a ValueError, before anything is compiled) through the compile
    cache, ``jobs`` at a time (worker processes where it can: see the module's docstring); the
    seconds each took, in order (where a worker compiled it: the worker's time). ``timeout``: the
    most seconds a worker may take over one specialization; one that takes longer is killed and,
    once every other specialization is compiled, :class:`CompileTimeout` names what it was
    compiling (None: no limit). A compile in this process (``jobs=1``, no disk cache, a ``@jit``
    kernel) cannot be killed: with a ``timeout`` each runs in a thread of its own, one at a time,
    and one still running after ``timeout`` seconds is left behind (it may yet finish, into the
    cache) and named by :class:`CompileTimeout` as a worker's is (:func:`_in_threads_timed`)."""
    targets = _targets(specs, target)
    jobs = max(1, min(jobs, len(specs)))
    portable = [spec.portable() for spec in specs]
    cache = default_cache()
    if jobs == 1 or not cache.disk_enabled or not all(portable):
        if timeout is None:
            return _in_threads(specs, targets, jobs)
        taken, hung = _in_threads_timed(specs, targets, timeout)
        if hung:
            raise CompileTimeout([(specs[i], targets[i]) for i in sorted(hung)], timeout)
        return taken
    taken, hung = _in_workers(portable, targets, jobs, str(cache.directory), timeout)  # type: ignore[arg-type]
    for i, spec in enumerate(specs):  # read back from the disk cache (a worker's failure: compiled here, and
        if i not in hung:  # raised here; not what hung in a worker: it would hang here)
            spec.compile(targets[i])
    if hung:
        raise CompileTimeout([(specs[i], targets[i]) for i in sorted(hung)], timeout)  # type: ignore[arg-type]
    return taken


def _targets(specs: list[Specialization], target: str | Sequence[str]) -> list[str]:
    """One target per spec: ``target`` repeated (one name) or as given; ValueError for a sequence of
    another length than ``specs`` (some specializations were compiled for no target, or none was)."""
    if isinstance(target, str):
        return [target] * len(specs)
    targets = list(target)
    if len(targets) != len(specs):
        raise ValueError(f"compile_specializations: {len(specs)} specializations but {len(targets)} targets: give "
                         "one target name for all, or one per specialization")
    return targets


def _in_threads(specs: list[Specialization], target: str | Sequence[str], jobs: int) -> list[float]:
    targets = _targets(specs, target)

    def one(spec: Specialization, target: str) -> float:
        start = time.perf_counter()
        spec.compile(target)
        return time.perf_counter() - start

    if jobs == 1:
        return [one(spec, target) for spec, target in zip(specs, targets, strict=True)]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sparsile-compile") as pool:
        return list(pool.map(one, specs, targets))


def _in_threads_timed(specs: list[Specialization], targets: list[str], timeout: float) -> tuple[list[float], set[int]]:
    """Compile ``specs`` here, one at a time, each in a daemon thread awaited at most ``timeout``
    seconds: (the seconds each took, the indices of those still running then). A thread cannot be
    stopped: one left behind runs on (a daemon: it does not keep the process alive) and, holding
    LLVM's lock, may make the next compiles wait; each of them has its own ``timeout``. A compile
    that raises raises here, as :func:`_in_threads`'s."""
    taken: list[float] = []
    hung: set[int] = set()
    for i, (spec, target) in enumerate(zip(specs, targets, strict=True)):
        outcome: list[BaseException | None] = []

        def one(spec: Specialization = spec, target: str = target, outcome: list = outcome) -> None:
            try:
                spec.compile(target)
                outcome.append(None)
            except BaseException as e:  # re-raised in the caller's thread
                outcome.append(e)

        start = time.perf_counter()  # in the caller's context (a `dumping(...)` block), as a compile here would be
        thread = threading.Thread(target=contextvars.copy_context().run, args=(one,), name="sparsile-compile",
                                  daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            hung.add(i)
            taken.append(timeout)
            continue
        if outcome and outcome[0] is not None:
            raise outcome[0]
        taken.append(time.perf_counter() - start)
    return taken, hung


_PACKAGE = __name__.rsplit(".", 2)[0]  # "sparsile"
_WORKER = f"from {_PACKAGE}.driver.compile_pool import worker_main; worker_main()"


def _in_workers(portable: list[Any], targets: list[str], jobs: int, cache_dir: str,
                timeout: float | None = None) -> tuple[list[float], set[int]]:
    """Compile ``portable`` jobs (for ``targets``) in ``jobs`` worker processes sharing the disk cache
    ``cache_dir``; (the seconds each took, the indices of those whose worker did not reply within
    ``timeout`` seconds and was killed)."""
    env = {**os.environ, "SPARSILE_CACHE_DIR": cache_dir}
    # the parent's sys.path, as it is now (a checkout added at run time): ``python -c`` would put the
    # working folder first, where another ``sparsile`` folder may stand
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    code = f"import sys; sys.path[:] = {paths!r}\n{_WORKER}"
    taken = [0.0] * len(portable)
    queue = list(range(len(portable)))
    hung: set[int] = set()
    lock = threading.Lock()

    def reply(proc: subprocess.Popen[bytes], seconds: float | None, job: int | None) -> Any:
        """The worker's next reply, or None where it sent none within ``seconds`` (it is killed then,
        and ``job`` counted as hung)."""
        def kill() -> None:
            with lock:
                if job is not None:
                    hung.add(job)
            proc.kill()  # (its reply pipe closes: the read below ends)

        timer = None if seconds is None else threading.Timer(seconds, kill)
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            return _receive(proc.stdout, most=_REPLY_MOST)  # type: ignore[arg-type]
        finally:
            if timer is not None:
                timer.cancel()

    def feed(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        started = False
        try:
            while True:
                with lock:
                    if not queue:
                        break
                    i = queue.pop(0)
                _send(proc.stdin, (targets[i], *portable[i]))
                if not started:  # (its start, apart from its first compile: see WORKER_START_MOST_S)
                    started = isinstance(reply(proc, timeout and max(timeout, WORKER_START_MOST_S), None), float)
                answer = reply(proc, timeout, i) if started else None
                with lock:
                    if i in hung and isinstance(answer, float):  # (the reply came as the timer fired)
                        hung.discard(i)
                if not isinstance(answer, float) or i in hung:  # the worker died: the parent compiles what it
                    proc.kill()  # did not (or it wrote what is not a reply: it is not waited for)
                    break
                taken[i] = answer
        except Exception:  # (likewise: a broken pipe, a reply that is not one)
            proc.kill()
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env) for _ in range(jobs)]
    threads = [threading.Thread(target=feed, args=(proc,), daemon=True) for proc in procs]
    for thread in threads:
        thread.start()
    for thread, proc in zip(threads, procs, strict=True):
        thread.join()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    return taken, hung


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


_REPLY_MOST = 1 << 12
"""The most bytes a worker's reply (a pickled float) may take: a longer one is not a reply."""


def _receive(stream: BinaryIO, most: int | None = None) -> Any:
    """The next object sent by :func:`_send`; None at the end of ``stream`` or, with ``most``, where
    the length read says more than ``most`` bytes (not a reply: reading on would wait for ever)."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    if most is not None and n > most:
        return None
    return pickle.loads(stream.read(n))


def _reply_stream() -> BinaryIO:
    """The worker's replies: its standard output as it started, which then becomes a copy of its
    standard error, so that what a compile prints (``static_print``, a library writing to file
    descriptor 1) cannot be read by the parent as a reply."""
    sys.stdout.flush()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return replies


def worker_main() -> None:
    """A worker process: compile each job read from stdin into the disk cache; reply with the
    seconds it took (a failed compile replies too: the parent compiles it again and reports it)."""
    from .module import loads

    modules: dict[tuple[str, str], Any] = {}
    stdin, stdout = sys.stdin.buffer, _reply_stream()
    _send(stdout, 0.0)  # started (the parent then times each compile apart from the start)
    while True:
        job = _receive(stdin)
        if job is None:
            return
        target, text, name, kernel_name, bindings, key, options = job
        start = time.perf_counter()
        try:
            module = modules.get((name, text))
            if module is None:
                module = modules[(name, text)] = loads(text, name, path=name if os.path.isfile(name) else None)
            compile_cached(module.kernels[kernel_name], bindings, key, get_target(target), options)
        except Exception:  # (the parent compiles it again, and raises there)
            pass
        _send(stdout, time.perf_counter() - start)
