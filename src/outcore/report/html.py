"""A self-contained HTML report of one plan: summary, decisions, simulation, plot.

The memory timeline is embedded as a base64 PNG, so the file can be mailed or archived on
its own. Every value is escaped.
"""

from __future__ import annotations

import base64
import html
import tempfile
from pathlib import Path
from typing import Any

from outcore.units import format_bytes

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.keep { color: #2a7; } .offload { color: #27a; } .recompute { color: #a52; }
"""


def _table(headers: list[str], rows: list[list[Any]], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            cls = ' class="num"' if isinstance(cell, (int, float)) else ""
            cells.append(f"<td{cls}>{html.escape(str(cell))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def render_html(planned: Any, title: str) -> str:
    """The report of ``planned`` (an ``outcore.api.PlannedStep``) as an HTML string."""
    from outcore.report.timeline import plot_memory

    summary = [["policy", planned.plan.policy],
               ["budget", "unbounded" if planned.budget is None else format_bytes(planned.budget)],
               ["predicted peak", format_bytes(planned.predicted_peak)],
               ["sub-batches", planned.plan.sub_batches],
               ["instructions", len(planned.schedule)]]
    summary += [[f"activations {k}", v] for k, v in planned.counts().items()]
    parts = [f"<h1>{html.escape(title)}</h1>", "<h2>Summary</h2>",
             _table(["quantity", "value"], summary, "summary")]
    sim = planned.simulation
    if sim is not None:
        rows = [[k, f"{v * 1e3:.3f}"] for k, v in sim.breakdown().items()]
        rows.insert(0, ["step time", f"{sim.step_time * 1e3:.3f}"])
        parts += [f"<h2>Simulation ({html.escape(sim.cost_model)})</h2>",
                  _table(["part", "ms"], rows, "simulation")]
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_memory(sim, Path(tmp) / "memory.png", graph=planned.graph,
                              budget=planned.budget)
            data = base64.b64encode(png.read_bytes()).decode()
        parts.append(f'<h2>Memory per step</h2><img id="timeline" alt="memory timeline" '
                     f'src="data:image/png;base64,{data}" width="900">')
    decisions = [[r["tensor"], r["bytes"], r["producer"], r["decision"], r["why"]]
                 for r in planned.explain()]
    parts += ["<h2>Decisions</h2>",
              _table(["tensor", "bytes", "producer", "decision", "why"], decisions, "decisions")]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def write_html(planned: Any, path: str | Path, title: str = "outcore plan") -> Path:
    """Write the report to ``path`` (parents created) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(planned, title), encoding="utf-8")
    return target
