"""How the torch integration's reports write counts: "1 linear layer", "2 linear layers", "0 MLPs"."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 ("1 linear layer", "2 linear layers", "0 MLPs")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
