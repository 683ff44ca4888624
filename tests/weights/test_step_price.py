"""The optimizer step is priced by the bytes each optimizer's step moves per parameter
(``OptimizerSpec.update_bytes``, from ``STATE``), AdamW's figures unchanged.

Before, every optimizer was priced at AdamW's rate: ``outcore.plan`` of the small
transformer on the a100-40gb profile gave SGD without momentum the same optimizer step as
AdamW (0.631 us with every weight on the device, 0.070 us exposed with every weight on the
host); now SGD's is 12/28 of AdamW's, SGD with momentum's 20/28.
"""

import math

import pytest
import torch
from weights_helpers import make_gpt, token_loss

import outcore
from outcore import zoo
from outcore.cost.profiles import get_profile
from outcore.weights import compile as compile_weights
from outcore.weights.optimizer import built_update_bytes
from outcore.weights.spec import (
    ADAM_UPDATE_BYTES,
    OptimizerSpec,
    torch_spec,
    update_bytes_of,
    update_rate,
)
from outcore.weights.step_cost import DEVICE_EFFICIENCY, step_seconds

#: (torch optimizer, options, bytes its step moves per parameter: 4 x (3 + 2 x state))
UPDATES = [("SGD", {}, 12), ("SGD", {"momentum": 0.9}, 20), ("Adam", {}, 28),
           ("AdamW", {}, 28), ("Adam", {"amsgrad": True}, 36), ("Adagrad", {}, 20),
           ("RMSprop", {"momentum": 0.9}, 28), ("Adafactor", {}, 20)]


@pytest.mark.parametrize("kind,options,expected", UPDATES,
                         ids=[f"{k}-{'-'.join(o)}" for k, o, _ in UPDATES])
def test_update_bytes_per_optimizer(kind, options, expected):
    assert torch_spec(kind, options).update_bytes() == expected
    built = getattr(torch.optim, kind)(torch.nn.Linear(4, 3).parameters(), lr=0.1, **options)
    assert built_update_bytes(built) == update_bytes_of(built) == expected


def test_adamw_is_the_reference_and_unknown_sizes_are_priced_as_adamw():
    assert ADAM_UPDATE_BYTES == update_bytes_of("adamw") == 28
    assert update_bytes_of("sgd") == 20  # the named "sgd" has momentum
    assert OptimizerSpec("custom", bytes_per_element=6.0).update_bytes() == 28
    assert update_rate(5e8) == 5e8 and update_rate(5e8, 12) == pytest.approx(5e8 * 28 / 12)


def test_param_groups_that_keep_different_state_are_priced_at_the_most():
    model = torch.nn.Linear(4, 3)
    sgd = torch.optim.SGD([{"params": [model.weight], "momentum": 0.9},
                           {"params": [model.bias]}], lr=0.1)
    assert built_update_bytes(sgd) == 20


def test_step_seconds_scale_with_the_bytes_moved():
    a100 = get_profile("a100-40gb")
    counts = {"device": 10**9, "host": 10**8}
    adamw = step_seconds(counts, a100)
    assert adamw == step_seconds(counts, a100, update_bytes=28)
    assert adamw[0] == pytest.approx(1e9 * 28 / (DEVICE_EFFICIENCY * a100.memory_bandwidth))
    assert adamw[1] == pytest.approx(1e8 / a100.host_adam_rate)
    sgd = step_seconds(counts, a100, update_bytes=12)
    assert sgd == pytest.approx((adamw[0] * 12 / 28, adamw[1] * 12 / 28))
    cast = step_seconds({"host": 10**8}, a100, master_cast_bytes=2, update_bytes=12)[1]
    assert cast - sgd[1] == pytest.approx(
        step_seconds({"host": 10**8}, a100, master_cast_bytes=2)[1] - adamw[1])


@pytest.fixture(scope="module")
def transformer():
    work = zoo.get("transformer", 4, small=True)
    graph = outcore.capture(work.model, work.loss_fn, work.batch)
    return work.model, graph


@pytest.mark.parametrize("weights", ["device", "host"])
def test_the_plan_prices_sgd_below_adamw_and_adamw_as_before(weights, transformer):
    model, graph = transformer

    def step(optimizer):
        planned = outcore.plan(graph, "1GB", optimizer=optimizer, weights=weights,
                               gpu="a100-40gb", cache=False)
        return planned.weights.optimizer_seconds

    adamw, momentum, plain = step("adamw"), step("sgd"), step(torch_spec("SGD"))
    assert 0 < plain < momentum < adamw
    built = torch.optim.SGD(model.parameters(), lr=0.1)
    assert step(built) == pytest.approx(plain)  # a built SGD is priced as its spec
    if weights == "device":  # after backward, at the device's rate: the formula of before
        numel = sum(p.numel() for p in model.parameters())
        bandwidth = get_profile("a100-40gb").memory_bandwidth
        assert adamw == pytest.approx(numel * 28 / (DEVICE_EFFICIENCY * bandwidth))
        assert math.isclose(adamw, 6.309453376221463e-07, rel_tol=1e-9)  # main's figure
        assert plain == pytest.approx(adamw * 12 / 28)
        assert momentum == pytest.approx(adamw * 20 / 28)
    else:
        assert math.isclose(adamw, 7.004103967298003e-08, rel_tol=1e-9)  # main's figure


def test_the_weights_trainer_prices_its_optimizer():
    """``outcore.weights.compile`` prices the built optimizer it is given: SGD's step at
    12/28 of AdamW's for the same placement."""
    seconds = {}
    for kind in ("SGD", "AdamW"):
        model, example = make_gpt()
        optimizer = getattr(torch.optim, kind)(model.parameters(), lr=0.01)
        with compile_weights(model, token_loss, example, optimizer=optimizer, budget="1GB",
                             weights="device") as trainer:
            seconds[kind] = trainer.choice.optimizer_seconds
    assert seconds["SGD"] == pytest.approx(seconds["AdamW"] * 12 / 28)
    assert seconds["SGD"] > 0
