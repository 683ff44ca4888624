"""Values a model reads from tensors into Python (``.tolist()``, ``.item()``, ``int(t)``, an
``if`` on a tensor, iteration) are specialised on (``outcore.capture.specialize``): each
read, however it is spelled, trains as eager does, step after step as the values change.

``.tolist()`` of a tensor with more than one element used to fail: tracing runs on
``FunctionalTensor``, whose ``tolist`` reads one ``item()`` per element, so the trace read
more values than the eager run had recorded (or, in Hugging Face's JetMoe, answered an
element's read with a whole list: "split_with_sizes(): ... found element of type list").
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.capture import capture
from outcore.errors import CaptureError, ReplanWarning
from outcore.trainer_stats import MANY_RESPECIALISATIONS

EXPERTS = 3
Read = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]


def _split(rows: torch.Tensor, sizes: object) -> list[torch.Tensor]:
    return list(rows.split(sizes, 0))  # type: ignore[arg-type]


#: how a model reads the tokens per expert (``counts``, 1-D) to group ``rows`` by expert
READS: dict[str, Read] = {
    "tolist 1-D": lambda c, r: _split(r, c.tolist()),
    "tuple(tolist)": lambda c, r: _split(r, tuple(c.tolist())),
    "torch.split(x, tolist)": lambda c, r: list(torch.split(r, c.tolist())),
    "tolist 2-D": lambda c, r: _split(r, c.view(1, -1).tolist()[0]),
    "tolist 0-D": lambda c, r: [r[: c[0].tolist()], r[c[0].tolist():]],
    "int each": lambda c, r: _split(r, [int(v) for v in c]),
    "item each": lambda c, r: _split(r, [v.item() for v in c]),
    "list(t)": lambda c, r: _split(r, [int(v) for v in list(c)]),
    "index (slice)": lambda c, r: [r[: c[0]], r[c[0]:]],
    "range(t)": lambda c, r: [r[i:i + 1] for i in range(c.max())],
    "split(tensor)": lambda c, r: _split(r, int(c[0])) if c[0] > 0 else [r],
    "float": lambda c, r: [r * float(c.float().std())],
    "complex": lambda c, r: [r * complex(c[0].float()).real],
    "bool (if)": lambda c, r: [r * 2] if (c > 4).any() else [r],
    "numpy()": lambda c, r: _split(r, c.numpy().tolist()),
    "np.asarray": lambda c, r: _split(r, [int(v) for v in np.asarray(c)]),
    "numpy(force=True)": lambda c, r: _split(r, c.numpy(force=True).tolist()),
}


class Routed(nn.Module):
    """Top-1 routing by a frozen gate, the tokens per expert read in Python (``how``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.gate = nn.Linear(8, EXPERTS).requires_grad_(False)
        self.experts = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.gate(x).argmax(-1)
        counts = torch.zeros(x.shape[0], EXPERTS).scatter(1, chosen[:, None], 1).long().sum(0)
        rows = x[chosen.sort().indices]
        parts = READS[self.how](counts, rows)
        grouped = sum((self.experts(p) * (i + 1)).sum() for i, p in enumerate(parts))
        return self.experts(x) + grouped


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(10, 8), torch.randn(10, 8)) for _ in range(n)]


@pytest.mark.parametrize("how", list(READS))
def test_each_read_trains_as_eager_as_its_values_change(how: str) -> None:
    torch.manual_seed(0)
    model = Routed(how)
    reference = copy.deepcopy(model)
    batches = _batches(3)
    graph = capture(model, nn.functional.mse_loss, batches[0])
    assert graph.source.guards  # the step was specialised on what it read
    trainer = outcore.compile(model, nn.functional.mse_loss, batches[0], budget=None,
                              device="cpu")
    for x, y in batches:
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        loss = trainer.step(x, y)
        expected = nn.functional.mse_loss(reference(x), y)
        expected.backward()
        assert torch.equal(loss, expected.detach())
        assert_grads_equal(model, reference)


