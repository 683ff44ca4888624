"""A plan that runs operator variants says so (``outcore.variants.notice``): a variant sums in
another order, so the step equals eager PyTorch's only up to rounding. vDNN-dyn and
SuperNeurons chose FFT convolutions for a BatchNorm CNN at batch 5 and the gradients differed
from eager by ~1e-8 with no warning, note or stats entry. ``variants=False`` (CLI
``--option variants=off``) keeps PyTorch's kernels: bit-equal to eager again."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.errors import VariantWarning
from outcore.graph.ir import Graph
from outcore.policies.common import variant_table
from outcore.variants.names import is_framework
from outcore.variants.notice import SHOWN, variant_note

CHOOSERS = ("superneurons", "vdnn-dyn")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(5, 3, 12, 12, generator=g), torch.randint(0, 4, (5,), generator=g)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return outcore.capture(_net(), F.cross_entropy, _batch())


@pytest.fixture(scope="module")
def budget(graph: Graph) -> int:
    peak = outcore.plan(graph, None, policy="liveness", simulate=False).predicted_peak
    return int(peak * 0.9)


def _runs_variants(planned: outcore.PlannedStep) -> bool:
    return any(not is_framework(str(v)) for v in planned.schedule.variants.values())


def _variant_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, VariantWarning)]


@pytest.mark.parametrize("policy", CHOOSERS)
def test_a_plan_with_variants_warns_and_notes_it(graph, budget, policy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        planned = outcore.plan(graph, budget, policy=policy, simulate=False, cache=False)
    assert _runs_variants(planned)  # the case: this policy picks a variant here
    said = _variant_warnings(caught)
    assert len(said) == 1 and "fft" in said[0] and "rounding" in said[0]
    assert said[0] in planned.notes and sum("operator variants" in n for n in planned.notes) == 1


@pytest.mark.parametrize("policy", [*CHOOSERS, "modnn"])
@pytest.mark.parametrize("off", [False, "off"])  # the Python value and the CLI's spelling
def test_variants_off_runs_pytorch_kernels_and_says_nothing(graph, budget, policy, off):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        planned = outcore.plan(graph, budget, policy=policy, simulate=False, cache=False,
                               variants=off)
    assert not _runs_variants(planned)
    assert not _variant_warnings(caught)
    assert not any("operator variants" in n for n in planned.notes)


def test_auto_never_notes_variants(graph, budget):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        planned = outcore.plan(graph, budget, policy="auto", simulate=False, cache=False)
    assert not _runs_variants(planned) and not _variant_warnings(caught)


@pytest.mark.parametrize("policy", CHOOSERS)
def test_trained_step_equals_eager_bit_for_bit_with_variants_off(budget, policy):
    """The class of the bug: with variants the gradients differed from eager by rounding; with
    them off every gradient is bit-equal, and with them on the trainer's stats say why not."""
    x, y = _batch()
    ref = _net()
    torch.manual_seed(7)
    F.cross_entropy(ref(x), y).backward()
    for variants in (False, None):
        ours = _net()
        options = {} if variants is None else {"variants": variants}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VariantWarning)
            trainer = outcore.compile(ours, F.cross_entropy, (x, y), budget=budget,
                                      device="cpu-emulated", policy=policy, **options)
        with trainer:
            torch.manual_seed(7)
            trainer.step(x, y)
            notes = list(trainer.stats.notes)
        equal = all(torch.equal(a.grad, b.grad)
                    for a, b in zip(ours.parameters(), ref.parameters(), strict=True))
        if variants is False:
            assert equal and not any("operator variants" in n for n in notes)
        else:
            assert any("operator variants" in n for n in notes)


def test_the_note_counts_every_op_and_names_the_first_few(graph):
    convs = [op.id for op in graph.ops][: SHOWN + 2]  # the note names ops, whatever they are
    text = variant_note(graph, dict.fromkeys(convs, "im2col"))
    assert text is not None
    assert f"on {SHOWN + 2} op(s)" in text and "and 2 more" in text
    assert variant_note(graph, {}) is None
    assert variant_note(graph, {convs[0]: "framework", convs[1]: ""}) is None


def test_false_is_the_empty_table_and_true_the_recorded_one(graph):
    assert variant_table(graph, False) == {}
    assert variant_table(graph, True) == variant_table(graph, None) != {}
