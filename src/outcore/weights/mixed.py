"""Mixed precision as users run it: low-precision weights, fp32 master weights on the host.

``MasterWeights(model)`` makes an fp32 copy of every parameter of a bf16 (or fp16) model, in
host memory, as ``nn.Parameter``s: the user builds the optimizer on them
(``torch.optim.AdamW(master.parameters(), ...)``), so its state is fp32 and lives on the
host too. One step of a parameter, wherever outcore runs it (``outcore.weights.host_step``):

1. ``master.grad = param.grad.to(fp32)`` (the low-precision gradient, widened);
2. the optimizer steps the master (clipping, when asked, is over the masters' gradients);
3. ``param.copy_(master)``: the device copy is the master cast to the model's dtype.

That is the scheme ``eager_step`` runs without outcore, the reference outcore's steps are
compared with. Invariant: ``param == master.to(param.dtype)`` after every step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from outcore.errors import OutcoreError


class MasterWeights:
    """fp32 (``dtype``) master copies of ``model``'s parameters, by parameter name."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.float32) -> None:
        self.params: dict[str, nn.Parameter] = dict(model.named_parameters())
        self.masters: dict[str, nn.Parameter] = {
            n: nn.Parameter(p.detach().to("cpu", dtype).clone()) for n, p in self.params.items()}
        self._name = {id(m): n for n, m in self.masters.items()}

    def parameters(self) -> Iterator[nn.Parameter]:
        """The masters, in the model's parameter order (build the optimizer on these)."""
        return iter(self.masters.values())

    def name_of(self, master: torch.Tensor) -> str:
        """The model's name of ``master``; OutcoreError for a tensor that is not a master."""
        name = self._name.get(id(master))
        if name is None:
            raise OutcoreError("the optimizer holds a tensor that is not one of the master "
                               "weights; build it on MasterWeights(model).parameters()")
        return name

    def set_grad(self, name: str, grad: torch.Tensor | None) -> None:
        """Widen the model's gradient of ``name`` into its master's ``.grad`` (copied to
        the master's device: a GPU gradient comes to the host)."""
        master = self.masters[name]
        master.grad = None if grad is None else grad.detach().to(master.device, master.dtype)

    @torch.no_grad()
    def publish(self, name: str) -> None:
        """Write the master of ``name`` into the model's parameter (cast to its dtype)."""
        self.params[name].copy_(self.masters[name])


def eager_step(model: nn.Module, master: MasterWeights, optimizer: torch.optim.Optimizer,
               loss: torch.Tensor, *, clip: float | None = None) -> None:
    """The eager reference of one mixed-precision step: backward in the model's dtype,
    gradients widened into the masters, clipping over the masters' gradients, the optimizer
    step on the masters, the model's parameters rewritten as their cast, gradients cleared."""
    loss.backward()
    for name, p in master.params.items():
        master.set_grad(name, p.grad)
        p.grad = None
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(list(master.parameters()), clip)
    optimizer.step()
    optimizer.zero_grad()
    for name in master.params:
        master.publish(name)
