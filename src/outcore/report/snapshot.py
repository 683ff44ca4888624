"""A simulated step as a ``torch.cuda.memory._snapshot()`` pickle, for PyTorch's memory
visualiser (drag the file onto https://pytorch.org/memory_viz).

Every device residency of the simulation (``SimResult.lifetimes``: a storage from the
instruction that allocates it to the one that releases it; an offloaded and prefetched
tensor has two) becomes an ``alloc`` and, unless still resident at the end, a
``free_requested``/``free_completed`` pair in ``device_traces[0]``, timed at the
instruction's issue time. Addresses come from a first-fit allocator over one segment
(512-byte aligned, as CUDA's caching allocator rounds), so the "Active Memory Timeline"
shows the simulated device memory and the stack of each block names the tensor, its op and
the user's module. ``segments`` holds what is resident when the step ends, with free gaps as
inactive blocks, as the real snapshot does.

Invariant: replaying the trace gives, after each instruction, the simulated device bytes
up to the 512-byte rounding of each block.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from outcore.graph.ir import Graph
from outcore.plan.schedule import Schedule
from outcore.report.explain import module_path
from outcore.report.files import write_bytes
from outcore.sim.result import SimResult

ALIGN = 512
BASE = 0x7F0000000000  # a plausible device address; only differences matter


def _round(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


class _FirstFit:
    """Addresses for blocks: the lowest gap that fits, else the end of the segment."""

    def __init__(self) -> None:
        self.used: dict[int, int] = {}  # offset -> size
        self.top = 0

    def alloc(self, size: int) -> int:
        at = 0
        for offset in sorted(self.used):
            if offset - at >= size:
                break
            at = max(at, offset + self.used[offset])
        self.used[at] = size
        self.top = max(self.top, at + size)
        return at

    def free(self, offset: int) -> None:
        del self.used[offset]


def _frames(graph: Graph, storage: int) -> list[dict[str, Any]]:
    t = graph.tensors[storage]
    frames = [{"filename": f"outcore: {t.kind}", "line": 0, "name": t.name}]
    if t.producer is not None:
        op = graph.ops[t.producer]
        where = module_path(graph, op.id) or "(top level or loss)"
        frames.append({"filename": where, "line": 0, "name": f"{op.name} ({op.target})"})
    return frames


def memory_snapshot(result: SimResult, graph: Graph, schedule: Schedule) -> dict[str, Any]:
    """The snapshot dict (``segments``, ``device_traces``) of a simulated step."""
    n = len(schedule.instructions)
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for k, life in enumerate(result.lifetimes):
        starts.setdefault(max(life.start, -1), []).append(k)
        if life.end < n:
            ends.setdefault(life.end, []).append(k)
    pool = _FirstFit()
    where: dict[int, int] = {}
    trace: list[dict[str, Any]] = []

    def event(action: str, k: int, at: int) -> None:
        life = result.lifetimes[k]
        time_us = int(result.issue[at] * 1e6) if 0 <= at < n else 0
        trace.append({"action": action, "addr": BASE + where[k], "size": _round(life.nbytes),
                      "stream": 0, "time_us": time_us,
                      "frames": _frames(graph, life.storage)})

    for i in range(-1, n):
        for k in starts.get(i, []):
            where[k] = pool.alloc(_round(result.lifetimes[k].nbytes))
            event("alloc", k, i)
        for k in ends.get(i, []):
            event("free_requested", k, i)
            event("free_completed", k, i)
            pool.free(where[k])
    total = max(pool.top, ALIGN)
    return {"segments": [_segment(result, graph, where, total)],
            "device_traces": [trace],
            "allocator_settings": {"source": "outcore simulation", "policy": schedule.policy}}


def _segment(result: SimResult, graph: Graph, where: dict[int, int], total: int) -> dict[str, Any]:
    live = sorted((offset, k) for k, offset in where.items()
                  if result.lifetimes[k].end >= len(result.issue))
    blocks: list[dict[str, Any]] = []
    at = 0
    for offset, k in live:
        if offset > at:
            blocks.append({"address": BASE + at, "size": offset - at, "requested_size": 0,
                           "state": "inactive", "frames": []})
        life = result.lifetimes[k]
        blocks.append({"address": BASE + offset, "size": _round(life.nbytes),
                       "requested_size": life.nbytes, "state": "active_allocated",
                       "frames": _frames(graph, life.storage)})
        at = offset + _round(life.nbytes)
    if total > at:
        blocks.append({"address": BASE + at, "size": total - at, "requested_size": 0,
                       "state": "inactive", "frames": []})
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": BASE, "total_size": total, "allocated_size": active,
            "active_size": active, "requested_size": active, "stream": 0,
            "segment_type": "large", "blocks": blocks}


def write_snapshot(path: str | Path, result: SimResult, graph: Graph,
                   schedule: Schedule) -> Path:
    """Write the snapshot pickle to ``path`` atomically; returns the path."""
    data = pickle.dumps(memory_snapshot(result, graph, schedule))
    return write_bytes(path, data)
