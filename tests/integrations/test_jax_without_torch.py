"""The JAX integration's tests need no torch: with torch missing (``sys.modules["torch"] = None``,
as test_torch_sparsify.test_missing_torch_is_sp0900 does), the property tests of
test_jax_properties.py are still collected, not skipped with the module whose reference they use."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sparsile.tests.support import ROOT

pytest.importorskip("jax")

PROPERTY_TESTS = 7
"""The tests of test_jax_properties.py (its ``@given`` functions)."""


def test_the_jax_property_tests_are_collected_without_torch() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import pytest
        sys.exit(pytest.main(["--collect-only", "-q", "-n", "0", "-rs", "tests/integrations/test_jax_properties.py"]))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ":".join(p for p in sys.path if p)})
    collected = [line for line in run.stdout.splitlines() if "test_jax_properties.py::" in line]
    assert run.returncode == 0 and len(collected) == PROPERTY_TESTS, run.stdout + run.stderr
