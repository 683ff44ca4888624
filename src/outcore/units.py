"""Byte quantities: parsing budgets ("12GB", "11.5GiB", 1_000_000) and printing them."""

from __future__ import annotations

import math
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
ACCEPTED = "a number of bytes or a string such as '512MB', '12GB' or '11.5GiB'"
_PATTERN = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Return a byte count from an int, a float, or a string like "12GB" or "11.5GiB".

    Decimal units (KB, MB, GB) are powers of 1000; binary units (KiB, MiB, GiB) and the
    one-letter forms (K, M, G) are powers of 1024. A string without a unit is bytes.

    Raises (all ``ValueError`` subclasses naming the value and the accepted forms):
        UnreadableBudgetError: not a number nor a string of the forms above (or a bool).
        NonPositiveBudgetError: a negative quantity.
        NonFiniteBudgetError: infinite or NaN, including strings that overflow ("1e400").
    """
    from outcore.errors import NonFiniteBudgetError, NonPositiveBudgetError, UnreadableBudgetError

    if isinstance(value, bool):
        raise UnreadableBudgetError(value, ACCEPTED, "A bool is not a size.")
    if isinstance(value, (int, float)):
        number, scale = float(value), 1
    else:
        match = _PATTERN.match(str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise UnreadableBudgetError(value, ACCEPTED,
                                        "Units are B, KB, MB, GB, TB (powers of 1000) or KiB, "
                                        "MiB, GiB, TiB, K, M, G (powers of 1024).")
        number, scale = float(match.group(1)), _UNITS[match.group(2).lower()]
    if not math.isfinite(number * scale):
        raise NonFiniteBudgetError(value, "a finite number of bytes",
                                   "Give a size such as '12GB'.")
    if number < 0:
        raise NonPositiveBudgetError(value, "a non-negative number of bytes",
                                     "Give a size such as '12GB'.")
    return int(value) if isinstance(value, int) else round(number * scale)


def has_unit(value: int | float | str) -> bool:
    """True when ``value`` is a string that names its unit ("12GB"), False for "12" or 12."""
    match = _PATTERN.match(str(value)) if isinstance(value, str) else None
    return bool(match and match.group(2))


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
