"""A step that reads a tensor that is neither parameter, buffer nor batch (a tensor the loss
closes over, a plain tensor attribute of the model) trains as eager PyTorch does: the tensor
is a constant of the captured graph bound from the user's object at every step
(``outcore.capture.closed_over``), so a change made in place between steps is seen, a
rebinding is followed (or captured again for another shape), and a tensor that requires
grad is refused by name rather than left without its gradient.

Found by a differential fuzz of training loops (session 19): class weights in a loss
closure (``lambda o, y: F.cross_entropy(o, y, weight=w)``) failed at compile with
FakeTensor's "Please convert all Tensors to FakeTensors first"; session 20 refused it with
advice (a buffer, the batch, a loss module); session 23 lifts it."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import CaptureError
from outcore.graph.bounds import reference_peaks

CLASSES = 5
#: a module global a loss function names (read again at each step, like a closure)
PRIOR = torch.linspace(-0.5, 0.5, CLASSES)


class Scaled(nn.Module):
    """An MLP whose output is scaled by ``scale``: a buffer, or a plain tensor attribute."""

    def __init__(self, as_buffer: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(16, 64), nn.ReLU()]
        for _ in range(7):  # deep and narrow: activations dominate, half the peak is feasible
            layers += [nn.Linear(64, 64), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Linear(64, CLASSES))
        scale = torch.linspace(0.5, 2, CLASSES)
        if as_buffer:
            self.register_buffer("scale", scale)
        else:
            self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(512, 16, generator=g), torch.randint(0, CLASSES, (512,), generator=g)


def _global_prior_loss(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(o + PRIOR, y)


Form = Callable[[], tuple[nn.Module, Any, Callable[[nn.Module], torch.Tensor]]]


def _closure_form(make_loss: Callable[[torch.Tensor], Any], init: torch.Tensor) -> Form:
    """A model with a buffer and a loss closing over a fresh copy of ``init``; the third item
    gives the tensor to change in place between steps."""
    def form() -> tuple[nn.Module, Any, Callable[[nn.Module], torch.Tensor]]:
        t = init.clone()
        return Scaled(as_buffer=True), make_loss(t), lambda _model: t
    return form


def _one_hot(y: torch.Tensor) -> torch.Tensor:
    return F.one_hot(y, CLASSES).float()


FORMS: dict[str, Form] = {
    "cross_entropy_weight": _closure_form(
        lambda w: lambda o, y: F.cross_entropy(o, y, weight=w), torch.linspace(0.5, 2, CLASSES)),
    "nll_loss_weight": _closure_form(
        lambda w: lambda o, y: F.nll_loss(o.log_softmax(1), y, weight=w),
        torch.linspace(2, 0.5, CLASSES)),
    "bce_pos_weight": _closure_form(
        lambda pw: lambda o, y: F.binary_cross_entropy_with_logits(o, _one_hot(y),
                                                                   pos_weight=pw),
        torch.linspace(1, 3, CLASSES)),
    "target_mask": _closure_form(
        lambda m: lambda o, y: ((o - _one_hot(y)).pow(2) * m).mean(),
        torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])),
    "class_prior": _closure_form(
        lambda p: lambda o, y: F.cross_entropy(o + p, y), torch.linspace(-1, 1, CLASSES)),
    "partial_weight": _closure_form(
        lambda w: functools.partial(F.cross_entropy, weight=w), torch.linspace(0.5, 2, CLASSES)),
    "global_prior": lambda: (Scaled(as_buffer=True), _global_prior_loss, lambda _m: PRIOR),
    "plain_attribute": lambda: (Scaled(as_buffer=False), F.cross_entropy,
                                lambda model: model.scale),
}


def _budget(model: nn.Module, loss_fn: Any, batch: Any, fraction: float) -> int:
    peaks = reference_peaks(outcore.capture(copy.deepcopy(model), loss_fn, batch))
    return int(peaks.liveness * fraction)


def _assert_eager(model: nn.Module, reference: nn.Module, loss: torch.Tensor,
                  expected: torch.Tensor) -> None:
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-6, atol=1e-7)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)


def _step_as_eager(trainer: Any, model: nn.Module, reference: nn.Module, ref_loss_fn: Any,
                   batch: Any, opts: tuple[Any, Any]) -> None:
    """One step of ``trainer`` and of eager on ``reference``, compared
    (``_assert_eager``), then both optimizers' steps (``opts``: ours, the reference's)."""
    for opt in opts:
        opt.zero_grad()
    loss = trainer.step(*batch)
    expected = ref_loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    _assert_eager(model, reference, loss, expected)
    for opt in opts:
        opt.step()


@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_three_steps_equal_eager_with_a_change_in_place(form: str, policy: str) -> None:
    """Three SGD steps at half the in-core peak equal eager's, the tensor the loss (or the
    model) reads changed in place between steps 1 and 2 in both."""
    model, loss_fn, held = FORMS[form]()
    reference = copy.deepcopy(model)
    ref_loss_fn = loss_fn
    if form == "plain_attribute":  # the reference reads its own copy of the attribute
        assert held(reference) is not held(model)
    batch = _batch()
    budget = _budget(model, loss_fn, batch, 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    before = held(model).clone()
    with outcore.compile(model, loss_fn, batch, budget=budget, device="cpu-emulated",
                         policy=policy) as trainer:
        assert trainer.stats.predicted_peak <= budget
        for i in range(3):
            if i == 1:
                with torch.no_grad():
                    for t in {id(held(model)): held(model), id(held(reference)):
                              held(reference)}.values():
                        t.mul_(1.5).add_(0.25)
            _step_as_eager(trainer, model, reference, ref_loss_fn, batch, (opt, ref_opt))
    assert not torch.equal(held(reference), before)  # the change was made
    if form == "global_prior":
        PRIOR.copy_(before)  # leave the module global as it was


def test_a_rebound_closure_variable_is_followed() -> None:
    """``w = new_w`` in the enclosing scope (same shape): the next step reads the new tensor,
    as eager does; the captured graph is kept."""
    model = Scaled(as_buffer=True)
    reference = copy.deepcopy(model)
    w = torch.linspace(0.5, 2, CLASSES)

    def loss_fn(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(o, y, weight=w)

    batch = _batch()
    with outcore.compile(model, loss_fn, batch, budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        trainer.step(*batch)
        first = trainer.planned
        w = torch.linspace(3, 0.25, CLASSES)
        model.zero_grad()
        loss = trainer.step(*batch)
        assert trainer.planned is first  # followed, not captured again
    expected = loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    _assert_eager(model, reference, loss, expected)


def test_an_attribute_rebound_to_another_shape_is_captured_again() -> None:
    """``model.scale = <a tensor of another shape>``: the graph cannot take it; the Trainer
    captures and plans the step again, and the step equals eager's with the new tensor."""
    model = Scaled(as_buffer=False)
    reference = copy.deepcopy(model)
    batch = _batch()
    with outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        trainer.step(*batch)
        first = trainer.planned
        model.scale = reference.scale = torch.tensor([0.75])
        model.zero_grad()
        loss = trainer.step(*batch)
        assert trainer.planned is not first
    expected = F.cross_entropy(reference(batch[0]), batch[1])
    expected.backward()
    _assert_eager(model, reference, loss, expected)


