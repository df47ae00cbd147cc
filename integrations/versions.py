"""The release numbers of an installed package's version string, for the import checks of the
optional integrations (torch_version.py: SP0908; jax/requires.py: SP0937). Imports neither."""

from __future__ import annotations

import re


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers at the start of a version string ("2.10.0a0+git1234" -> (2, 10, 0),
    "0.5.0.dev20250101" -> (0, 5, 0)), or None when it does not start with a number."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else None
