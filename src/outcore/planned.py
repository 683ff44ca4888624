"""Plan a captured step: ``plan(graph, budget, policy=..., gpu=...) -> PlannedStep``.

Torch-free (a graph loaded from JSON plans without torch); ``outcore.plan`` and
``outcore.api.plan`` are this module's ``plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan.memory import MemoryTrace, memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.policies.registry import PolicyContext, config_for, get
from outcore.units import format_bytes, parse_bytes

DEFAULT_GPU = "v100-pcie"
DEFAULT_POLICY = "outcore-auto"
#: ``host_budget`` default: this machine's limit (``outcore.host.host_limit``) for graphs
#: that can run here; no host limit for fake graphs (sized for another machine).
MACHINE = "machine"


def cost_model_for(gpu: str | None, graph: Graph | None = None, device: str | None = None) -> Any:
    """The analytic cost model of a named hardware profile.

    Without ``gpu``, ``outcore.hardware.default_gpu(graph, device)``: the GPU that is there
    on ``device="cuda"``, else ``v100-pcie``, or a profile that knows the graph's dtypes.
    Operator variants are timed with the assumed GPU ratios of ``outcore.cost.gpu_variants``
    on GPU profiles, and with this CPU's measured ratios on ``this-cpu``.
    """
    from outcore.cost.model import AnalyticCostModel
    from outcore.cost.profiles import get_profile
    from outcore.cost.variant_costs import ASSUMED_GPU, RECORDED
    from outcore.hardware import default_gpu

    name = gpu or default_gpu(graph, device)
    variants = RECORDED if name == "this-cpu" else ASSUMED_GPU
    return AnalyticCostModel(get_profile(name), variants=variants)


def _policy_name(policy: str) -> str:
    return DEFAULT_POLICY if policy == "auto" else policy


@dataclass
class PlannedStep:
    """A graph, what a policy decided for it, and the Schedule that carries it out.

    Attributes:
        graph: the graph the schedule runs on (a sub-batch graph if ``plan.sub_batches > 1``).
        plan: per-tensor decisions and their reasons.
        schedule: the instruction list the simulator and the executor run.
        predicted_peak: device bytes at the schedule's peak (what the executor will measure).
        budget: the budget planned for, in bytes (None = unbounded).
        simulation: the simulated step on the cost model's GPU (a ``SimResult``), if any.
        lower_bound: seconds no plan of keep/offload/recompute decisions (framework kernels,
            one sub-batch) beats on this cost model and budget (``outcore-optimal``'s
            relaxation), when asked for (``plan(..., bound=True)``); ``gap`` is the
            simulated step's distance to it. Planned with an optimizer: the joint bound
            on the step plus the optimizer step (``outcore.weights.bound``).
        weights: planned with an optimizer, a ``outcore.weights.report.WeightReport``:
            the parameters held in host memory, host and pinned bytes, the step time with
            the optimizer step, and why; None otherwise. ``host_peak`` then counts the
            host-held optimizer state too.
        host_peak: host bytes the step's host copies hold at their peak (the sum of its
            offloaded storages: nothing leaves the host before the step ends), known before
            the step runs; the simulator's ``host_peak_bytes`` is the same number.
        host_budget: the host limit planned for, in bytes (None = unbounded).
        host_sizes: bytes of each Offload's storage, in schedule order (what a device's
            pinned pool reserves: ``CudaDevice.reserve_host``).
        scope: what ``budget`` bounds (``outcore.plan.scope``): "step", every device byte
            (``predicted_peak <= budget``), or "activations", the device bytes less the
            parameters, buffers, inputs and the parameters' gradients
            (``scoped_peak <= budget``; ``predicted_peak`` is still the whole step's).
        scoped_peak: the peak of what ``budget`` bounds: ``predicted_peak`` under "step",
            the activation-scoped peak (``outcore.plan.scope.scoped_curve``) under
            "activations". Always ``<= budget`` when a budget is set.
    """

    graph: Graph
    plan: Plan
    schedule: Schedule
    predicted_peak: int
    budget: int | None
    simulation: Any = None
    host_peak: int = 0
    host_budget: int | None = None
    host_sizes: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lower_bound: float | None = None
    weights: Any = None
    scope: str = "step"
    scoped_peak: int = -1

    def __post_init__(self) -> None:
        if self.scoped_peak < 0:  # step scope: the budget bounds the whole step
            self.scoped_peak = self.predicted_peak

    @property
    def gap(self) -> float | None:
        """``step_time / lower_bound - 1`` when both are known (planned with an optimizer:
        the step with the optimizer step over the joint bound, ``weights.gap``)."""
        if self.weights is not None:
            return self.weights.gap
        if self.lower_bound is None or self.simulation is None or self.lower_bound <= 0:
            return None
        return float(self.simulation.step_time / self.lower_bound - 1.0)

    def explain(self) -> list[dict[str, Any]]:
        """Per activation: module path, ATen op, bytes, decision and why, grouped by decision
        (offload, recompute, keep; largest first). The returned list's ``.notes`` says what
        changed semantics (sub-batches); see ``outcore.report.explain``."""
        from outcore.report.explain import explain_rows

        return explain_rows(self)

    def counts(self) -> dict[str, int]:
        """How many activations each decision got."""
        result = {str(d): 0 for d in Decision}
        for t in self.graph.activations():
            result[str(self.plan.decision(t.id))] += 1
        return result


def plan(graph: Graph, budget: int | str | None = None, *, policy: str = "auto",
         gpu: str | None = None, cost: Any = None,
         recapture: Callable[[int], Graph] | None = None, simulate: bool = True,
         allow_sub_batches: bool | None = None, cache: bool | None = None,
         host_budget: int | str | None = MACHINE, bound: bool = False,
         optimizer: Any = None, weights: str | None = None,
         host_adam_rate: float | None = None, scope: str = "step",
         **options: Any) -> PlannedStep:
    """Plan ``graph`` under ``budget`` with ``policy``; nothing runs.

    Args:
        graph: from ``outcore.capture`` (real or fake).
        budget: bytes, or a string such as "12GB" or "11.5GiB"; None plans without a bound.
        policy: a name from ``outcore.policies()``; "auto" is ``outcore-auto``.
        gpu: a hardware profile name for the cost model (default: see
            ``outcore.hardware.default_gpu``).
        cost: a cost model to use instead of the GPU profile's analytic one.
        recapture: ``k -> Graph`` captured at batch/k, for policies that split the batch.
        simulate: also simulate the schedule on the cost model (fills ``.simulation``).
        allow_sub_batches: let a policy split the batch into sub-batches (changes what
            BatchNorm computes; see ``outcore.sub_batching``). Default: only policy="modnn".
        bound: also compute a lower bound on the step time of any plan at this budget
            (``outcore.policies.optimal.lower_bound``: an LP/MILP on HiGHS, seconds on big
            graphs), filling ``lower_bound`` and ``gap``.
        cache: reuse (and store) the plan in the on-disk cache (``outcore.plan_cache``);
            default on unless ``OUTCORE_NO_CACHE=1``.
        host_budget: host bytes the plan's host copies may hold (bytes or "64GiB"); None:
            no limit; default: what this machine or its cgroup allows
            (``outcore.host.host_limit``) when the graph can run here, no limit for a fake
            graph. outcore-auto prefers plans that fit it.
        optimizer: plan the parameters, gradients and optimizer state with the
            activations against ``budget`` (which then holds them all): "adamw", "adam",
            "sgd", an ``outcore.weights.spec.OptimizerSpec`` or a built torch optimizer.
            A name is the mixed-precision recipe (fp32 state, and fp32 masters of bf16/fp16
            parameters: what ``compile(..., master=MasterWeights(model))`` allocates); a
            built optimizer is sized as built (on the model's own parameters: state in
            their dtype, no masters, what ``outcore run --optimizer`` trains with). The
            result's ``weights`` says which are held in host memory, the host and
            pinned bytes and the step with the optimizer step (``outcore.weights.planned``).
        weights: with ``optimizer``: "auto" (default), "device" or "host".
        host_adam_rate: with ``optimizer``: the host's AdamW parameters per second
            (default: the profile's ``host_adam_rate``). Another optimizer's step is priced
            from AdamW's rates by the bytes it moves per parameter
            (``outcore.weights.spec.update_rate``: SGD without momentum 12 to AdamW's 28).
        scope: what ``budget`` bounds (``outcore.plan.scope``): "step" (default), every
            device byte at every instruction; "activations", those bytes less the
            parameters, buffers, inputs and the parameters' gradients, as PyTorch's
            ``activation_memory_budget`` scopes its own (kernel temporaries, workspaces and
            activations' gradients stay in). The plan is made on a copy of the graph with
            those storages at 0 bytes, then attached to ``graph``: ``predicted_peak`` is the
            whole step's, ``scoped_peak`` (``<= budget``) the activations'. Not with
            ``optimizer``/``weights`` (they move parameters) nor with sub-batches.
        options: policy-specific options (see each policy's docstring).

    Raises:
        InvalidArgumentError: (also a ValueError) an unknown policy, option, GPU or scope,
            an unreadable, non-positive or non-finite budget, or ``scope="activations"``
            with ``optimizer``, ``weights`` or ``allow_sub_batches=True``, before any
            planning.
        InfeasibleBudgetError: the budget is below what the policy can reach, or below the
            layer-wise lower bound (the message names the bound and what to change; under
            ``scope="activations"`` every figure in it is activation-scoped, and it says so).
        outcore.host.HostBudgetError (an InfeasibleBudgetError): the plan's host copies
            exceed ``host_budget``.
    """
    from outcore import plan_cache, progress, sub_batching
    from outcore.plan.scope import ACTIVATIONS, check_scope, scoped_copy
    from outcore.validation import check_budget, check_gpu, check_policy
    from outcore.variants.notice import announce_variants

    limit = check_budget(budget)
    name = check_policy(policy, options)
    gpu = check_gpu(gpu)
    scope = check_scope(scope)
    if scope == ACTIVATIONS:
        _check_activation_scope(optimizer, weights, allow_sub_batches)
    split_ok = (sub_batching.allowed(name, allow_sub_batches) and recapture is not None
                and scope != ACTIVATIONS)
    model = cost if cost is not None else cost_model_for(gpu, graph)
    if hasattr(model, "bind"):  # before any policy: a measured profile writes its kernel
        model.bind(graph)       # temporaries onto the ops, which the memory rule counts
    real = graph
    can_split = recapture is not None and scope != ACTIVATIONS  # what refusals suggest
    if scope == ACTIVATIONS:  # plan on a copy without the scoped-out bytes (bound above)
        graph = scoped_copy(real)
    if optimizer is not None or weights is not None:
        return _plan_with_weights(graph, limit, name, model, optimizer, weights, simulate,
                                  host_budget, host_adam_rate)
    if limit is not None:
        layer_bound = reference_peaks(graph).layer_lower_bound
        if limit < layer_bound and not split_ok:
            with _refused(graph, model, can_split, scope):
                sub_batching.refuse_below_bound(name, limit, layer_bound, can_split)
    host_limit, host_source = resolve_host_budget(graph, host_budget)
    key = _cache_key(graph, limit, name, {**options, "(host_budget)": host_limit,
                                          "(scope)": scope}, model, split_ok, cache)
    cached = None if key is None else plan_cache.load(key)
    if cached is not None:
        cached_plan, schedule, peak, simulation, notes = cached
        result = PlannedStep(graph, cached_plan, schedule, peak, limit,
                             simulation if simulate else None, notes=list(notes))
        trace = memory_curve(graph, schedule)
    else:
        ctx = PolicyContext(budget=limit, cost=model,
                            recapture=_checked(recapture, graph) if split_ok else None,
                            options=options, config=config_for(name, options),
                            host_budget=host_limit, split_changes_ok=split_ok)
        with _refused(graph, model, can_split and not split_ok, scope,
                      opted_in=name if split_ok else None):
            result, trace = _run_fresh(graph, name, ctx, can_split and not split_ok, simulate)
    if scope == ACTIVATIONS:
        trace = _attach_real(result, real)
    check_host(result, trace, name, host_limit, host_source)
    if simulate and result.simulation is None:
        from outcore.sim import simulate as run_simulation

        with progress.task(f"simulating {graph.name}"):
            result.simulation = run_simulation(result.graph, result.schedule, model)
    if key is not None and cached is None and result.graph is real:
        plan_cache.store(key, (result.plan, result.schedule, result.scoped_peak,
                               result.simulation, list(result.notes)))
    if bound and simulate and limit is not None and result.plan.sub_batches == 1:
        _attach_bound(result, limit, model, graph)
    if result.plan.sub_batches > 1:
        result.notes.insert(0, sub_batching.announce_split(graph, result.plan.sub_batches,
                                                           result.graph))
    if graph.meta.get("rounding") and graph.meta["rounding"] not in result.notes:
        result.notes.append(graph.meta["rounding"])  # said at capture (RoundingWarning)
    variants_text = announce_variants(result.graph, result.schedule.variants)
    if variants_text is not None:
        result.notes.append(variants_text)
    from outcore.log import info as log_info

    log_info(f"planned {graph.name} with {result.plan.policy}"
             f"{' (from the plan cache)' if cached is not None else ''}: predicted peak "
             f"{format_bytes(result.predicted_peak)}"
             + (f", activation peak {format_bytes(result.scoped_peak)}" if scope == ACTIVATIONS
                else "") + f", {result.plan.sub_batches} sub-batch(es)")
    return result


def _plan_with_weights(graph: Graph, limit: int | None, name: str, model: Any,
                       optimizer: Any, weights: str | None, simulate: bool,
                       host_budget: int | str | None, host_adam_rate: float | None
                       ) -> PlannedStep:
    """``plan`` with ``optimizer=``: ``outcore.weights.planned.plan_weights``."""
    from outcore import progress
    from outcore.errors import InvalidArgumentError
    from outcore.log import info as log_info
    from outcore.weights.planned import plan_weights

    if optimizer is None:
        raise InvalidArgumentError(weights, "weights= together with optimizer=", "The "
                                   "placement is planned with the optimizer's state.")
    host_limit, host_source = resolve_host_budget(graph, host_budget)
    with progress.task(f"planning {graph.name}'s weights and activations with {name}"):
        result = plan_weights(graph, limit, name, model, optimizer, weights,
                              simulate=simulate, host_adam_rate=host_adam_rate,
                              host_limit=host_limit, host_source=host_source)
    log_info(f"planned {graph.name} with {result.plan.policy} and its weights: "
             f"{result.weights.summary()}")
    return result


def _checked(recapture: Callable[[int], Graph] | None, full: Graph
             ) -> Callable[[int], Graph] | None:
    """``recapture`` with every sub-batch graph checked against ``full``
    (``outcore.runtime.loss_split.checked_sub_batch``: a loss that cannot split exactly is
    refused for that size, and one that divides a sum by the batch size weighs as a mean)."""
    if recapture is None:
        return None
    from outcore.runtime.loss_split import checked_sub_batch

    return lambda parts: checked_sub_batch(recapture(parts), full)


def _run_fresh(graph: Graph, name: str, ctx: PolicyContext, unsplit: bool,
               simulate: bool = True) -> tuple[PlannedStep, MemoryTrace]:
    """Run policy ``name`` and check its schedule with the memory rule: the policy's own
    predicted peak (when it states one) must be the rule's, and the peak must fit the budget.
    With ``simulate``, the simulation the policy made of its schedule (if any) is kept.
    """
    from outcore import progress

    with progress.task(f"planning {graph.name} with {name}"):
        out = _run_policy(get(name).fn, graph, ctx, unsplit)
    # the trace and simulation a policy computed on exactly this graph and schedule
    # (outcore-auto's portfolio: ``PolicyOutput.trace``) are reused, not replayed again
    trace = out.trace if out.trace is not None else memory_curve(out.graph, out.schedule)
    peak = trace.peak
    if out.predicted_peak is not None and out.predicted_peak != peak:
        raise AssertionError(f"policy {name!r} predicted a peak of {out.predicted_peak} "
                             f"bytes, the memory rule gives {peak}")
    if ctx.budget is not None and peak > ctx.budget:
        raise InfeasibleBudgetError(name, ctx.budget, peak, "This policy ignores budgets or "
                                    "cannot move enough; try policy='auto'.")
    return PlannedStep(out.graph, out.plan, out.schedule, peak, ctx.budget,
                       out.simulation if simulate else None, notes=list(out.notes)), trace


def check_host(result: PlannedStep, trace: MemoryTrace, name: str, host_limit: int | None,
                host_source: str) -> None:
    """Fill ``result``'s host memory figures from ``trace`` (the memory rule's curve of its
    schedule); raise ``HostBudgetError`` when its host copies exceed ``host_limit``."""
    result.host_peak = max(trace.host, default=0)
    result.host_budget = host_limit
    result.host_sizes = _offload_sizes(result.schedule, trace)
    if host_limit is not None and result.host_peak > host_limit:
        from outcore.host import HostBudgetError

        raise HostBudgetError(name, host_limit, result.host_peak, host_source)


def _attach_bound(result: PlannedStep, limit: int, model: Any, graph: Graph) -> None:
    """Fill ``result.lower_bound`` (``outcore.policies.optimal.lower_bound`` on ``graph``, the
    graph the budget was planned on: a scoped copy under ``scope="activations"``), or say in
    its notes why none is reported (a schedule built outside ``outcore.plan.lower`` beat it).
    The plan's simulated step goes with it: where the coarse bound model already proves the
    plan within ``optimal.policy.REFINE_ABOVE``, the full bound model is not solved."""
    from outcore import progress
    from outcore.policies.optimal import lower_bound

    with progress.task(f"bounding {result.graph.name}'s step time (LP relaxation)"):
        step = None if result.simulation is None else result.simulation.step_time
        found = lower_bound(graph, limit, model, step)
    if found is not None and result.simulation is not None \
            and found > result.simulation.step_time:
        # the bound covers schedules that outcore.plan.lower builds from keep/offload/
        # recompute decisions; a policy's own schedule (PoocH's early swap-in) can beat it
        result.notes.append(
            f"no lower bound reported: this schedule ({result.plan.policy}, built outside "
            f"outcore.plan.lower) beats the LP bound of lowered plans "
            f"({found * 1e3:.2f} ms)")
    else:
        result.lower_bound = found


def resolve_host_budget(graph: Graph, host_budget: int | str | None) -> tuple[int | None, str]:
    """The host limit in bytes (None: none) and where it came from (see ``plan``)."""
    if host_budget is None:
        return None, ""
    if host_budget != MACHINE:
        return parse_bytes(host_budget), "host_budget="
    step = graph.source
    if step is None or getattr(step, "fake", True):
        return None, ""
    from outcore.host import host_limit

    found = host_limit()
    return found.bytes, found.source


def _offload_sizes(schedule: Schedule, trace: MemoryTrace) -> list[int]:
    """Bytes each Offload adds to the host, in schedule order (from the one memory rule)."""
    from outcore.plan.schedule import Offload

    sizes, before = [], 0
    for ins, host in zip(schedule.instructions, trace.host, strict=True):
        if isinstance(ins, Offload):
            sizes.append(host - before)
        before = host
    return sizes


@contextmanager
def _refused(graph: Graph, cost: Any, can_split: bool, scope: str = "step", *,
             opted_in: str | None = None) -> Iterator[None]:
    """Re-raise an InfeasibleBudgetError with the lowest peak any plan reaches and what would
    lower it (``outcore.refusal``; ``opted_in``: the policy's name when the user allowed
    sub-batches); a host budget's error passes as it is. Under
    ``scope="activations"`` (``graph`` is then the scoped copy, so every figure is
    activation-scoped) the message opens by saying so."""
    try:
        yield
    except InfeasibleBudgetError as exc:
        from outcore.host import HostBudgetError

        if isinstance(exc, HostBudgetError):
            raise
        from outcore.refusal import refusal

        found = refusal(graph, exc, cost, can_split, opted_in)
        if scope != "step":
            from outcore.plan.scope import scope_words

            lowest = found.lowest
            found = InfeasibleBudgetError(
                found.policy, found.budget, found.required,
                f"The budget bounds {scope_words(scope)}; every figure here is in those "
                f"terms. {found.hint}".strip())
            found.lowest = lowest
        raise found from exc


def _check_activation_scope(optimizer: Any, weights: str | None,
                            allow_sub_batches: bool | None) -> None:
    """InvalidArgumentError for what ``scope="activations"`` cannot plan (``plan``'s doc)."""
    from outcore.errors import InvalidArgumentError

    if optimizer is not None or weights is not None:
        raise InvalidArgumentError(
            "scope='activations' with optimizer=/weights=", "scope='step' there",
            "Planning the weights moves parameters and gradients, which an "
            "activation-scoped budget leaves out; with scope='step' the budget holds them "
            "all.")
    if allow_sub_batches:
        raise InvalidArgumentError(
            "scope='activations' with allow_sub_batches=True", "scope='step' there",
            "Sub-batches are planned on the whole step.")


def _attach_real(result: PlannedStep, real: Graph) -> MemoryTrace:
    """Move an activation-scoped ``result`` (planned on a scoped copy) onto ``real``: its
    ``scoped_peak`` is the planned peak, ``predicted_peak`` the real graph's, ``scope``
    "activations"; a simulation of the copy is dropped (``plan`` simulates the real graph).
    Returns the real graph's memory curve (the schedule replayed and checked on it)."""
    from outcore.plan.memory import trace_of
    from outcore.plan.residency import checked_steps

    trace = trace_of(checked_steps(real, result.schedule))
    result.scoped_peak = result.predicted_peak
    result.predicted_peak = trace.peak
    result.graph = real
    result.scope = "activations"
    result.simulation = None
    return trace


def _run_policy(fn: Callable[..., Any], graph: Graph, ctx: PolicyContext,
                could_split: bool) -> Any:
    """Run a policy; an infeasible budget that sub-batches could meet says so."""
    try:
        return fn(graph, ctx)
    except InfeasibleBudgetError as exc:
        if not could_split:
            raise
        raise InfeasibleBudgetError(
            exc.policy, exc.budget, exc.required,
            f"{exc.hint} Splitting the batch into sub-batches might fit: pass "
            "allow_sub_batches=True (CLI: --allow-sub-batches), which changes what BatchNorm "
            "computes.".strip()) from exc


def _cache_key(graph: Graph, limit: int | None, name: str, options: dict[str, Any],
               model: Any, split_ok: bool, cache: bool | None) -> str | None:
    from outcore import plan_cache

    if not plan_cache.enabled(cache):
        return None
    return plan_cache.plan_key(graph, limit, name, options, model, split_ok)


def policies() -> list[str]:
    """Every policy name ``plan``/``compile`` accept (plus "auto" for outcore-auto)."""
    from outcore.policies.registry import names

    return names()
