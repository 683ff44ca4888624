"""What an infeasible budget advises about sub-batches follows what the user already did
(``outcore.refusal``): with ``allow_sub_batches=True`` it never asks for that opt-in again.
A policy that does not split names the ones that do; a policy that splits (it went as far
as it could) names only a smaller batch. ``SPLITTING_POLICIES`` is checked against what every
registered policy does at a budget only sub-batches reach. Found by the session-19 journey
(offload-all with the opt-in was told to pass it)."""

import warnings

import pytest
import torch
from torch import nn

import outcore
from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.policies.registry import names
from outcore.refusal import SPLITTING_POLICIES, lowest_peak, ways_out


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(6)],
                         nn.Linear(64, 10))


BATCH = (torch.randn(256, 64), torch.randint(0, 10, (256,)))
LOSS = nn.functional.cross_entropy


def budget_only_splitting_reaches() -> int:
    """Between the static tensors and the lowest peak of any one-batch plan."""
    graph = outcore.capture(mlp(), LOSS, BATCH)
    peaks = reference_peaks(graph)
    floor = lowest_peak(graph, cost_model_for("v100-pcie"))
    budget = (peaks.static + floor) // 2
    assert peaks.static < budget < floor
    return budget


def plan_opted_in(policy: str, budget: int) -> outcore.PlannedStep | InfeasibleBudgetError:
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the split's announcement
        try:
            return outcore.compile(model, LOSS, BATCH, budget=budget, device="cpu-emulated",
                                   policy=policy, allow_sub_batches=True, gpu="v100-pcie").planned
        except InfeasibleBudgetError as exc:
            return exc


@pytest.fixture(scope="module")
def budget() -> int:
    return budget_only_splitting_reaches()


@pytest.mark.parametrize("policy", names())
def test_with_the_opt_in_the_advice_never_asks_for_it_again(policy, budget):
    found = plan_opted_in(policy, budget)
    if policy in SPLITTING_POLICIES:
        assert not isinstance(found, InfeasibleBudgetError), str(found)
        assert found.plan.sub_batches > 1 and found.predicted_peak <= budget
        return
    assert isinstance(found, InfeasibleBudgetError), f"{policy} fit without splitting"
    text = str(found)
    assert "(allow_sub_batches=True, CLI" not in text and "recapture=" not in text
    assert f"policy {policy!r} never splits" in text
    assert "policy='auto' or policy='modnn' splits it" in text


def test_a_splitting_policy_that_still_cannot_fit_names_only_a_smaller_batch():
    graph = outcore.capture(mlp(), LOSS, BATCH)
    static = reference_peaks(graph).static
    text = ways_out(graph, static + 1024, floor=2 * static, can_split=True,
                     opted_in="modnn")
    assert "shrink the batch to about" in text and "splits as far as it can" in text
    assert "sub-batches (allow_sub_batches=True" not in text and "never splits" not in text


def test_without_the_opt_in_the_advice_still_names_it(budget):
    with pytest.raises(InfeasibleBudgetError) as info:
        outcore.compile(mlp(), LOSS, BATCH, budget=budget, device="cpu-emulated",
                        policy="offload-all", gpu="v100-pcie")
    assert "allow_sub_batches=True" in str(info.value)
    assert "never splits" not in str(info.value)
