"""README.md's sample ``sparsile demo`` output is what the demo prints now (issue 15), up to the
run's timings, cubin sizes and the machine line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparsile import demo

README = Path(__file__).resolve().parents[1] / "README.md"


def _masked(text: str) -> list[str]:
    text = re.sub(r"\(\d+(\.\d+)? s\)", "(T s)", text)
    text = re.sub(r"\d+(\.\d+)? s in all", "T s in all", text)
    text = re.sub(r"cubin \d+ B", "cubin N B", text)
    return [line.rstrip() for line in text.strip().splitlines() if not line.lstrip().startswith("machine:")]


def test_readme_sample_matches_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    sample = re.search(r"```text\n(sparsile \S+ demo:.*?)```", README.read_text(), re.S)
    assert sample is not None, "README.md lost its sample demo output"
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("the README shows the demo on a machine without a GPU")
    assert demo.main([]) == 0
    assert _masked(capsys.readouterr().out) == _masked(sample.group(1))

