"""The JAX versions sparsile.jax supports: the floor of pyproject's ``[jax]`` extra is the one the
import checks, and an older jax is refused at ``import sparsile.jax`` with SP0937 (docs/jax.md,
"Install"), not with an error from inside the integration."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sparsile.integrations.jax.requires import JAX_MIN, JAX_MIN_TEXT, JaxVersionError, check_jax_version, release

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=120)


def test_pyproject_floor_is_the_checked_floor() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["jax"] == [f"jax>={JAX_MIN_TEXT}"]
    assert JAX_MIN_TEXT == "0.4.36" and JAX_MIN == (0, 4, 36)


@pytest.mark.parametrize(("text", "want"), [("0.4.36", (0, 4, 36)), ("0.10.2", (0, 10, 2)), ("0.9.0.1", (0, 9, 0, 1)),
                                            ("0.5.0.dev20250101", (0, 5, 0)), ("0.4.36+cuda", (0, 4, 36)),
                                            ("unknown", None)])
def test_release_numbers(text: str, want: tuple[int, ...] | None) -> None:
    assert release(text) == want


@pytest.mark.parametrize("version", ["0.4.36", "0.4.37", "0.5.0.dev20250101", "0.9.0.1", "0.10.2", "0.11.2", "1.0",
                                     "unknown"])
def test_supported_versions_pass(version: str) -> None:
    check_jax_version(version)


@pytest.mark.parametrize("version", ["0.4.35", "0.4.6", "0.3.25", "0.4.35.dev20241001"])
def test_older_versions_are_sp0937(version: str) -> None:
    with pytest.raises(JaxVersionError) as info:
        check_jax_version(version)
    e = info.value
    assert isinstance(e, ImportError) and e.name == "jax"
    assert (e.code, e.message) == ("SP0937", f"sparsile.jax needs jax>=0.4.36, but jax {version} is installed")
    assert e.help == ("install jax>=0.4.36: `pip install -e '.[jax]'` in the sparsile checkout, or "
                      "`pip install -U 'jax>=0.4.36'`")  # as README.md installs: from the checkout
    assert str(e).startswith(f"error[SP0937]: {e.message}\n = help: ")


def test_import_with_an_older_jax_is_sp0937() -> None:
    """jax 0.4.35 failed inside linear.py (register_dataclass without field lists: a TypeError); the
    import now refuses it first. The installed jax stands in for an old one by its version string."""
    pytest.importorskip("jax")
    r = _python("import jax\njax.__version__ = '0.4.35'\nimport sparsile\ntry:\n import sparsile.jax\n"
                "except ImportError as e:\n print(type(e).__name__, e.code, e.message)\n"
                "print(hasattr(sparsile, 'jax'))")
    assert r.stdout.splitlines() == [
        "JaxVersionError SP0937 sparsile.jax needs jax>=0.4.36, but jax 0.4.35 is installed", "False"], r.stderr


def test_import_with_a_supported_jax_works() -> None:
    jax = pytest.importorskip("jax")
    r = _python("import jax\njax.__version__ = '0.4.36'\nimport sparsile.jax as j\nprint(j.call.__name__)")
    assert r.stdout.strip() == "call", r.stderr
    assert release(jax.__version__) >= JAX_MIN
