"""Interval arithmetic on sorted lists of (start, end) pairs, in linear time."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def union(*lists: Iterable[Interval]) -> list[Interval]:
    """Coalesce intervals from lists that are each sorted by start into disjoint, sorted
    intervals. Empty intervals (end <= start) are dropped."""
    merged: list[Interval] = []
    for s, e in heapq.merge(*lists):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def total(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in intervals if e > s)


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    result = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            result += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result
