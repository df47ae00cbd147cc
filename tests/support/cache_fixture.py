"""Counting compiles in tests: the pytest fixture of an empty default compile cache (bind it in a
module as ``fresh_cache = cache_fixture.fresh_cache``) and a spy on ``compile_function``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from sparsile.driver import cache as cache_mod
from sparsile.driver import compiler


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Iterator[cache_mod.CompileCache]:
    """An empty default compile cache in ``tmp_path`` (and the usual one afterwards)."""
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    yield cache_mod.default_cache()
    cache_mod.reset_default_cache()


def spy_compiles(monkeypatch, delay: float = 0.0) -> list[str]:
    """The names of the kernels ``compile_function`` compiles from now on (cache hits do not appear);
    ``delay``: seconds each compile waits first (two threads asking for one kernel then both reach
    ``compile_cached`` before either has stored it)."""
    seen: list[str] = []
    real = compiler.compile_function

    def spy(func, *args, **kwargs):
        seen.append(func.name)
        if delay:
            time.sleep(delay)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(compiler, "compile_function", spy)
    return seen


def forget_launchers(monkeypatch, kernels: Iterable[Any]) -> None:
    """Make ``kernels`` find no launcher built by an earlier test of this process (a kernel keeps its
    loaded specializations in ``_launchers`` and its fast-path entries in ``_fast_launches``, which
    no compile-cache reset reaches): each starts with none, and its own are back afterwards."""
    for kernel in {id(k): k for k in kernels}.values():
        monkeypatch.setitem(kernel.__dict__, "_launchers", {})
        monkeypatch.delitem(kernel.__dict__, "_fast_launches", raising=False)
