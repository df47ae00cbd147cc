"""The values of ``@sparsile.autotune``: :class:`Config` (one choice of constexpr values and kernel
options), :class:`TuneRecord` (what was chosen for one key, and how), the checks of
``prune_configs_by=`` made when a kernel is decorated, the environment switches
(``SPARSILE_AUTOTUNE``, ``SPARSILE_AUTOTUNE_PRINT``) and the autotuner's diagnostic codes."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..frontend.diagnostics import LaunchError
from .kernel_options import KERNEL_OPTIONS

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


def tuning_enabled() -> bool:
    """Whether tuning is on (``SPARSILE_AUTOTUNE=0`` turns it off)."""
    return os.environ.get(ENV_AUTOTUNE, "1").strip().lower() not in _OFF


def printing_requested() -> bool:
    """Whether SPARSILE_AUTOTUNE_PRINT asks for progress and chosen configs on stderr."""
    return os.environ.get(ENV_PRINT, "").strip().lower() in {"1", "true", "yes", "on"}


_PRUNE_KEYS = ("early_config_prune", "perf_model", "top_k")


def checked_prune(kernel: str, prune: Any) -> dict[str, Any]:
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

