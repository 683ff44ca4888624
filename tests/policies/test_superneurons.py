"""SuperNeurons policy: the paper's rules on a hand-made CNN graph with known answers (cost-aware
recomputation, LRU tensor cache, offload only when memory is short), and the executor running
the schedules on small real models."""

from __future__ import annotations

import copy

import pytest
import torch

from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, Phase
from outcore.graph.order import execution_order
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Wait
from outcore.plan.verify import verify
from outcore.policies import registry
from outcore.policies.registry import PolicyContext
from outcore.policies.superneurons import LruCache, checkpoint_tensor, plan_superneurons, segment
from outcore.runtime.devices.factory import make_device
from outcore.runtime.executor import Executor
from outcore.sim import simulate

from models import make


def sn(graph: Graph, budget: int | None = None, cost=None, **options):
    """SuperNeurons' entry point for a context with ``budget``, ``cost`` and ``options``
    (the user's spelling: strings read as the config's enums)."""
    return plan_superneurons(graph, PolicyContext(budget=budget, cost=cost, options=options))


def tname(graph: Graph, tid: int) -> str:
    return graph.tensors[tid].name


def recomputed(graph: Graph, schedule) -> list[str]:
    return [graph.ops[o].name for o in schedule.recomputed_ops()]


# ---- checkpoints, segments, cost-aware choice -----------------------------------------------

def test_checkpoints_are_conv_and_fc_outputs_through_in_place_relu(cnn):
    seg = segment(cnn, execution_order(cnn, "superneurons"))
    assert {tname(cnn, s) for s in seg.checkpoints} == {"r0", "r1", "r2", "y"}
    assert {tname(cnn, s) for s in seg.offloadable} == {"r0", "r1", "r2"}  # CONV only
    assert {tname(cnn, s) for s in seg.dropped} == {"c0", "p0", "idx0", "c1", "p1", "idx1", "c2"}
    assert tname(cnn, checkpoint_tensor(cnn, 0)) == "r0"  # conv0's output feeds ReLU only


def test_cost_aware_picks_memory_centric_where_speed_centric_exceeds_l_peak(cnn):
    seg = segment(cnn, execution_order(cnn, "superneurons"))
    # l_peak: dpool0 holds gp0 + r0 + idx0 + gr0 = 100 + 200 + 800 + 200 = 1300 B.
    assert seg.l_peak == 1300
    costs = [s.speed_cost(cnn) for s in seg.segments]
    # seg0: p0 + idx0 (900) + its source r0 (200) + dpool0 (1300) = 2400 > 1300
    # seg1: p1 + idx1 (300) + its source r1 (200) + dpool1 (700) = 1200 <= 1300
    assert costs[:2] == [2400, 1200]
    assert [s.strategy for s in seg.segments] == ["memory", "speed", "speed", "speed"]


@pytest.mark.parametrize("strategy, expected", [
    ("speed", ["pool1", "pool0"]),  # once per segment, results kept
    ("memory", ["pool1", "pool1", "pool0", "pool0"]),  # per backward layer that needs them
    ("cost-aware", ["pool1", "pool0", "pool0"]),  # seg0 memory-centric, seg1 speed-centric
    ("none", []),
])
def test_recomputations_follow_the_strategy(cnn, strategy, expected):
    r = sn(cnn, recompute=strategy, offload=False)
    verify(cnn, r.schedule)
    assert recomputed(cnn, r.schedule) == expected
    assert r.recomputations == len(expected)


def test_cost_aware_peak_equals_memory_centric_with_fewer_recomputations(cnn):
    speed = sn(cnn, recompute="speed", tensor_cache=False)
    memory = sn(cnn, recompute="memory", tensor_cache=False)
    aware = sn(cnn, recompute="cost-aware", tensor_cache=False)
    assert aware.peak == memory.peak < speed.peak
    assert speed.recomputations < aware.recomputations < memory.recomputations


def test_anchor_keeps_a_shortcut_so_recomputation_stays_in_its_segment():
    model, loss_fn, batch = make("resnet")
    graph = capture(model, loss_fn, batch, fake=True)
    seg = segment(graph, execution_order(graph, "superneurons"))
    assert seg.anchors, "block outputs read by the next block's add are anchors"
    for s in seg.anchors:
        readers = {graph.ops[c].target for t in graph.aliases()[s]
                   for c in graph.tensors[t].consumers if graph.ops[c].phase is Phase.FORWARD}
        assert "aten.add.Tensor" in readers
    r = sn(graph)
    forward_ops = {o.id for o in graph.ops if o.phase is Phase.FORWARD}
    # every recompute chain starts from checkpoints: no op is recomputed twice in a row of blocks
    assert set(r.schedule.recomputed_ops()) <= forward_ops
    assert all(graph.ops[o].category.value not in ("conv", "matmul")
               for o in r.schedule.recomputed_ops())


# ---- the tensor pool ------------------------------------------------------------------------

