"""Tuning the torch layer's tiled kernel (stdlib/kernels/linear_tuning.py): the configs applied to a
linear plan, the tuning loop over them in the interpreter with a fake timer (a wrong config skipped,
the fastest correct one kept, y checked against float64), the dtype check and the command line's
``--linear``. The GPU run: scripts/gpu_runs.sh (tune-linear), benchmarks/RESULTS.md."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from sparsile.cli import main
from sparsile.frontend.diagnostics import LaunchError
from sparsile.stdlib.kernels import linear_tuning as lt
from sparsile.stdlib.kernels.gemm_config import GemmConfig
from sparsile.stdlib.kernels.linear import plan_sparse_linear
from sparsile.stdlib.kernels.tuning import TuneTarget, tune_plan
from sparsile.tests.stdlib.test_linear_api import assert_linear_close, problem


@pytest.fixture(autouse=True)
def _tiled_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")


def test_a_config_applied_to_a_linear_plan() -> None:
    weight, x = problem("bf16", 300, 80, 256, seed=1)
    base = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=132)
    assert lt.default_linear_config(base) == GemmConfig(base.bn, 4, base.split_k, False, 16)
    split = lt.with_linear_config(base, GemmConfig(32, 3, 4, False, 8), 132, interpret=True)
    assert (split.bn, split.split_k, split.stages, split.group_m, split.pair) == (32, 4, 3, 8, 0)
    assert split.workspace.shape == (4, 80, 300) and len(split.launches()) == 2
    pair = lt.with_linear_config(base, GemmConfig(64, 5, 1, True), 132, interpret=True)
    assert pair.pair == 2 * 2 * 2 and pair.workspace is None and pair.kernel.name == "sparse_linear_bf16_pair_mt"
    assert pair.launches()[0][3]["STAGES"] == 5
    assert lt.with_linear_config(base, GemmConfig(64, 5, 1, True), 7, interpret=True).pair == 6  # an even grid


def test_tuning_a_linear_plan_keeps_the_fastest_correct_config() -> None:
    """A config whose y is wrong is skipped even when it is 'fastest'; the fastest correct one wins,
    and the plan it makes computes y within the float64 bound."""
    weight, x = problem("f16", 130, 96, 192, seed=3)
    base = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=132)
    default = lt.default_linear_config(base)
    wrong, good = GemmConfig(16, 3, 1), GemmConfig(32, 3, 2, False, 8)

    def run(plan: Any, config: GemmConfig, interpret: bool) -> Any:
        y = plan.run(interpret)
        if config == wrong:
            y[0, 0] += 100.0
        return y
    target = TuneTarget(lt.LINEAR_TARGET.default, lt.LINEAR_TARGET.configure, run, lt.LINEAR_TARGET.dims,
                        lt.LINEAR_TARGET.name)
    times = {default: 3.0, wrong: 0.5, good: 1.0}
    said: list[str] = []
    entry = tune_plan(base, 132, lambda fn, **kw: times[fn.config], space=lambda *a: [wrong, good],
                      interpret=True, say=lambda text, end="\n": said.append(text), target=target)
    assert GemmConfig.from_json(entry["config"]) == good and entry["default_us"] == 3000.0
    assert entry["skipped"] == {str(wrong): "wrong result against the default config"}
    assert said[-1].startswith("\rsparsile tune linear-f16 130x96x192: BN=32 STAGES=3 split_k=2")
    best = lt.with_linear_config(base, good, 132, interpret=True)
    best.out[...] = np.nan
    assert_linear_close(best.run(), weight, x, 192, "f16", "float16")


def test_the_space_is_the_layer_s_problem() -> None:
    """M out features, N = T tokens, K padded: what config_space sizes its split-K by."""
    weight, x = problem("bf16", 200, 70, 100, seed=2)
    base = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=132)
    assert lt.LINEAR_TARGET.dims(base) == (200, 70, 112)  # K padded to 16-byte rows of the values (K/2)
    assert lt.LINEAR_TARGET.name(base) == "linear-bf16 200x70x100"


def test_dtypes_without_a_linear_kernel_are_refused() -> None:
    with pytest.raises(LaunchError) as e:
        lt.tune_sparse_linear([(256, 128, 256)], dtypes=["s8"])
    assert e.value.code == "SP0778" and "no sparse linear kernel for dtype 's8'" in str(e.value)


def test_cli_tune_linear_needs_a_gpu(tmp_path: Any) -> None:
    from sparsile.backend import runtime

    out, err = io.StringIO(), io.StringIO()
    assert main(["tune", "--linear", "4096x12"], stdout=out, stderr=err) == 2
    if not runtime.has_gpu():
        assert main(["tune", "--linear", "4096x256x4096"], stdout=out, stderr=err) == 3
        assert "no NVIDIA GPU is available" in err.getvalue()


def test_shapes_are_parsed_and_checked_before_the_gpu() -> None:
    with pytest.raises(LaunchError) as e:
        lt.tune_sparse_linear(["4096x12"], dtypes=["bf16"])
    assert e.value.code == "SP0778" and "'4096x12'" in str(e.value)


def test_the_layer_s_space_has_no_inflight_configs() -> None:
    """The layer's kernels (sparse_linear_<t>) have no INFLIGHT constexpr and its configs are run
    without it: e4m3's INFLIGHT twins would be timed again as the same launches (and a noisy win
    written to the table as INFLIGHT: 1)."""
    from sparsile.stdlib.kernels.gemm_choice import KERNELS
    from sparsile.stdlib.kernels.tuning import config_space

    assert any(c.inflight for c in config_space(KERNELS["e4m3"], 8192, 4096, 8192, 132))
    space = lt.layer_space(KERNELS["e4m3"], 8192, 4096, 8192, 132)
    assert space and not any(c.inflight for c in space)
