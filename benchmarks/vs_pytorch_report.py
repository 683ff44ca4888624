"""The results of ``vs_pytorch.py``: one ``Row`` per model and tool, the markdown table of
them and the per-peer verdicts (its module docstring defines the measures).

Invariants: ``table`` gives every row its ratios to the eager row of the same model (every
model has one); ``verdicts`` pairs each peer row with the ``outcore @ <peer>`` and
``outcore+inductor @ <peer>`` rows of the same model, compares their peaks by the ``--match``
measure and their times by the spread and the paired statistic (``paired.py``), and says when
the peer's own gradients were found wrong (``peer_gradients.py``'s note on the row).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_ratio  # a sibling module of this script


@dataclass
class Row:
    """One tool's measures on one model: its peaks in bytes (``activation`` <= ``step_peak``,
    the gradients left out of the first) and its step seconds, one per round."""

    model: str
    tool: str
    activation: int
    step_peak: int
    seconds: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def table(rows: list[Row]) -> str:
    """The rows as a markdown table, each peak and median also as a ratio to its model's eager
    row (which must be among ``rows``)."""
    out = [("| model | tool | step peak MiB | / eager | activation MiB | / eager | "
            "step ms (median) | spread ms | / eager |"),
           "|---|---|---|---|---|---|---|---|---|"]
    eager = {r.model: r for r in rows if r.tool == "eager"}
    for r in rows:
        e = eager[r.model]
        out.append(f"| {r.model} | {r.tool} | {r.step_peak / 2**20:.1f} | "
                   f"{r.step_peak / e.step_peak:.2f} | {r.activation / 2**20:.1f} | "
                   f"{r.activation / e.activation:.2f} | {r.median * 1e3:.1f} | "
                   f"{min(r.seconds) * 1e3:.1f}-{max(r.seconds) * 1e3:.1f} | "
                   f"{r.median / e.median:.2f} |")
    return "\n".join(out)


def verdicts(rows: list[Row], match: str = "step") -> list[str]:
    """Per peer: is outcore's peak (the ``match`` measure) <= the peer's, and its time <= the
    peer's beyond the spread (its slowest round faster than the peer's fastest = resolved),
    and the paired per-round ratio's median with its interval (``paired.py``)?"""
    lines = []
    by = {(r.model, r.tool): r for r in rows}
    measure = (lambda r: r.step_peak) if match == "step" else (lambda r: r.activation)
    pairs = [(r, o, kind) for r in rows for kind in ("outcore", "outcore+inductor")
             if (o := by.get((r.model, f"{kind} @ {r.tool}"))) is not None]
    for r, o, kind in pairs:
        mem = ("<=" if measure(o) <= measure(r) else ">") + f" ({match} peak)"
        if max(o.seconds) < min(r.seconds):
            speed = "faster beyond the spread"
        elif min(o.seconds) > max(r.seconds):
            speed = "slower beyond the spread"
        else:
            speed = "within the spread (median " + (
                "faster" if o.median < r.median else "slower") + ")"
        pair = paired_ratio(o.seconds, r.seconds)
        lines.append(f"{r.model} @ {r.tool}: {kind} memory {mem} peer, time {speed} "
                     f"({o.median / r.median:.2f}x the peer's median); paired "
                     f"{pair.verdict}: {pair.text()}"
                     + ("; the PEER's gradients are WRONG" if "WRONG" in r.note else ""))
    return lines


def write_json(rows: list[Row], path: str) -> None:
    """Every row with its median, as ``--json`` writes it."""
    with open(path, "w") as fh:
        json.dump([{**asdict(r), "median": r.median} for r in rows], fh, indent=1)