def test_lru_cache_order_and_locks():
    lru = LruCache()
    for s in (1, 2, 3):
        lru.insert_front(s)
    assert lru.order() == [3, 2, 1]
    lru.place_to_front(1)  # a hit
    assert lru.order() == [1, 3, 2]
    assert list(lru.unlocked_from_tail(lambda s: s == 2)) == [3, 1]
    lru.remove(3)
    assert lru.order() == [1, 2]


def test_no_budget_moves_nothing_and_eager_mode_offloads_every_conv_checkpoint(chain):
    cached = sn(chain)
    assert cached.schedule.count(Offload) == 0 and cached.stats.offloads == 0
    eager = sn(chain, tensor_cache=False)
    assert {tname(chain, i.tensor) for i in eager.schedule.instructions
            if isinstance(i, Offload)} == {f"r{i}" for i in range(1, 7)}
    assert eager.peak < cached.peak


def test_tensor_cache_offloads_only_when_memory_is_short(chain):
    free_run = sn(chain)
    ok = sn(chain, budget=free_run.peak)
    assert ok.schedule.count(Offload) == 0, "it fits: the cache keeps everything"
    tight = sn(chain, budget=free_run.peak - 1)
    assert tight.schedule.count(Offload) == 1, "one 400 B checkpoint out makes it fit"
    assert tight.peak <= free_run.peak - 1
    tighter = sn(chain, budget=free_run.peak - 801)
    assert tighter.schedule.count(Offload) == 3
    verify(chain, tighter.schedule)


def replay_victims(graph, schedule, offloadable):
    """For each eviction (an Offload directly followed by its Wait and Free, before the op
    that needed room), the resident offloadable tensors and their last access index."""
    last_access: dict[int, int] = {}
    resident: set[int] = set()
    checks = []
    seq = schedule.instructions
    for i, ins in enumerate(seq):
        if isinstance(ins, Compute):
            for t in graph.ops[ins.op].inputs + graph.ops[ins.op].outputs:
                s = graph.tensors[t].storage
                if s in offloadable:
                    last_access[s] = i
                    if t in graph.ops[ins.op].outputs:
                        resident.add(s)
        elif isinstance(ins, Prefetch) and ins.tensor in offloadable:
            resident.add(ins.tensor)
            last_access[ins.tensor] = i
        elif isinstance(ins, Offload) and seq[i + 2] == Free(ins.tensor):
            user = next(s for s in seq[i:] if isinstance(s, Compute))
            locked = {graph.tensors[t].storage for t in
                      graph.ops[user.op].inputs + graph.ops[user.op].outputs}
            candidates = {s: last_access[s] for s in resident - locked}
            checks.append((ins.tensor, candidates))
        elif isinstance(ins, Free) and ins.tensor in offloadable:
            resident.discard(ins.tensor)
    return checks


def test_eviction_takes_the_least_recently_used_unlocked_tensor():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch, fake=True)
    free_run = sn(graph)
    r = sn(graph, budget=int(free_run.peak * 0.8))
    checks = replay_victims(graph, r.schedule, r.segmentation.offloadable)
    assert checks, "a budget below the free-running peak forces evictions"
    for victim, candidates in checks:
        assert victim in candidates
        assert candidates[victim] == min(candidates.values()), \
            f"evicted {tname(graph, victim)} but a less recently used tensor was resident"


def test_evictions_on_the_chain_take_the_oldest_layers_first(chain):
    free_run = sn(chain)
    r = sn(chain, budget=free_run.peak - 801)
    checks = replay_victims(chain, r.schedule, r.segmentation.offloadable)
    assert [tname(chain, victim) for victim, _ in checks] == ["r1", "r2", "r3"]


def test_prefetches_are_waited_before_use(chain):
    r = sn(chain, budget=1600)
    seq = r.schedule.instructions
    assert r.schedule.count(Prefetch) == 5
    for i, ins in enumerate(seq):
        if isinstance(ins, Prefetch):
            wait = seq.index(Wait(ins.tensor, "h2d"), i)
            use = next(j for j in range(i, len(seq)) if isinstance(seq[j], Compute)
                       and ins.tensor in chain.ops[seq[j].op].inputs)
            assert wait < use


def test_simulator_runs_the_schedule_with_the_chosen_workspace(chain):
    class Cost:  # conv ops: framework 2 s, fft 1 s with 500 B of workspace
        copy_engines = 2

        def op_time(self, op):
            return 1.0 if op.variant == "fft" or op.category.value != "conv" else 2.0

        def bind(self, graph):  # needs nothing from the graph
            return self

        def workspace(self, op):
            return 500 if op.variant == "fft" else 0

        def transfer_time(self, nbytes, direction):
            return nbytes / 100

    table = {o.id: ["framework", "fft"] for o in chain.ops if o.category.value == "conv"}
    free_run = sn(chain, cost=Cost(), variants=table)
    assert set(free_run.schedule.variants.values()) == {"fft"}, "no budget: the fastest"
    budget = free_run.peak - 100
    r = sn(chain, budget=budget, cost=Cost(), variants=table)
    sim = simulate(chain, r.schedule, Cost())
    assert sim.peak_bytes == r.peak <= budget
    assert "framework" in r.schedule.variants.values(), "some step had no room for 500 B"
    assert sim.bytes_d2h == r.stats.offload_bytes


