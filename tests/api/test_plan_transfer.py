"""Plans carried to a new batch shape (``outcore.plan_transfer``) against eager PyTorch.

A Trainer that meets another sequence length (or image size) near a planned one runs the
planned schedule on the new capture instead of a new search: gradients must equal eager's
(dropout included), the measured peak must equal the predicted one within the budget, and a
shape far from every planned one, longer than them, or of another structure is searched."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
import outcore.trainer as trainer_module
from outcore import plan_transfer
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.errors import ReplanWarning, UnsupportedModelError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan_transfer import NEAR, best_carry, carry, step_bytes, structure
from outcore.sim import simulate
from outcore.trainer_stats import MANY_SHAPES
from outcore.variants.notice import variant_note

VOCAB, WIDTH, BATCH = 50, 32, 4


class TinyLM(nn.Module):
    """Embedding, two pre-norm encoder layers with dropout, a head: a length-generic step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, 2, 2 * WIDTH, dropout=0.1, batch_first=True,
                                       norm_first=True) for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


class TinyCNN(nn.Module):
    """Convolutions with BatchNorm and a global pool: generic in the image size."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def tokens(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    return (torch.randint(0, VOCAB, (BATCH, length), generator=gen),
            torch.randint(0, VOCAB, (BATCH, length), generator=gen))


def images(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(size)
    return torch.randn(BATCH, 3, size, size, generator=gen), torch.randint(0, 5, (BATCH,),
                                                                           generator=gen)


CASES = {"lm": (TinyLM, lm_loss, tokens, 32, 31, 12),
         "cnn": (TinyCNN, F.cross_entropy, images, 16, 15, 8)}


def budget_for(model: nn.Module, loss, batch, share: float = 0.6) -> int:
    """``share`` of the way from the layer-wise bound to the in-core peak of ``batch``'s step:
    a budget that moves activations."""
    peaks = reference_peaks(outcore.capture(model, loss, batch))
    return int(peaks.layer_lower_bound + share * (peaks.liveness - peaks.layer_lower_bound))


def step_both(trainer, model, reference, loss, batch, seed: int) -> None:
    model.zero_grad()
    reference.zero_grad()
    torch.manual_seed(seed)
    got = trainer.step(*batch)
    torch.manual_seed(seed)
    expected = loss(reference(batch[0]), batch[1])
    expected.backward()
    # bit-exact on framework kernels; a chosen convolution algorithm changes the rounding
    same = (torch.equal if not trainer.planned.schedule.variants
            else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6))
    assert same(got, expected.detach())
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert same(p.grad, q.grad), f"gradient of {name} differs from eager"
    for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        assert same(b, c), f"buffer {name} differs from eager"


@contextlib.contextmanager
def carrying_lm(**options):
    """A Trainer carrying plans for ``CASES["lm"]`` compiled at its full length, with the
    model, an eager twin and the budget."""
    build, loss, make, full, _, _ = CASES["lm"]
    model = build()
    reference = copy.deepcopy(model)
    budget = budget_for(model, loss, make(full))
    with outcore.compile(model, loss, make(full), budget=budget, device="cpu-emulated",
                         transfer_plans=True, **options) as trainer:
        yield trainer, model, reference, budget


@pytest.mark.parametrize("device", ["cpu-emulated", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_near_shape_runs_the_carried_plan_with_eagers_gradients(case, device):
    build, loss, make, full, near, _ = CASES[case]
    model = build()
    reference = copy.deepcopy(model)
    budget = budget_for(model, loss, make(full))
    with outcore.compile(model, loss, make(full), budget=budget, device=device,
                         transfer_plans=True) as trainer:
        assert trainer.planned.counts()["keep"] < len(trainer.planned.graph.activations())
        step_both(trainer, model, reference, loss, make(full), seed=1)
        step_both(trainer, model, reference, loss, make(near), seed=2)
        stats = trainer.stats
        assert (stats.replans, stats.transfers) == (1, 1)
        assert any("carried to this shape" in note for note in stats.notes)
        assert stats.measured_peak == stats.predicted_peak <= budget
        carried = trainer.planned
        assert carried.schedule is trainer._cache[next(iter(trainer._cache))].planned.schedule
        step_both(trainer, model, reference, loss, make(near), seed=3)  # a cache hit
        assert trainer.stats.cache_hits == 2  # the first step and this one


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_far_shape_is_searched_and_a_longer_one_carried_only_where_it_fits(case):
    build, loss, make, full, near, far = CASES[case]
    model = build()
    reference = copy.deepcopy(model)
    budget = budget_for(model, loss, make(near - 1))  # so near - 1 has something to move
    with outcore.compile(model, loss, make(near), budget=budget, device="cpu-emulated",
                         transfer_plans=True) as tr:
        source = tr.planned
        step_both(tr, model, reference, loss, make(far), seed=1)    # far below: searched
        assert (tr.stats.replans, tr.stats.transfers) == (1, 0)
        assert not any("carried" in note for note in tr.stats.notes)
        fits = carry(source, outcore.capture(model, loss, make(full)), budget) is not None
        step_both(tr, model, reference, loss, make(full), seed=2)   # longer
        assert (tr.stats.replans, tr.stats.transfers) == (2, int(fits))
        assert tr.stats.measured_peak == tr.stats.predicted_peak <= budget
        step_both(tr, model, reference, loss, make(near - 1), seed=3)  # near `near`'s plan
        assert tr.stats.transfers == 1 + int(fits)
        assert tr.stats.measured_peak == tr.stats.predicted_peak <= budget


def test_by_default_every_shape_is_searched():
    build, loss, make, full, near, _ = CASES["lm"]
    model = build()
    budget = budget_for(model, loss, make(full))
    with outcore.compile(model, loss, make(full), budget=budget,
                         device="cpu-emulated") as trainer:
        trainer.step(*make(near))
        assert (trainer.stats.replans, trainer.stats.transfers) == (1, 0)


def test_a_carried_shape_is_planned_for_its_sizes_after_promote_after_steps(monkeypatch):
    monkeypatch.setattr(trainer_module, "PROMOTE_AFTER", 2)
    _, loss, make, _, near, _ = CASES["lm"]
    with carrying_lm() as (tr, model, reference, budget):
        for seed in (1, 2):  # carried, then a hit on the carried plan
            step_both(tr, model, reference, loss, make(near), seed=seed)
        assert (tr.stats.transfers, tr.stats.promotions) == (1, 0)
        captures = tr.stats.captures
        step_both(tr, model, reference, loss, make(near), seed=3)
        assert (tr.stats.promotions, tr.stats.captures) == (1, captures)  # no new capture
        assert not any("carried" in note for note in tr.stats.notes)
        assert tr.stats.measured_peak == tr.stats.predicted_peak <= budget
        step_both(tr, model, reference, loss, make(near), seed=4)
        assert tr.stats.promotions == 1


def test_carry_refuses_what_it_cannot_prove():
    build, loss, make, full, near, _ = CASES["lm"]
    model = build()
    budget = budget_for(model, loss, make(full))
    graph = outcore.capture(model, loss, make(full))
    planned = outcore.plan(graph, budget, simulate=False, cache=False)
    assert planned.host_peak > 0, "the budget should make the plan offload"
    near_graph = outcore.capture(model, loss, make(near))
    assert structure(near_graph) == structure(graph)
    assert NEAR * step_bytes(graph) <= step_bytes(near_graph) < step_bytes(graph)
    found = carry(planned, near_graph, budget)
    assert found is not None and found[0].predicted_peak == found[1].peak <= budget
    assert found[0].graph is near_graph and found[0].schedule is planned.schedule
    # a longer length: carried where the replay fits, refused where it does not
    full_graph = outcore.capture(model, loss, make(full))
    roomy = outcore.plan(near_graph, budget, simulate=False, cache=False)
    up = carry(roomy, full_graph, budget + (budget >> 2))
    assert up is not None and up[0].predicted_peak > roomy.predicted_peak
    assert carry(roomy, full_graph, roomy.predicted_peak) is None
    # another structure: a length of 1 captures other view ops
    assert structure(outcore.capture(model, loss, make(1))) != structure(graph)
    assert carry(planned, outcore.capture(model, loss, make(1)), budget) is None
    # over the budget, the host budget, or the near share
    assert carry(planned, near_graph, found[1].peak - 1) is None
    assert carry(planned, near_graph, budget, host_limit=planned.host_peak // 2) is None
    assert carry(planned, outcore.capture(model, loss, make(full // 2)), budget) is None
    # a chosen operator variant the new graph does not offer
    odd = dataclasses.replace(planned, schedule=dataclasses.replace(
        planned.schedule, variants={planned.graph.ops[0].id: "no-such-variant"}))
    assert carry(odd, near_graph, budget) is None
    # a sub-batched plan runs on a re-captured graph: never carried
    split = dataclasses.replace(planned, plan=dataclasses.replace(planned.plan, sub_batches=2))
    assert carry(split, near_graph, budget) is None


POLICIES = [p for p in outcore.policies() if p not in ("keep-all", "liveness")]
#: policies that move by a fixed rule (and refuse budgets their rule cannot meet): no budget
RULE_BOUND = {"offload-all", "recompute-cheap", "vdnn-all", "vdnn-conv", "vdnn-base",
              "vdnn-all-p", "vdnn-conv-m", "vdnn-conv-p"}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_policys_carried_schedule_computes_eagers_step(case, policy):
    """Each policy's schedule (lowered plans, PoocH's and vDNN's own schedules, convolution
    variants) carried from the full shape to a near one, on the emulated device's copies."""
    build, loss, make, full, near, _ = CASES[case]
    model = build()
    reference = copy.deepcopy(model)
    # from the near shape's range: its in-core peak must not fit (nothing would move)
    budget = None if policy in RULE_BOUND else budget_for(model, loss, make(near), share=0.8)
    with outcore.compile(model, loss, make(full), budget=budget, device="cpu-emulated",
                         policy=policy, allow_sub_batches=False, transfer_plans=True) as trainer:
        step_both(trainer, model, reference, loss, make(near), seed=5)
        stats = trainer.stats
        if trainer._cache[next(iter(trainer._cache))].planned.plan.sub_batches == 1:
            assert stats.transfers == 1, policy
        assert stats.measured_peak == stats.predicted_peak
        assert budget is None or stats.predicted_peak <= budget


