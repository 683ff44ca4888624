"""``explain()``: per activation, which of the user's modules made it, what was decided, why.

Rows are grouped by decision (offload, recompute, keep), largest first within a group, and
name the module path recorded at capture (``layer3.1.conv2``, ``graph.meta["module_paths"]``)
beside the ATen op. ``Explanation`` is a list of those rows with ``.notes``: what changed the
step's semantics (sub-batches), also shown above the CLI's and the HTML report's tables.
"""

from __future__ import annotations

from typing import Any

from outcore.units import format_bytes

#: Display order of decisions: what moved first, then what stayed.
ORDER = ("offload", "recompute", "keep")
#: Colours of the decisions, shared by the CLI (rich) and the HTML report.
COLOURS = {"keep": "#2a7d4f", "offload": "#2a6fb0", "recompute": "#b0552a"}
RICH_STYLES = {"keep": "green", "offload": "blue", "recompute": "dark_orange"}


class Explanation(list[dict[str, Any]]):
    """The rows of ``explain()`` plus ``notes`` (strings) and ``sub_batches``."""

    notes: list[str]
    sub_batches: int

    def groups(self) -> dict[str, list[dict[str, Any]]]:
        """Rows by decision, in ``ORDER``."""
        out: dict[str, list[dict[str, Any]]] = {}
        for row in self:
            out.setdefault(row["decision"], []).append(row)
        return {k: out[k] for k in sorted(out, key=_rank)}


def _rank(decision: str) -> int:
    return ORDER.index(decision) if decision in ORDER else len(ORDER)


def module_path(graph: Any, op_id: int) -> str:
    """The module path of op ``op_id`` ("" when the capture recorded none)."""
    paths = graph.meta.get("module_paths") or []
    return paths[op_id] if op_id < len(paths) else ""


def explain_rows(planned: Any) -> Explanation:
    """The Explanation of an ``outcore.api.PlannedStep``."""
    graph, plan = planned.graph, planned.plan
    rows = []
    for t in graph.activations():
        producer = graph.producer_op(t.id)
        path = module_path(graph, producer.id) or (
            "(loss)" if producer.category.value == "loss" else "(top level)")
        rows.append({"tensor": t.name, "module": path,
                     "op": producer.name, "producer": producer.target,
                     "category": str(producer.category), "bytes": t.nbytes,
                     "size": format_bytes(t.nbytes),
                     "decision": str(plan.decision(t.id)),
                     "why": plan.reasons.get(t.id, "kept (not named by the policy)")})
    rows.sort(key=lambda r: (_rank(r["decision"]), -r["bytes"]))
    result = Explanation(rows)
    result.notes = list(getattr(planned, "notes", []))
    result.sub_batches = plan.sub_batches
    return result


def common_suffix(rows: list[dict[str, Any]]) -> str:
    """The longest tail of ``why`` every row shares (a policy's note repeated per row), so
    reports can print it once; "" when there is none worth lifting (< 40 characters)."""
    whys = [r["why"] for r in rows]
    if len(whys) < 2:
        return ""
    first = whys[0]
    n = 0
    while n < len(first) and all(len(w) > n and w[-1 - n] == first[-1 - n] for w in whys):
        n += 1
    tail = first[len(first) - n:]
    start = tail.find("[")  # lift whole bracketed notes, or whole clauses after "; "
    if start < 0:
        start = tail.find("; ")
    tail = tail[start:] if start >= 0 else ""
    return tail if len(tail) >= 40 else ""
