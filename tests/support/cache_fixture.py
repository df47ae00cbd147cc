"""The pytest fixture of an empty default compile cache, for the test modules that count compiles
(bind it in a module as ``fresh_cache = cache_fixture.fresh_cache``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparsile.driver import cache as cache_mod


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Iterator[cache_mod.CompileCache]:
    """An empty default compile cache in ``tmp_path`` (and the usual one afterwards)."""
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    yield cache_mod.default_cache()
    cache_mod.reset_default_cache()
