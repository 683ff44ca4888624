"""What each rank does in ``test_one_sided_refusals``: one rank refuses, the others do not.

Every case runs in one process group (2 gloo ranks, a 20 s collective timeout), in order;
each refused step is followed by steps that train on every rank, so a case also shows that
the group is still in step after the refusal. The model: a 1x1 Conv1d, BatchNorm1d (its
running statistics differ between the ranks after a step, so a buffer broadcast from rank
0 would show), ReLU, a 1x1 Conv1d, on batches ``(n, 8, t)``, planned by offload-all under
``BUDGET`` (a share of 4 x 8 fits, one of 2 x 64 does not: the step of a share of fewer,
longer sequences, as a loader that pads each share to its own longest sequence gives).

Cases (``refused[name]`` on each rank: the exception's type and message, and the state it
changed, parameters, buffers, ``.grad`` and the optimizer's momentum, which must be none):

* ``"compile"``: rank 1's first share (4 x 64) does not fit the budget; the ranks then
  compile with shares that fit;
* ``"replan"``: the smaller last batch: rank 0's share 2 x 8 (re-planned, it fits), rank 1's
  2 x 64 (its re-plan raises InfeasibleBudgetError);
* ``"batch-check"``: rank 1 steps under ``torch.autocast`` the step was not captured in
  (the step's check of the batch refuses it);
* ``"loss"``: rank 0's share of 3 is re-planned, rank 1's of 1 sample makes the user's loss
  raise while it is captured.

After the refusals each rank records ``.grad`` of one more step against eager PyTorch's
average over the ranks' shares (``grad_error``).
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: The device budget (bytes): offload-all peaks at about 12.4 KiB on a share of 4 x 8 (plus
#: its gradient bucket), and needs 42 KiB at 2 x 64 (the inputs and one op's tensors alone).
BUDGET = 30_000
TIMEOUT = datetime.timedelta(seconds=20)


def picky_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The user's loss, which refuses a batch of one sample."""
    if out.shape[0] < 2:
        raise ValueError(f"picky_mse needs 2 samples or more, got {out.shape[0]}")
    return F.mse_loss(out, y)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(8, 16, 1), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Conv1d(16, 8, 1))


def _batch(seed: int, n: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, t, generator=g), torch.randn(n, 8, t, generator=g)


def snapshot(model: nn.Module, opt: torch.optim.Optimizer | None) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers, ``.grad`` and the optimizer's state tensors."""
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    state.update({f"{n}.grad": p.grad.clone() for n, p in model.named_parameters()
                  if p.grad is not None})
    if opt is not None:
        for k, s in opt.state_dict()["state"].items():
            state.update({f"opt.{k}.{n}": v.clone() for n, v in s.items()
                          if isinstance(v, torch.Tensor)})
    return state


def changed(before: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> list[str]:
    return sorted(n for n in before.keys() | now.keys()
                  if n not in now or n not in before or not torch.equal(now[n], before[n]))


def _refusal(exc: BaseException, before: dict[str, torch.Tensor],
             now: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "changed": changed(before, now)}


class Ranks:
    """This rank's model, trainer and optimizer through the cases (module doc)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.model = _model()
        self.refused: dict[str, Any] = {}
        self.trainer: Any = None
        self.opt: torch.optim.Optimizer | None = None

    def compile(self, share: Any) -> Any:
        import outcore

        return outcore.compile(self.model, picky_mse, share, budget=BUDGET,
                               device="cpu-emulated", policy="offload-all",
                               distributed=True, timeout=TIMEOUT)

    def refuse(self, name: str, step: Any) -> None:
        """Run ``step``, which must raise on every rank; record the refusal."""
        before = snapshot(self.model, self.opt)
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - recorded for the test, which asserts on it
            self.refused[name] = _refusal(exc, before, snapshot(self.model, self.opt))
        else:
            self.refused[name] = {"type": None, "message": "it stepped",
                                  "changed": changed(before, snapshot(self.model, self.opt))}

    def train(self, seed: int) -> float:
        """A step on every rank's share of the global batch ``(8, 8, 8)`` of ``seed``, from
        zeroed ``.grad``; the largest difference of ``.grad`` from eager PyTorch's average
        of the ranks' share gradients, relative to its size."""
        assert self.opt is not None
        self.opt.zero_grad()
        x, y = _batch(seed, 4 * self.world, 8)
        shares = list(zip(x.chunk(self.world), y.chunk(self.world), strict=True))
        ref = copy.deepcopy(self.model)
        for xs, ys in shares:
            (picky_mse(ref(xs), ys) / self.world).backward()
        self.trainer.step(*shares[self.rank])
        err = 0.0
        for p, q in zip(ref.parameters(), self.model.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            err = max(err, float((p.grad - q.grad).abs().max() / p.grad.abs().max()))
        self.opt.step()
        return err

    def run(self) -> dict[str, Any]:
        mine = 1 if self.rank == 1 else 0
        # compile: rank 1's first share does not fit
        self.refuse("compile", lambda: self.compile(_batch(1, 4, 64 if mine else 8)))
        self.trainer = self.compile(_batch(2, 4, 8))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        errors = [self.train(3)]
        # .grad of that step is kept (no zero_grad): a refused step must leave it
        short = _batch(4, 2, 64 if mine else 8)
        self.refuse("replan", lambda: self.trainer.step(*short))
        errors.append(self.train(5))
        full = _batch(6, 4, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(mine)):
            self.refuse("batch-check", lambda: self.trainer.step(*full))
        errors.append(self.train(7))
        one = _batch(8, 1 if mine else 3, 8)
        self.refuse("loss", lambda: self.trainer.step(*one))
        errors.append(self.train(9))
        self.trainer.close()
        return {"refused": self.refused, "grad_error": errors,
                "replans": self.trainer.replans}


def refusals(rank: int, world: int) -> dict[str, Any]:
    """Every case on this rank (module doc)."""
    return Ranks(rank, world).run()
