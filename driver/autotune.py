"""``@sparsile.autotune``: pick the fastest of several configs of a kernel, per call key.

Triton's convention (docs/autotune.md)::

    @sp.autotune(configs=[sp.Config({"BLOCK": 256}, num_warps=4), {"BLOCK": 1024, "num_warps": 8}],
                 key=["n"])
    @sp.jit
    def add(x, y, out, n: sp.i32, BLOCK: sp.constexpr): ...

    add[lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, y, out, n)

The first call with a new key (the ``key`` arguments' values, an array's shape and dtype, plus the
dtypes of every array argument) compiles every config, skips those that fail to compile (the
reason is kept for :meth:`Autotuner.summary`), times the others on the GPU (``warmup``/``rep``
launches, CUDA events on the launch stream) and launches the fastest. Arrays the kernel writes are
saved before tuning and restored after it, so tuning does not change the results. The winner is
cached in memory and on disk per GPU name, key and compiler version (driver/autotune_cache.py).
``SPARSILE_AUTOTUNE=0`` turns tuning off: the ``defaults=`` table's choice, else the first config.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..frontend.diagnostics import CompileError, LaunchError
from ..frontend.ir import types as T
from ..frontend.sema.specialize import bind_arguments
from .array_devices import launch_device, several_gpus
from .autotune_arrays import hook_stream, launch_stream, snapshot, zero
from .autotune_cache import TuningFile, identity_hash, key_string, load_table, table_choice, tuning_path
from .kernel import (
    KERNEL_OPTIONS,
    SP_BAD_OPTION,
    SP_CLUSTER_SHAPE,
    GridIndexer,
    Kernel,
    no_grid,
    normalize_grid,
    option_problem,
)

ENV_AUTOTUNE = "SPARSILE_AUTOTUNE"
ENV_PRINT = "SPARSILE_AUTOTUNE_PRINT"
SP_BAD_CONFIG = "SP0770"
SP_BAD_NAME = "SP0771"
SP_CONFIG_PARAM = "SP0772"
SP_PRUNED_ALL = "SP0776"
SP_TUNED_ARGUMENT = "SP0777"
_OFF = frozenset({"0", "off", "false", "no"})


class Config:
    """One choice for an autotuned kernel: constexpr values (``kwargs``) and kernel options."""

    def __init__(self, kwargs: Mapping[str, Any] | None = None, num_warps: int | None = None,
                 num_stages: int | None = None, maxnreg: int | None = None, num_ctas: int | None = None,
                 cluster: Any = None, pre_hook: Callable[[dict[str, Any]], None] | None = None,
                 pdl: bool | None = None, target: str | None = None):
        self.kwargs = dict(kwargs or {})
        given = {"num_warps": num_warps, "num_stages": num_stages, "maxnreg": maxnreg, "num_ctas": num_ctas,
                 "cluster": cluster, "pdl": pdl, "target": target}
        self.options = {k: v for k, v in given.items() if v is not None}
        self.pre_hook = pre_hook

    @classmethod
    def of(cls, value: Any) -> Config:
        """A Config as given, or one from a plain dict (its option names become options)."""
        if isinstance(value, Config):
            return value
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            options = {k: v for k, v in value.items() if k in KERNEL_OPTIONS}
            return cls({k: v for k, v in value.items() if k not in KERNEL_OPTIONS}, **options)
        raise LaunchError(SP_BAD_CONFIG, f"an autotune config must be a sparsile.Config or a dict of constexpr "
                                         f"values and options, found {value!r}",
                          help='e.g. sparsile.Config({"BLOCK": 256}, num_warps=4) or {"BLOCK": 256, "num_warps": 4}')

    def all_kwargs(self) -> dict[str, Any]:
        """The constexpr values and the options, as the launch takes them."""
        return {**self.kwargs, **self.options}

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.all_kwargs().items()}

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.all_kwargs().items()) or "(no values)"

    def __repr__(self) -> str:
        return f"Config({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_json().items())))


@dataclass
class TuneRecord:
    """What the tuner decided for one key: the config, how (``tuned``, ``disk``, ``table``,
    ``first``), the time of every timed config (ms) and the reason of every skipped one."""

    config: Config
    how: str
    timings: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def _enabled() -> bool:
    return os.environ.get(ENV_AUTOTUNE, "1").strip().lower() not in _OFF


def printing_requested() -> bool:
    """Whether SPARSILE_AUTOTUNE_PRINT asks for progress and chosen configs on stderr."""
    return os.environ.get(ENV_PRINT, "").strip().lower() in {"1", "true", "yes", "on"}


class Autotuner:
    """An autotuned kernel: ``tuned[grid](*args)`` launches the best config for the call's key,
    ``tuned.interpret[grid](*args)`` runs ``interpret_config`` (default the first config) in the
    interpreter without timing, :meth:`summary` tells what was chosen."""

    def __init__(self, kernel: Kernel, configs: Sequence[Any], key: Sequence[str], *,
                 prune_configs_by: Mapping[str, Any] | None = None, warmup: int = 10, rep: int = 50,
                 restore_value: Sequence[str] | None = None, reset_to_zero: Sequence[str] = (),
                 defaults: Any = None, interpret_config: Any = None, benchmarker: Callable[..., float] | None = None,
                 cache_results: bool = True):
        if isinstance(kernel, staticmethod) and isinstance(kernel.__func__, Kernel):
            kernel = kernel.__func__  # a kernel is no descriptor: never bound, as a @staticmethod
        if not isinstance(kernel, Kernel):
            raise LaunchError(SP_BAD_CONFIG, f"sparsile.autotune wraps a kernel (@sparsile.jit or a .spk module's "
                                             f"kernel), found {kernel!r}",
                              help="put @sparsile.autotune(...) above @sparsile.jit")
        self.kernel = kernel
        if isinstance(configs, str | Mapping | Config) or not isinstance(configs, Sequence):
            raise LaunchError(SP_BAD_CONFIG, f"sparsile.autotune of `{kernel.name}` takes a list of configs, found "
                                             f"{configs!r}",
                              help='e.g. configs=[sparsile.Config({"BLOCK": 256}), {"BLOCK": 1024, "num_warps": 8}]')
        self.configs = [Config.of(c) for c in configs]
        if not self.configs:
            raise LaunchError(SP_BAD_CONFIG, f"sparsile.autotune of `{kernel.name}` needs at least one config")
        if isinstance(key, str):
            key = [key]
        for what, names in (("key", key), ("restore_value", restore_value), ("reset_to_zero", reset_to_zero)):
            if names is None and what == "restore_value":
                continue  # the default: every array a config stores to
            if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
                raise LaunchError(SP_BAD_NAME, f"autotune {what}= takes a list of parameter names of "
                                               f"`{kernel.name}`, found {names!r}",
                                  help=f"e.g. {what}=[\"n\"]" + ("; key=[] tunes once per argument dtypes"
                                                                 if what == "key" else ""))
        self.key = list(key)
        self.prune_configs_by = _checked_prune(kernel.name, prune_configs_by)
        self.warmup, self.rep = warmup, rep
        self.restore_value = None if restore_value is None else list(restore_value)
        self.reset_to_zero = list(reset_to_zero)
        self.table = load_table(defaults)
        self.interpret_config = self._given(interpret_config) if interpret_config is not None else self.configs[0]
        self.benchmarker = benchmarker
        self.cache: dict[str, TuneRecord] = {}  # by "GPU name|cache key"
        self.stderr: TextIO | None = None
        self.tuned = {n for c in self.configs for n in c.kwargs}  # the constexprs the configs choose
        self._check_names()
        self.call_constexprs = [p.name for p in kernel.params if p.annotation is T.CONSTEXPR
                                and p.name not in self.tuned and p.name not in self.key]
        """Constexprs the call gives: part of every cache key (they change the compiled kernel, so a
        winner for one value may not compile, or not win, for another)."""
        ident = identity_hash(kernel.source_key, kernel.name, [c.to_json() for c in self.configs], self.key)
        self.file = TuningFile(tuning_path(kernel.name, ident) if cache_results else None, kernel.name)

    # ------------------------------------------------------------------ checks
    def _check_names(self) -> None:
        params = {p.name: p for p in self.kernel.params}
        listed = ", ".join(params)
        for what, names in (("key", self.key), ("restore_value", self.restore_value or []),
                            ("reset_to_zero", self.reset_to_zero)):
            for n in names:
                if n not in params:
                    raise LaunchError(SP_BAD_NAME, f"autotune {what}= names `{n}`, which is no parameter of "
                                                   f"`{self.kernel.name}`", help=f"parameters: {listed}")
                annotation = params[n].annotation
                if what != "key" and (annotation is T.CONSTEXPR or isinstance(annotation, T.ScalarType)):
                    raise LaunchError(SP_BAD_NAME, f"autotune {what}= names `{n}`, which is a scalar parameter of "
                                                   f"`{self.kernel.name}`, not an array",
                                      help=f"{what}= names the arrays tuning must put back (or zero)")
        table = [(f"the defaults= entry `{k}`", Config.of(v)) for k, v in self.table.items()]
        for where, c in [*(("the autotune config", c) for c in self.configs),
                         ("the interpret_config", self.interpret_config), *table]:
            for n in c.kwargs:
                p = params.get(n)
                if p is None or p.annotation is not T.CONSTEXPR:
                    what = "no parameter" if p is None else "not a constexpr parameter"
                    raise LaunchError(SP_CONFIG_PARAM, f"{where} {{{c}}} sets `{n}`, which is {what} "
                                                       f"of `{self.kernel.name}`",
                                      help="a config gives constexpr parameters (`NAME: constexpr`) and kernel "
                                           f"options ({', '.join(KERNEL_OPTIONS)})")
            for name, value in c.options.items():
                problem = option_problem(name, value)
                if problem is not None:  # refused here: timing would skip the config without a word
                    raise LaunchError(SP_CLUSTER_SHAPE if name == "cluster" else SP_BAD_OPTION,
                                      f"{where} {{{c}}}: {problem[0]}", help=problem[1])
        for n in self.key:
            if n in self.tuned:
                raise LaunchError(SP_BAD_NAME, f"autotune key= names `{n}`, which the configs of `{self.kernel.name}` "
                                               "choose: it cannot tell calls apart",
                                  help="key= names the call's arguments a choice depends on (sizes, arrays)")

    # ------------------------------------------------------------------ the kernel's face
    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def params(self) -> Any:
        return self.kernel.params

    def __repr__(self) -> str:
        return f"<sparsile autotuned kernel {self.name}: {len(self.configs)} configs, key {self.key}>"

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, stream=None, **kwargs: self._launch(grid, args, kwargs, stream)

    @property
    def interpret(self) -> GridIndexer:
        """``tuned.interpret[grid](*args)``: ``interpret_config`` (default: the first config) in the
        numpy interpreter; nothing is timed or cached."""
        config = self.interpret_config

        def run(grid: Any) -> Callable[..., None]:
            def call(*args: Any, **kwargs: Any) -> None:
                kwargs = self._user_kwargs(kwargs, config)
                if config.pre_hook is not None:
                    config.pre_hook(self._bound(args, kwargs, config))
                self.kernel.interpret[grid](*args, **kwargs, **config.all_kwargs())
            return call
        return GridIndexer(run, f"{self.kernel.name}.interpret")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise no_grid(self.kernel.name)

    # ------------------------------------------------------------------ choosing
    def _user_kwargs(self, kwargs: dict[str, Any], config: Config) -> dict[str, Any]:
        clash = sorted(set(kwargs) & set(config.all_kwargs()))
        if clash:
            raise LaunchError(SP_TUNED_ARGUMENT, f"`{clash[0]}` is chosen by the autotuner of `{self.name}`; do "
                                                 "not pass it to the call",
                              help="drop it from the call, or from the configs")
        return kwargs

    def _given(self, value: Any, among: Sequence[Config] | None = None) -> Config:
        """``value`` (a Config, or a dict: the table's choice, a pruner's) as a Config; a dict equal
        to one of ``among`` (default: the configs) is that config, so that its pre_hook runs."""
        config = Config.of(value)
        if isinstance(value, Config):
            return config
        return next((c for c in (self.configs if among is None else among) if c == config), config)

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any], config: Config | None = None
               ) -> dict[str, Any]:
        """The call's arguments by parameter name; constexprs the call leaves out take ``config``'s
        (default: the first config's) values."""
        names = {p.name for p in self.params}
        plain = {k: v for k, v in kwargs.items() if k in names or k not in KERNEL_OPTIONS}
        return bind_arguments(self.name, self.params, args, {**(config or self.configs[0]).kwargs, **plain})

    def _launch(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: Any) -> None:
        config = self.choose(grid, args, kwargs, stream)
        if config.pre_hook is not None:
            bound = self._bound(args, kwargs, config)
            with hook_stream(launch_stream(bound, stream), launch_device(bound)):  # (as a timed launch's)
                config.pre_hook(bound)
        self.launch_kernel(grid, args, {**self._user_kwargs(kwargs, config), **config.all_kwargs()}, stream)

    def launch_kernel(self, grid: Any, args: tuple[Any, ...], call_kwargs: dict[str, Any], stream: Any) -> None:
        """One launch of the kernel with a config's values in ``call_kwargs`` (tuning and the tuned
        call both launch here; the CPU tests replace it by the interpreter)."""
        self.kernel[grid](*args, stream=stream, **call_kwargs)

    def choose(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: Any = None) -> Config:
        """The config for this call: cached in memory, stored on disk, the table's or the first
        (``SPARSILE_AUTOTUNE=0``), else tuned now."""
        for c in self.configs:
            self._user_kwargs(kwargs, c)
        bound = self._bound(args, kwargs)
        names = {p.name for p in self.params}
        options = {k: v for k, v in kwargs.items() if k in KERNEL_OPTIONS and k not in names}
        key = key_string(self.key + self.call_constexprs, bound, options)
        # the GPU the call's arrays live on (None: the current one), asked only on a host of several
        ordinal = launch_device(bound) if several_gpus() else None
        gpu = self._gpu_name() if ordinal is None else self._gpu_name(ordinal)
        record = self.cache.get(f"{gpu}|{key}")
        if record is not None:
            return record.config
        if not _enabled():
            shipped = table_choice(self.table, gpu, key)
            record = TuneRecord(self._given(shipped), "table") if shipped else TuneRecord(self.configs[0], "first")
        else:
            record = self._stored(gpu, key)
            if record is None and self._empty_grid(grid, args, kwargs):
                return self._for_empty_batch(grid, args, kwargs, bound, gpu, key, ordinal)  # nothing to time or store
            record = record or self._tune(grid, args, kwargs, bound, stream, gpu, key, ordinal)
        self.cache[f"{gpu}|{key}"] = record
        if printing_requested():
            print(f"sparsile autotune: `{self.name}` [{key}] on {gpu}: {record.config} ({record.how}"
                  + (f", {len(record.timings)} timed, {len(record.skipped)} skipped in {record.seconds:.2f} s"
                     if record.how == "tuned" else "") + ")", file=self._err())
        return record.config

    def _empty_grid(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether ``grid`` has a 0 dimension under every config (an empty batch): its launch runs
        nothing, so the call is not tuned; it launches with the config of :meth:`_for_empty_batch`, which checks the
        arguments and compiles (docs/autotune.md). False when a grid cannot be evaluated here: the
        tuning launches report it."""
        for config in self.configs:
            dims = self._grid_dims(grid, args, kwargs, config)
            if dims is None or 0 not in dims:
                return False
        return True

    def _for_empty_batch(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], bound: dict[str, Any],
                         gpu: str, key: str, ordinal: int | None = None) -> Config:
        """The config an empty batch launches with (docs/autotune.md): the first of the configs
        tuning would try (pruned as there) that compiles, as tuning skips those that do not; the
        first compile error where none does. Nothing is timed or cached."""
        errors: list[CompileError] = []
        for config in self._pruned(self._candidates(gpu, key), bound):
            try:
                self._compile(grid, args, {**self._user_kwargs(kwargs, config), **config.all_kwargs()}, ordinal)
            except CompileError as e:
                errors.append(e)
                continue
            return config
        raise errors[0]

    def _grid_dims(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: Config
                   ) -> tuple[int, int, int] | None:
        """``grid`` under ``config``, or None when it cannot be evaluated here (a grid function that
        looks up a name the call does not have, a bad grid: left to the launches to report). A grid
        function is given every argument of the call and ``config``'s constexprs, as a launch gives it."""
        try:
            return normalize_grid(grid, {**self._bound(args, kwargs, config), **config.all_kwargs()})
        except Exception:
            return None

    def _stored(self, gpu: str, key: str) -> TuneRecord | None:
        entry = self.file.read().get(f"{gpu}|{key}")
        if entry is None or not isinstance(entry.get("config"), dict):
            return None
        config = Config.of(entry["config"])
        config = next((c for c in self._candidates(gpu, key) if c == config), None)  # the given one: its pre_hook
        if config is None:
            return None
        timings, skipped = entry.get("timings"), entry.get("skipped")  # for the summary only: dropped when malformed
        timings = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)} \
            if isinstance(timings, dict) else {}
        skipped = {k: str(v) for k, v in skipped.items()} if isinstance(skipped, dict) else {}
        return TuneRecord(config, "disk", timings, skipped)

    def _candidates(self, gpu: str, key: str) -> list[Config]:
        """The configs, with the table's choice for this key added when it is none of them (so a
        tuned choice is never slower than the shipped one)."""
        shipped = table_choice(self.table, gpu, key)
        extra = Config.of(shipped) if shipped else None
        return self.configs + ([extra] if extra is not None and extra not in self.configs else [])

    def _pruned(self, configs: list[Config], bound: dict[str, Any]) -> list[Config]:
        prune = self.prune_configs_by
        if "early_config_prune" in prune:
            kept = prune["early_config_prune"](configs, bound)
            if isinstance(kept, str | Mapping | Config) or not isinstance(kept, Iterable):
                raise LaunchError(SP_BAD_CONFIG, f"early_config_prune of `{self.name}` must return a list of configs, "
                                                 f"found {kept!r}", help="return the configs to keep (a sublist of "
                                                                         "those it is given)")
            configs = [self._given(c, configs) for c in kept]
        if "perf_model" in prune:
            model = prune["perf_model"]
            top = prune.get("top_k", len(configs))
            keep = int(top * len(configs)) if isinstance(top, float) else int(top)
            configs = sorted(configs, key=lambda c: model(**{**bound, **c.all_kwargs()}))[:max(1, keep)]
        if not configs:
            raise LaunchError(SP_PRUNED_ALL, f"prune_configs_by left no config of `{self.name}` to try",
                              help="make early_config_prune keep at least one config")
        return configs

    # ------------------------------------------------------------------ tuning
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

    # ------------------------------------------------------------------ reporting
    def _gpu_name(self, ordinal: int | None = None) -> str:
        """The name of GPU ``ordinal`` (default: the current one), what tuning records are keyed by."""
        from ..backend.runtime.bench import device_name

        return device_name(ordinal)

    def _err(self) -> TextIO:
        return self.stderr or sys.stderr

    def _progress(self) -> bool:
        err = self._err()
        return printing_requested() or bool(getattr(err, "isatty", lambda: False)())

    def summary(self) -> str:
        """The chosen config per key, how it was chosen, the times and the skipped configs."""
        lines = [f"sparsile autotune `{self.name}`: {len(self.configs)} configs, key {self.key}"]
        if not self.cache:
            lines.append("  (no call yet)")
        for key, r in self.cache.items():
            ms = r.timings.get(str(r.config))
            lines.append(f"  [{key or 'no key'}] -> {r.config} ({r.how}" + (f", {ms:.4f} ms" if ms is not None else "")
                         + ")")
            for name, t in sorted(r.timings.items(), key=lambda kv: kv[1]):
                lines.append(f"      {t:10.4f} ms  {name}")
            for name, why in r.skipped.items():
                lines.append(f"      skipped     {name}: {why}")
        return "\n".join(lines)


