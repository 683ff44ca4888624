"""Plans carried over to a batch of another shape: a new sequence length without a new search.

Under dynamic padding (Hugging Face's ``DataCollatorWithPadding``, a length-bucketing
sampler) nearly every batch has another sequence length, so the Trainer meets a new
signature on most steps. Each is captured again (its sizes, kernels and kernel temporaries
are its own), but searching a plan for each costs seconds to minutes a shape. Most new
shapes need no search:

* **Same structure.** Two captures of one model at two sequence lengths give graphs with the
  same ops, in the same order, reading and making the same tensor ids, with the same kinds,
  dtypes, aliasing and random ops; only the sizes differ (``structure``). A Schedule is an
  instruction list over op and tensor ids (``outcore.plan.schedule``), so a schedule planned
  for one runs on the other as it is. (A degenerate size can change the structure: a length
  of 1 captures ``view`` where longer ones capture ``t``; such a graph is planned afresh.)
* **Checked, not assumed.** A carried schedule is replayed on the new graph with the memory
  rule (``outcore.plan.residency``: the verifier's rules and the exact peak the executor
  measures, kernel temporaries and chosen variants' workspace included) and kept only when
  it is sound there, its peak is within the budget, its host copies within the host budget
  and, on CUDA, its caching-allocator bound within the budget. A schedule planned for a
  longer sequence peaks lower on a shorter one (every size shrinks), so the longest batch
  seen covers the shorter ones near it; one planned for a shorter sequence is carried to a
  longer one only where the replay shows it still fits (a plan with room to spare).
* **Only from a near shape.** A plan searched for a much longer sequence moves far more
  than a short one needs (measured: the small transformer of ``tests/api/
  test_plan_transfer.py``'s family at length 40 ran 5.6x slower on length 128's plan than
  on its own, which keeps everything). So a plan is carried only to a graph whose bytes made
  during the step are at least ``NEAR`` of its own graph's; a shorter one is searched afresh
  and becomes a source itself. Over lengths 40 to 128 that is a handful of searches (128,
  ~102, ~82, ~66, ~52, ~42), not one per length.
* **Not where nothing needs moving.** A graph whose in-core peak (every activation freed
  at its last use: ``reference_peaks(...).liveness``) fits the budget is searched, not
  carried: the search keeps everything there at once, and a carried plan would move what
  need not move.
* **Which one, and whether.** Each plan that passes is simulated on the new graph with the
  cost model the Trainer plans with; one is a candidate only if its overhead over the
  compute floor (``step_time / floor - 1``; the floor, the sum of the op times, is what no
  schedule on framework kernels beats) is at most ``MAX_EXTRA`` above the overhead its own
  plan had on its own graph, and the fastest candidate is carried. A plan that moves much
  more than the new shape needs fails that test; when every one fails, the shape is
  searched.

What the step computes is unchanged: a schedule's gradients are eager's whatever it keeps,
offloads or recomputes (the executor's invariant), and the new graph's own kernels run.
What changes is the step time: the plan was searched for other sizes, so it may move more
than a plan searched for this shape would. The Trainer says so in the step's notes and counts
these steps (``TrainerStats.transfers``); a carried shape used ``PROMOTE_AFTER`` times is
planned for its own sizes (``Trainer``).

The Trainer carries plans only when asked (``compile(..., transfer_plans=True)``): what it
saves is the search, not the capture, and a carried plan moves what its source moved, which
the cost model may price as free while a device pays for it. Measured
(``benchmarks/dynamic_shapes.py``, BENCHMARKS.md "Dynamic shapes"): on the emulated device
a 4-layer model's searches are cheap and its carried plans ran slower; it pays where a
search costs far more than a capture.

Only steps planned whole transfer: one sub-batch (a sub-batched plan runs on a re-captured
sub-batch graph), the budget bounding the whole step (``scope="step"``), no parameters held
in host memory, and only operator variants the new graph offers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from outcore.errors import ScheduleError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph, TensorKind
from outcore.plan.memory import MemoryTrace, trace_of
from outcore.plan.residency import checked_steps
from outcore.planned import PlannedStep, check_host
from outcore.units import format_bytes

#: ``Graph.meta`` key caching ``structure``'s digest (a leading "_": not serialised)
STRUCTURE_KEY = "_structure"
#: steps a carried plan runs before the Trainer plans its shape for its own sizes
PROMOTE_AFTER = 16
#: a plan is carried only to a graph making at least this share of its graph's bytes
NEAR = 0.8
#: a carried plan's overhead over the compute floor may exceed its source's by this much
MAX_EXTRA = 0.05
#: ``Graph.meta`` key caching ``step_bytes``
STEP_BYTES_KEY = "_step_bytes"


def step_bytes(graph: Graph) -> int:
    """Bytes of the activations the step makes (forward values and the gradients of
    activations; views count 0): what grows with the batch's shape, where parameters and
    their gradients do not. Cached in ``graph.meta``."""
    found = graph.meta.get(STEP_BYTES_KEY)
    if isinstance(found, int):
        return found
    total = sum(t.nbytes for t in graph.tensors if t.kind is TensorKind.ACTIVATION)
    graph.meta[STEP_BYTES_KEY] = total
    return total


def structure(graph: Graph) -> str:
    """A digest of everything a Schedule's soundness depends on, and nothing of the sizes.

    Per tensor: kind, dtype, storage (aliasing), producer, consumers, rank, whether it lives
    in host memory, its parameter/buffer source; per op: target, phase, category, inputs,
    outputs, whether it draws random numbers; the graph's outputs. Shapes, bytes, flops,
    kernel temporaries and variant workspaces are left out: the memory rule prices them on
    the graph a schedule runs on. Cached in ``graph.meta``."""
    found = graph.meta.get(STRUCTURE_KEY)
    if isinstance(found, str):
        return found
    digest = hashlib.sha256()
    for t in graph.tensors:
        digest.update(repr((t.kind.value, t.dtype, t.storage, t.producer, t.consumers,
                            len(t.shape), t.host, t.source)).encode())
    digest.update(b"|")
    for o in graph.ops:
        digest.update(repr((o.target, o.phase.value, o.category.value, o.inputs, o.outputs,
                            o.random)).encode())
    digest.update(repr(graph.outputs).encode())
    text = digest.hexdigest()
    graph.meta[STRUCTURE_KEY] = text
    return text


def transferable(planned: PlannedStep) -> bool:
    """Whether ``planned`` can be carried to another graph at all (module doc's last part)."""
    return (planned.plan.sub_batches == 1 and planned.schedule.sub_batches == 1
            and planned.scope == "step" and planned.weights is None
            and not planned.schedule.host_static and not planned.schedule.host_outputs)


def carry(planned: PlannedStep, graph: Graph, budget: int | None, *,
          host_limit: int | None = None, host_source: str = "",
          cuda: bool = False) -> tuple[PlannedStep, MemoryTrace] | None:
    """``planned``'s plan and schedule on ``graph``, or None when they do not carry over.

    None when ``planned`` is not ``transferable``, the structures differ, ``graph`` makes
    fewer than ``NEAR`` of ``planned.graph``'s activation bytes, a chosen variant is not
    offered (or refused) on ``graph``'s op, the schedule breaks a rule of the memory
    replay on ``graph``, or its peak exceeds ``budget``, its host copies ``host_limit`` or,
    with ``cuda``, its caching-allocator bound ``budget``. Invariant: a returned step's
    ``predicted_peak`` is the memory rule's peak of its schedule on ``graph``."""
    if not transferable(planned) or structure(planned.graph) != structure(graph):
        return None
    if step_bytes(graph) < NEAR * step_bytes(planned.graph):
        return None
    for op, variant in planned.schedule.variants.items():
        offered = graph.ops[op].variant_options.get(variant)
        if variant and (offered is None or "refused" in offered):
            return None
    try:
        trace = trace_of(checked_steps(graph, planned.schedule))
    except ScheduleError:
        return None
    if budget is not None and trace.peak > budget:
        return None
    if cuda and budget is not None:
        from outcore.plan.allocator_rounding import caching_allocator_bound

        if caching_allocator_bound(graph, planned.schedule) > budget:
            return None
    # the source's reasons and notes describe its own search (its candidates' times, its
    # sizes): the reasons say so; of the notes only what holds for the schedule here stays
    reasons = {tid: f"{why} {_SOURCE_SIZES}" for tid, why in planned.plan.reasons.items()}
    plan = replace(planned.plan, budget=budget, reasons=reasons)  # a new Plan: none mutates
    from outcore.policies.auto import HOST_COPIES_NOTE
    from outcore.variants.notice import variant_note

    runs = variant_note(graph, planned.schedule.variants)
    notes = [n for n in planned.notes if n == HOST_COPIES_NOTE]  # true of the schedule here
    result = PlannedStep(graph, plan, planned.schedule, trace.peak, budget, None,
                         notes=notes + ([runs] if runs is not None else []))
    from outcore.host import HostBudgetError

    try:
        check_host(result, trace, plan.policy, host_limit, host_source)
    except HostBudgetError:
        return None
    return result, trace


def best_carry(planned: Iterable[tuple[str, PlannedStep]], graph: Graph, budget: int | None,
               cost: Any, *, host_limit: int | None = None, host_source: str = "",
               cuda: bool = False) -> tuple[PlannedStep, str, PlannedStep] | None:
    """Of ``planned`` (searched steps, each with a description of the batch it was searched
    for), the carried step that simulates fastest on ``graph`` under ``cost`` among those
    that do not move too much (overhead over the compute floor at most ``MAX_EXTRA`` above
    its own source's: module doc), with a note naming where it came from and its
    ``simulation``, with the source and its description; None when ``graph``'s in-core peak
    fits the budget (nothing needs moving) or none carries over within ``MAX_EXTRA``. A
    source's own simulation is computed once and kept on it. Give searched steps only: a
    carried one's graph is not the shape its plan was searched for, so ``NEAR`` and
    ``MAX_EXTRA`` would drift."""
    from outcore.policies.auto.portfolio import compute_floor
    from outcore.sim import simulate

    if budget is not None and reference_peaks(graph).liveness <= budget:
        return None
    floor = max(compute_floor(graph, cost), 1e-30)
    best: tuple[float, float, str, PlannedStep, PlannedStep] | None = None
    for shape, step in planned:
        found = carry(step, graph, budget, host_limit=host_limit, host_source=host_source,
                      cuda=cuda)
        if found is None:
            continue
        result = found[0]
        result.simulation = simulate(graph, result.schedule, cost)
        seconds = result.simulation.step_time
        source_overhead = _overhead(step, cost)
        if seconds / floor - 1.0 > source_overhead + MAX_EXTRA:
            continue  # moves too much here; a slower carry may still qualify
        if best is None or seconds < best[0]:
            best = (seconds, source_overhead, shape, result, step)
    if best is None:
        return None
    seconds, source_overhead, shape, result, source = best
    overhead = seconds / floor - 1.0
    result.notes.append(
        f"{_NOTE_HEAD} for the batch {shape} and carried to this shape without a new search "
        f"(same graph structure; predicted peak {format_bytes(result.predicted_peak)} here"
        + (f", within the budget of {format_bytes(budget)}" if budget is not None else "")
        + f"; simulated {overhead:.1%} over the compute floor, its source "
        f"{source_overhead:.1%}). Gradients are unchanged; the step may move more than a plan "
        f"searched for this shape would, until it is planned for its own sizes after "
        f"{PROMOTE_AFTER} steps (compile(..., transfer_plans=True) asked for this)")
    return result, shape, source


def _overhead(planned: PlannedStep, cost: Any) -> float:
    """``planned``'s simulated step over its graph's compute floor, less 1; its simulation
    is made (and kept on it) when it has none."""
    from outcore.policies.auto.portfolio import compute_floor
    from outcore.sim import simulate

    if planned.simulation is None:
        planned.simulation = simulate(planned.graph, planned.schedule, cost)
    return float(planned.simulation.step_time / max(compute_floor(planned.graph, cost), 1e-30)
                 - 1.0)


_NOTE_HEAD = "plan searched"
#: Appended to a carried plan's reasons: their sizes and times are the source shape's.
_SOURCE_SIZES = "(decided for the batch shape this plan was searched for; carried here)"
