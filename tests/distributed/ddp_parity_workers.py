"""What each rank of ``test_ddp_parity`` does: eager DDP and outcore's data parallel over the
same loops, compared bit for bit on every rank (losses, ``.grad`` after every step, the
final parameters and buffers). Three loops, in one launch:

* ``last_batch``: two epochs whose last global batch (5 samples) is split unevenly over the
  2 ranks (3 and 2), as a DataLoader without ``drop_last`` ends an epoch; the second epoch
  reuses the plans of the first;
* ``no_grad``: training steps with validation under ``torch.no_grad()`` between them, in
  eval and in train mode (BatchNorm's running statistics: DDP broadcasts rank 0's buffers
  before the first no_grad forward after a training one, and not before the training
  forward after it);
* ``tied``: a language model whose output projection is tied to its embedding, with a
  gradient accumulated over two steps per optimizer step.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from accumulate_workers import Net
from torch import nn

#: small buckets: several per model, so their order and the layout of a re-plan matter
BUCKET_CAP = 2048


def tensors_differ(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    """``a`` and ``b`` differ: not bit-equal at ``rtol`` 0, else by more than ``rtol`` of
    ``a``'s largest magnitude, floored at 1e-2 for values that are rounding noise (a
    convolution's bias before a BatchNorm: its gradient is zero in exact arithmetic, 1e-8
    seen, off by as much on 4 ranks)."""
    if rtol == 0.0:
        return not torch.equal(a, b)
    scale = max(a.abs().max().item(), 1e-2) if a.numel() else 1.0
    return bool((a.double() - b.double()).abs().max().item() > rtol * scale)


def grad_mismatches(ref: nn.Module, ours: nn.Module,
                    differ: Any) -> list[str]:
    """Names of ``ref``'s parameters whose ``.grad`` ``ours`` lacks, has extra, or has
    otherwise (``differ(a, b)``), in parameter order."""
    out = []
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        if (p.grad is None) != (q.grad is None) or (
                p.grad is not None and differ(p.grad, q.grad)):
            out.append(name)
    return out


class TiedLM(nn.Module):
    """Embedding -> MLP -> a head whose weight is the embedding's."""

    def __init__(self, vocab: int = 23, width: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mid = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(x))))


