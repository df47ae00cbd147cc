"""sparsile.torch.warm_up on the GPU (integrations/torch/first_call.py): after it, the first eager
calls of a sparsified model at the warmed token counts compile nothing (their launch records'
``prepare`` finds every kernel in the compile cache) and give the same outputs as a model that was
not warmed up; worker processes (jobs=2) and threads of this process (no disk cache) alike."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.driver import cache as cache_mod  # noqa: E402
from sparsile.tests.support import cache_fixture  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _model(dtype: str) -> torch.nn.Module:
    model = torch.nn.Sequential(linear(512, 256, seed=1, device="cuda"), linear(256, 512, seed=2, device="cuda"))
    spt.sparsify_(model.to(torch.bfloat16), dtype=dtype)
    return model


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("cache_dir", ["disk", "off"])
def test_the_first_calls_after_warm_up_compile_nothing(tmp_path, monkeypatch, dtype, cache_dir) -> None:
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache") if cache_dir == "disk" else "off")
    cache_mod.reset_default_cache()
    compiled = cache_fixture.spy_compiles(monkeypatch)
    try:
        model = _model(dtype)
        report = spt.warm_up(model, tokens=(1, 16, 300), jobs=2)
        assert report.compiled == len(report.kernels) > 0 and report.cached == 0
        compiled.clear()
        xs = [torch.randn(t, 256, device="cuda").to(torch.bfloat16) for t in (1, 16, 300)]
        with torch.inference_mode():
            ys = [model(x) for x in xs]
        torch.cuda.synchronize()
        assert compiled == []
        cache_mod.reset_default_cache()
        monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, "off")
        cold = _model(dtype)
        cold.load_state_dict(model.state_dict())
        with torch.inference_mode():
            for x, y in zip(xs, ys, strict=True):
                assert torch.equal(cold(x), y)
    finally:
        cache_mod.reset_default_cache()
