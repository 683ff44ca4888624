"""Byte quantities: parsing budgets ("12GB", "11.5GiB", 1_000_000) and printing them."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Return a byte count from an int, a float, or a string like "12GB" or "11.5GiB".

    Decimal units (KB, MB, GB) are powers of 1000; binary units (KiB, MiB, GiB) and the
    one-letter forms (K, M, G) are powers of 1024. Raises ValueError for negative or
    unparseable values, naming the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"a byte quantity cannot be a bool: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a byte quantity must be non-negative, got {value}")
        return int(value)
    match = _PATTERN.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as bytes: use a number of bytes or a string such as "
            "'512MB', '12GB' or '11.5GiB'"
        )
    number = float(match.group(1))
    return round(number * _UNITS[match.group(2).lower()])


def format_bytes(n: int | float) -> str:
    """Human-readable binary size, e.g. 1536 -> '1.5 KiB'."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
