"""Block lifetimes, the plain-data input of every placement policy.

A ``Block`` is one allocation: ``size`` bytes that are live at every step ``t`` with
``start <= t <= end`` (allocated at step ``start``, freed after step ``end``). Steps are
integers (for a Schedule: instruction indices). Within one step, frees of blocks whose
``end`` was the previous step happen before the step's allocations, and the step's usage is
sampled after its allocations. ``event_stream`` turns blocks into that ordered alloc/free stream,
which is what the online pools consume.

``mobility`` is Dymem's grouping (§3.3.2, Alg. 3) plus ``static`` for memory that lives the
whole step (parameters, buffers, inputs, tangents):

* ``movable``: one reader, consumed by the very next op, or offloaded/prefetched;
* ``temporary``: several readers, or not read by the next op (forks, tensors awaiting a join);
* ``reclaimed``: outputs of FC (matmul), softmax/loss and dropout ops, not offloaded.

Invariants (checked on construction): ``size > 0``; ``0 <= start <= end``; ``mobility`` is
one of ``MOBILITIES``. Block ids are unique within one list (``check_unique``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from outcore.pool.errors import PoolError

Mobility = Literal["static", "movable", "temporary", "reclaimed"]
MOBILITIES: tuple[str, ...] = ("static", "movable", "temporary", "reclaimed")


@dataclass(frozen=True)
class Block:
    """``size`` bytes live from step ``start`` to step ``end`` inclusive.

    ``name`` and ``storage`` (the graph storage id, -1 if none) only label error messages
    and reports.
    """

    id: int
    size: int
    start: int
    end: int
    mobility: str = "movable"
    name: str = ""
    storage: int = -1

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise PoolError(f"block {self.id} ({self.name or 'unnamed'}) has size {self.size}: "
                            "sizes must be positive; drop zero-byte blocks before placing")
        if not 0 <= self.start <= self.end:
            raise PoolError(f"block {self.id} ({self.name or 'unnamed'}) has lifetime "
                            f"[{self.start}, {self.end}]: need 0 <= start <= end")
        if self.mobility not in MOBILITIES:
            raise PoolError(f"block {self.id} has mobility {self.mobility!r}; "
                            f"use one of {', '.join(MOBILITIES)}")

    def label(self) -> str:
        """``'block 3 (relu_2)'`` for messages."""
        return f"block {self.id}" + (f" ({self.name})" if self.name else "")

    def overlaps_in_time(self, other: Block) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class Alloc:
    """Allocate block ``id`` of ``size`` bytes at step ``step``; ``hint`` is its mobility."""

    step: int
    id: int
    size: int
    hint: str


@dataclass(frozen=True)
class Release:
    """Free block ``id`` before the allocations of step ``step``."""

    step: int
    id: int


Event = Alloc | Release


def round_up(size: int, granularity: int) -> int:
    """``size`` rounded up to a multiple of ``granularity`` (which must be positive)."""
    if granularity <= 0:
        raise PoolError(f"granularity must be positive, got {granularity}")
    return -(-size // granularity) * granularity


def check_unique(blocks: Sequence[Block]) -> None:
    """Raise PoolError naming the first block id that appears twice."""
    seen: set[int] = set()
    for b in blocks:
        if b.id in seen:
            raise PoolError(f"block id {b.id} appears twice; every block needs its own id")
        seen.add(b.id)


def event_stream(blocks: Iterable[Block]) -> list[Event]:
    """The alloc/free stream of ``blocks``, in time order.

    At each step: releases of blocks that ended at the previous step (by id), then
    allocations of blocks starting at this step (by id). Every block is released after its
    ``end``, so the stream leaves the pool empty.
    """
    keyed: list[tuple[int, int, int, Event]] = []
    for b in blocks:
        keyed.append((b.start, 1, b.id, Alloc(b.start, b.id, b.size, b.mobility)))
        keyed.append((b.end + 1, 0, b.id, Release(b.end + 1, b.id)))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [k[3] for k in keyed]


def num_steps(blocks: Iterable[Block]) -> int:
    """One past the last step at which any block is live (0 for no blocks)."""
    return max((b.end for b in blocks), default=-1) + 1


def live_curve(blocks: Sequence[Block], sizes: dict[int, int] | None = None) -> list[int]:
    """Bytes live at each step: ``sizes[id]`` if given (e.g. rounded), else ``block.size``."""
    diff = [0] * (num_steps(blocks) + 1)
    for b in blocks:
        s = b.size if sizes is None else sizes[b.id]
        diff[b.start] += s
        diff[b.end + 1] -= s
    curve, running = [], 0
    for d in diff[:-1]:
        running += d
        curve.append(running)
    return curve


def lower_bound(blocks: Sequence[Block]) -> int:
    """The peak of live unrounded bytes: no placement of ``blocks`` fits in a smaller pool."""
    return max(live_curve(blocks), default=0)
