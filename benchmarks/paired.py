"""Paired comparison of two tools' step times, round by round (used by ``vs_pytorch.py``).

Each round of ``vs_pytorch.py`` runs every tool once, a peer and the outcore rows matched
to it back to back (``round_order``), so round ``i``'s times of the two were taken under
nearly the same machine load. The statistic:

* per round ``i`` the ratio ``r_i = outcore_i / peer_i`` (every round, none dropped);
* its median, and a distribution-free confidence interval for that median from order
  statistics: with the ratios sorted ``r_(1) <= ... <= r_(n)``, ``[r_(k), r_(n+1-k)]``
  covers the true median with probability ``1 - 2 * P(Binomial(n, 1/2) < k)``; ``k`` is the
  largest whose coverage is at least ``level`` (0.95), or ``k = 1`` (the whole range) when
  ``n`` is too small to reach it, and the achieved coverage is reported either way;
* **resolved** when the interval excludes 1: faster if its upper end is below 1, slower if
  its lower end is above 1.

Invariants: the rounds are paired by index, so both tools must have the same number of
rounds; the computation is deterministic (no resampling), so the same times give the same
interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Paired:
    """Median of the per-round ratios, its interval and the interval's coverage."""

    median: float
    low: float
    high: float
    coverage: float
    rounds: int

    @property
    def verdict(self) -> str:
        """"faster" / "slower" when the interval excludes 1, else "unresolved"."""
        if self.high < 1.0:
            return "faster"
        if self.low > 1.0:
            return "slower"
        return "unresolved"

    def text(self) -> str:
        return (f"{self.median:.3f}x [{self.low:.3f}, {self.high:.3f}] "
                f"({self.coverage:.1%} CI, {self.rounds} paired rounds)")


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return sum(math.comb(n, j) for j in range(k)) / 2 ** n


def paired_ratio(outcore: Sequence[float], peer: Sequence[float],
                 level: float = 0.95) -> Paired:
    """The paired statistic of the module docstring for two tools' per-round seconds."""
    if len(outcore) != len(peer) or not outcore:
        raise ValueError(f"paired rounds need equal, non-zero counts (got {len(outcore)} and "
                         f"{len(peer)}): run every tool once per round")
    ratios = sorted(o / p for o, p in zip(outcore, peer, strict=True))
    n = len(ratios)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _below(n, k + 1) >= level:
        k += 1
    return Paired(statistics.median(ratios), ratios[k - 1], ratios[n - k],
                  1 - 2 * _below(n, k), n)


def round_order(names: Sequence[str], rng: random.Random | None = None) -> list[str]:
    """One round's order: each peer with the ``... @ <peer>`` tools matched to it as one
    block (the block's members shuffled), the blocks shuffled; every name exactly once."""
    rng = rng or random.Random()
    blocks: dict[str, list[str]] = {}
    for name in names:
        peer = name.split(" @ ", 1)[1] if " @ " in name else name
        blocks.setdefault(peer, []).append(name)
    groups = list(blocks.values())
    rng.shuffle(groups)
    order: list[str] = []
    for group in groups:
        members = list(group)
        rng.shuffle(members)
        order.extend(members)
    return order
