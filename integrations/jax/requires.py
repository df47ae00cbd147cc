"""The oldest JAX that ``sparsile.jax`` supports, and the import-time check against it (SP0937).

``JAX_MIN`` is the floor of pyproject's ``[jax]`` extra (tests/integrations/test_jax_call.py checks
that they agree): the oldest release whose CPU tests were run and passed (docs/jax.md, "Install").
An older JAX fails inside the integration with errors that do not say why (jax 0.4.35's
``jax.tree_util.register_dataclass`` needs its field lists), so the import refuses it first. This
module imports nothing from JAX: it is given the version string.
"""

from __future__ import annotations

from ...install_hints import install_hint
from ..versions import release
from .errors import SP_JAX_TOO_OLD

JAX_MIN = (0, 4, 36)
"""The oldest jax release the CPU tests passed on."""
JAX_MIN_TEXT = ".".join(map(str, JAX_MIN))


class JaxVersionError(ImportError):
    """SP0937: ``import sparsile.jax`` with a JAX older than :data:`JAX_MIN`; ``code``, ``message``
    and ``help`` as the other diagnostics have them."""

    def __init__(self, version: str):
        self.code = SP_JAX_TOO_OLD
        self.message = f"sparsile.jax needs jax>={JAX_MIN_TEXT}, but jax {version} is installed"
        self.help = install_hint("jax", f"jax>={JAX_MIN_TEXT}", upgrade=True)
        super().__init__(f"error[{self.code}]: {self.message}\n = help: {self.help}", name="jax")


def check_jax_version(version: str) -> None:
    """Raise :class:`JaxVersionError` for a jax ``version`` older than :data:`JAX_MIN` (a version
    that names no release is let through: a source build can call itself anything)."""
    found = release(version)
    if found is not None and found < JAX_MIN:
        raise JaxVersionError(version)
