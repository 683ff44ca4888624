"""Dymem's offload candidates and prefetch candidate search (HPDC'20 §2.3, §3.2, Alg. 2).

* **What is offloaded.** "It is not fruitful to offload Dropout, Softmax, and FC layers
  because they only require less than 1% of the total memory" (§2.3.2); CONV, POOL, ACT and
  BN outputs hold over 90%. Dymem offloads every feature map (``Profile.features``) except
  those made by FC (matmul), softmax/loss and dropout ops; those are kept (Alg. 3's
  "reclaimed" tensors).
* **When a prefetch is issued (Alg. 2).** While backward layer l runs, Dymem walks the DFS
  backward order from l and issues the prefetch of every offloaded non-CONV layer it meets
  and of at most two CONV layers ("no more than two Convolution layers residing in the GPU",
  line 11). Read as a window: the prefetches issued at position j are those of the maps
  needed before the second CONV op after j. So a map is prefetched at the second-to-last
  CONV op before its use (or as soon as backward starts, if fewer than two CONV ops come
  first), not after its copy-out ended (§3.2.1), and later when memory does not allow it
  then: "the execution for the next layer has to be blocked if the available memory is not
  enough", so the copy waits until the map fits until its use. The pseudo-code's first
  lines (a CONV layer's own search) are garbled in the paper; this reading is ours.
"""

from __future__ import annotations

import bisect

import numpy as np

from outcore.graph.ir import OpCategory
from outcore.policies.common.timeline import Profile, SwapInRule, earliest_fit, producer

RECLAIMED = frozenset({OpCategory.MATMUL, OpCategory.LOSS, OpCategory.DROPOUT})


def offload_candidates(p: Profile) -> list[int]:
    """Feature maps Dymem offloads (see the module docstring)."""
    g = p.graph
    return [x for x in p.features if g.ops[producer(g, x)].category not in RECLAIMED]


def conv_positions(p: Profile) -> list[int]:
    """Positions of the backward CONV ops in the execution order."""
    return [j for j in range(p.nf, p.n) if p.graph.ops[p.order[j]].category is OpCategory.CONV]


def alg2_position(convs: list[int], lo: int, need: int) -> int:
    """The position at which Alg. 2's window first reaches ``need``: the second-to-last CONV
    op before ``need``, or ``lo`` when fewer than two come after ``lo``."""
    k = bisect.bisect_left(convs, need)  # convs[:k] are before need
    if k >= 2 and convs[k - 2] > lo:
        return convs[k - 2]
    return lo


def alg2_rule(p: Profile) -> SwapInRule:
    """A ``SwapInRule`` issuing each prefetch by Alg. 2, later if memory does not allow."""
    convs = conv_positions(p)

    def rule(prof: Profile, x: int, lo: int, need: int, memory: np.ndarray, budget: float) -> int:
        start = alg2_position(convs, lo, need)
        return earliest_fit(prof, x, start, need, memory, budget)

    return rule
