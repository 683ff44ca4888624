"""Chrome / Perfetto trace of a simulated step (open in ui.perfetto.dev or chrome://tracing).

One process, three tracks: "compute" (kernels, waits, frees), "d2h" and "h2d" (copies).
Every instruction is one complete event (``"ph": "X"``, microseconds); waits that stalled
show as "wait ..." slices on the compute track. Counter events (``"ph": "C"``) carry the
device memory and the live tensor count after each instruction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from outcore.graph.ir import Graph
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.report.files import write_text
from outcore.sim.result import SimResult

PID = 1
TRACKS = {"compute": 1, "d2h": 2, "h2d": 3}


def _label(graph: Graph, ins: Any) -> tuple[str, dict[str, Any]]:
    """Event name and args for one instruction."""
    if isinstance(ins, Compute):
        op = graph.ops[ins.op]
        name = f"{op.name} (recompute)" if ins.recompute else op.name
        return name, {"op": op.id, "target": op.target, "category": op.category.value,
                      "phase": op.phase.value, "flops": op.flops}
    t = graph.tensors[ins.tensor]
    args = {"tensor": t.id, "bytes": graph.storage_bytes(t.id)}
    if isinstance(ins, Wait):
        return f"wait {ins.direction} {t.name}", args
    verb = {Offload: "offload", Prefetch: "prefetch", Free: "free"}[type(ins)]
    return f"{verb} {t.name}", args


def chrome_trace(result: SimResult, graph: Graph, schedule: Schedule, *,
                 counters: bool = True, title: str | None = None) -> dict[str, Any]:
    """The trace as a dict with a ``"traceEvents"`` list (JSON-serialisable)."""
    if len(schedule.instructions) != len(result.start):
        raise ValueError(f"the result has {len(result.start)} instructions but the schedule "
                         f"has {len(schedule.instructions)}; pass the schedule that was simulated")
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "name": "process_name",
         "args": {"name": title or f"outcore sim: {graph.name}"}},
    ]
    for track, tid in TRACKS.items():
        events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name",
                       "args": {"name": track}})
        events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
    for i, ins in enumerate(schedule.instructions):
        name, args = _label(graph, ins)
        args["index"] = i
        events.append({
            "name": name, "cat": result.kind[i], "ph": "X", "pid": PID,
            "tid": TRACKS[result.stream[i]],
            "ts": result.start[i] * 1e6, "dur": max(0.0, result.end[i] - result.start[i]) * 1e6,
            "args": args,
        })
        if counters:
            events.append({"name": "device memory", "ph": "C", "pid": PID,
                           "ts": result.issue[i] * 1e6, "args": {"bytes": result.memory[i]}})
            events.append({"name": "live tensors", "ph": "C", "pid": PID,
                           "ts": result.issue[i] * 1e6, "args": {"count": result.live_tensors[i]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": graph.name, "policy": schedule.policy, **result.to_dict()}}


def write_trace(path: str | Path, result: SimResult, graph: Graph, schedule: Schedule, *,
                model: str | None = None, **options: Any) -> Path:
    """Write ``chrome_trace(...)`` as JSON to ``path`` atomically; returns the path.

    ``model`` names the process ("outcore sim: resnet50, outcore-auto") instead of the
    captured module's class name (``graph.name``, e.g. "Sequential").
    """
    if model is not None and "title" not in options:
        options["title"] = f"outcore sim: {model}, {schedule.policy}"
    return write_text(path, json.dumps(chrome_trace(result, graph, schedule, **options)))