def test_the_executor_refuses_a_rebinding_it_cannot_take() -> None:
    """Without the Trainer (a planned step's executor) the rebinding is refused by name
    before anything runs."""
    from outcore.capture.step import ConstantRebound

    w = torch.linspace(0.5, 2, CLASSES)
    graph = outcore.capture(Scaled(as_buffer=True),
                            lambda o, y: F.cross_entropy(o, y, weight=w), _batch())
    step = graph.source
    where = ("variable 'w' that test_the_executor_refuses_a_rebinding_it_cannot_take."
             "<locals>.<lambda> closes over")
    assert {o.where for o in step.lifted.values()} == {where}
    w = torch.ones(CLASSES, requires_grad=True)
    with pytest.raises(ConstantRebound, match=r"variable 'w'.*\[5\] float32.*requires grad"):
        step.static_values(graph, _batch())


def test_a_closed_over_tensor_that_requires_grad_is_refused_by_name() -> None:
    """A leaf with requires_grad=True read through a detach in the loss (eager gives it no
    gradient here, but outcore cannot tell): refused, naming it, not silently constant."""
    w = torch.linspace(0.5, 2, CLASSES, requires_grad=True)
    with pytest.raises(CaptureError, match=r"variable 'w'.*\[5\] float32 on cpu.*requires "
                                           r"grad.*nn\.Parameter"):
        outcore.capture(Scaled(as_buffer=True),
                        lambda o, y: F.cross_entropy(o, y, weight=w.detach() * 1), _batch())
    with pytest.raises(CaptureError, match=r"variable 'w'.*requires grad"):
        outcore.capture(Scaled(as_buffer=True), lambda o, y: F.cross_entropy(o * w, y),
                        _batch())


