"""Calling conventions, plan cache, eval mode, mixed precision and node kinds, against eager."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict, UserDict
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import outcore
from outcore.capture.batching import loss_of
from outcore.capture.convert import build_graph
from outcore.capture.step import BatchMismatch
from outcore.errors import CaptureError, InvalidArgumentError, SubBatchWarning
from outcore.runtime.executor import Executor


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))


def same_grads(model: nn.Module, reference: nn.Module) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"gradient of {name} differs from eager"


def step_both(trainer: outcore.Trainer, model: nn.Module, reference: nn.Module, batch,
              eager, seed: int = 3, **kwargs) -> torch.Tensor:
    model.zero_grad()
    reference.zero_grad()
    torch.manual_seed(seed)
    loss = trainer.step(batch, **kwargs)
    torch.manual_seed(seed)
    expected = eager(reference, batch)
    expected.backward()
    assert torch.equal(loss, expected.detach())
    same_grads(model, reference)
    return loss


@dataclass
class Out:
    loss: torch.Tensor
    logits: torch.Tensor


class SelfLoss(nn.Module):
    """Returns its own loss in the form ``kind`` names (the ecosystem's output types)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.net = mlp()
        self.kind = kind

    def forward(self, features: torch.Tensor, labels: torch.Tensor, scale: float = 1.0):
        logits = self.net(features) * scale
        loss = F.cross_entropy(logits, labels)
        if self.kind == "dict":
            return {"logits": logits, "loss": loss}
        if self.kind == "ordered":
            return OrderedDict(loss=loss, logits=logits)
        if self.kind == "tuple":
            return (loss, logits)
        return Out(loss, logits)


def dict_batch(n: int = 6) -> dict:
    torch.manual_seed(1)
    return {"features": torch.randn(n, 8), "labels": torch.randint(0, 3, (n,)), "scale": 2.0}


@pytest.mark.parametrize("kind", ["dict", "ordered", "tuple", "dataclass"])
def test_model_returning_its_loss_from_a_dict_batch(kind):
    model = SelfLoss(kind)
    reference = copy.deepcopy(model)
    batch = dict_batch()
    trainer = outcore.compile(model, None, batch, budget=None, device="cpu",
                              policy="recompute-cheap")

    def eager(m, b):
        return loss_of(m(**b))

    step_both(trainer, model, reference, batch, eager)


def test_a_user_dict_batch_is_read_as_its_dict():
    """Hugging Face tokenizers and data collators yield a ``BatchEncoding``, a ``UserDict``
    that pytree takes as one opaque leaf: its tensors must still be the step's inputs, so the
    next batch's values are used, not the example's."""
    model = SelfLoss("dict")
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, None, UserDict(dict_batch()), budget=None, device="cpu")
    assert trainer.executor.step.batch_leaves == 2, "features and labels are inputs"

    def eager(m, b):
        return loss_of(m(**b))

    torch.manual_seed(5)
    other = UserDict({"features": torch.randn(6, 8), "labels": torch.randint(0, 3, (6,)),
                      "scale": 2.0})
    step_both(trainer, model, reference, other, eager)
    assert trainer.stats.captures == 1


def test_step_takes_x_y_or_the_batch_and_a_loss_fn_may_read_a_dict_batch():
    model = mlp()
    x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
    trainer = outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu")
    torch.manual_seed(0)
    first = trainer.step(x, y)
    torch.manual_seed(0)
    second = trainer.step((x, y))
    assert torch.equal(first, second)
    assert trainer.stats.captures == 1

    def by_dict(out, batch):
        return F.cross_entropy(out["logits"], batch["labels"])

    wrapped = SelfLoss("dict")
    ref = copy.deepcopy(wrapped)
    batch = dict_batch()
    t2 = outcore.compile(wrapped, by_dict, batch, budget=None, device="cpu")
    step_both(t2, wrapped, ref, batch, lambda m, b: by_dict(m(**b), b))


