"""The memory rule's replay (``outcore.plan.residency``): exact steps on a hand-made schedule
(a view outliving its base, offload/prefetch, a recompute's duplicate, variant workspace), and,
on the spine's models, agreement with a plain oracle replay and with every consumer of the
rule (``memory_curve``, the simulator's lifetimes, the pool's blocks, outcore-auto's spans)."""

from __future__ import annotations

import pytest

from outcore.capture import capture
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.graph.ir import STATIC_KINDS, Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.residency import (
    NONE,
    TRANSIENT,
    Allocation,
    Step,
    residency_steps,
    resident_spans,
)
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.policies import baseline
from outcore.pool import blocks_from_schedule, live_curve
from outcore.sim import Lifetime, simulate

from models import MODELS, make

X, W, A, V, M, N, LOSS = range(7)  # tensor ids of the hand-made graph
CONV, VIEW, NORM, LOSS_OP = range(4)  # its op ids


def hand_graph() -> Graph:
    """x, w -> conv -> a; v = view(a); norm(v) -> (m: 8 B statistics, n); loss(n).
    ``norm`` has a variant with 1000 B of workspace."""
    spec = [  # name, nbytes, kind, storage
        ("x", 100, TensorKind.INPUT, X), ("w", 40, TensorKind.PARAMETER, W),
        ("a", 400, TensorKind.ACTIVATION, A), ("v", 0, TensorKind.ACTIVATION, A),
        ("m", 8, TensorKind.ACTIVATION, M), ("n", 400, TensorKind.ACTIVATION, N),
        ("loss", 4, TensorKind.OUTPUT, LOSS),
    ]
    tensors = [Tensor(i, name, (1,), "float32", b, kind, s)
               for i, (name, b, kind, s) in enumerate(spec)]
    ops_spec = [("conv", OpCategory.CONV, [X, W], [A]), ("view", OpCategory.VIEW, [A], [V]),
                ("norm", OpCategory.NORM, [V], [M, N]), ("loss", OpCategory.LOSS, [N], [LOSS])]
    ops = []
    for oid, (name, category, ins, outs) in enumerate(ops_spec):
        ops.append(Op(oid, name, f"aten.{name}.default", Phase.FORWARD, category, ins, outs))
        for t in outs:
            tensors[t].producer = oid
        for t in ins:
            tensors[t].consumers.append(oid)
    ops[NORM].variant_options = {"fast": {"workspace": 1000}}
    graph = Graph(tensors, ops, outputs=[LOSS], name="hand")
    graph.validate()
    return graph


def hand_schedule() -> Schedule:
    return Schedule([
        Compute(CONV), Compute(VIEW), Offload(A), Wait(A, "d2h"), Free(A),      # 0-4
        Compute(NORM), Free(V), Free(N), Prefetch(A), Wait(A, "h2d"),           # 5-9
        Compute(VIEW, recompute=True), Compute(NORM, recompute=True),           # 10-11
        Compute(LOSS_OP),                                                       # 12
    ], keep_at_end=[LOSS], variants={NORM: "fast"})


def alloc(tid: int, nbytes: int) -> Allocation:
    return Allocation(tid, nbytes, tid)


WORKSPACE = Allocation(TRANSIENT, 1000, NONE)


def test_hand_schedule_steps():
    steps = list(residency_steps(hand_graph(), hand_schedule()))
    # at, allocations, released, made_resident, dropped, device, transient, host, tensors
    assert steps == [
        Step(-1, (alloc(X, 100), alloc(W, 40)), NONE, (X, W), NONE, 140, 0, 0, 2),
        Step(0, (alloc(A, 400),), NONE, (A,), NONE, 540, 0, 0, 3),
        Step(1, (), NONE, (V,), NONE, 540, 0, 0, 4),  # a view: no allocation
        Step(2, (), NONE, (), NONE, 540, 0, 400, 4),  # offload: host bytes only
        Step(3, (), NONE, (), NONE, 540, 0, 400, 4),
        Step(4, (), NONE, (), A, 540, 0, 400, 3),  # the view v still holds a's storage
        Step(5, (alloc(M, 8), alloc(N, 400), WORKSPACE), NONE, (M, N), NONE, 1948, 1000, 400, 5),
        Step(6, (), A, (), V, 548, 0, 400, 4),  # the last tensor of a's storage goes
        Step(7, (), N, (), N, 148, 0, 400, 3),
        Step(8, (alloc(A, 400),), NONE, (A,), NONE, 548, 0, 400, 4),  # prefetch allocates
        Step(9, (), NONE, (), NONE, 548, 0, 400, 4),
        Step(10, (), NONE, (V,), NONE, 548, 0, 400, 5),
        # m is still resident: its recompute is a duplicate for this instruction only,
        # listed in output order before n's allocation, then the workspace
        Step(11, (Allocation(TRANSIENT, 8, M), alloc(N, 400), WORKSPACE), NONE, (N,), NONE,
             1956, 1008, 400, 6),
        Step(12, (alloc(LOSS, 4),), NONE, (LOSS,), NONE, 952, 0, 400, 7),
    ]


def test_workspace_argument_overrides_the_variants():
    graph, schedule = hand_graph(), hand_schedule()
    none = list(residency_steps(graph, schedule, lambda op: 0))
    assert [s.transient for s in none[1:]] == [0] * 11 + [8, 0]  # only the duplicate of m
    assert all(a.tensor != NONE for s in none for a in s.allocations)
    custom = list(residency_steps(graph, schedule, lambda op: 7 * (op + 1)))
    assert custom[1].allocations == (alloc(A, 400), Allocation(TRANSIENT, 7, NONE))
    assert custom[1].device == 547