def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _images(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def _mine(batch: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[Any, ...]:
    """This rank's share; uneven when the batch does not divide (5 over 2: 3 and 2)."""
    return tuple(t.tensor_split(world)[rank].clone() for t in batch)


class Pair:
    """The same model under DDP and under ``outcore.compile(distributed=True)``."""

    def __init__(self, model: nn.Module, loss_fn: Any, example: Any, unused: bool,
                 rtol: float = 0.0) -> None:
        from torch.nn.parallel import DistributedDataParallel

        import outcore

        self.ours = copy.deepcopy(model)
        self.ref = model
        self.loss_fn = loss_fn
        self.trainer = outcore.compile(self.ours, loss_fn, example, budget=None,
                                       device="cpu-emulated", policy="offload-all",
                                       distributed=True, bucket_cap=BUCKET_CAP)
        self.ddp = DistributedDataParallel(model, find_unused_parameters=unused)
        self.opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
                     for m in (self.ref, self.ours)]
        self.bad: list[str] = []
        #: 0: bit for bit; else the largest difference relative to the reference's largest
        #: magnitude (gloo sums more than two ranks in an order that depends on where an
        #: element sits in its bucket, and DDP's buckets are laid out otherwise)
        self.rtol = rtol

    def differ(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return tensors_differ(a, b, self.rtol)

    def step(self, what: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step of each (a training step, or an eval under no_grad when grad is
        off); records what differs."""
        want = self.loss_fn(self.ddp(x), y)
        if want.requires_grad:
            want.backward()
        got = self.trainer.step(x, y)
        if self.differ(want.detach(), got):
            self.bad.append(f"{what}: loss {float(want)} != {float(got)}")
        self.compare(what)

    def optimizer_step(self) -> None:
        for opt in self.opts:
            opt.step()
            opt.zero_grad()

    def compare(self, what: str) -> None:
        self.bad += [f"{what}: .grad of {name}"
                     for name in grad_mismatches(self.ref, self.ours, self.differ)]
        for (name, a), b in zip(self.ref.state_dict().items(),
                                self.ours.state_dict().values(), strict=True):
            if (self.differ(a, b) if a.is_floating_point() else not torch.equal(a, b)):
                self.bad.append(f"{what}: {name}")


def last_batch(rank: int, world: int, last: int = 5) -> dict[str, Any]:
    """Two epochs of 8 + 8 + ``last`` samples (5 on 2 ranks: 3 and 2; 10 on 4: 3, 3, 2, 2,
    where the ranks with 2 keep their first plan and the others plan anew); an optimizer
    step after each."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    epoch = [_images(g, 8), _images(g, 8), _images(g, last)]
    pair = Pair(Net(), F.cross_entropy, _mine(epoch[0], rank, world), unused=True,
                rtol=0.0 if world == 2 else 1e-5)
    replans, excess = [], []
    for e in range(2):
        for i, batch in enumerate(epoch):
            pair.step(f"epoch {e} batch {i}", *_mine(batch, rank, world))
            pair.optimizer_step()
            stats = pair.trainer.stats  # the emulated device counts the plan's bytes
            excess.append(stats.measured_peak - stats.predicted_peak)
        replans.append(pair.trainer.replans)
    buckets = len(pair.trainer.buckets)
    pair.trainer.close()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in pair.ours.parameters())).hexdigest()
    return {"mismatches": pair.bad, "replans": replans, "excess": excess, "digest": digest,
            "buckets": buckets, "last_shape": list(_mine(epoch[2], rank, world)[0].shape)}


def no_grad(rank: int, world: int) -> dict[str, Any]:
    """Train, validate (eval mode, then train mode) under no_grad, train again."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    batches = [_mine(_images(g, 8), rank, world) for _ in range(6)]
    pair = Pair(Net(), F.cross_entropy, batches[0], unused=True)
    # (what, the mode set before it (None: as it is), grad enabled)
    plan: list[tuple[str, bool | None, bool]] = [
        ("train 0", None, True), ("train 1", None, True),
        ("eval-mode val 0", False, False), ("eval-mode val 1", None, False),
        ("train-mode val", True, False), ("train 2", None, True)]
    for (what, train, grad), batch in zip(plan, batches, strict=True):
        if train is not None:
            pair.ref.train(train)
            pair.ours.train(train)
        with torch.set_grad_enabled(grad):
            pair.step(what, *batch)
        if grad:
            pair.optimizer_step()
    eval_steps = pair.trainer.stats.eval_steps
    pair.trainer.close()
    return {"mismatches": pair.bad, "eval_steps": eval_steps}


def tied(rank: int, world: int) -> dict[str, Any]:
    """Four steps on the tied LM, an optimizer step every two (the second of each pair
    accumulates onto ``.grad``)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    batches = [_mine((torch.randint(0, 23, (4, 6), generator=g),
                      torch.randint(0, 23, (4, 6), generator=g)), rank, world)
               for _ in range(4)]
    pair = Pair(TiedLM(), lm_loss, batches[0], unused=False)
    for i, batch in enumerate(batches):
        pair.step(f"step {i}", *batch)
        if i % 2 == 1:
            pair.optimizer_step()
    tied_slots = [len(b.tensors) for b in pair.trainer.buckets]
    pair.trainer.close()
    return {"mismatches": pair.bad, "slots": tied_slots}


def all_cases(rank: int, world: int) -> dict[str, Any]:
    """Every loop above on this rank (one process group); a loop that raises is reported
    under its name."""
    out: dict[str, Any] = {}
    for name, fn in (("last_batch", last_batch), ("no_grad", no_grad), ("tied", tied)):
        try:
            out[name] = fn(rank, world)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts none
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