# ---- budgets --------------------------------------------------------------------------------

def test_budget_below_the_least_need_is_refused_at_planning_time(cnn):
    with pytest.raises(InfeasibleBudgetError) as info:
        sn(cnn, budget=1000)
    err = info.value
    assert err.policy == "superneurons" and err.budget == 1000
    assert "superneurons" in str(err) and str(err.required) in str(err)
    sn(cnn, budget=err.required)  # the named need is enough
    with pytest.raises(InfeasibleBudgetError):
        sn(cnn, budget=err.required * 998 // 1000)  # and it is the least (0.1%)


def test_registered_policy_reads_its_options(cnn):
    assert "superneurons" in registry.names()
    out = registry.get("superneurons").fn(cnn, PolicyContext(options={"recompute": "none",
                                                                       "tensor_cache": False}))
    assert out.schedule.recomputed_ops() == [] and out.schedule.count(Offload) == 3
    assert {tname(cnn, t) for t in out.plan.tensors_with(Decision.OFFLOAD)} == {"r0", "r1", "r2"}
    with pytest.raises(ValueError, match="recompute"):
        registry.get("superneurons").fn(cnn, PolicyContext(options={"recompute": "all"}))
    with pytest.raises(InfeasibleBudgetError) as info:
        registry.get("superneurons").fn(cnn, PolicyContext(budget=1000))
    assert (info.value.policy, info.value.budget) == ("superneurons", 1000)


# ---- the executor runs the schedules --------------------------------------------------------

def eager(model, loss_fn, batch, seed=5):
    torch.manual_seed(seed)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["vgg", "resnet", "inception", "transformer"])
def test_executor_matches_eager_and_the_predicted_peak(name):
    model, loss_fn, batch = make(name)
    loss, grads = eager(copy.deepcopy(model), loss_fn, batch)
    graph = capture(model, loss_fn, batch)
    for options in ({}, {"tensor_cache": False}, {"recompute": "memory", "tensor_cache": False},
                    {"recompute": "speed"}):
        r = sn(graph, **options)
        torch.manual_seed(5)
        result = Executor(graph, r.schedule).run(batch, apply=False)
        assert torch.equal(result.loss, loss), options
        for pname, g in grads.items():
            assert torch.equal(result.grads[pname], g), f"{options}: grad {pname}"
        assert result.peak_bytes == predicted_peak(graph, r.schedule), options


def test_runs_within_its_least_budget_on_the_emulated_device():
    model, loss_fn, batch = make("vgg")
    loss, grads = eager(copy.deepcopy(model), loss_fn, batch)
    graph = capture(model, loss_fn, batch)
    with pytest.raises(InfeasibleBudgetError) as info:
        sn(graph, budget=1)
    assert all(p.grad is None for p in model.parameters()), "nothing ran"
    budget = info.value.required
    r = sn(graph, budget=budget)
    assert r.schedule.count(Offload) > 0
    device = make_device("cpu-emulated", capacity=budget, bandwidth=1e10)
    torch.manual_seed(5)
    result = Executor(graph, r.schedule, device).run(batch, apply=False)
    assert result.peak_bytes == predicted_peak(graph, r.schedule) <= budget
    assert torch.equal(result.loss, loss)
    for pname, g in grads.items():
        assert torch.equal(result.grads[pname], g), pname


@pytest.mark.parametrize("seed", range(5))
def test_first_reads_in_a_window_equal_the_scan_of_every_tensor(seed):
    """``first_reads_in`` (SuperNeurons' prefetch window, a walk over the window's read
    events) lists exactly what scanning every tensor of ``among`` for its next read gives:
    ``sorted((next read after i, s))`` of those whose next read is at most ``end``."""
    import bisect
    import random

    from outcore.policies.superneurons import first_reads_in

    rng = random.Random(seed)
    reads = {s: sorted(rng.sample(range(200), rng.randint(0, 6))) for s in range(60)}
    events = sorted((step, s) for s, steps in reads.items() for step in steps)
    steps, storages = [e[0] for e in events], [e[1] for e in events]
    nonempty = 0
    for _ in range(200):
        among = set(rng.sample(range(60), rng.randint(0, 60)))
        i = rng.randint(-1, 200)
        end = rng.randint(i, 210)
        firsts = {s: reads[s][bisect.bisect_right(reads[s], i)] for s in among
                  if bisect.bisect_right(reads[s], i) < len(reads[s])}
        got = first_reads_in(steps, storages, among, i, end)
        assert got == sorted((f, s) for s, f in firsts.items() if f <= end)
        nonempty += bool(got)
    assert nonempty > 20  # the windows were not all empty
