"""How :class:`~sparsile.driver.autotune.Autotuner` tunes one key: every candidate config compiled
(those that fail are skipped, with their reason), timed on the GPU with the arrays it may change
saved and restored around it and the ``reset_to_zero`` ones zeroed before each launch, and the
fastest stored. A mixin of the Autotuner."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from ..frontend.diagnostics import CompileError, LaunchError
from .autotune_arrays import hook_stream, launch_stream, snapshot, zero
from .autotune_cache import TuningFile
from .autotune_config import SP_BAD_NAME, Config, TuneRecord
from .kernel import Kernel


class TimingMixin:
    """Tuning and timing for :class:`~sparsile.driver.autotune.Autotuner`."""

    # provided by Autotuner
    kernel: Kernel
    warmup: int
    rep: int
    restore_value: list[str] | None
    reset_to_zero: list[str]
    benchmarker: Callable[..., float] | None
    file: TuningFile

    if TYPE_CHECKING:
        @property
        def name(self) -> str: ...
        def _pruned(self, configs: list[Config], bound: dict[str, Any]) -> list[Config]: ...
        def _candidates(self, gpu: str, key: str) -> list[Config]: ...
        def _user_kwargs(self, kwargs: dict[str, Any], config: Config) -> dict[str, Any]: ...
        def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any], config: Config | None = None
                   ) -> dict[str, Any]: ...
        def _grid_dims(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: Config
                       ) -> tuple[int, int, int] | None: ...
        def _progress(self) -> bool: ...
        def _err(self) -> TextIO: ...
        def launch_kernel(self, grid: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any],
                          stream: Any) -> None: ...

    def _tune(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound: dict[str, Any], stream: Any,
              gpu: str, key: str, ordinal: int | None = None) -> TuneRecord:
        configs = self._pruned(self._candidates(gpu, key), bound)  # a pruning mistake first, GPU or not
        for n in self.reset_to_zero:
            if not hasattr(bound[n], "shape"):
                raise LaunchError(SP_BAD_NAME, f"autotune reset_to_zero= names `{n}`, which is {bound[n]!r} in this "
                                               "call, not an array", help="reset_to_zero= names arrays tuning zeroes "
                                                                          "before each timed launch")
        bench = self._timer(ordinal)
        handle = launch_stream(bound, stream)  # where zeroing, saving and restoring go (autotune_arrays.py)
        started = time.perf_counter()
        timings: dict[str, float] = {}
        skipped: dict[str, str] = {}
        errors: list[CompileError | LaunchError] = []
        saved: dict[str, Callable[[], None]] = {}
        progress = self._progress()
        try:
            for i, config in enumerate(configs):
                if progress:
                    print(f"\rsparsile autotune `{self.name}` [{i + 1}/{len(configs)}] {config}\x1b[K", end="",
                          file=self._err(), flush=True)
                call_kwargs = {**self._user_kwargs(kwargs, config), **config.all_kwargs()}
                try:
                    self._compile(grid, args, call_kwargs, ordinal)
                except CompileError as e:
                    skipped[str(config)] = _reason(e)
                    errors.append(e)
                    continue
                dims = self._grid_dims(grid, args, kwargs, config)
                if dims is not None and 0 in dims:  # would run nothing and time fastest
                    e = LaunchError("SP0710", f"grid {dims} has a 0 dimension: it launches nothing, so it is not timed")
                    skipped[str(config)] = _reason(e)
                    errors.append(e)
                    continue
                self._save(args, call_kwargs, saved, handle)
                try:
                    timings[str(config)] = float(bench(self._runner(grid, args, call_kwargs, config, stream, handle,
                                                                    ordinal),
                                                       warmup=self.warmup, rep=self.rep, stream=stream))
                except LaunchError as e:  # refused before it ran (a grid, block or shared memory over a limit)
                    skipped[str(config)] = _reason(e)
                    errors.append(e)
                finally:
                    for restore in saved.values():
                        restore()
        finally:
            if progress:
                print(file=self._err(), flush=True)
        if not timings:
            raise errors[0]
        best = min((c for c in configs if str(c) in timings), key=lambda c: timings[str(c)])
        record = TuneRecord(best, "tuned", timings, skipped, time.perf_counter() - started)
        self.file.store(f"{gpu}|{key}", {"config": best.to_json(), "ms": timings[str(best)], "timings": timings,
                                          "skipped": skipped})
        return record

    def _timer(self, ordinal: int | None) -> Callable[..., float]:
        """What tuning on GPU ``ordinal`` (the call's arrays'; None: sparsile's current device) times
        with: the GPU timer, or ``benchmarker=`` run with that GPU as sparsile's and torch's current
        device (backend/runtime/bench.py ``on_device``): its contract names no device, so it times
        with the current one's events (docs/autotune.md). Given as is without a GPU (the CPU tests)."""
        from ..backend import runtime
        from ..backend.runtime import devices
        from ..backend.runtime.bench import on_device

        if self.benchmarker is None:
            return _default_benchmarker(self.name, ordinal)
        if not runtime.has_gpu():
            return self.benchmarker
        return on_device(self.benchmarker, devices.default_ordinal if ordinal is None else ordinal)

    def _runner(self, grid: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any], config: Config,
                stream: Any, handle: int = 0, ordinal: int | None = None) -> Callable[[], None]:
        """One timed launch: the ``reset_to_zero`` arrays zeroed and the config's ``pre_hook`` run
        on the launch stream ``handle`` (of GPU ``ordinal``), then the launch on ``stream``: each
        zeroing is ordered after the previous repetition's kernel and before this one, whatever the
        stream (autotune_arrays.py)."""
        bound = self._bound(args, {k: v for k, v in call_kwargs.items() if k not in config.all_kwargs()}, config)
        zeroed = [bound[n] for n in self.reset_to_zero]

        def run() -> None:
            for x in zeroed:
                zero(x, handle)
            if config.pre_hook is not None:
                with hook_stream(handle, ordinal):
                    config.pre_hook(bound)
            self.launch_kernel(grid, args, call_kwargs, stream)
        run.config = config  # type: ignore[attr-defined]  # which config a benchmarker times
        return run

    def _save(self, args: tuple[Any, ...], call_kwargs: dict[str, Any], saved: dict[str, Callable[[], None]],
              handle: int = 0) -> None:
        """Add to ``saved`` the restore functions of the arrays timing this config may change:
        ``restore_value``, by default every array argument this config's kernel stores to (configs
        can store to different arrays: a workspace only a split config writes), and
        ``reset_to_zero``. An array first seen here is as the caller passed it: every earlier
        config was restored, and none stored to it. Saved and restored on the launch stream
        ``handle``: after the caller's work queued there, before the launches after."""
        if self.restore_value is not None:
            names = set(self.restore_value)
        else:
            from ..frontend.interp.host_arrays import stored_params

            names = stored_params(self.kernel.ir(*args, **call_kwargs))
        names |= set(self.reset_to_zero)
        bound = self._bound(args, call_kwargs)
        for n in sorted(names - set(saved)):
            if hasattr(bound[n], "shape"):
                saved[n] = snapshot(bound[n], handle)

    def _compile(self, grid: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any], ordinal: int | None = None
                 ) -> None:
        """Compile one config for the GPU of the call's arrays, ``ordinal`` (default the current GPU;
        sm_90a where there is none, so that the CPU tests reach the same compile errors);
        CompileError when it cannot be."""
        from ..backend import runtime
        from ..target.targets import target_for_capability
        from .launch import GpuLaunch

        target = target_for_capability(*runtime.current_device(ordinal).compute_capability).name \
            if runtime.has_gpu() else "sm_90a"
        GpuLaunch(self.kernel, grid).compile_for(call_kwargs.get("target") or target, *args, **call_kwargs)


def _reason(error: CompileError | LaunchError) -> str:
    if isinstance(error, LaunchError):
        return f"{error.code}: {error.message}"
    d = error.diagnostics[0] if error.diagnostics else None
    return f"{d.code}: {d.message}" if d is not None else str(error)


def _default_benchmarker(kernel: str, ordinal: int | None = None) -> Callable[..., float]:
    """The GPU timer (on device ``ordinal``, the tuned call's: default the current one); LaunchError
    SP0731 where there is no GPU (as the kernel's own launch)."""
    from ..backend import runtime
    from ..backend.runtime.bench import do_bench

    if not runtime.has_gpu():
        raise LaunchError("SP0731", f"kernel `{kernel}` cannot be tuned: no NVIDIA GPU is available",
                          help=f"run it on the CPU with `{kernel}.interpret[grid](...)` (the first config, or "
                               "interpret_config=)")
    return do_bench if ordinal is None else functools.partial(do_bench, device=ordinal)

