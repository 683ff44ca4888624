"""The model's units and its sparse constraint rows (shared by ``formulation`` and
``d2h_windows``).

The model counts bytes in GiB (``BYTES``) and seconds in milliseconds (``SECONDS``), so that
its coefficients stay near 1 (HiGHS misjudges feasibility when bytes and seconds meet in
one model unscaled).
"""

from __future__ import annotations

import math

BYTES = 2.0**-30
SECONDS = 1e3


class Rows:
    """A sparse constraint matrix built row by row: ``lo <= sum entries <= hi`` per row; zero
    coefficients are dropped."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, entries: dict[int, float], lo: float, hi: float = math.inf) -> None:
        row = len(self.lo)
        for col, val in entries.items():
            if val:
                self.r.append(row)
                self.c.append(col)
                self.v.append(val)
        self.lo.append(lo)
        self.hi.append(hi)
