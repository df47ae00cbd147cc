"""Issue 15 item 5: hypothesis never uses an example database from the checkout, and CI (env CI
set, as .ci/run does) runs the derandomized profile (conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]


def test_no_example_database_by_default() -> None:
    from hypothesis.configuration import storage_directory

    assert settings.default.database is None
    where = storage_directory("x")  # a StorageDirectory in newer hypothesis, a Path before (6.100)
    home = Path(getattr(where, "home_directory", where)).resolve()
    assert home != ROOT and ROOT not in home.parents  # nothing of hypothesis's in the checkout


def test_ci_profile_is_derandomized() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest; from hypothesis import settings; "
            "print(settings.default.derandomize, settings.default.database)")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    for ci, want in ((None, "False None"), ("1", "True None")):
        run_env = env if ci is None else {**env, "CI": ci}
        out = subprocess.run([sys.executable, "-c", code, str(ROOT)], env=run_env, capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == want, (ci, out)
    assert 'export CI="${CI:-1}"' in (ROOT / ".ci" / "run").read_text()