_PRUNE_KEYS = ("early_config_prune", "perf_model", "top_k")


def _checked_prune(kernel: str, prune: Any) -> dict[str, Any]:
    """``prune_configs_by`` as a dict, checked when the kernel is decorated: a misspelt key was
    ignored (nothing pruned, no word), a bad value failed inside the first tuning."""
    if prune is None:
        return {}
    what = "autotune prune_configs_by="
    example = 'e.g. prune_configs_by={"early_config_prune": lambda configs, args: configs[:2]}'
    if not isinstance(prune, Mapping):
        raise LaunchError(SP_BAD_CONFIG, f"{what} takes a dict ({', '.join(_PRUNE_KEYS)}), found {prune!r}",
                          help=example)
    for name, value in prune.items():
        if name not in _PRUNE_KEYS:
            raise LaunchError(SP_BAD_CONFIG, f"{what} takes early_config_prune, perf_model and top_k, found "
                                             f"`{name}`", help=example)
        if name != "top_k" and not callable(value):
            raise LaunchError(SP_BAD_CONFIG, f"{what} {name} must be a function, found {value!r}", help=example)
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if name == "top_k" and not (whole or (isinstance(value, float) and 0 < value <= 1)):
            raise LaunchError(SP_BAD_CONFIG, f"{what} top_k must be a positive int or a fraction in (0, 1], found "
                              f"{value!r}", help="top_k: how many configs (or which fraction of them) perf_model's "
                                                 "lowest estimates keep")
    return dict(prune)


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