def test_new_shapes_are_replanned_and_cached_lru():
    model = mlp()
    reference = copy.deepcopy(model)
    full = (torch.randn(8, 8), torch.randint(0, 3, (8,)))
    last = (torch.randn(5, 8), torch.randint(0, 3, (5,)))
    trainer = outcore.compile(model, F.cross_entropy, full, budget="64KiB", device="cpu",
                              cache_size=1)

    def eager(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    step_both(trainer, model, reference, full, eager)
    assert (trainer.stats.replans, trainer.stats.cache_hits) == (0, 1)
    step_both(trainer, model, reference, last, eager)
    assert trainer.stats.replans == 1 and trainer.stats.signature.startswith("([5, 8]")
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak <= 64 * 1024
    step_both(trainer, model, reference, full, eager)
    assert (trainer.stats.replans, trainer.stats.evictions) == (2, 2)  # cache of one
    with pytest.raises(InvalidArgumentError, match="cache_size of at least 1"):
        outcore.compile(model, F.cross_entropy, full, budget=None, device="cpu", cache_size=0)


def test_other_dtype_is_replanned_not_a_raw_error():
    model = mlp().double()
    reference = copy.deepcopy(model)
    batch = (torch.randn(4, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu")
    step_both(trainer, model, reference, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    model.float()
    reference.float()
    single = (batch[0].float(), batch[1])
    step_both(trainer, model, reference, single, lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    assert trainer.stats.replans == 1


def test_an_executor_refuses_a_batch_of_another_signature_by_name():
    model = mlp()
    graph = outcore.capture(model, F.cross_entropy, (torch.randn(4, 8), torch.tensor([0, 1, 2, 0])))
    planned = outcore.plan(graph, None, policy="keep-all", simulate=False)
    executor = Executor(planned.graph, planned.schedule)
    with pytest.raises(BatchMismatch, match=r"\[3, 8\]:float32.*does not match.*\[4, 8\]"):
        executor.run((torch.randn(3, 8), torch.tensor([0, 1, 2])))


def test_freezing_parameters_invalidates_the_plan():
    model = mlp()
    reference = copy.deepcopy(model)
    batch = (torch.randn(6, 8), torch.randint(0, 3, (6,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu")

    def eager(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    step_both(trainer, model, reference, batch, eager)
    for m in (model, reference):
        m[0].weight.requires_grad_(False)
        m[0].weight.grad = None
    step_both(trainer, model, reference, batch, eager)
    assert trainer.stats.replans == 1 and model[0].weight.grad is None


def test_a_step_under_no_grad_runs_an_eager_no_grad_forward():
    model = mlp()
    batch = (torch.randn(6, 8), torch.randint(0, 3, (6,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu")
    model.eval()
    with torch.no_grad():
        loss = trainer.step(*batch)
        expected = F.cross_entropy(model(batch[0]), batch[1])
    assert torch.equal(loss, expected)
    assert all(p.grad is None for p in model.parameters())
    assert (trainer.stats.eval_steps, trainer.stats.steps, trainer.stats.captures) == (1, 0, 1)


class Branchy(nn.Module):
    """Data-dependent Python control flow, as Hugging Face models have on their inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if bool((x > 0).all()):
            return h * 2
        return h - float(x.abs().max().item())


def _eager_mse(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The eager step's loss of the value-branching models below."""
    return F.mse_loss(m(b[0]), b[1])


def test_value_specialised_step_is_guarded_and_recaptured():
    torch.manual_seed(0)
    model = Branchy()
    reference = copy.deepcopy(model)
    positive = (torch.rand(3, 4) + 0.1, torch.randn(3, 4))
    mixed = (torch.randn(3, 4), torch.randn(3, 4))

    trainer = outcore.compile(model, F.mse_loss, positive, budget=None, device="cpu")
    step_both(trainer, model, reference, positive, _eager_mse)
    step_both(trainer, model, reference, mixed, _eager_mse)  # the guard fails: captured again
    assert trainer.stats.replans == 1
    step_both(trainer, model, reference, (-mixed[0].abs() - 1, mixed[1]), _eager_mse)
    assert trainer.stats.replans == 2  # same branch, other max: a value guard, not a shape


class RandomBranchy(Branchy):
    """Branchy behind dropout and BatchNorm: a failed guard must not cost a random draw or a
    running-statistics update."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(super().forward(x)))


def test_a_failed_guard_reruns_with_eagers_random_draws_and_buffers():
    torch.manual_seed(0)
    model = RandomBranchy()
    reference = copy.deepcopy(model)
    positive = (torch.rand(6, 4) + 0.1, torch.randn(6, 4))
    mixed = (torch.randn(6, 4), torch.randn(6, 4))

    trainer = outcore.compile(model, F.mse_loss, positive, budget=None, device="cpu",
                              policy="recompute-cheap")
    for batch in (positive, mixed):  # the second fails the guard and is run again
        model.zero_grad()
        reference.zero_grad()
        torch.manual_seed(3)
        loss = trainer.step(batch)
        drawn_after = torch.rand(4)
        torch.manual_seed(3)
        expected = _eager_mse(reference, batch)
        expected.backward()
        assert torch.equal(loss, expected.detach())
        same_grads(model, reference)
        assert torch.equal(drawn_after, torch.rand(4)), "the generator ends where eager's does"
        for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
            assert torch.equal(b, c), f"buffer {name} differs from eager"
    assert trainer.stats.replans == 1
    assert model.norm.num_batches_tracked.item() == 2  # the failed run applied nothing


class LayerDrop(nn.Module):
    """Skips its middle layer when a Python-side draw says so (LayerDrop, as wav2vec2 does)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        if torch.rand(()) < 0.5:
            h = h + torch.relu(self.middle(h))
        return self.last(h)


def test_a_value_drawn_in_python_is_recaptured_from_the_steps_random_state():
    torch.manual_seed(0)
    model = LayerDrop()
    reference = copy.deepcopy(model)
    batch = (torch.randn(3, 4), torch.randn(3, 4))
    trainer = outcore.compile(model, F.mse_loss, batch, budget=None, device="cpu")
    for seed in range(6):  # both branches; each change of branch fails the guard
        step_both(trainer, model, reference, batch,
                  lambda m, b: F.mse_loss(m(b[0]), b[1]), seed=seed)
    assert trainer.stats.replans >= 1


class BranchyConv(nn.Module):
    """A convolution net behind a data-dependent branch, large enough for moDNN to split."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(8 * 16 * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return h * 2 if bool((x > 0).all()) else h


def test_sub_batches_that_read_other_values_are_refused_with_the_way_out():
    from outcore.graph.bounds import reference_peaks

    torch.manual_seed(0)
    model = BranchyConv()
    x = torch.rand(32, 3, 16, 16) + 0.1
    x[:4] -= 5  # the whole batch and its first half read False, the second half True
    batch = (x, torch.randint(0, 10, (32,)))
    budget = int(reference_peaks(outcore.capture(model, F.cross_entropy, batch))
                 .layer_lower_bound * 0.7)
    with pytest.warns(SubBatchWarning):
        # cpu-emulated: the budget is 0.7 x the tensors-only layer bound; on "cpu" the
        # kernels' measured temporaries are budgeted too and put it out of reach
        trainer = outcore.compile(model, F.cross_entropy, batch, budget=budget,
                                  device="cpu-emulated", policy="modnn")
    parts = trainer.stats.sub_batches
    assert parts >= 2  # the first sub-batch reads False, a later one True
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CaptureError, match=rf"{parts} sub-batches whose values differ.*whole"):
        trainer.step(*batch)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("how", ["context", "argument"])
def test_autocast_gradients_equal_eager_under_the_same_autocast(dtype, how):
    model = mlp()
    reference = copy.deepcopy(model)
    batch = (torch.randn(6, 8), torch.randint(0, 3, (6,)))
    if how == "context":
        with torch.autocast("cpu", dtype=dtype):
            trainer = outcore.compile(model, F.cross_entropy, batch, budget=None,
                                      device="cpu", policy="recompute-cheap")
    else:
        trainer = outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu",
                                  policy="recompute-cheap", autocast=dtype)
    casts = [t for t in trainer.planned.graph.tensors if t.dtype == str(dtype)[6:]]
    assert casts, "the graph holds the autocast's low-precision tensors"

    def eager(m, b):
        with torch.autocast("cpu", dtype=dtype):
            return F.cross_entropy(m(b[0]), b[1])

    step_both(trainer, model, reference, batch, eager)


def test_autocast_offload_moves_the_low_precision_bytes_it_planned():
    """Under autocast the plan sizes the casts' bfloat16 tensors at 2 bytes an element, the
    offloads move exactly those bytes, and the measured peak is the predicted one."""
    from outcore.plan.schedule import Offload

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 3))
    batch = (torch.randn(32, 64), torch.randint(0, 3, (32,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None,
                              device="cpu-emulated", policy="offload-all",
                              autocast=torch.bfloat16)
    graph, schedule = trainer.planned.graph, trainer.planned.schedule
    moved = [graph.tensors[i.tensor] for i in schedule.instructions if isinstance(i, Offload)]
    low = [t for t in moved if t.dtype == "bfloat16"]
    assert low and all(t.nbytes == 2 * math.prod(t.shape) for t in low)
    result = trainer.executor.run(batch)
    assert result.transfers is not None
    assert result.transfers.d2h.bytes == sum(t.nbytes for t in moved)
    assert result.peak_bytes == trainer.planned.predicted_peak


def test_bfloat16_model_and_grad_scaler():
    model = mlp().to(torch.bfloat16)
    reference = copy.deepcopy(model)
    batch = (torch.randn(6, 8, dtype=torch.bfloat16), torch.randint(0, 3, (6,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu",
                              policy="offload-all")
    graph = trainer.planned.graph
    assert {t.dtype for t in graph.tensors if t.kind == "activation"} >= {"bfloat16"}
    scaler = outcore_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    torch.manual_seed(0)
    loss = trainer.step(batch, scaler=outcore_scaler)
    torch.manual_seed(0)
    expected = F.cross_entropy(reference(batch[0]), batch[1])
    ref_scaler.scale(expected).backward()
    assert torch.equal(loss, expected.detach())
    same_grads(model, reference)
    for s, m in ((scaler, model), (ref_scaler, reference)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        s.step(opt)
        s.update()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


class Kinds(nn.Module):
    """Node kinds real models produce: padding_idx, tied and frozen weights, integer inputs,
    in-place buffer updates, out= ops, a tensor constant and attention with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, padding_idx=0)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.embed(ids))
        self.steps += 1
        self.ema.mul_(0.9).add_(h.detach().mean((0, 1)), alpha=0.1)
        scale = torch.tensor([1.0, 0.5, 0.25, 2.0, 1.0, 0.5, 0.25, 2.0])
        pad = torch.empty(ids.shape)
        torch.eq(ids, 0, out=pad)  # an out= op (on a tensor needing no gradient)
        tmp = h * scale + pad.unsqueeze(-1)
        q = tmp.view(tmp.shape[0], tmp.shape[1], 2, 4).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
        return self.head(a.transpose(1, 2).reshape_as(h))


@pytest.mark.parametrize("policy", ["keep-all", "recompute-cheap", "offload-all"])
def test_node_kinds_of_real_models_equal_eager(policy):
    torch.manual_seed(0)
    model = Kinds()
    reference = copy.deepcopy(model)
    ids = torch.tensor([[0, 3, 5, 0, 7], [2, 0, 9, 11, 0]])
    batch = (ids, ids)

    def loss_fn(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    trainer = outcore.compile(model, loss_fn, batch, budget=None, device="cpu", policy=policy)
    graph = trainer.planned.graph
    assert any(t.source.startswith("const:") for t in graph.tensors)
    assert sum(op.random for op in graph.ops) >= 1, "attention with dropout is a random op"
    step_both(trainer, model, reference, batch, lambda m, b: loss_fn(m(b[0]), b[1]))
    for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        assert torch.equal(b, c), f"buffer {name} updated otherwise than eager"
    assert int(model.steps) == 1
    assert model.frozen.weight.grad is None


def test_a_node_outcore_cannot_hold_names_node_module_and_way_out():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2)
    y = g.call_module("block", (x,))
    y.meta["nn_module_stack"] = {"block": ("model.block", nn.ReLU)}
    g.output((y,))
    gm = fx.GraphModule({"block": nn.ReLU()}, g)
    with pytest.raises(CaptureError, match=r"node block \(call_module.*model\.block \(ReLU\)"
                                           r".*Way out"):
        build_graph(gm, "bad")


class RandomOps(nn.Module):
    """Every random op real models draw in a training step: dropout, an in-place
    ``bernoulli_`` (timm's drop-path), ``rand_like`` noise and attention with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(torch.relu(self.fc1(x)), 0.3)
        keep = x.new_empty(x.shape[0], 1, 1).bernoulli_(0.8)  # drop-path
        h = h + torch.tanh(self.fc2(h)) * keep / 0.8
        h = h * (1 + 0.1 * torch.rand_like(h))
        q = h.view(h.shape[0], h.shape[1], 2, 8).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)
        return self.fc3(F.gelu(a.transpose(1, 2).reshape_as(h)))


def _recomputes_a_random_op(graph, schedule) -> bool:
    from outcore.plan.schedule import Compute

    random_ops = {op.id for op in graph.ops if op.random}
    assert len(random_ops) >= 4, "dropout, bernoulli, rand_like and SDPA dropout are random"
    return any(isinstance(i, Compute) and i.recompute and i.op in random_ops
               for i in schedule.instructions)


def test_random_ops_are_replayed_by_a_recompute():
    """A recompute of a random op draws what the forward drew (its RNG state is saved and
    replayed), so gradients equal eager's under the same seed bit for bit."""
    torch.manual_seed(0)
    model = RandomOps()
    reference = copy.deepcopy(model)
    batch = (torch.randn(6, 2, 8), torch.randint(0, 4, (6, 2)))

    def loss_fn(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    trainer = outcore.compile(model, loss_fn, batch, budget=None, device="cpu-emulated",
                              policy="recompute-cheap")
    assert _recomputes_a_random_op(trainer.planned.graph, trainer.planned.schedule)
    step_both(trainer, model, reference, batch, lambda m, b: loss_fn(m(b[0]), b[1]))
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak


def test_random_ops_are_replayed_across_the_backend_split():
    """Through ``torch.compile``'s backend the forward half saves each random op's RNG state
    and the backward half's recompute replays it: gradients equal eager's bit for bit."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = RandomOps()
    reference = copy.deepcopy(model)
    x, y = torch.randn(6, 2, 8), torch.randint(0, 4, (6, 2))
    be = outcore.backend(None, policy="recompute-cheap", device="cpu-emulated")
    try:
        torch.manual_seed(3)
        out = torch.compile(model, backend=be, dynamic=False)(x)
        loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
        loss.backward()
        torch.manual_seed(3)
        expected = F.cross_entropy(reference(x).flatten(0, 1), y.flatten())
        expected.backward()
        (compiled,) = be.graphs
        assert _recomputes_a_random_op(compiled.planned.graph, compiled.planned.schedule)
        assert torch.equal(loss.detach(), expected.detach())
        same_grads(model, reference)
        assert be.stats.measured_peak == be.stats.predicted_peak
    finally:
        be.close()
        torch._dynamo.reset()
