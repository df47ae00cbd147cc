"""The pieces every descriptor module of ``target/`` shares: :class:`Problem`, the violated rule that
``*_problems(...)`` return and the legality pass turns into a diagnostic, and the helpers that pack
and unpack the bit fields of a descriptor word (``docs/hardware.md`` §1.3, §1.5, §4.3 give the
fields; ptxas checks none of them, §0 item 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..frontend.diagnostics import InternalError


@dataclass(frozen=True)
class Problem:
    """One violated rule: ``code`` (SP05xx), a one-line ``message`` naming the value found,
    a ``help`` line naming the fix, and the descriptor ``field`` it is about."""

    code: str
    message: str
    help: str
    field: str = ""


def pack_fields(fields: Iterable[tuple[int, int, int]]) -> int:
    """OR together ``(value, lsb, width)`` fields; each value must fit its width."""
    word = 0
    for value, lsb, width in fields:
        if not 0 <= value < (1 << width):
            raise InternalError(f"descriptor field at bit {lsb} (width {width}) cannot hold {value}")
        word |= value << lsb
    return word


def field_bits(word: int, lsb: int, width: int) -> int:
    return (word >> lsb) & ((1 << width) - 1)


def raise_if_problems(problems: list[Problem], what: str) -> None:
    if problems:
        listed = "; ".join(f"[{p.code}] {p.message}" for p in problems)
        raise InternalError(f"{what} built with unchecked problems: {listed}")


def join_values(values: Iterable[object]) -> str:
    return ", ".join(str(v) for v in values)


def code_name(table: dict[str, int], code: int, what: str) -> str:
    for name, value in table.items():
        if value == code:
            return name
    raise ValueError(f"undefined {what} code {code}")


__all__ = ["Problem", "code_name", "field_bits", "join_values", "pack_fields", "raise_if_problems"]