def autotune(configs: Sequence[Any], key: Sequence[str], *, prune_configs_by: Mapping[str, Any] | None = None,
             warmup: int = 10, rep: int = 50, restore_value: Sequence[str] | None = None,
             reset_to_zero: Sequence[str] = (), defaults: Any = None, interpret_config: Any = None,
             benchmarker: Callable[..., float] | None = None, cache_results: bool = True
             ) -> Callable[[Kernel], Autotuner]:
    """Decorate a kernel (above ``@sparsile.jit``, or called on a ``.spk`` module's kernel) to pick
    the fastest of ``configs`` per value of the ``key`` arguments (docs/autotune.md).

    ``configs``: ``sparsile.Config(kwargs, num_warps=, num_stages=, ...)`` or plain dicts.
    ``prune_configs_by``: ``early_config_prune(configs, named_args)`` and/or ``perf_model`` with
    ``top_k``. ``warmup``/``rep``: launches before and during timing. ``restore_value``: arrays
    restored after timing each config (default: every array the kernel writes); ``reset_to_zero``:
    arrays zeroed before every timed launch. ``defaults``: a table (mapping or JSON file) of choices
    used with ``SPARSILE_AUTOTUNE=0`` and tried as one more candidate. ``interpret_config``: what
    ``.interpret`` runs. ``benchmarker(fn, warmup=, rep=, stream=) -> ms``: the timer (default:
    CUDA events, backend/runtime/bench.py). ``cache_results=False``: no disk cache.
    """
    def wrap(kernel: Kernel) -> Autotuner:
        return Autotuner(kernel, configs, key, prune_configs_by=prune_configs_by, warmup=warmup, rep=rep,
                         restore_value=restore_value, reset_to_zero=reset_to_zero, defaults=defaults,
                         interpret_config=interpret_config, benchmarker=benchmarker, cache_results=cache_results)
    return wrap