def test_a_signature_back_after_eviction_says_how_to_stop_it():
    build, loss, make, full, _, far = CASES["lm"]
    model = build()
    with outcore.compile(model, loss, make(full), budget=None, device="cpu",
                         cache_size=1) as trainer:
        trainer.step(*make(far))
        with pytest.warns(ReplanWarning, match=r"cache_size=1\) came back.*2 "
                          r"signatures seen.*pad sequences to a multiple"):
            trainer.step(*make(full))
        assert trainer.stats.evictions == 2


def test_many_shapes_say_how_to_make_fewer_once():
    build, loss, make, full, _, _ = CASES["lm"]
    model = build()
    with outcore.compile(model, loss, make(full), budget=None, device="cpu") as trainer:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReplanWarning)
            for length in range(full - MANY_SHAPES + 2, full):  # signatures 2 .. MANY_SHAPES-1
                trainer.step(*make(length))
        with pytest.warns(ReplanWarning, match=f"met {MANY_SHAPES} batch signatures"):
            trainer.step(*make(full - MANY_SHAPES + 1))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReplanWarning)
            trainer.step(*make(full - MANY_SHAPES))  # said once


def test_the_fastest_carried_plan_is_kept_only_within_max_extra_of_its_source(monkeypatch):
    build, loss, make, full, near, _ = CASES["lm"]
    model = build()
    budget = budget_for(model, loss, make(full))
    # a host link slow enough that the copies of this tiny model cannot hide behind compute
    slow = dataclasses.replace(get_profile("v100-pcie"), h2d_bandwidth=2e7, d2h_bandwidth=2e7)
    cost = AnalyticCostModel(slow)
    near_graph = outcore.capture(model, loss, make(near))
    more = (budget + reference_peaks(near_graph).liveness) // 2  # near still moves something
    tight = outcore.plan(outcore.capture(model, loss, make(full)), budget, simulate=False,
                         cache=False)
    roomy = outcore.plan(outcore.capture(model, loss, make(full)), more, simulate=False,
                         cache=False)
    found = best_carry([("tight", tight), ("roomy", roomy)], near_graph, more, cost)
    assert found is not None
    picked, _, source = found
    times = {name: simulate(near_graph, p.schedule, cost).step_time
             for name, p in (("tight", tight), ("roomy", roomy))}
    name = min(times, key=lambda k: times[k])  # the first of equals, as best_carry keeps
    assert times["roomy"] < times["tight"]  # else this would not test the choice
    assert picked.simulation.step_time == times[name]
    assert source is (tight if name == "tight" else roomy)
    assert picked.schedule is source.schedule
    assert f"for the batch {name} and carried" in picked.notes[-1]
    # none of the source's own notes (its search's times, for its sizes) comes along, but
    # the note of the variants its schedule runs; its reasons say they are the source's
    runs = variant_note(near_graph, source.schedule.variants)
    assert not any(note in picked.notes for note in source.notes if note != runs)
    assert source.notes  # else this would not test it
    assert picked.plan.reasons.keys() == source.plan.reasons.keys() and all(
        why.startswith(source.plan.reasons[tid]) and "searched for" in why[len(
            source.plan.reasons[tid]):] for tid, why in picked.plan.reasons.items())
    assert (tight if name == "tight" else roomy).simulation is not None  # kept on the source
    # a source whose replay exceeds the budget is not a candidate
    peak_r = carry(roomy, near_graph, None)[0].predicted_peak
    peak_t = carry(tight, near_graph, None)[0].predicted_peak
    assert peak_t < peak_r
    only = best_carry([("roomy", roomy), ("tight", tight)], near_graph, peak_r - 1, cost)
    assert only is not None and only[2] is tight and only[0].schedule is tight.schedule
    # the fastest carry moving too much for its own source leaves the choice to the next
    real = plan_transfer._overhead
    monkeypatch.setattr(plan_transfer, "_overhead",
                        lambda p, c: -1.0 if p is roomy else real(p, c))
    second = best_carry([("roomy", roomy), ("tight", tight)], near_graph, more, cost)
    assert second is not None and second[2] is tight
    assert second[0].simulation.step_time == times["tight"]
    monkeypatch.setattr(plan_transfer, "_overhead", real)
    monkeypatch.setattr(plan_transfer, "MAX_EXTRA", -1.0)  # no carried plan is good enough
    assert best_carry([("tight", tight)], near_graph, budget, cost) is None


