"""``state_bytes`` sizes an optimizer's state from its options, before any step, to the byte
torch then keeps: the sum of ``nbytes`` of ``optimizer.state[p]``'s tensors after one step,
on a model with 0-, 1-, 2-, 3- and 4-dimensional parameters (Adafactor factors the last
two dimensions). LBFGS, whose state is one history over all parameters, is refused."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

from weights_helpers import make_gpt, token_loss

import outcore
from outcore import zoo
from outcore.errors import OutcoreError
from outcore.weights import compile as compile_weights
from outcore.weights.optimizer import state_bytes


class Shapes(nn.Module):
    """Parameters of every rank an optimizer may treat differently."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # 4-D weight, 1-D bias
        self.norm = nn.BatchNorm2d(4)  # 1-D
        self.mix = nn.Parameter(torch.randn(2, 3, 5))  # 3-D
        self.head = nn.Linear(4 * 6 * 6, 5)  # 2-D
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-D

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.conv(x)).flatten(1)
        return self.head(h) * self.scale + self.mix.sum()


CASES = [
    ("Adam", {}), ("Adam", {"amsgrad": True}), ("Adam", {"fused": True}), ("AdamW", {}),
    ("NAdam", {}), ("RAdam", {}), ("Adamax", {}), ("Adadelta", {}), ("Adagrad", {}),
    ("RMSprop", {}), ("RMSprop", {"momentum": 0.9, "centered": True}), ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}), ("ASGD", {}), ("Rprop", {}), ("Adafactor", {}),
    ("Adafactor", {"weight_decay": 0.01}),
]


def squared_error(out, y):
    return (out - y).square().mean()


def captured_shapes(dtype):
    """A ``Shapes`` model in ``dtype`` and its captured step (squared error on a batch of 2):
    the model the plan-side state tests size."""
    torch.manual_seed(0)
    model = Shapes().to(dtype)
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    y = torch.zeros(2, 5, dtype=dtype)
    return model, outcore.capture(model, squared_error, (x, y))


def real_state_bytes(optimizer, model):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)]: sum(v.nbytes for v in s.values() if isinstance(v, torch.Tensor))
            for p, s in optimizer.state.items()}


def one_step(model, optimizer):
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    x = x.to(model.head.weight.dtype)
    model(x).square().mean().backward()
    optimizer.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,options", CASES, ids=[f"{k}-{'-'.join(o)}" for k, o in CASES])
def test_sized_state_is_the_state_after_one_step(kind, options, dtype):
    torch.manual_seed(0)
    model = Shapes().to(dtype)
    optimizer = getattr(torch.optim, kind)(model.parameters(), **options)
    sized = state_bytes(optimizer, model)
    one_step(model, optimizer)
    real = real_state_bytes(optimizer, model)
    assert sized == {n: real.get(n, 0) for n in sized}
    assert set(real) <= set(sized)
    if kind != "SGD" or options.get("momentum"):
        assert sum(real.values()) > 0


@pytest.mark.parametrize("kind", ["ASGD", "NAdam", "Adafactor"])
def test_step_counts_follow_the_default_dtype(kind):
    """torch keeps the step counts (and ASGD's eta and mu, NAdam's mu_product) in float64
    when that is the default dtype."""
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = Shapes()
        optimizer = getattr(torch.optim, kind)(model.parameters())
        sized = state_bytes(optimizer, model)
        one_step(model, optimizer)
    finally:
        torch.set_default_dtype(before)
    assert sized == real_state_bytes(optimizer, model)
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_lbfgs_is_refused_with_why_and_what_instead():
    model = Shapes()
    optimizer = torch.optim.LBFGS(model.parameters())
    with pytest.raises(OutcoreError) as caught:
        state_bytes(optimizer, model)
    message = str(caught.value)
    assert "LBFGS" in message and "all the parameters together" in message
    assert "AdamW" in message and "without optimizer=" in message


def test_the_way_out_for_lbfgs_trains_as_eager():
    """What the refusal offers: the activations planned (outcore.compile without
    optimizer=), LBFGS stepped with a closure over trainer.step, equal to eager LBFGS."""
    work = zoo.get("mlp", 8, small=True)
    model, loss_fn, (x, y) = work.model, work.loss_fn, work.batch
    ref = copy.deepcopy(model)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    ref_opt = torch.optim.LBFGS(ref.parameters(), max_iter=4)

    def closure():
        opt.zero_grad()
        return trainer.step(x, y)

    def ref_closure():
        ref_opt.zero_grad()
        loss = loss_fn(ref(x), y)
        loss.backward()
        return loss

    with outcore.compile(model, loss_fn, (x, y), budget="64MB",
                         device="cpu-emulated") as trainer:
        for _ in range(2):
            assert torch.equal(opt.step(closure).detach(), ref_opt.step(ref_closure).detach())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kind,options", [("ASGD", {"lr": 1e-2}), ("Rprop", {"lr": 1e-3}),
                                          ("Adafactor", {"lr": 1e-2})])
def test_newly_sized_optimizers_train_held_weights_as_eager(kind, options):
    """Through the weights path (sized before any step, some parameters held in host memory
    and stepped there while backward goes on): 3 steps equal eager PyTorch's, bit for bit,
    and the step's peak plus the device-held state stays within the budget."""
    model, example = make_gpt()
    ref = copy.deepcopy(model)
    opt = getattr(torch.optim, kind)(model.parameters(), **options)
    ref_opt = getattr(torch.optim, kind)(ref.parameters(), **options)
    budget = sum(p.nbytes for p in model.parameters())  # below weights + gradients
    gen = torch.Generator().manual_seed(5)
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         bandwidth=2e9) as trainer:
        assert trainer.held() and trainer.stepper.grad_of
        assert trainer.predicted_peak + trainer.choice.device_state <= budget
        for i in range(3):
            x, y = (torch.randint(0, 64, (2, 16), generator=gen) for _ in range(2))
            loss = trainer.train_step(x, y)
            ref_loss = token_loss(ref(x), y)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            assert torch.equal(loss, ref_loss.detach()), f"step {i}"
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert sum(trainer.state.values()) == sum(real_state_bytes(opt, model).values())
