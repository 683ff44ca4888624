"""benchmarks/paired.py: the paired per-round statistic vs_pytorch.py resolves times with."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from paired import paired_ratio, round_order  # a benchmarks/ module, not a package


def _coverage(n: int, k: int) -> float:
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n


def test_fifteen_rounds_interval_is_fourth_order_statistics() -> None:
    peer = [1.0] * 15
    ratios = [0.80 + 0.01 * i for i in range(15)]  # 0.80 .. 0.94, all below 1
    shuffled = random.Random(3).sample(ratios, 15)
    pair = paired_ratio(shuffled, peer)
    assert pair.median == pytest.approx(0.87)
    assert (pair.low, pair.high) == (pytest.approx(0.83), pytest.approx(0.91))  # r_(4), r_(12)
    assert pair.coverage == pytest.approx(_coverage(15, 4))
    assert pair.coverage >= 0.95 > _coverage(15, 5)
    assert pair.verdict == "faster"


def test_five_rounds_use_the_whole_range_and_report_its_coverage() -> None:
    pair = paired_ratio([1.1, 1.2, 1.05, 1.3, 1.15], [1.0] * 5)
    assert (pair.low, pair.high) == (pytest.approx(1.05), pytest.approx(1.3))
    assert pair.coverage == pytest.approx(1 - 2 / 32)
    assert pair.verdict == "slower"


def test_interval_straddling_one_is_unresolved() -> None:
    pair = paired_ratio([0.9, 1.1, 0.95, 1.05, 1.0, 0.97, 1.02], [1.0] * 7)
    assert pair.low < 1 < pair.high
    assert pair.verdict == "unresolved"


def test_pairs_by_round_so_shared_drift_cancels() -> None:
    # both tools slow down together; outcore is 0.9x the peer in every round
    load = [1.0, 3.0, 1.5, 4.0, 2.0, 1.2, 2.5]
    pair = paired_ratio([0.9 * x for x in load], load)
    assert pair.low == pytest.approx(0.9) and pair.high == pytest.approx(0.9)
    assert pair.verdict == "faster"
    assert max(0.9 * x for x in load) > min(load)  # the spread test could not resolve it


def test_unequal_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="equal"):
        paired_ratio([1.0, 2.0], [1.0])


def test_round_order_runs_each_peer_with_its_outcore_rows_back_to_back() -> None:
    names = ["eager", "checkpoint", "selective", "compile 0.5", "outcore @ checkpoint",
             "outcore+inductor @ checkpoint", "outcore @ selective",
             "outcore+inductor @ compile 0.5"]
    for seed in range(20):
        order = round_order(names, random.Random(seed))
        assert sorted(order) == sorted(names)
        peers = [n.split(" @ ", 1)[1] if " @ " in n else n for n in order]
        blocks = [p for i, p in enumerate(peers) if i == 0 or peers[i - 1] != p]
        assert len(blocks) == len(set(blocks)), order  # each peer's block is contiguous
