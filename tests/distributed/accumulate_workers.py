"""What each rank of ``test_ddp_accumulate`` does: eager DDP and outcore's data parallel
over the same steps, with gradients accumulated over two steps per optimizer step."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """BatchNorm (a buffer broadcast from rank 0) and a parameter the forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.l = nn.Linear(8 * 16, 32)
        self.fc = nn.Linear(32, 5)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.bn(self.c(x))), 2).flatten(1)
        return self.fc(torch.relu(self.l(h)))


def _shares(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x, y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g)
        out.append((x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]))
    return out


def _train(model: nn.Module, step: Any, shares: list[Any]) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i, (x, y) in enumerate(shares):
        losses.append(step(x, y))
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    return losses


def accumulate(rank: int, world: int, steps: int) -> dict[str, Any]:
    """Mismatches between eager DDP and ``distributed=True`` after ``steps`` steps (an
    optimizer step every two), then whether a refused step (a layer frozen after
    compiling) left the accumulated ``.grad`` in place."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import outcore

    torch.manual_seed(0)
    model = Net()
    ours = copy.deepcopy(model)
    shares = _shares(rank, steps + 1)
    trainer = outcore.compile(ours, F.cross_entropy, shares[0], budget=None,
                              device="cpu-emulated", policy="offload-all", distributed=True)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    assert dist.is_initialized()

    def eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        return loss.detach()

    want = _train(model, eager, shares[:steps])
    got = _train(ours, trainer.step, shares[:steps])
    bad = [f"loss {i}" for i, (a, b) in enumerate(zip(want, got, strict=True))
           if not torch.equal(a, b)]
    bad += [k for k, v in model.state_dict().items() if not torch.equal(v, ours.state_dict()[k])]
    bad += [n for (n, p), q in zip(model.named_parameters(), ours.parameters(), strict=True)
            if (p.grad is None) != (q.grad is None)
            or (p.grad is not None and not torch.equal(p.grad, q.grad))]
    trainer.step(*shares[steps])  # accumulated, not stepped
    held = {n: p.grad for n, p in ours.named_parameters() if p.grad is not None}
    ours.fc.weight.requires_grad_(False)  # a frozen layer: refused before anything runs
    try:
        trainer.step(*shares[steps])
        refused = False
    except outcore.errors.UnsupportedModelError:
        refused = True
    kept = all(p.grad is held.get(n) for n, p in ours.named_parameters())
    trainer.close()
    return {"mismatches": bad, "refused": refused, "kept": kept}
