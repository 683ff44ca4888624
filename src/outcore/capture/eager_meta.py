"""Fake-tensor shape rules no stricter than the eager kernels they stand for.

A capture sizes every op of the step with its fake-tensor rule (the Python ``Meta`` kernel in
``torch._meta_registrations``). Where that rule refuses inputs eager's kernel accepts, a model
that eager trains cannot be captured at all. PyTorch 2.13 has one such rule on a training
step's path:

- **``aten._grouped_mm``** (``torch.nn.functional.grouped_mm``, ``torch._grouped_mm``). The
  rule copies the checks of CUDA's bfloat16 fast path and refuses every other dtype ("Expected
  inputs of BF16 type"), while eager's CPU kernel and CUDA's fallback (a loop of ``mm``) take
  float32 and float16 operands as well. Hugging Face transformers 5 sends the experts of its
  mixture-of-experts models to it (``transformers.integrations.moe``: Mixtral, Qwen2-MoE,
  Qwen3-MoE, OLMoE, gpt-oss, GLM-4-MoE, Granite-MoE, PhiMoE, MiniMax, ...), so every one of
  them in float32 (and under autocast, where transformers casts the tokens to the weights'
  dtype) failed capture. ``torch.compile`` does not meet it: transformers takes its own
  fallback kernel when it sees dynamo.

While ``traced_as_eager()`` is open (``outcore.capture.traced_as_eager``, which calls
``patch`` and ``restore``), ``_grouped_mm`` on two float32 or two float16 operands (no bias,
no ``out_dtype``) is sized by ``_grouped_mm_rule``: the dimension, contraction and offsets
checks of torch's rule, and the output of torch's own helper
(``_create_grouped_mm_output_tensor``, which mirrors ATen's
``create_grouped_gemm_output_tensor``: the shape, and on CUDA builds the padded strides, eager
allocates). Everything else (bfloat16, a bias, an ``out_dtype``, mixed dtypes) goes to torch's
rule unchanged, errors included. The stride-alignment checks are eager's at run time: an
operand eager refuses fails the first step with eager's message, before anything is
committed. The rule is a Python-dispatcher kernel (``OpOverload.py_kernels``), which the
capture's export consults; a bare ``FakeTensorMode`` outside it still meets torch's rule.

Invariants: the rule never accepts a call torch's rule would size differently (it only
answers where torch's rule raises on the dtype); ``restore`` puts back exactly the kernel
``patch`` replaced, and both run under ``traced_as_eager``'s lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

#: Operand dtypes eager's ``_grouped_mm`` takes beyond torch's bfloat16-only rule.
_WIDER = (torch.float32, torch.float16)
_REPLACED: list[tuple[Any, Callable[..., Any]]] = []  # (op, torch's Meta kernel)


def _grouped_mm_rule(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_grouped_mm``'s Meta kernel: float32 / float16 operands sized as eager sizes them,
    every other call by ``original`` (module doc)."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    def rule(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
             bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None
             ) -> torch.Tensor:
        if (bias is not None or out_dtype is not None or mat_a.dtype not in _WIDER
                or mat_b.dtype != mat_a.dtype):
            return original(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
        torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3), lambda: (
            f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and "
            f"mat_b.dim()={mat_b.dim()}"))
        both_3d = mat_a.dim() == 3 and mat_b.dim() == 3
        if mat_a.dim() == 3 or mat_b.dim() == 3:
            torch._check(mat_a.size(-1) == mat_b.size(-2),
                         lambda: "contraction dimension of mat_a and mat_b must match")
        torch._check(both_3d == (offs is None), lambda: (
            "offs is required with a 2D operand and not allowed with two 3D operands"))
        if offs is not None:
            torch._check(offs.dim() == 1 and offs.dtype == torch.int32, lambda: (
                f"Offsets tensor must be a 1D int32 tensor, got {offs.dim()}D {offs.dtype}"))
        return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)

    return rule


def patch() -> None:
    """Install the rules of the module doc (the caller holds ``traced_as_eager``'s lock)."""
    op = torch.ops.aten._grouped_mm.default
    original = op.py_kernels.get(DispatchKey.Meta)
    if original is None:  # another torch: nothing to widen
        return
    _REPLACED.append((op, original))
    op.py_kernels[DispatchKey.Meta] = _grouped_mm_rule(original)
    op._dispatch_cache.clear()


def restore() -> None:
    """Put back the kernels ``patch`` replaced."""
    for op, original in _REPLACED:
        op.py_kernels[DispatchKey.Meta] = original
        op._dispatch_cache.clear()
    _REPLACED.clear()