def test_a_free_of_a_tensor_not_resident_is_ignored():
    graph = hand_graph()
    schedule = Schedule([Compute(CONV), Free(A), Free(A), Free(X)])
    steps = list(residency_steps(graph, schedule))[1:]
    assert [(s.released, s.dropped, s.device, s.tensors) for s in steps] == [
        (NONE, NONE, 540, 3), (A, A, 140, 2), (NONE, NONE, 140, 2), (X, X, 40, 1)]


def test_hand_schedule_consumers_agree():
    graph, schedule = hand_graph(), hand_schedule()
    steps = list(residency_steps(graph, schedule))
    trace = memory_curve(graph, schedule)
    assert trace.device == [s.device for s in steps[1:]]
    assert (trace.static, trace.peak) == (140, 1956)
    assert live_curve(blocks_from_schedule(graph, schedule)) == trace.device
    result = simulate(graph, schedule, AnalyticCostModel(get_profile("k40c")))
    n = len(schedule)
    assert result.lifetimes == [  # released first (in release order), then by allocation
        Lifetime(A, 400, 0, 6), Lifetime(N, 400, 5, 7), Lifetime(X, 100, -1, n),
        Lifetime(W, 40, -1, n), Lifetime(M, 8, 5, n), Lifetime(A, 400, 8, n),
        Lifetime(N, 400, 11, n), Lifetime(LOSS, 4, 12, n)]
    # auto's spans follow the base tensor itself: a's first span ends at its own Free (4)
    assert resident_spans(graph, schedule) == {
        A: [(0, 4), (8, n)], N: [(5, 7), (11, n)], M: [(5, n)], LOSS: [(12, n)]}


# ---- the spine's models ------------------------------------------------------------------

def oracle(graph: Graph, schedule: Schedule, workspace) -> list[tuple[set[int], int, int]]:
    """The memory rule replayed plainly, independently of ``residency_steps``: per
    instruction, (resident tensors, device bytes, host bytes) after it."""
    tensors = graph.tensors
    resident = {t.id for t in tensors if t.kind in STATIC_KINDS}
    host = 0
    out = []
    for ins in schedule.instructions:
        extra = 0
        if isinstance(ins, Compute):
            outputs = graph.ops[ins.op].outputs
            extra = sum(tensors[t].nbytes for t in outputs if t in resident) + workspace(ins.op)
            resident |= set(outputs)
        elif isinstance(ins, Prefetch):
            resident.add(ins.tensor)
        elif isinstance(ins, Free):
            resident.discard(ins.tensor)
        elif isinstance(ins, Offload):
            host += tensors[tensors[ins.tensor].storage].nbytes
        storages = {tensors[t].storage for t in resident}
        out.append((set(resident), sum(tensors[s].nbytes for s in storages) + extra, host))
    return out


POLICIES = [baseline.keep_all, baseline.liveness, baseline.offload_all, baseline.recompute_cheap]


@pytest.fixture(scope="module", params=MODELS)
def graph(request):
    model, loss_fn, batch = make(request.param)
    return capture(model, loss_fn, batch)


def _workspace(op: int) -> int:
    return 64 * (op % 3)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_steps_follow_the_oracle_and_keep_their_invariants(graph, policy):
    schedule = lower(graph, policy(graph))
    steps = list(residency_steps(graph, schedule, _workspace))
    expected = oracle(graph, schedule, _workspace)
    assert [s.at for s in steps] == list(range(-1, len(schedule)))
    assert [(s.device, s.host) for s in steps[1:]] == [(d, h) for _, d, h in expected]
    assert [s.tensors for s in steps[1:]] == [len(r) for r, _, _ in expected]
    tensors = graph.tensors
    before: set[int] = set()
    prev = Step(-2, (), NONE, (), NONE, 0, 0, 0, 0)
    nows = [set(steps[0].made_resident), *(r for r, _, _ in expected)]
    for step, now in zip(steps, nows, strict=True):
        stored = {a.storage for a in step.allocations if a.storage != TRANSIENT}
        assert set(step.made_resident) == now - before
        assert step.dropped == NONE or before - now == {step.dropped}
        assert stored == {tensors[t].storage for t in now} - {tensors[t].storage for t in before}
        gone = {tensors[t].storage for t in before} - {tensors[t].storage for t in now}
        assert gone == ({step.released} - {NONE})
        assert step.transient == sum(a.nbytes for a in step.allocations if a.storage == TRANSIENT)
        assert step.device - step.transient == (prev.device - prev.transient
                                                + sum(a.nbytes for a in step.allocations
                                                      if a.storage != TRANSIENT)
                                                - (tensors[step.released].nbytes
                                                   if step.released != NONE else 0))
        assert step.host >= prev.host
        before, prev = now, step


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_every_consumer_agrees_with_the_steps(graph, policy):
    schedule = lower(graph, policy(graph))
    steps = list(residency_steps(graph, schedule))
    trace = memory_curve(graph, schedule)
    assert trace.device == [s.device for s in steps[1:]]
    assert trace.static == steps[0].device == graph.static_bytes()
    assert live_curve(blocks_from_schedule(graph, schedule)) == trace.device
    lifetimes = simulate(graph, schedule, AnalyticCostModel(get_profile("k40c"))).lifetimes
    for step in steps[1:]:
        held = sum(lt.nbytes for lt in lifetimes if lt.start <= step.at < lt.end)
        assert held == step.device - step.transient, step.at
    resident = [r for r, _, _ in oracle(graph, schedule, lambda op: 0)]
    for tid, spans in resident_spans(graph, schedule).items():
        for start, end in spans:
            assert all(tid in resident[i] for i in range(start, end)), (tid, start, end)
            assert end == len(schedule) or tid not in resident[end]
