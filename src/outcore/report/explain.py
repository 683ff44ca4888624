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
    """The rows of ``explain()`` plus ``notes`` (strings), ``sub_batches`` and ``binding``:
    the instructions whose device bytes are within ``outcore.report.binding.EPSILON`` of the
    budget (of the peak without one), as ``BindingInstruction`` objects; ``parameters``:
    planned with an optimizer, one row per parameter held in host memory and why
    (``outcore.weights.report``; empty otherwise)."""

    notes: list[str]
    parameters: list[dict[str, Any]]
    sub_batches: int
    binding: list[Any]
    binds: bool  # False: no instruction is within epsilon of the budget; ``binding`` is the peak

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
    from outcore.report.binding import binding

    graph, plan = planned.graph, planned.plan
    simulation = getattr(planned, "simulation", None)
    bound = binding(graph, planned.schedule, planned.budget, simulation)
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
                     "why": plan.reasons.get(t.id, "kept (not named by the policy)"),
                     **_binding_fields(bound, t.id, plan.decision(t.id), simulation)})
    rows.sort(key=lambda r: (_rank(r["decision"]), -r["bytes"]))
    result = Explanation(rows)
    result.notes = list(getattr(planned, "notes", []))
    if getattr(planned, "scope", "step") != "step" and planned.budget is not None:
        from outcore.plan.scope import scope_words

        result.notes.insert(0, f"the budget ({format_bytes(planned.budget)}) bounds "
                               f"{scope_words(planned.scope)}: activation peak "
                               f"{format_bytes(planned.scoped_peak)}, whole step "
                               f"{format_bytes(planned.predicted_peak)}")
    weights = getattr(planned, "weights", None)
    result.parameters = list(weights.rows) if weights is not None else []
    result.sub_batches = plan.sub_batches
    result.binding = bound.instructions
    result.binds = bound.binds
    return result


def _binding_fields(bound: Any, tid: int, decision: Any, simulation: Any) -> dict[str, Any]:
    """A row's ``cost_s`` (seconds its decision costs the step; None unsimulated),
    ``copy_s`` (an offload's copy seconds on the copy engines), ``frees`` (bytes it frees at
    the binding instructions, the most at any one) and ``binding_at`` (those instructions)
    (definitions: ``outcore.report.binding``)."""
    frees = bound.frees.get(tid, {})
    kept = str(decision) == "keep"
    cost = None if simulation is None else (0.0 if kept else bound.cost_s.get(tid, 0.0))
    return {"cost_s": cost, "copy_s": bound.copy_s.get(tid, 0.0), "frees": max(
        frees.values(), default=0), "binding_at": sorted(frees)}


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


def binding_line(rows: Explanation, shown: int = 6) -> str:
    """The binding instructions of an Explanation in one line, for reports."""
    found = rows.binding
    if not found:
        return "no instruction holds device memory"
    from outcore.report.binding import EPSILON

    head = ("the budget binds at" if rows.binds else
            f"the budget does not bind (slack above {EPSILON:.0%} of it); the peak is at")
    listed = "; ".join(f"#{b.index} {b.instruction} ({format_bytes(b.device)}, "
                       f"slack {format_bytes(b.slack)})" for b in found[:shown])
    more = f"; and {len(found) - shown} more" if len(found) > shown else ""
    return f"{head} {len(found)} instruction(s): {listed}{more}"
