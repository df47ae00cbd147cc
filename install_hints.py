"""The install hints of the diagnostics that need an optional extra (SP0612, SP0816, SP0900, SP0908,
SP0930, SP0937): each installs as README.md does, from the checkout (``pip install -e '.[EXTRA]'``),
never ``pip install 'sparsile[EXTRA]'``, which asks the package index for a project named sparsile.

Imports nothing (layer 0, docs/architecture.md): the backend and the package face build their help
lines here. The requirement each caller passes is pyproject's for that extra
(tests/test_install_hints.py checks that they agree).
"""

from __future__ import annotations

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""The index of torch's CPU build (README.md: the default Linux wheel brings about 5 GB of CUDA libraries)."""


def checkout_install(extra: str) -> str:
    """How README.md installs ``extra``: ```pip install -e '.[EXTRA]'` in the sparsile checkout``."""
    return f"`pip install -e '.[{extra}]'` in the sparsile checkout"


def install_hint(extra: str, requirement: str, *, upgrade: bool = False) -> str:
    """The help of a missing (``upgrade``: too old) package of ``extra``: the checkout's extra, or the
    package alone, e.g. ``install jax>=0.4.36: `pip install -e '.[jax]'` in the sparsile checkout, or
    `pip install 'jax>=0.4.36'```."""
    flag = "-U " if upgrade else ""
    return f"install {requirement}: {checkout_install(extra)}, or `pip install {flag}'{requirement}'`"


def torch_install_hint(requirement: str, *, upgrade: bool = False) -> str:
    """The help of a missing (``upgrade``: too old) torch: the ``[torch]`` extra of the checkout, with
    torch's CPU build installed first on a machine without a GPU, as README.md says."""
    flag = "-U " if upgrade else ""
    return (f"install {requirement}: {checkout_install('torch')} (without a GPU, "
            f"`pip install {flag}torch --index-url {TORCH_CPU_INDEX}` first)")


__all__ = ["TORCH_CPU_INDEX", "checkout_install", "install_hint", "torch_install_hint"]
