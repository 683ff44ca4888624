"""An index of time intervals answering "which stored items overlap ``[start, end]``?".

A segment tree over steps ``[0, steps)``: an interval is stored at its O(log T) canonical
nodes (``cover``) and at those nodes and all their ancestors (``inside``). A query's
canonical nodes report their ``inside`` items; their ancestors report their ``cover`` items.
Every overlapping item is found (the step where it meets the query lies under one of the
query's canonical nodes, and the item's own canonical node holding that step is below or
above it); an item may be found twice, so results are de-duplicated. Cost: O(log T) per
insertion, O(log T + k) per query with k overlapping items.
"""

from __future__ import annotations


class TimeIndex:
    """Items (any hashable payload keyed by an int id) over integer time intervals."""

    def __init__(self, steps: int) -> None:
        n = 1
        while n < max(steps, 1):
            n *= 2
        self.n = n
        self.cover: dict[int, list[int]] = {}
        self.inside: dict[int, list[int]] = {}

    def _canonical(self, start: int, end: int) -> list[int]:
        nodes = []
        lo, hi = start + self.n, end + self.n + 1
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo >>= 1
            hi >>= 1
        return nodes

    def _ancestors(self, nodes: list[int]) -> set[int]:
        result: set[int] = set()
        for leaf in nodes:
            node = leaf >> 1
            while node and node not in result:
                result.add(node)
                node >>= 1
        return result

    def add(self, item: int, start: int, end: int) -> None:
        """Store ``item`` over steps ``start..end`` (inclusive)."""
        nodes = self._canonical(start, end)
        for node in nodes:
            self.cover.setdefault(node, []).append(item)
            self.inside.setdefault(node, []).append(item)
        for node in self._ancestors(nodes):
            self.inside.setdefault(node, []).append(item)

    def overlapping(self, start: int, end: int) -> set[int]:
        """Every stored item whose interval shares a step with ``start..end``."""
        nodes = self._canonical(start, end)
        found: set[int] = set()
        for node in nodes:
            found.update(self.inside.get(node, ()))
        for node in self._ancestors(nodes):
            found.update(self.cover.get(node, ()))
        return found
