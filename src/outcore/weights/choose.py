"""Which parameters go to host memory, planned with the activations against one budget.

Plain Python (no torch). The device budget holds, during the step, what the Schedule keeps
resident (``predicted_peak``: activations, the device-held parameters and gradients, the
held parameters while they are prefetched) and, across steps, the optimizer state of the
device-held parameters (``state_bytes``: AdamW's two moments, ...). The state of a held
parameter lives in host memory, where its optimizer step runs.

The rule (``choose_weights``):

* the placements tried are prefixes of two rankings (``outcore.weights.search``: largest
  first, and most bytes per second of exposed copy and host optimizer time first), at
  byte targets that start where the end-of-step count says any fitting placement must be
  and grow by what the activation planners lacked, then wider and refined around the best;
* for each, the activations are planned by outcore-auto and outcore-checkpoint *through the
  same lowering*, so the activation planner sees the real peak, parameters' prefetches
  included, against ``budget - state of the device-held parameters``;
* placements are planned in the order of their own lower bound
  (``outcore.weights.bound.placement_bound``), and one whose bound is no better than the
  best step found is not planned (it cannot win);
* among those that fit, the smallest estimated step wins (within ``TIE`` of it, the one
  holding fewer bytes). With ``overlap`` (what ``outcore.plan`` uses) the step is the
  simulated schedule with each host-stepped parameter's optimizer step on the CPU as soon
  as its gradient has landed, overlapped with the rest of backward
  (``outcore.weights.step_cost.host_steps``, ``outcore.sim.host_steps``); without it, the
  simulated schedule plus the whole optimizer step after it
  (``outcore.weights.spec.optimizer_seconds``). The rates are read by
  ``outcore.weights.step_cost`` from the hardware profile (the host's measured or
  catalogued AdamW rate, the device's memory bandwidth); ``host_adam_rate`` overrides the
  host's. They are AdamW's: another optimizer's step is priced by the bytes it moves per
  parameter (``update_bytes``, ``outcore.weights.spec.update_rate``: SGD's below AdamW's);
* ``outcore.weights.bound.joint_lower_bound`` bounds every placement and plan from below;
  ``WeightChoice.gap`` is the chosen step's distance to it.

``mode="device"`` tries the empty placement only, ``mode="host"`` every parameter held
(a parameter another one views, tied weights, always stays on the device: the lowering
cannot hold it yet).
A gradient is sent to host memory exactly when its parameter is held; the optimizer state
lives with its parameter. ``WeightChoice.tried`` records every candidate for the report.

Mixed precision (``masters``: the parameters with an fp32 master, ``MasterWeights``): the
master and its optimizer state (a mastered parameter's ``state_bytes``) live in host
memory whatever the placement, so they are host bytes (``WeightChoice.host_state``), never
device bytes: holding such a parameter frees its weight and gradient only. Its step runs
on the host, where its master is, with the two casts of ``step_cost.master_cast_seconds``;
one the device keeps is stepped after the pass and its updated weight copied back h2d.
The lower bound and the ``cost`` ranking keep pricing a device-kept parameter's step on
the device without the casts: below what any placement costs, so still a bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from outcore.errors import (
    InfeasibleBudgetError,
    InvalidArgumentError,
    ProfileError,
    ScheduleError,
)
from outcore.graph.ir import Graph, Phase
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Plan
from outcore.plan.schedule import Schedule
from outcore.plan.weights import WeightPlacement, gradients, parameters
from outcore.units import format_bytes
from outcore.weights import search
from outcore.weights.bound import (
    JointBound,
    Overlap,
    ParamFacts,
    joint_lower_bound,
    op_times,
    param_facts,
    placement_bound,
)
from outcore.weights.spec import (
    ADAM_UPDATE_BYTES,
    DEVICE_ADAM_RATE,
    HOST_ADAM_RATE,
    optimizer_seconds,
    update_rate,
)

__all__ = ["DEVICE_ADAM_RATE", "HOST_ADAM_RATE", "MODES", "Candidate", "WeightChoice",
           "adam_state_bytes", "choose_weights", "default_planners", "ranking",
           "state_bytes_of"]

MODES = ("auto", "device", "host")
#: steps within this fraction of each other are a tie, won by the fewer held bytes
TIE = 1e-3
Planner = Callable[[Graph, int, Any, Callable[[Graph, Plan], Schedule]], tuple[Plan, Schedule]]


@dataclass
class Candidate:
    """One placement tried: its held bytes, and its outcome (``error`` when none fitted)."""

    held_bytes: int
    params: int
    policy: str = ""
    peak: int = 0
    device_state: int = 0
    step_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    error: str = ""
    ranking: str = ""
    required: int | None = None
    #: not planned: its own bound is no better than the best step found
    pruned: bool = False
    host_numel: int = 0
    device_numel: int = 0
    #: the mastered parameters' casts, and the copies back of the device-kept ones'
    #: updated weights (without ``overlap``; ``choose`` module doc)
    master_seconds: float = 0.0

    @property
    def fits(self) -> bool:
        return not self.error

    @property
    def total_seconds(self) -> float:
        return self.step_seconds + self.optimizer_seconds


@dataclass
class WeightChoice:
    """The chosen placement, the activation plan and Schedule that go with it, and why.

    ``device_state``: the optimizer state on the device (the device-held parameters' that
    have no host master), beside ``peak`` in the budget; ``host_state``: the optimizer
    state in host memory (the held parameters', and every master with its state);
    ``host_resident``: what stays in host memory across steps, the held parameters'
    weights and ``host_state`` (the step's host copies, sent gradients and offloaded
    activations, are in the schedule's host peak: ``WeightReport.host_bytes`` counts
    both); ``bound``: the joint lower bound (None without a cost model);
    ``facts``/``exposed``: every parameter's bytes (``state``: on the device unless held)
    and copy seconds, and the seconds of its copies the compute would not hide if held."""

    placement: WeightPlacement
    plan: Plan
    schedule: Schedule
    peak: int
    device_state: int
    host_resident: int
    step_seconds: float
    optimizer_seconds: float
    tried: list[Candidate] = field(default_factory=list)
    bound: JointBound | None = None
    host_state: int = 0
    facts: list[ParamFacts] = field(default_factory=list)
    exposed: dict[str, float] = field(default_factory=dict)
    chosen: Candidate | None = None

    @property
    def total_seconds(self) -> float:
        """The simulated step plus the optimizer step."""
        return self.step_seconds + self.optimizer_seconds

    @property
    def gap(self) -> float | None:
        """``total_seconds / bound - 1`` when the bound is known."""
        if self.bound is None or self.bound.seconds <= 0:
            return None
        return self.total_seconds / self.bound.seconds - 1.0

    def explain(self, graph: Graph) -> list[str]:
        """One line per candidate and one per held parameter: what moved and why."""
        lines = [("chosen: " if c is self.chosen else "")
                 + f"{c.ranking or 'given'} ranking, held {c.params} parameters "
                 f"({format_bytes(c.held_bytes)}): "
                 + (f"{c.policy}, peak {format_bytes(c.peak)} + state "
                    f"{format_bytes(c.device_state)}, step {c.step_seconds * 1e3:.3f} ms + "
                    f"optimizer {c.optimizer_seconds * 1e3:.3f} ms"
                    if c.fits else f"no plan ({c.error})")
                 for c in self.tried]
        if self.bound is not None:
            b = self.bound
            lines.append(f"lower bound {b.seconds * 1e3:.3f} ms (compute "
                         f"{b.compute * 1e3:.3f} ms, copies {b.copies * 1e3:.3f} ms, "
                         f"optimizer {b.optimizer * 1e3:.3f} ms; any fitting placement frees "
                         f"{format_bytes(b.need)}); gap {(self.gap or 0.0) * 100:.1f}%")
        lines += [f"{graph.tensors[t].source}: held in host memory (prefetched before its "
                  "forward and backward use; gradient sent to host; optimizer step on host)"
                  for t in sorted(self.placement.params)]
        return lines


def _rates(profile: Any, host: float | None, device: float | None) -> tuple[float, float]:
    """(host, device) optimizer parameters per second: given, else the profile's
    (``outcore.weights.step_cost``), else (no profile, or one without host figures)
    ``outcore.weights.spec``'s constants."""
    from outcore.weights import step_cost

    def read(rate: Callable[[Any], float], fallback: float) -> float:
        if profile is None or getattr(profile, "profile", profile) is None:
            return fallback
        try:
            return rate(profile)
        except ProfileError:  # a measured cost model without host figures
            return fallback

    return (read(step_cost.host_adam_rate, HOST_ADAM_RATE) if host is None else host,
            read(step_cost.device_adam_rate, DEVICE_ADAM_RATE) if device is None else device)


def _overlap(graph: Graph, profile: Any, times: list[float], host_rate: float,
             update_bytes: int) -> tuple[Any, Overlap]:
    """The profile the overlapped simulation prices the optimizer with (its host AdamW rate
    set to the chooser's ``host_rate``), and the bound's ``Overlap`` at the same rates for
    an optimizer moving ``update_bytes`` per parameter."""
    from outcore.cost.profiles import HardwareProfile
    from outcore.weights import step_cost

    prof = getattr(profile, "profile", None) or profile
    if not isinstance(prof, HardwareProfile):
        raise InvalidArgumentError(profile, "a hardware profile to simulate the optimizer "
                                   "overlapped with backward", "Pass cost= or profile=.")
    priced = dataclasses.replace(prof, host_adam_rate=host_rate)
    forward = sum(t for op, t in zip(graph.ops, times, strict=True)
                  if op.phase is Phase.FORWARD)
    return priced, Overlap(update_rate(host_rate, update_bytes),
                           update_rate(step_cost.device_adam_rate(priced), update_bytes),
                           forward)


def _casts(facts: list[ParamFacts], masters: frozenset[str], profile: Any,
           host_adam_rate: float) -> float:
    """Seconds of the casts of every mastered parameter's step
    (``outcore.weights.step_cost.master_cast_seconds`` at its element size), at the
    profile's host DRAM bandwidth, else the one derived from the chooser's host AdamW rate
    (``step_cost.host_bandwidth``)."""
    from outcore.weights.step_cost import host_bandwidth, master_cast_seconds

    bandwidth = host_bandwidth(profile, host_adam_rate)
    return sum(master_cast_seconds(f.numel, f.weight // max(f.numel, 1), bandwidth)
               for f in facts if f.name in masters)


def ranking(graph: Graph, state_bytes: Mapping[str, int]) -> list[str]:
    """Parameter names, largest device bytes freed by holding them first (ties: later
    parameters first, whose backward use comes first)."""
    params = parameters(graph)
    size = {n: graph.tensors[t].nbytes + state_bytes.get(n, 0) for n, t in params.items()}
    return sorted(params, key=lambda n: (-size[n], -params[n]))


def choose_weights(graph: Graph, budget: int, cost: Any, state_bytes: Mapping[str, int], *,
                   planners: Mapping[str, Planner] | None = None,
                   simulate: Callable[[Graph, Schedule], float] | None = None,
                   host_adam_rate: float | None = None,
                   device_adam_rate: float | None = None, mode: str = "auto",
                   given: Iterable[str] | None = None, profile: Any = None,
                   overlap: bool = False, update_bytes: int = ADAM_UPDATE_BYTES,
                   masters: Collection[str] = ()) -> WeightChoice:
    """The fastest candidate placement that fits ``budget`` (module doc); raises
    ``InfeasibleBudgetError`` with the lowest need seen when none does. ``given``: plan
    exactly the placement holding these parameter names (``mode`` is then ignored).
    ``profile``: the hardware profile pricing the optimizer step (default: ``cost``'s; with
    neither, the rates default to ``outcore.weights.spec``'s constants). ``overlap``: decide
    by the step with the optimizer overlapped with backward (``outcore.sim.simulate`` with
    ``outcore.weights.step_cost.host_steps``: each host step as soon as its gradient has
    landed) instead of the simulated pass plus the optimizer after it; needs ``cost``
    with a hardware profile (``simulate`` is then not called). ``update_bytes``: the bytes
    the optimizer's step moves per parameter (``outcore.weights.spec.update_bytes_of``;
    default AdamW's): ``host_adam_rate``/``device_adam_rate`` (AdamW's) are scaled by it.
    ``masters``: the parameters with an fp32 master in host memory (``MasterWeights``;
    ``outcore.weights.spec.graph_masters``), whose ``state_bytes`` (master and state) are
    host bytes whatever the placement (module doc)."""
    if mode not in MODES:
        raise InvalidArgumentError(mode, f"a weights placement among {MODES}")
    host_adam_rate, device_adam_rate = _rates(cost if profile is None else profile,
                                              host_adam_rate, device_adam_rate)

    host_rate = update_rate(host_adam_rate, update_bytes)
    device_rate = update_rate(device_adam_rate, update_bytes)

    def step_cost(host: float, device: float) -> float:
        return optimizer_seconds(int(host), int(device), host_rate=host_rate,
                                 device_rate=device_rate)

    mastered = frozenset(masters)
    on_device = {n: 0 if n in mastered else b for n, b in state_bytes.items()}
    facts = param_facts(graph, on_device, cost)
    times = op_times(graph, cost) if cost is not None else [0.0] * len(graph.ops)
    timing = _overlap(graph, cost if profile is None else profile, times, host_adam_rate,
                      update_bytes) if overlap and cost is not None else None
    bound = joint_lower_bound(graph, budget, cost, on_device, step_cost=step_cost,
                              overlap=timing[1] if timing else None) \
        if cost is not None else None
    need = sum(f.freed for f in facts) - budget
    exposed = search.exposure(graph, facts, times)
    run = _Runner(graph, budget, cost, facts, planners or default_planners(), simulate,
                  step_cost)
    run.update_bytes = update_bytes
    run.masters, run.master_host = mastered, sum(state_bytes.get(n, 0) for n in mastered)
    run.casts = _casts(facts, mastered, cost if profile is None else profile, host_adam_rate)
    if timing is not None:
        run.priced, run.overlap = timing
    if given is not None:
        names = {n.removeprefix("model.") for n in given}
        unknown = names - {f.name for f in facts if f.holdable}
        if unknown:
            raise InvalidArgumentError(sorted(unknown)[0], "a parameter name of the graph "
                                       "that is not tied to another (tied ones stay on the "
                                       "device)")
        run.evaluate(search.Proposal(tuple(f.name for f in facts if f.name in names),
                                     "given", 0.0))
    elif mode == "device":
        run.evaluate(search.Proposal((), "given", 0.0))
    elif mode == "host":
        run.evaluate(search.Proposal(tuple(f.name for f in facts if f.holdable), "given",
                                     1.0))
    else:
        run.compute = sum(times)
        run.engines = int(getattr(cost, "copy_engines", 2))
        _search(run, facts, need, search.rankings(facts, exposed, step_cost))
    if run.best is None:
        raise _refusal(budget, run.tried, mode)
    run.best.tried = run.tried
    run.best.bound = bound
    run.best.facts = facts
    run.best.exposed = exposed
    return run.best


def _search(run: _Runner, facts: list[ParamFacts], need: int,
            orders: dict[str, list[str]]) -> None:
    """The placements of ``outcore.weights.search``, planned by ``run``: per ranking the
    shortest fitting prefix (``_first_fit``), then wider, then refined; every parameter
    held when none fitted (the refusal's lowest figure)."""
    freed = {f.name: f.freed for f in facts if f.holdable}
    total = sum(freed.values())
    fitting: dict[str, float] = {}
    tried: dict[str, list[float]] = {r: [] for r in orders}
    for ranking, order in orders.items():
        found = _first_fit(run, order, freed, float(max(0, need)), ranking, tried[ranking])
        if found is not None:
            fitting[ranking] = found
    for prop in run.by_bound(search.wider(fitting, total, freed, orders)):
        run.evaluate(prop)
        tried[prop.ranking].append(prop.target)
    if run.best is None:
        run.evaluate(search.Proposal(tuple(sorted(freed)), "all", float(total)))
        return
    best = run.best_proposal
    if best.ranking in orders:
        for prop in run.by_bound(search.refine(best, tried[best.ranking], freed, orders)):
            run.evaluate(prop)


def _first_fit(run: _Runner, order: list[str], freed: dict[str, int], target: float,
               ranking: str, tried: list[float]) -> float | None:
    """The held bytes of the shortest prefix of ``order`` that fits (or that the bound
    prunes: no longer prefix can win then), None when even all of it does not.

    From ``target`` (the need) the prefix grows by what the planners lacked, *past the
    failed prefix's own bytes* (a prefix overshoots its target by up to one parameter, so
    growing the target alone can name the same prefix again), ``search.STEPS`` times; then
    it bisects on the prefix length between the longest failed one and the whole ranking
    (taking fitting as monotone in the prefix: each longer one frees more device bytes,
    though its prefetches also take room; a non-monotone ranking can make the bisection
    miss a shorter fitting prefix, never return one that does not fit)."""
    bytes_of = [0]
    for name in order:
        bytes_of.append(bytes_of[-1] + freed[name])

    def length(t: float) -> int:
        return len(search.prefix(order, freed, t))

    def attempt(k: int) -> Candidate:
        tried.append(float(bytes_of[k]))
        return run.evaluate(search.Proposal(tuple(order[:k]), ranking, float(bytes_of[k])))

    failed, k = -1, length(target)
    for _ in range(search.STEPS):
        cand = attempt(k)
        if cand.fits or cand.pruned:
            return float(bytes_of[k])
        failed = k
        if cand.required is None or k == len(order):
            break
        k = max(k + 1, length(bytes_of[k] + max(cand.required - run.budget, 1)))
    if failed >= len(order):
        return None
    hi = len(order)
    cand = attempt(hi)
    if not (cand.fits or cand.pruned):
        return None
    while hi - failed > 1:
        mid = (failed + hi) // 2
        cand = attempt(mid)
        if cand.fits or cand.pruned:
            hi = mid
        else:
            failed = mid
    return float(bytes_of[hi])


class _Runner:
    """Plans candidate placements and keeps the fastest that fits."""

    def __init__(self, graph: Graph, budget: int, cost: Any, facts: list[ParamFacts],
                 planners: Mapping[str, Planner],
                 simulate: Callable[[Graph, Schedule], float] | None,
                 step_cost: Callable[[float, float], float]) -> None:
        self.graph, self.budget, self.cost = graph, budget, cost
        self.facts = {f.name: f for f in facts}
        self.planners, self.simulate, self.step_cost = planners, simulate, step_cost
        self.tried: list[Candidate] = []
        self.best: WeightChoice | None = None
        self.best_proposal = search.Proposal((), "", 0.0)
        self._seen: dict[frozenset[str], Candidate] = {}
        self.compute: float | None = None  # set: prune by each placement's bound
        self.engines = 2
        self.priced: Any = None  # with ``overlap``: the profile pricing the host steps
        self.overlap: Overlap | None = None
        self.update_bytes = ADAM_UPDATE_BYTES  # the optimizer's, for the host steps
        self.masters: frozenset[str] = frozenset()  # parameters with a host master
        self.master_host = 0  # bytes of the masters and their state (host, any placement)
        self.casts = 0.0  # seconds of the masters' casts (the same for every placement)

    def bound(self, prop: search.Proposal) -> float:
        """``placement_bound`` of ``prop`` (0 when not pruning)."""
        if self.compute is None:
            return 0.0
        return placement_bound([self.facts[n] for n in prop.names], list(self.facts.values()),
                               self.compute, self.engines, self.step_cost, self.overlap)

    def by_bound(self, props: list[search.Proposal]) -> list[search.Proposal]:
        """``props``, the lowest bound first (ties: as given), so the pruning bites."""
        return sorted(props, key=self.bound)

    def evaluate(self, prop: search.Proposal) -> Candidate:
        """Plan ``prop`` (once per distinct placement) and return its Candidate."""
        key = frozenset(prop.names)
        if key in self._seen:
            return self._seen[key]
        held = [self.facts[n] for n in prop.names]
        device = [f for n, f in self.facts.items() if n not in key]
        params, grads = parameters(self.graph), gradients(self.graph)
        placement = WeightPlacement(frozenset(params[f.name] for f in held),
                                    frozenset(grads[f.name] for f in held if f.name in grads))
        device_state = sum(f.state for f in device)
        cand = Candidate(held_bytes=sum(f.freed for f in held), params=len(held),
                         device_state=device_state, ranking=prop.ranking)
        kept = [f for f in device if f.name in self.masters]  # stepped on the host
        cand.host_numel = sum(f.numel for f in held) + sum(f.numel for f in kept)
        cand.device_numel = sum(f.numel for f in device) - sum(f.numel for f in kept)
        back = getattr(self.cost, "transfer_time", None)
        cand.master_seconds = self.casts + (sum(back(f.weight, "h2d") for f in kept)
                                            if back is not None else 0.0)
        cand.optimizer_seconds = self._optimizer(cand)
        self.tried.append(cand)
        self._seen[key] = cand
        floor = self.bound(prop)
        if self.best is not None and floor >= self.best.total_seconds:
            cand.error = (f"not planned: no activation plan beats {floor * 1e3:.3f} ms with "
                          f"this placement, the best step found is "
                          f"{self.best.total_seconds * 1e3:.3f} ms")
            cand.pruned = True
            return cand
        room = self.budget - device_state
        if room <= 0:
            cand.error = (f"the device-held optimizer state alone ({format_bytes(device_state)})"
                          " fills the budget")
            cand.required = sum(f.freed for f in device)  # at the end of the step
            return cand
        found = self._plan(cand, placement, room)
        if found is None:
            return cand
        plan, schedule = found
        if self.best is None or _better(cand, self.best):
            host_state = sum(f.state for f in held) + self.master_host
            self.best = WeightChoice(placement, plan, schedule, cand.peak, device_state,
                                     sum(f.weight for f in held) + host_state,
                                     cand.step_seconds, cand.optimizer_seconds,
                                     host_state=host_state, chosen=cand)
            self.best_proposal = prop
        return cand

    def _plan(self, cand: Candidate, placement: WeightPlacement, room: int
              ) -> tuple[Plan, Schedule] | None:
        """Each planner through the weights' lowering; the fastest fitting plan, or None
        (``cand.error``/``required`` say why)."""
        lowerer = partial(lower, weights=placement)
        errors: list[str] = []
        best: tuple[Plan, Schedule] | None = None
        for pname, planner in self.planners.items():
            try:
                plan, schedule = planner(self.graph, room, self.cost, lowerer)
            except (InfeasibleBudgetError, ScheduleError) as exc:
                need = getattr(exc, "required", None)
                if isinstance(need, int):
                    need += cand.device_state
                    cand.required = need if cand.required is None else min(cand.required,
                                                                            need)
                errors.append(str(exc).splitlines()[0][:120])
                continue
            peak = predicted_peak(self.graph, schedule)
            if peak > room:
                errors.append(f"{pname}'s plan peaks at {format_bytes(peak)} > "
                              f"{format_bytes(room)}")
                need = peak + cand.device_state
                cand.required = need if cand.required is None else min(cand.required, need)
                continue
            seconds, optimizer = self._time(schedule, cand)
            if best is None or seconds + optimizer < cand.total_seconds:
                cand.policy, cand.peak = pname, peak
                cand.step_seconds, cand.optimizer_seconds = seconds, optimizer
                best = (plan, schedule)
        if best is None:
            cand.error = errors[0] if errors else "no planner"
        return best

    def _time(self, schedule: Schedule, cand: Candidate) -> tuple[float, float]:
        """(the pass, what the optimizer adds after it) of ``schedule``: overlapped with
        backward by the simulator's host timeline, or the simulated pass and the whole
        optimizer step after it."""
        if self.overlap is not None:
            from outcore.sim import simulate
            from outcore.weights.step_cost import host_steps

            result = simulate(self.graph, schedule, self.cost,
                              optimizer=host_steps(self.graph, schedule, self.priced,
                                                   update_bytes=self.update_bytes,
                                                   masters=self.masters))
            return result.step_time - result.optimizer_time, result.optimizer_time
        seconds = self.simulate(self.graph, schedule) if self.simulate is not None else 0.0
        return seconds, self._optimizer(cand)

    def _optimizer(self, cand: Candidate) -> float:
        """The optimizer step after the pass (not overlapped): ``step_cost`` at the
        candidate's host/device split plus its ``master_seconds``."""
        return self.step_cost(cand.host_numel, cand.device_numel) + cand.master_seconds


def _better(cand: Candidate, best: WeightChoice) -> bool:
    """Whether ``cand`` replaces ``best``: faster by more than ``TIE`` of the step, or
    within it and holding fewer bytes in host memory (a step that only hides a few
    microseconds more of the device's optimizer step is not worth pinned host memory)."""
    held = best.chosen.held_bytes if best.chosen is not None else 0
    if cand.total_seconds < best.total_seconds * (1 - TIE):
        return True
    return cand.total_seconds <= best.total_seconds * (1 + TIE) and cand.held_bytes < held


def _refusal(budget: int, tried: list[Candidate], mode: str) -> InfeasibleBudgetError:
    """No placement fits: the lowest need any candidate reported, and the ways out."""
    needs = [c.required for c in tried if c.required is not None]
    lowest = min(needs) if needs else budget + 1
    every = max(tried, key=lambda c: c.held_bytes) if tried else None
    what = ("with every parameter, gradient and optimizer state in host memory"
            if every is not None and every.params and mode != "device" else
            "with the weights on the device")
    hint = (f"No placement fits: {what} the lowest the planners reach is "
            f"{format_bytes(lowest)} (activations, the parameters in flight and the "
            "device-held state). Ways out: a budget of at least "
            f"{format_bytes(lowest)} (a GPU with more memory), a smaller batch or sequence, "
            "or a smaller model or precision.")
    if mode == "device":
        hint += " weights='auto' would hold parameters in host memory."
    exc = InfeasibleBudgetError("outcore-auto (weights)", budget, lowest, hint)
    exc.lowest = lowest
    return exc


def default_planners() -> dict[str, Planner]:
    """outcore-auto and outcore-checkpoint, each given the weights' lowering."""
    from outcore.policies.auto import plan_auto, plan_checkpoint

    return {"outcore-auto": plan_auto, "outcore-checkpoint": plan_checkpoint}


def state_bytes_of(names: list[str], state_bytes: Mapping[str, int]) -> int:
    return sum(state_bytes.get(n, 0) for n in names)


def adam_state_bytes(graph: Graph) -> dict[str, int]:
    """Adam/AdamW's state per parameter of ``graph`` (two moments of the parameter's size
    and dtype, and a 4-byte step), as ``outcore.weights.optimizer.state_bytes`` sizes it:
    for a graph captured with fake tensors, where no optimizer is built
    (``outcore.weights.spec.STATE``'s account)."""
    from outcore.weights.spec import graph_state_bytes, torch_spec

    return graph_state_bytes(graph, torch_spec("Adam", master=False, own_dtype=True))
