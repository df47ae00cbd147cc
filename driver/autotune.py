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

This module holds the :class:`Autotuner` (its checks, the choice per call key, the summary) and the
decorator; :class:`Config`, :class:`TuneRecord` and the switches are in driver/autotune_config.py,
the tuning of one key (compiling, timing, saving arrays) in driver/autotune_timing.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from ..frontend.diagnostics import CompileError, LaunchError
from ..frontend.ir import types as T
from ..frontend.sema.specialize import bind_arguments
from .array_devices import launch_device, several_gpus
from .autotune_arrays import hook_stream, launch_stream
from .autotune_cache import TuningFile, identity_hash, load_table, table_choice, tuning_path
from .autotune_config import (
    ENV_AUTOTUNE,
    ENV_PRINT,
    SP_BAD_CONFIG,
    SP_BAD_NAME,
    SP_CONFIG_PARAM,
    SP_PRUNED_ALL,
    SP_TUNED_ARGUMENT,
    Config,
    TuneRecord,
    checked_prune,
    printing_requested,
    tuning_enabled,
)
from .autotune_keys import key_string
from .autotune_timing import TimingMixin
from .grid import GridIndexer, no_grid, normalize_grid
from .kernel import Kernel
from .kernel_options import KERNEL_OPTIONS, SP_BAD_OPTION, SP_CLUSTER_SHAPE, option_problem

__all__ = ["ENV_AUTOTUNE", "ENV_PRINT", "SP_BAD_CONFIG", "SP_BAD_NAME", "SP_CONFIG_PARAM", "SP_PRUNED_ALL",
           "SP_TUNED_ARGUMENT", "Autotuner", "Config", "TuneRecord", "autotune", "printing_requested"]


class Autotuner(TimingMixin):
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
        self.prune_configs_by = checked_prune(kernel.name, prune_configs_by)
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
        """The kernel's parameters as a launch binds them (read again where a default was assigned
        since: the key and a pre_hook see the value the launch uses)."""
        return self.kernel.current_params()

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
        if not tuning_enabled():
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
