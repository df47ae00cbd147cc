"""The oldest PyTorch that ``sparsile.torch`` supports, and the SP0908 check of the installed one.

Kept out of the :mod:`.torch` package (and free of torch imports) so that ``sparsile``'s SP0900 help
can name the floor without importing either. The floor is the oldest release the torch CPU tests
were run on and passed (docs/torch.md, Supported PyTorch): the integration uses parts of torch that
change between releases, and on an older one it would fail somewhere inside torch, or give results
nobody checked, where SP0908 says what to install.
"""

from __future__ import annotations

from ..install_hints import torch_install_hint
from .errors import SP_TORCH_VERSION, IntegrationError
from .versions import release

TORCH_FLOOR = (2, 10)
"""(major, minor) of the oldest supported torch release; pyproject's ``torch`` extra says the same."""

TORCH_REQUIREMENT = f"torch>={TORCH_FLOOR[0]}.{TORCH_FLOOR[1]}"


class TorchVersionError(IntegrationError, ImportError):
    """SP0908: ``import sparsile.torch`` with a torch older than :data:`TORCH_FLOOR`. An ImportError
    as SP0900 (no torch) and SP0937 (jax too old) are, so that ``hasattr(sparsile, "torch")`` is
    False and code that tries the import and falls back keeps working."""


def require_torch_release(version: str) -> None:
    """SP0908 where ``version`` (``torch.__version__``) is older than :data:`TORCH_FLOOR`."""
    found = release(version)  # (2, 10, 0) is not below (2, 10): a pre-release of the floor is that release
    if found is not None and found < TORCH_FLOOR:
        floor = f"{TORCH_FLOOR[0]}.{TORCH_FLOOR[1]}"
        raise TorchVersionError(SP_TORCH_VERSION, f"sparsile.torch needs PyTorch {floor} or later, found {version}",
                               help=f"{torch_install_hint(TORCH_REQUIREMENT, upgrade=True)}; docs/torch.md lists "
                                    "the versions checked")
