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

from outcore.report.explain import COLOURS, common_suffix
from outcore.report.files import write_text
from outcore.units import format_bytes

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { background: #fff6d5; border-left: 4px solid #d9a400; padding: 0.5em 1em; }
""" + "".join(f".{d} {{ color: {c}; font-weight: 600; }} tr.{d} td:first-child "
              f"{{ border-left: 4px solid {c}; }}\n" for d, c in COLOURS.items())


def _cell(cell: Any) -> str:
    cls = ' class="num"' if isinstance(cell, (int, float)) else ""
    return f"<td{cls}>{html.escape(str(cell))}</td>"


def _table(headers: list[str], rows: list[list[Any]], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows]
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _decisions(planned: Any) -> list[str]:
    """The decisions, one table per decision (offload, recompute, keep), largest first; a
    note every row of a group shares is printed once above it."""
    rows = planned.explain()
    parts = ["<h2>Decisions (by decision, largest first)</h2>"]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in rows.notes]
    for decision, group in rows.groups().items():
        total = sum(r["bytes"] for r in group)
        shared = common_suffix(group)
        parts.append(f'<h3 class="{html.escape(decision)}">{html.escape(decision)}: '
                     f"{len(group)} tensors, {format_bytes(total)}</h3>")
        if shared:
            parts.append(f"<p>Every {html.escape(decision)} row: "
                         f"{html.escape(shared.strip('; '))}</p>")
        head = "".join(f"<th>{h}</th>" for h in ("module", "op", "tensor", "size", "decision",
                                                 "why"))
        body = []
        for r in group:
            why = r["why"][: len(r["why"]) - len(shared)] if shared else r["why"]
            d = html.escape(r["decision"])
            body.append(f'<tr class="{d}"><td>{html.escape(r["module"])}</td>'
                        f'<td>{html.escape(r["op"])} <small>{html.escape(r["producer"])}'
                        f'</small></td><td>{html.escape(r["tensor"])}</td>'
                        f'<td class="num" title="{r["bytes"]} bytes">{html.escape(r["size"])}'
                        f'</td><td class="{d}">{d}</td><td>{html.escape(why)}</td></tr>')
        parts.append(f'<table id="decisions-{html.escape(decision)}"><thead><tr>{head}'
                     f'</tr></thead><tbody>{"".join(body)}</tbody></table>')
    return ['<section id="decisions">', *parts, "</section>"]


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
                              schedule=planned.schedule, budget=planned.budget)
            data = base64.b64encode(png.read_bytes()).decode()
        parts.append(f'<h2>Memory per step</h2><img id="timeline" alt="memory timeline" '
                     f'src="data:image/png;base64,{data}" width="900">')
    parts += _decisions(planned)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def write_html(planned: Any, path: str | Path, title: str = "outcore plan") -> Path:
    """Write the report to ``path`` atomically (folder created) and return the path;
    ``OutputPathError`` when it cannot be written."""
    return write_text(path, render_html(planned, title))
