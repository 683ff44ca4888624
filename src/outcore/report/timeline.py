"""Plot device memory and live tensor count over a simulated step (SuperNeurons Fig. 10).

Uses matplotlib's object API with the Agg canvas: no pyplot, no global backend switch, so it
is safe in scripts, tests and notebooks alike. The file format follows the path's suffix
(.png, .svg, .pdf).
"""

from __future__ import annotations

import io
from bisect import bisect_right
from itertools import pairwise
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from outcore.graph.ir import Graph, Phase
from outcore.plan.schedule import Compute, Schedule
from outcore.report.files import write_bytes
from outcore.sim.result import SimResult

_AXES = ("step", "instruction", "time")


def _unit(peak: float) -> tuple[float, str]:
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return float(scale), name
    return 1.0, "B"


def stepwise(result: SimResult) -> tuple[list[int], list[int]]:
    """Per step (one Compute and the instructions up to the next): the highest device bytes
    and live tensor count. Instructions before the first Compute join step 0."""
    steps = result.steps
    if not steps:
        return [], []
    bounds = [0, *steps[1:], len(result.memory)]
    mem = [max(result.memory[a:b]) for a, b in pairwise(bounds)]
    live = [max(result.live_tensors[a:b]) for a, b in pairwise(bounds)]
    return mem, live


def _series(result: SimResult, by: str) -> tuple[list[float], list[int], list[int], str]:
    if by == "step":
        mem, live = stepwise(result)
        return list(range(len(mem))), mem, live, "step (forward and backward computations)"
    if by == "instruction":
        n = len(result.memory)
        return list(range(n)), result.memory, result.live_tensors, "instruction"
    return [t * 1e3 for t in result.issue], result.memory, result.live_tensors, "time (ms)"


def _backward_start(result: SimResult, graph: Graph | None, by: str,
                    schedule: Schedule | None) -> float | None:
    """The x position where backward starts, when the graph and schedule are known."""
    if graph is None or schedule is None:
        return None
    for k, i in enumerate(result.steps):
        ins = schedule.instructions[i]
        if isinstance(ins, Compute) and graph.ops[ins.op].phase is Phase.BACKWARD:
            return {"step": float(k), "instruction": float(i), "time": result.issue[i] * 1e3}[by]
    return None


def _x_of(result: SimResult, by: str, index: int) -> float:
    """The x position of instruction ``index`` on the ``by`` axis."""
    if by == "instruction":
        return float(index)
    if by == "time":
        return result.issue[index] * 1e3
    return float(max(0, bisect_right(result.steps, index) - 1))


#: Instruction kinds marked on the plot: kind -> (label, marker, colour).
MARKS = {"offload": ("offload", "v", "#2a6fb0"), "prefetch": ("prefetch", "^", "#6a3d9a"),
         "recompute": ("recompute", "x", "#b0552a")}


def _mark_instructions(ax: Any, result: SimResult, by: str, top: float) -> None:
    """Rug markers just under the top of the axes for offloads, prefetches, recomputes."""
    for row, (kind, (label, marker, colour)) in enumerate(MARKS.items()):
        xs = [_x_of(result, by, i) for i, k in enumerate(result.kind) if k == kind]
        if xs:
            ax.plot(xs, [top * (1.04 + 0.05 * row)] * len(xs), ls="none", marker=marker,
                    ms=4, color=colour, label=f"{label} ({len(xs)})", clip_on=False)


def plot_memory(result: SimResult, path: str | Path, *, by: str = "step",
                graph: Graph | None = None, schedule: Schedule | None = None,
                budget: int | None = None, title: str | None = None) -> Path:
    """Write the memory timeline of ``result`` to ``path`` (atomically) and return the path.

    Always drawn: device memory, its peak, the budget (or "no budget" in the legend),
    markers for every offload, prefetch and recompute. With the graph and the simulated
    schedule, the forward and backward phases are labelled and backward is shaded.

    Args:
        by: x axis: "step" (one point per Compute, the step's peak, like SuperNeurons
            Fig. 10), "instruction" or "time".
        budget: the device budget (bytes), drawn as a horizontal line.
    """
    if by not in _AXES:
        raise ValueError(f"by must be one of {_AXES}, got {by!r}")
    x, mem, live, xlabel = _series(result, by)
    scale, unit = _unit(max([result.peak_bytes, budget or 0, 1]))
    fig = Figure(figsize=(9, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.step(x, [m / scale for m in mem], where="post", color="tab:blue", label="device memory")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"device memory ({unit})")
    ax.axhline(result.peak_bytes / scale, color="tab:blue", lw=0.8, ls=":",
               label=f"peak {result.peak_bytes / scale:.2f} {unit}")
    top = max(result.peak_bytes, budget or 0, 1) / scale
    if budget is not None:
        ax.axhline(budget / scale, color="tab:red", lw=1.2, ls="--",
                   label=f"budget {budget / scale:.2f} {unit}")
    else:
        ax.plot([], [], color="tab:red", ls="--", label="no budget (unbounded)")
    ax.set_ylim(0, top * 1.25)
    start = _backward_start(result, graph, by, schedule)
    if start is not None and x:
        ax.axvspan(start, x[-1], color="0.92", zorder=0, label="backward")
        ax.axvline(start, color="0.4", lw=0.8)
        ax.text(start, top * 1.24, " backward", fontsize=8, va="top", ha="left")
        ax.text(x[0], top * 1.24, " forward", fontsize=8, va="top", ha="left")
    _mark_instructions(ax, result, by, top)
    ax2 = ax.twinx()
    ax2.step(x, live, where="post", color="tab:orange", lw=0.9, label="live tensors")
    ax2.set_ylabel("live tensors")
    ax2.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], loc="upper center",
              bbox_to_anchor=(0.5, -0.13), fontsize=7, ncol=5, frameon=False)
    ax.set_title(title or f"memory per {by}: step {result.step_time * 1e3:.2f} ms")
    fig.tight_layout()
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png")
    return write_bytes(path, buffer.getvalue())