def test_plans_are_carried_from_the_searched_shape_never_from_a_carried_one():
    """A chain of shorter lengths: each carried one comes from a *searched* length (named in
    its note, its schedule that length's), within ``NEAR`` of that length's bytes, however
    near the last carried length it is."""
    build, loss, make, full, _, _ = CASES["lm"]
    model = build()
    reference = copy.deepcopy(model)
    budget = budget_for(model, loss, make(full))
    with outcore.compile(model, loss, make(full), budget=budget, device="cpu-emulated",
                         transfer_plans=True, cache_size=16) as tr:
        searched = {full: tr.planned}
        for seed, length in enumerate(range(full - 2, 17, -3)):
            step_both(tr, model, reference, loss, make(length), seed=seed)
            note = next((n for n in tr.stats.notes if "carried to this shape" in n), None)
            if note is None:
                searched[length] = tr.planned
                continue
            source = int(note.split(f"for the batch ([{BATCH}, ", 1)[1].split("]", 1)[0])
            assert source in searched, (length, source)
            assert tr.planned.schedule is searched[source].schedule
            assert step_bytes(tr.planned.graph) >= NEAR * step_bytes(searched[source].graph)
        assert 1 <= tr.stats.transfers < tr.stats.captures


def test_a_promotion_that_finds_no_plan_keeps_the_carried_one(monkeypatch):
    monkeypatch.setattr(trainer_module, "PROMOTE_AFTER", 1)
    _, loss, make, _, near, _ = CASES["lm"]
    with carrying_lm() as (tr, model, reference, budget):
        step_both(tr, model, reference, loss, make(near), seed=1)
        assert tr.stats.transfers == 1
        calls = []
        planned_entry = tr._planned_entry

        def refuse(graph, batch, *, carry):
            if carry:
                return planned_entry(graph, batch, carry=carry)
            calls.append(graph)
            raise UnsupportedModelError("no plan of its own in this test")

        monkeypatch.setattr(tr, "_planned_entry", refuse)
        for seed in (2, 3):
            step_both(tr, model, reference, loss, make(near), seed=seed)
        assert len(calls) == 1 and tr.stats.promotions == 0
        assert any("found no plan" in note for note in tr.stats.notes)
        assert tr.stats.measured_peak == tr.stats.predicted_peak <= budget


