"""The install hints (install_hints.py) install as README.md does, from the checkout: no help line,
doc or script of the checkout says ``pip install 'sparsile[EXTRA]'``, which asks the package index for
a project named sparsile; and the requirement each hint names is pyproject's for that extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from sparsile.backend.toolchain.whole_program import PTXAS_REQUIREMENT
from sparsile.install_hints import checkout_install, install_hint, torch_install_hint
from sparsile.integrations.jax.requires import JAX_MIN_TEXT
from sparsile.integrations.torch_version import TORCH_REQUIREMENT
from sparsile.stdlib.viz import MATPLOTLIB_REQUIREMENT
from sparsile.tests.test_packaging import source_files

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
INDEX_FORM = re.compile(r"sparsile\[(" + "|".join(map(re.escape, EXTRAS)) + r")\]")


@pytest.mark.parametrize(("extra", "requirement"), [
    ("torch", TORCH_REQUIREMENT), ("jax", f"jax>={JAX_MIN_TEXT}"), ("viz", MATPLOTLIB_REQUIREMENT),
    ("ptxas", PTXAS_REQUIREMENT)])
def test_each_hint_names_the_requirement_of_its_extra(extra: str, requirement: str) -> None:
    assert EXTRAS[extra] == [requirement]


def test_the_hints_install_from_the_checkout() -> None:
    assert checkout_install("viz") == "`pip install -e '.[viz]'` in the sparsile checkout"
    assert install_hint("jax", "jax>=0.4.36") == (
        "install jax>=0.4.36: `pip install -e '.[jax]'` in the sparsile checkout, or `pip install 'jax>=0.4.36'`")
    assert install_hint("jax", "jax>=0.4.36", upgrade=True).endswith(", or `pip install -U 'jax>=0.4.36'`")
    assert torch_install_hint("torch>=2.10", upgrade=True) == (
        "install torch>=2.10: `pip install -e '.[torch]'` in the sparsile checkout (without a GPU, "
        "`pip install -U torch --index-url https://download.pytorch.org/whl/cpu` first)")


def test_no_file_of_the_checkout_installs_an_extra_from_the_index() -> None:
    found = [f"{path}:{n}: {line.strip()}" for path in source_files() if path.suffix in (".py", ".md", ".toml")
             for n, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
             if INDEX_FORM.search(line)]
    assert not found, "install extras as README.md does (install_hints.py):\n" + "\n".join(found)
