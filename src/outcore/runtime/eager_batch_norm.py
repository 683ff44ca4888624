"""Training BatchNorm with the kernels eager PyTorch picks (cuDNN's on CUDA where it applies).

Capture (aot_autograd's functionalization) records a training BatchNorm as
``_native_batch_norm_legit_functional`` and ``native_batch_norm_backward``: PyTorch's native
kernels. Eager PyTorch runs ``at::batch_norm`` -> ``_batch_norm_impl_index``, which on CUDA
picks cuDNN's kernels where they apply (cuDNN enabled, 3+ dims, fp32/fp16 input, ...). Their
summation order differs, so a replay of the captured ops differed from eager by rounding,
amplified by depth (seen on an H100 and an H200, torch 2.11: ResNet-20 at batch 2, loss
1.960824 against eager's 1.960823 and 59 gradients off; a batch-2 ResNeXt-3d 1.5% off in the
loss). With cuDNN turned off on both sides the replay was bit-identical.

Here the forward runs ``_batch_norm_impl_index`` itself, so the backend is chosen by the same
code as eager's, on clones of the running statistics (the functional op returns updated
copies and leaves its inputs alone: the clones are those copies), and the matching backward
runs ``_batch_norm_impl_index_backward`` with that forward's backend index and cuDNN reserve
space, as eager's autograd does. Where the input is not on CUDA (the CPU devices) both run
the captured op unchanged (``everywhere=True`` takes the eager path there too; the CPU test
uses it to check the plumbing).

Invariants:
* outputs have the captured op's structure: five tensors forward; three backward slots,
  None where ``output_mask`` is off;
* a forward re-run by a recompute overwrites its record (backend index, reserve) before the
  backward reads it, as that backward then reads the re-made saved statistics; the backward
  takes the record (the reserve is freed with it);
* the saved statistics mean the same on both backends (mean and inverse standard deviation),
  so every other reader of them is unaffected.

Memory: the reserve space lives from the forward to the backward outside the graph's
tensors (cuDNN's SPATIAL mode, the one for contiguous inputs, needs none); the CUDA oracle
asserts that the tracked peak equals the predicted one on the BatchNorm networks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from outcore.graph.ir import Graph

FORWARD = "aten._native_batch_norm_legit_functional.default"
BACKWARD = "aten.native_batch_norm_backward.default"

_aten = torch.ops.aten
_Record = dict[int, tuple[int, torch.Tensor]]  # forward op id -> (backend index, reserve)


def batch_norm_impls(graph: Graph, *, everywhere: bool = False) -> dict[int, Callable[..., Any]]:
    """Op id -> callable for every training BatchNorm of ``graph`` (forward and backward)
    that runs eager's backend choice; see the module docstring."""
    saved_by: dict[int, int] = {}  # saved statistics (outputs 1 and 2) -> their forward
    impls: dict[int, Callable[..., Any]] = {}
    records: _Record = {}
    for op in graph.ops:
        if op.target == FORWARD:  # not by the running statistics: a norm used twice reads
            saved_by.update((t, op.id) for t in op.outputs[1:3])  # its first use's update
            impls[op.id] = _forward(op.id, records, everywhere)
    for op in graph.ops:
        if op.target == BACKWARD:
            forward = next((saved_by[t] for t in op.inputs if t in saved_by), None)
            if forward is not None:
                impls[op.id] = _backward(forward, records)
    return impls


def _forward(oid: int, records: _Record, everywhere: bool) -> Callable[..., Any]:
    def batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   running_mean: torch.Tensor, running_var: torch.Tensor, training: bool,
                   momentum: float, eps: float) -> tuple[torch.Tensor, ...]:
        if not (everywhere or input.is_cuda):
            return _aten._native_batch_norm_legit_functional.default(
                input, weight, bias, running_mean, running_var, training, momentum, eps)
        mean, var = running_mean.clone(), running_var.clone()
        out, save_mean, save_invstd, reserve, index = _aten._batch_norm_impl_index.default(
            input, weight, bias, mean, var, training, momentum, eps,
            torch.backends.cudnn.enabled)
        records[oid] = (index, reserve)
        return out, save_mean, save_invstd, mean, var
    return batch_norm


def _backward(forward: int, records: _Record) -> Callable[..., Any]:
    def batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor,
                            weight: torch.Tensor | None, running_mean: torch.Tensor | None,
                            running_var: torch.Tensor | None, save_mean: torch.Tensor | None,
                            save_invstd: torch.Tensor | None, train: bool, eps: float,
                            output_mask: list[bool]) -> tuple[torch.Tensor | None, ...]:
        record = records.pop(forward, None)
        if record is None:  # the forward ran the captured op (not on CUDA)
            return _aten.native_batch_norm_backward.default(
                grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                train, eps, output_mask)
        index, reserve = record
        grads = _aten._batch_norm_impl_index_backward.default(
            index, input, grad_out, weight, running_mean, running_var, save_mean, save_invstd,
            train, eps, output_mask, reserve)
        return tuple(g if keep else None for g, keep in zip(grads, output_mask, strict=True))
    return batch_norm_backward
