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


@pytest.mark.parametrize("calls", ["both", "eager"])
def test_the_first_compiled_calls_after_warm_up(tmp_path, monkeypatch, calls) -> None:
    """torch.compile'd calls of an e4m3 split-K weight (k/v of Llama-3-8B, 1024 x 4096) at T = 1 and
    16: after warm_up's default (calls="both") they compile nothing; after the eager calls' list
    alone they compile exactly the specializations of the traced records that list lacks
    (``first_call_launches(traced=True)`` against the eager one: on the H200, the decode kernel of
    the fp8 x with split-K reduced in the kernel)."""
    from sparsile.integrations.torch import first_call as wu

    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    compiled = cache_fixture.spy_compiles(monkeypatch)
    try:
        model = torch.nn.Sequential(linear(1024, 4096, seed=1, device="cuda"))
        spt.sparsify_(model.to(torch.bfloat16), dtype="e4m3")
        layer, tokens = model[0], (1, 16)

        def specs(traced: bool) -> dict:
            launches = [launch for t in tokens for launch in wu.first_call_launches(layer, t, traced=traced)]
            return {(id(spec.kernel), spec.key): spec for _, spec in wu.distinct_specializations(launches)}

        traced, eager = specs(True), specs(False)
        # an earlier test of this worker (this one's other parametrization) may have loaded them
        cache_fixture.forget_launchers(monkeypatch, [spec.kernel for spec in (*traced.values(), *eager.values())])
        traced = {key: spec.kernel.name for key, spec in traced.items()}
        missing = sorted(name for key, name in traced.items() if key not in eager) if calls == "eager" else []
        spt.warm_up(model, tokens=tokens, jobs=2, calls=calls)
        compiled.clear()
        fast = torch.compile(model, backend="eager", fullgraph=True)
        with torch.no_grad():
            for t in tokens:
                y = fast(torch.randn(t, 4096, device="cuda").to(torch.bfloat16))
                assert y.shape == (t, 1024) and bool(torch.isfinite(y).all())
        torch.cuda.synchronize()
        assert sorted(compiled) == missing
    finally:
        cache_mod.reset_default_cache()
