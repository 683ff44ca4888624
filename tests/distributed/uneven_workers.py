"""What each rank of ``test_uneven_shares`` does: one cell of the matrix (a model, one pass
or sub-batches) trained over an epoch whose last global batch (5 samples) splits unevenly
over 2 ranks (3 and 2), compared after every step with its reference:

* DDP (gloo, eager) on the rank's share, where DDP runs on the CPU: ``.grad`` is the
  average over the world size of each rank's share's gradient, whatever its size;
* SyncBatchNorm (DDP's runs only on CUDA): eager BatchNorm in one process on the
  concatenation of the ranks' shares, with the loss ``(1/N) sum_r loss_fn(share r)``: the
  same average over the world size, with statistics over the global batch (float64: a
  scale-invariant BatchNorm's gradients are rounding noise in float32, see
  ``test_sync_batchnorm``);
* with sub-batches (``policy="modnn"``, a budget it splits the first share at), the
  documented semantics: each pass its own BatchNorm statistics and running-statistics
  update, its gradient weighted as the loss reduces (``outcore.runtime.subbatch``); for DDP,
  the rank's passes under ``no_sync`` but the last, losses weighted the same way.

Each cell reports the mismatches (losses, ``.grad``, parameters and buffers, per step) and
the passes each step ran.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from ddp_parity_workers import TiedLM, grad_mismatches, lm_loss, tensors_differ
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

#: The global batch sizes of one epoch: 4 + 4 twice, then 3 + 2 (a DataLoader without
#: ``drop_last``).
EPOCH = (8, 8, 5)
#: The modes of a cell: one pass (offload-all, unbounded); sub-batches (moDNN at the
#: model's ``budget``, which it meets by splitting a share of 4 into passes); no-split (moDNN
#: at that budget with ``allow_sub_batches=False``: one pass, as the refusal advises);
#: autocast (one pass, ``compile(autocast=torch.bfloat16, cache_size=0)`` over two epochs:
#: the reference's forward under ``torch.autocast``, the last share planned in each epoch).
MODES = ("one-pass", "sub-batches", "no-split", "autocast")
#: float32 gradients re-associated over sub-batches (seen: 3e-7), relative to each tensor's
#: largest magnitude; float64 SyncBatchNorm against eager BatchNorm (seen: 1e-15)
RTOL = {torch.float32: 1e-5, torch.float64: 1e-9}


class ConvNet(nn.Module):
    """Two convolutions (activations large beside the weights: sub-batches pay), an optional
    BatchNorm (its running statistics are buffers updated in forward) and an unused layer."""

    def __init__(self, norm: type[nn.Module] | None = None) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = norm(8) if norm is not None else nn.Identity()
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Linear(8, 5)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(torch.tanh(self.bn(self.a(x)))))
        return self.c(h.mean((2, 3)))


class DictNet(nn.Module):
    """Called as ``model(**batch)``: an image and per-sample features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = ConvNet()
        self.side = nn.Linear(4, 5)

    def forward(self, image: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.conv(image) + self.side(features)


class OwnLossNet(nn.Module):
    """Hugging Face's convention: the whole dict batch as ``model(**batch)``, labels in it,
    the loss computed by the model (``loss_fn=None``; the trainer is stepped as
    ``step(batch)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = DictNet()

    def forward(self, image: torch.Tensor, features: torch.Tensor,
                labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(self.net(image, features), labels)}


def _images(g: torch.Generator, n: int, dtype: torch.dtype = torch.float32) -> Any:
    return (torch.randn(n, 3, 16, 16, generator=g, dtype=dtype),
            torch.randint(0, 5, (n,), generator=g))


def _tokens(g: torch.Generator, n: int) -> Any:
    """32 tokens per sample: activations large enough beside the weights that moDNN splits."""
    return (torch.randint(0, 23, (n, 32), generator=g),
            torch.randint(0, 23, (n, 32), generator=g))


def _dicts(g: torch.Generator, n: int) -> Any:
    x, y = _images(g, n)
    return {"image": x, "features": torch.randn(n, 4, generator=g)}, y


def _labelled(g: torch.Generator, n: int) -> Any:
    x, y = _dicts(g, n)
    return {**x, "labels": y}


def sum_over_batch(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross entropy summed, divided by the batch size traced as a number: a mean, which a
    sub-batch's graph alone reads as a sum (``outcore.runtime.loss_split.checked_sub_batch``:
    the re-plan of the last share weighed it 1 per pass, twice the gradient)."""
    return F.cross_entropy(out, y, reduction="sum") / out.shape[0]


#: name -> (model builder, loss, global batch maker, dtype, DDP's find_unused_parameters,
#: the budget at which moDNN splits a share of 4: into 2 passes (3 and 2 samples in one),
#: SyncBatchNorm's float64 into 4, as measured on the rank's cost model; the test asserts
#: the passes)
MODELS: dict[str, tuple[Callable[[], nn.Module], Any, Callable[..., Any], torch.dtype, bool,
                        int]] = {
    "plain": (ConvNet, F.cross_entropy, _images, torch.float32, True, 275_000),
    "batchnorm": (lambda: ConvNet(nn.BatchNorm2d), F.cross_entropy, _images, torch.float32,
                  True, 275_000),
    "syncbn": (lambda: ConvNet(nn.SyncBatchNorm).double(), F.cross_entropy,
               lambda g, n: _images(g, n, torch.float64), torch.float64, True, 275_000),
    "tied": (TiedLM, lm_loss, _tokens, torch.float32, False, 35_000),
    "dict": (DictNet, F.cross_entropy, _dicts, torch.float32, True, 275_000),
    "sum-over-batch": (ConvNet, sum_over_batch, _images, torch.float32, True, 275_000),
    "own-loss": (OwnLossNet, None, _labelled, torch.float32, True, 275_000),
}


def shares(batch: Any, world: int) -> list[Any]:
    """Each rank's share of a global batch (any pytree of batch-first tensors); uneven when
    the batch does not divide (5 over 2: 3 and 2)."""
    leaves, spec = tree_flatten(batch)
    parts = [leaf.tensor_split(world) for leaf in leaves]
    return [tree_unflatten([p[r].clone() for p in parts], spec) for r in range(world)]


def _chunks(batch: Any, k: int) -> list[Any]:
    leaves, spec = tree_flatten(batch)
    parts = [leaf.chunk(k) for leaf in leaves]
    return [tree_unflatten([p[i] for p in parts], spec) for i in range(k)]


def _call(model: Any, x: Any) -> Any:
    return model(**x) if isinstance(x, dict) else model(x)


class Cell:
    """One cell: outcore's trainer and its reference on this rank (module doc)."""

    def __init__(self, rank: int, world: int, name: str, mode: str,
                 budget: int | None = None, timeout: float = 30.0,
                 broken: int | None = None, accumulate: bool = False) -> None:
        from torch.nn.parallel import DistributedDataParallel

        import outcore

        build, self.loss_fn, self.make, self.dtype, unused, split_at = MODELS[name]
        budget = split_at if budget is None else budget
        self.rank, self.world, self.name = rank, world, name
        #: the rank whose device is too small for its last share: it is planned (every
        #: rank agrees to run the step) and runs out of memory in its first pass, so another
        #: rank fails in the step's gradient all-reduce
        self.broken = broken
        #: no optimizer step after odd steps: step 2 (the uneven last share) accumulates
        #: onto step 1's ``.grad``
        self.accumulate = accumulate
        torch.manual_seed(0)
        model = build()
        self.ours = copy.deepcopy(model)
        g = torch.Generator().manual_seed(1)
        self.epoch = [self.make(g, n) for n in EPOCH]
        options: dict[str, Any] = {"budget": None, "policy": "offload-all"}
        self.autocast = mode == "autocast"
        self.epochs = 2 if self.autocast else 1
        if self.autocast:
            options.update(autocast=torch.bfloat16, cache_size=0)
        elif mode != "one-pass":
            options = {"budget": budget, "policy": "modnn"}
        if mode == "no-split":
            options["allow_sub_batches"] = False
        self.trainer = outcore.compile(self.ours, self.loss_fn, self.mine(0), distributed=True,
                                       device="cpu-emulated", bucket_cap=2048,
                                       timeout=datetime.timedelta(seconds=timeout), **options)
        self.sync = name == "syncbn"
        if self.sync:  # one process, plain BatchNorm on the global batch (module doc)
            self.ref = _plain_batchnorm(model)
        else:
            self.ref = model
            self.ddp = DistributedDataParallel(model, find_unused_parameters=unused)
        self.opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
                     for m in (self.ref, self.ours)]
        # one pass with the framework's kernels: DDP's bits (2 ranks sum commutatively, see
        # test_ddp_parity); moDNN picks other convolution algorithms, and sub-batches
        # re-associate the sums
        # (autocast too: the captured casts are eager autocast's)
        self.rtol = RTOL[self.dtype] if self.sync or mode in ("sub-batches", "no-split") else 0.0
        self.bad: list[str] = []
        self.passes: list[int] = []

    def mine(self, i: int) -> Any:
        """This rank's share of step ``i``: ``(x, y)``, or the dict batch (``own-loss``)."""
        share = shares(self.epoch[i], self.world)[self.rank]
        if self.rank == self.broken and i == len(self.epoch) - 1:
            # the executor planned for this share now reads it: DeviceOutOfMemory
            self.trainer.device.tracker.capacity = 1024
        return share if isinstance(share, dict) else tuple(share)

    def run(self) -> dict[str, Any]:
        """The epoch, compared step by step; a refused step (``OutcoreError``) ends it and
        reports the message and the state it changed (``changed``: none expected)."""
        from outcore.errors import OutcoreError

        refused: dict[str, Any] = {}
        steps = [i for _ in range(self.epochs) for i in range(len(self.epoch))]
        for n, i in enumerate(steps):
            before = snapshot(self.ours)
            try:
                share = self.mine(i)
                got = self.trainer.step(*((share,) if isinstance(share, dict) else share))
            except OutcoreError as exc:  # a refusal, or another rank's (DistributedError)
                refused = {"step": n, "type": type(exc).__name__, "message": str(exc),
                           "changed": changed(self.ours, before)}
                break
            k = self.trainer.planned.plan.sub_batches
            self.passes.append(k)
            with (torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast
                  else contextlib.nullcontext()):
                want = self.reference(i, k)
            if self.differ(want, got):
                self.bad.append(f"step {n}: loss {float(want)} != {float(got)}")
            self.compare(f"step {n}")
            if self.accumulate and n % 2 == 1:
                continue
            for opt in self.opts:
                opt.step()
                opt.zero_grad()
            self.compare(f"after step {n}")
        self.trainer.close()
        cast = self.trainer.autocast
        return {"mismatches": self.bad, "passes": self.passes, "replans": self.trainer.replans,
                "refused": refused, "autocast": None if cast is None else str(cast[1])}

    def reference(self, i: int, k: int) -> torch.Tensor:
        """The reference's step ``i`` with ``k`` passes; returns this rank's loss."""
        if self.sync:
            return self._sync_reference(i, k)
        total = torch.zeros(())
        for j, part in enumerate(_chunks(self.mine(i), k)):
            # forward and backward under no_sync but the last pass (a forward outside it
            # would broadcast rank 0's buffers again before the next pass)
            with self.ddp.no_sync() if j < k - 1 else contextlib.nullcontext():
                if self.loss_fn is None:
                    loss = self.ddp(**part)["loss"] / k
                else:
                    xs, ys = part
                    loss = self.loss_fn(_call(self.ddp, xs), ys) / k
                loss.backward()
            total = total + loss.detach()
        return total

    def _sync_reference(self, i: int, k: int) -> torch.Tensor:
        """Eager BatchNorm on the ranks' pass ``j`` concatenated, loss averaged over the
        ranks; every rank computes the same (module doc)."""
        per_rank = [_chunks(s, k) for s in shares(self.epoch[i], self.world)]
        mine = torch.zeros((), dtype=self.dtype)
        for j in range(k):
            parts = [p[j] for p in per_rank]
            out = self.ref(torch.cat([x for x, _ in parts]))
            rows = [len(y) for _, y in parts]
            losses = [self.loss_fn(o, y) / k for o, (_, y) in
                      zip(out.split(rows), parts, strict=True)]
            (sum(losses) / self.world).backward()  # type: ignore[union-attr]
            mine = mine + losses[self.rank].detach()
        return mine

    def differ(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return tensors_differ(a, b, self.rtol)

    def compare(self, what: str) -> None:
        self.bad += [f"{what}: .grad of {name}"
                     for name in grad_mismatches(self.ref, self.ours, self.differ)]
        for (name, p), q in zip(self.ref.named_parameters(), self.ours.parameters(),
                                strict=True):
            if self.differ(p.detach(), q.detach()):
                self.bad.append(f"{what}: {name}")
        for (name, a), b in zip(self.ref.named_buffers(), self.ours.buffers(), strict=True):
            if self.differ(a, b) if a.is_floating_point() else not torch.equal(a, b):
                self.bad.append(f"{what}: buffer {name}")


def _plain_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its SyncBatchNorms as plain BatchNorm2d (same state)."""
    ref = copy.deepcopy(model)
    for parent in ref.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.SyncBatchNorm):
                plain = nn.BatchNorm2d(child.num_features, dtype=child.weight.dtype)
                plain.load_state_dict(child.state_dict())
                setattr(parent, child_name, plain)
    return ref


def cells(rank: int, world: int, matrix: list[str]) -> dict[str, Any]:
    """Every cell of ``matrix`` (``"model/mode"``, or ``"model/mode/accumulate"``: the last
    share accumulates onto the previous step's ``.grad``, or ``"model/mode/rank-1-fails"``:
    so, and rank 1's device is too small for its last share) on this rank, in one process group; a
    cell that raises is reported under its key."""
    out: dict[str, Any] = {}
    for key in matrix:
        name, mode, *how = key.split("/")
        broken = 1 if how == ["rank-1-fails"] else None
        try:
            out[key] = Cell(rank, world, name, mode, broken=broken,
                            timeout=10.0 if broken is not None else 30.0,
                            accumulate=how in (["accumulate"], ["rank-1-fails"])).run()
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts none
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def changed(model: nn.Module, before: dict[str, torch.Tensor]) -> list[str]:
    """Names of ``model``'s state (``state_dict`` and ``.grad``) that differ from
    ``before`` (``snapshot``)."""
    now = snapshot(model)
    return sorted(n for n in before.keys() | now.keys()
                  if n not in now or n not in before or not torch.equal(now[n], before[n]))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    state.update({f"{n}.grad": p.grad.clone() for n, p in model.named_parameters()
                  if p.grad is not None})
    return state