@pytest.mark.parametrize("change", ["random op", "host tensor", "aliasing", "outputs"])
def test_structure_tells_apart_what_a_schedule_depends_on(change):
    build, loss, make, full, _, _ = CASES["lm"]
    graph = outcore.capture(build(), loss, make(full))
    other = Graph.from_json(graph.to_json())  # a plain copy, without the cached digest
    assert structure(other) == structure(graph)
    other = Graph.from_json(graph.to_json())
    view = next(t for t in other.tensors if t.is_view)
    if change == "random op":
        op = next(o for o in other.ops if not o.random)
        op.random = True
    elif change == "host tensor":
        other.tensors[other.ops[0].outputs[0]].host = True
    elif change == "aliasing":
        view.storage = view.id
    else:
        other.outputs = other.outputs[::-1]
    assert structure(other) != structure(graph)


def test_a_carried_step_keeps_only_the_notes_true_of_its_schedule_here():
    from outcore.policies.auto import HOST_COPIES_NOTE

    build, loss, make, full, near, _ = CASES["lm"]
    model = build()
    budget = budget_for(model, loss, make(full))
    source = outcore.plan(outcore.capture(model, loss, make(full)), budget, simulate=False,
                          cache=False)
    source = dataclasses.replace(source, notes=[HOST_COPIES_NOTE, "outcore-auto chose x: 1 ms"])
    found = carry(source, outcore.capture(model, loss, make(near)), budget)
    assert found is not None
    assert found[0].notes == [HOST_COPIES_NOTE]  # the machine's fact stays, the search's goes
