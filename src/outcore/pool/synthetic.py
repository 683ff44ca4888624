"""Random block lifetimes shaped like a training step, for property tests and benchmarks.

Most blocks live a few steps (gradients, temporaries); ``long_fraction`` of them live long
(saved activations); sizes are log-uniform between ``min_size`` and ``max_size``. The
mobility follows the lifetime (short: movable, long: temporary, a few small: reclaimed),
so every policy, GTBM included, can place them.
"""

from __future__ import annotations

import math
import random

from outcore.pool.blocks import Block


def random_blocks(n: int, seed: int = 0, steps: int | None = None, long_fraction: float = 0.1,
                  mean_short: float = 8.0, min_size: int = 256, max_size: int = 64 << 20
                  ) -> list[Block]:
    """``n`` blocks over ``steps`` steps (default ``2 * n``), reproducible from ``seed``."""
    rng = random.Random(seed)
    steps = steps or 2 * n
    lo, hi = math.log(min_size), math.log(max_size)
    blocks = []
    for i in range(n):
        start = rng.randrange(steps)
        long = rng.random() < long_fraction
        if long:
            length = rng.randrange(steps - start)
        else:
            length = min(int(rng.expovariate(1.0 / mean_short)), steps - 1 - start)
        size = int(math.exp(rng.uniform(lo, hi)))
        mobility = "temporary" if long else ("reclaimed" if size < 4 * min_size else "movable")
        blocks.append(Block(id=i, size=size, start=start, end=start + length, mobility=mobility))
    return blocks