def test_tolist_is_one_guard_holding_the_whole_list() -> None:
    torch.manual_seed(0)
    batch = _batches(1)[0]
    graph = capture(Routed("tolist 2-D"), nn.functional.mse_loss, batch)
    (guard,) = graph.source.guards
    assert guard.reader == "tolist" and guard.shape == (1, EXPERTS)
    assert isinstance(guard.value, list) and sum(guard.value[0]) == batch[0].shape[0]


def test_new_counts_are_captured_again_not_run_on_the_old_split() -> None:
    """Counts that change between steps fail the guard: the step is captured and planned
    again for them (the old split's sizes would not even fit the new batch's groups)."""
    torch.manual_seed(0)
    model = Routed("tolist 1-D")
    batches = _batches(4)
    trainer = outcore.compile(model, nn.functional.mse_loss, batches[0], budget=None,
                              device="cpu")
    counts = set()
    for x, y in batches:
        trainer.step(x, y)
        with torch.no_grad():
            chosen = model.gate(x).argmax(-1)
        counts.add(tuple(torch.bincount(chosen, minlength=EXPERTS).tolist()))
    assert len(counts) > 1  # the batches route differently
    assert trainer.stats.replans >= len(counts) - 1


def test_captures_at_many_steps_are_announced_once_with_the_way_out() -> None:
    """Routing by counts read with .tolist() fails the guard at almost every step; each
    costs a capture and a plan, which the Trainer says once, with the fixed-shape way out."""
    torch.manual_seed(0)
    model = Routed("tolist 1-D")
    batches = _batches(3 * MANY_RESPECIALISATIONS)
    trainer = outcore.compile(model, nn.functional.mse_loss, batches[0], budget=None,
                              device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches:
            trainer.step(x, y)
    notes = [w for w in caught if issubclass(w.category, ReplanWarning)]
    assert trainer.stats.replans >= MANY_RESPECIALISATIONS
    assert len(notes) == 1
    message = str(notes[0].message)
    assert f"again {MANY_RESPECIALISATIONS} times" in message
    assert ".tolist() being [" in message and "fixed shapes" in message


class ReadsOtherwiseWhenTraced(nn.Module):
    """Reads a 1-element tensor eagerly (no gradient) but a 0-D one when traced."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        scale = int(h[0, 0] > 0) if torch.is_grad_enabled() else int(h[:1, 0] > 0)
        return h * (scale + 1)


def test_a_trace_that_reads_another_tensor_is_refused_not_answered() -> None:
    batch = (torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(CaptureError, match=r"read number 1 .* shape \(1,\).*differ"):
        capture(ReadsOtherwiseWhenTraced(), nn.functional.mse_loss, batch)


class Unreadable(nn.Linear):
    """A linear layer that reads its output in a way no trace can: a format spec. (NumPy
    was refused too until session 30: ``.numpy()`` and ``np.asarray`` are reads now.)"""

    def __init__(self, how: str) -> None:
        super().__init__(4, 4)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        print(f"mean {out.mean():.3f}")
        return out


@pytest.mark.parametrize(("how", "advice"), [("format", r"without a spec \(f'\{t\}'\)")])
def test_reads_no_trace_can_make_are_refused_with_what_to_write(how: str, advice: str) -> None:
    """It failed with "check that model(x) runs eagerly", which it does."""
    batch = (torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(CaptureError, match=advice) as err:
        capture(Unreadable(how), nn.functional.mse_loss, batch)
    assert "run eagerly" not in str(err.value)


def test_the_readers_are_restored_after_a_capture() -> None:
    from torch._subclasses.functional_tensor import FunctionalTensor

    before = {name: vars(FunctionalTensor).get(name) for name in ("tolist", "__bool__")}
    capture(Routed("tolist 1-D"), nn.functional.mse_loss, _batches(1)[0])
    assert {name: vars(FunctionalTensor).get(name) for name in before} == before
    assert "tolist" not in vars(torch.Tensor) and "item" not in vars(torch.Tensor)
    assert torch.tensor([1, 2]).tolist() == [1, 2]


def test_a_model_that_read_values_is_captured_again_without_the_plain_trace(monkeypatch):
    """A re-capture after a failed guard goes straight to the eager run and the replayed
    trace: the plain trace, which only meets the read again, is skipped (a re-capture of
    DETR's step took 1.6-2.1 s CPU with it, 1.2 s without)."""
    import importlib

    specialize = importlib.import_module("outcore.capture.specialize")
    traces: list[int] = []
    export = specialize._export
    monkeypatch.setattr(specialize, "_export",
                        lambda *a: traces.append(1) or export(*a))  # type: ignore[func-returns-value]
    torch.manual_seed(0)
    model, batches = Routed("tolist 1-D"), _batches(2)
    first = capture(model, nn.functional.mse_loss, batches[0])
    assert len(traces) == 2 and first.source.guards  # the plain trace failed, then replayed
    again = capture(model, nn.functional.mse_loss, batches[1])
    assert len(traces) == 3 and again.source.guards
    capture(Routed("tolist 1-D"), nn.functional.mse_loss, batches[1])  # another model
    assert len(traces) == 5


class ChecksWithAMessage(nn.Module):
    """Hugging Face's placeholder check: a count formatted into the message (and a tensor
    printed) before the condition is read with ``_is_all_true().item()``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        count = (x > 0).sum()
        if self.how == "f-string":
            message = f"tokens: {count}, features: {h.shape[0]}"
        else:
            message = repr(count) + str(h[:1])
        torch._check_tensor_all_with(ValueError, count >= 0, lambda: message)
        return h * 2 if bool(count > 40) else h


@pytest.mark.parametrize("how", ["f-string", "repr"])
def test_a_tensor_formatted_into_a_message_is_no_read(how: str) -> None:
    """Formatting reads a 0-d tensor's value in eager but not in the trace, so the trace's
    reads were answered with the eager run's shifted by one: LLaVA's and PaliGemma's check
    got the token count where it read a bool ("cond must be a bool, but got int")."""
    from exact import train_against_eager

    torch.manual_seed(0)
    graph = capture(ChecksWithAMessage(how), nn.functional.mse_loss, _batches(1)[0])
    assert [g.reader for g in graph.source.guards] == ["item", "__bool__"]
    train_against_eager(ChecksWithAMessage(how), nn.functional.mse_loss, _batches(3),
                        budget=None, device="cpu")


class ReadsAnAttribute(nn.Module):
    """Reads a tensor held in a plain attribute (not a buffer) in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.rows = torch.tensor(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h * int(self.rows) if bool((h > 0).any()) else h


def test_a_value_read_from_a_tensor_held_outside_the_step_is_a_guard_that_can_fail() -> None:
    """Such a tensor is read again at every step; its read is a traced op, not a constant the
    trace built (those always hold, and their guards are dropped), so a new value makes the
    step be captured again, as eager reads the new value."""
    from exact import train_against_eager

    torch.manual_seed(0)
    model = ReadsAnAttribute()
    graph = capture(model, nn.functional.mse_loss, (torch.randn(10, 8), torch.randn(10, 8)))
    assert graph.source.nodes.constant_guards == []
    trainer = train_against_eager(model, nn.functional.mse_loss,
                                  [(torch.randn(10, 8), torch.randn(10, 8))], budget=None,
                                  device="cpu")
    model.rows = torch.tensor(5)
    reference = ReadsAnAttribute()
    reference.load_state_dict(model.state_dict())
    reference.rows = torch.tensor(5)
    x, y = torch.randn(10, 8), torch.randn(10, 8)  # the batch's signature is the same
    model.zero_grad()
    loss = trainer.step(x, y)
    expected = nn.functional.mse_loss(reference(x), y)
    expected.backward()
    assert torch.equal(loss, expected.detach())
    assert trainer.stats.captures == 2