@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all"])
def test_parameters_held_in_a_variable_are_the_models(policy: str) -> None:
    """An L2 term over ``params = list(model.parameters())`` and a loss reading a buffer
    through a variable: traced as the model's own parameters and buffer (not constants),
    so each parameter's gradient sums both uses, as eager's does, over 3 steps at half the
    in-core peak."""
    model = Scaled(as_buffer=True)
    reference = copy.deepcopy(model)

    def make(m: nn.Module) -> Any:
        params, scale = list(m.parameters()), m.scale
        return lambda o, y: (F.cross_entropy(o / scale, y)
                             + 1e-2 * sum(p.pow(2).sum() for p in params))

    loss_fn, ref_loss_fn = make(model), make(reference)
    batch = _batch()
    twin = copy.deepcopy(model)  # its own loss: the loss reads the model it was made for
    budget = int(reference_peaks(outcore.capture(twin, make(twin), batch)).liveness * 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    with outcore.compile(model, loss_fn, batch, budget=budget, device="cpu-emulated",
                         policy=policy) as trainer:
        assert not trainer.planned.graph.source.lifted  # nothing lifted as a constant
        for _ in range(3):
            _step_as_eager(trainer, model, reference, ref_loss_fn, batch, (opt, ref_opt))


def test_a_tensor_computed_from_a_parameter_outside_the_step_is_refused() -> None:
    """``w = 2 * model.<param>`` computed before the step: it requires grad, is no parameter
    and would be a constant; refused by name."""
    model = Scaled(as_buffer=True)
    doubled = model.body[16].bias * 2
    with pytest.raises(CaptureError, match=r"variable 'doubled'.*\[5\] float32 on cpu.*"
                                           r"requires grad"):
        outcore.capture(model, lambda o, y: F.cross_entropy(o + doubled, y), _batch())


class Counting(Scaled):
    """Counts its calls in a plain tensor attribute, changed in place by the forward."""

    def __init__(self) -> None:
        super().__init__(as_buffer=True)
        self.calls = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def test_a_step_that_changes_such_a_tensor_in_place_is_refused_and_leaves_it() -> None:
    """``w.mul_(0.5)`` in the loss, ``self.calls += 1`` on a plain attribute: the graph
    cannot change a constant, so capture refuses them by name before the call runs. Without
    the guard the trace ran the change on the user's tensor twice before failing."""
    w = torch.ones(CLASSES)

    def decaying(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        w.mul_(0.5)
        return F.cross_entropy(o * w, y)

    with pytest.raises(CaptureError, match=r"changes variable 'w' that .*decaying closes over "
                                           r"\(\[5\] float32 on cpu\) in place \(mul_\).*"
                                           r"register_buffer"):
        outcore.capture(Scaled(as_buffer=True), decaying, _batch())
    assert torch.equal(w, torch.ones(CLASSES))
    model = Counting()
    with pytest.raises(CaptureError, match=r"changes attribute model\.calls .*in place "
                                           r"\(add_\)"):
        outcore.capture(model, F.cross_entropy, _batch())
    assert model.calls.item() == 0


def test_the_buffer_form_still_trains_as_eager() -> None:
    model = Scaled(as_buffer=True)
    reference = copy.deepcopy(model)
    loss_fn = nn.CrossEntropyLoss(weight=torch.linspace(0.5, 2, CLASSES))
    x, y = _batch()
    with outcore.compile(model, loss_fn, (x, y), budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        got = trainer.step(x, y)
    expected = loss_fn(reference(x), y)
    expected.backward()
    assert torch.equal(got, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
