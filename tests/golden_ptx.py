"""Golden snapshots of shipped kernels (tests/golden/*.ptx: PTX; tests/golden/*.ir: the typed IR after
layout inference): reviewed by reading, regenerated deliberately with SPARSILE_UPDATE_GOLDEN=1."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"


def check_golden(ptx: str, name: str, what: str = "PTX") -> None:
    """Fail with the first lines of the diff when ``ptx`` (text of kind ``what``) differs from
    ``tests/golden/<name>``."""
    path = GOLDEN / name
    if os.environ.get("SPARSILE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ptx)
    want = path.read_text()
    if ptx != want:
        diff = "\n".join(list(difflib.unified_diff(want.splitlines(), ptx.splitlines(), "golden", "now",
                                                   lineterm=""))[:80])
        pytest.fail(f"the {what} of {name} changed; review the diff and regenerate with SPARSILE_UPDATE_GOLDEN=1 "
                    f"if it is intended:\n{diff}")
