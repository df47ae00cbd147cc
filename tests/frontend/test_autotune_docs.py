"""docs/autotune.md's example runs on the CPU: the decorated kernel is tuned with a fake timer
(``benchmarker=``, as tests/frontend/test_autotune.py does) and launched in the interpreter; the
key, the summary and the disk cache file are what the doc says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparsile.driver.autotune import Autotuner

DOC = Path(__file__).resolve().parents[2] / "docs" / "autotune.md"
TIMES = {256: 3.0, 1024: 1.0, 4096: 2.0}  # ms by BLOCK: the second config wins


def example() -> str:
    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M) if "sp.autotune(" in b]
    return block


def test_the_example_tunes_launches_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPARSILE_AUTOTUNE", raising=False)
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self: "Fake GPU")
    block = example()
    definition, call = block.split("\nadd[", 1)
    assert 'key=["n"])' in definition
    timed: list[int] = []

    def bench(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        assert (warmup, rep) == (10, 50)  # the defaults the doc gives
        timed.append(fn.config.kwargs["BLOCK"])
        return TIMES[fn.config.kwargs["BLOCK"]]

    path = tmp_path / "autotune_example.py"  # a file, so that @jit reads the function's source
    path.write_text(definition.replace('key=["n"])', 'key=["n"], benchmarker=bench)'))
    n = 4096
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = np.zeros_like(x)
    env: dict[str, Any] = {"__name__": "doc_example", "bench": bench, "x": x, "y": y, "out": out, "n": n}
    exec(compile(path.read_text(), str(path), "exec"), env)
    add = env["add"]
    assert isinstance(add, Autotuner)
    add.launch_kernel = lambda grid, args, kwargs, stream: add.kernel.interpret[grid](*args, **kwargs)
    exec(compile("add[" + call, str(DOC), "exec"), env)
    assert np.array_equal(out, x + y)
    assert sorted(timed) == [256, 1024, 4096]  # the dict config too
    summary = capsys.readouterr().out
    assert summary.strip() == add.summary()
    key = "n=4096; dtypes: x=float32 y=float32 out=float32"
    assert f"`{key}`" in DOC.read_text()  # the doc's example of a cache key
    assert f"[Fake GPU|{key}] -> BLOCK: 1024, num_warps: 4 (tuned" in summary
    (file,) = (tmp_path / "autotune").iterdir()  # $SPARSILE_CACHE_DIR/autotune/<kernel>-<hash>.json
    assert re.fullmatch(r"add-[0-9a-f]+\.json", file.name)
    assert f"Fake GPU|{key}" in file.read_text()
