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

A second kind of divergence leaves capture working but the step off eager's values by a
rounding: **layouts**. The Meta kernels of several elementwise backward and loss ops
(``LAYOUT_FROM``: softplus, hardtanh (ReLU6), ELU, hardswish, hardsigmoid, logit, copysign,
the MSE / smooth-L1 / Huber / BCE losses' backward, ``_log_softmax_backward_data``) are
Python decompositions that lay the output out after another operand than eager's
``TensorIterator`` does. Where the operands' layouts differ (a gradient arriving transposed
meets a contiguous saved input), the traced output is contiguous and eager's is transposed,
or the reverse. The step still runs (``outcore.runtime.layout`` copies the real output into
the traced layout), but a later reduction (a bias's gradient: ``sum`` over the batch) then
adds in another order: Qwen3-Next's ``dt_bias`` gradient was 2.5e-7 relative off eager's
(``softplus_backward`` of a transposed gradient). While a step is traced these ops keep
torch's rule for the shape and dtype and take the strides eager's iterator gives, from the
operands it reads in its order (``compute_elementwise_output_strides``), so everything
traced after them sees eager's layouts.

The same holds for the ops of ``outcore.capture.layouts.KNOWN_RULES`` (batch norm's forward
and backward, ``native_layer_norm_backward``, ``native_dropout_backward``), whose real
kernels lay an output out otherwise than torch's Meta kernel. ``layouts.repair_layouts`` used
to mend them after the trace with a copy into the traced layout; values were right, but the
rest of the graph had been traced, and then ran, in the other layout, so its reductions
summed in another order than eager's: BatchNorm1d over a sequence (``Linear -> transpose ->
BatchNorm1d -> transpose``, 4 x 32 x 64) had every gradient off eager's in the last bits, and
FocalNet's last-stage biases (``LayerNorm`` over a channels-last map, its gradient arriving
from the pool contiguous) by one float32 ulp. While a step is traced these ops now return
the real kernel's layout for that output (``_laid_out_as_eager`` with the table's own rule), so the
trace is eager's from there on and ``repair_layouts`` finds nothing to mend.

A third kind is an op fake tensors refuse outright: **``aten._ctc_loss``** (``F.ctc_loss``,
``nn.CTCLoss``; Wav2Vec2's, HuBERT's and every CTC head's loss) carries torch's
``dynamic_output_shape`` tag, so a fake tensor raises ``DynamicOutputShapeException`` on it
(``fake_impls.dyn_shape``). Yet with its lengths given as ints (the ``.default`` overload)
its outputs' shapes are known: the negative log-likelihood ``(batch,)`` and the saved
``log_alpha`` ``(batch, time, 2 * longest target + 1)``, the longest target being the
largest target length, for padded (2-D) targets as for concatenated (1-D) ones, as ATen's
``ctc_loss_cpu_template`` and its CUDA twin allocate them. ``_ctc_loss_rule`` answers for
that overload, ahead of torch's refusal, while a step is traced. ``F.ctc_loss`` itself is
traced as ``outcore.capture.value_shapes.ctc_loss_as_eager``: lengths given as tensors are
read with ``.tolist()``, which is what eager's ``ctc_loss`` does with them before it calls
the same kernel (the ``.Tensor`` overload, whose size needs their values, is never traced),
and the reduction is applied as ATen applies it.

Invariants: the dtype rule never accepts a call torch's rule would size differently (it only
answers where torch's rule raises on the dtype); the layout rules change strides only, never
a shape or dtype; ``restore`` puts back exactly the kernels ``patch`` replaced, and both run
under ``traced_as_eager``'s lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

from outcore.capture.layouts import KNOWN_RULES

#: Operand dtypes eager's ``_grouped_mm`` takes beyond torch's bfloat16-only rule.
_WIDER = (torch.float32, torch.float16)
#: ATen overload -> positions of the arguments eager's TensorIterator reads, in its order
#: (the output's strides follow the first operand that orders two dimensions; module doc);
#: no positions: eager's kernel returns a contiguous tensor.
#: Each entry is checked against the eager kernel in tests/spine/test_eager_layouts.py.
LAYOUT_FROM: dict[str, tuple[int, ...]] = {
    "softplus_backward.default": (0, 1),
    "hardtanh_backward.default": (0, 1),
    "elu_backward.default": (0, 5),
    "hardswish_backward.default": (0, 1),
    "hardsigmoid_backward.default": (0, 1),
    "logit_backward.default": (0, 1),
    "copysign.Tensor": (0, 1),
    "mse_loss_backward.default": (),  # these three: a contiguous gradient in eager
    "smooth_l1_loss_backward.default": (),
    "huber_loss_backward.default": (),
    "binary_cross_entropy_backward.default": (1, 2, 0),
    "_log_softmax_backward_data.default": (),  # eager's CPU kernel: always contiguous
}
#: (op, table, torch's rule): ``table`` is the op's ``py_kernels`` (key DispatchKey.Meta) or
#: ``torch._decomp.decomposition_table`` (key the op), the two places fake tensors size it
_REPLACED: list[tuple[Any, dict[Any, Any], Callable[..., Any]]] = []


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


#: the strides eager gives an op's output, from the op's positional arguments and torch's
#: fake output (None: keep torch's)
Strides = Callable[[tuple[Any, ...], torch.Tensor], "tuple[int, ...] | None"]


def _ctc_loss_rule(fake_mode: Any, func: Any, log_probs: torch.Tensor, targets: torch.Tensor,
                   input_lengths: Any, target_lengths: Any, blank: int = 0,
                   zero_infinity: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``_ctc_loss.default``'s outputs as eager allocates them (module doc)."""
    steps, batch = log_probs.shape[0], log_probs.shape[1]
    longest = max(target_lengths, default=0)
    return (log_probs.new_empty((batch,)),
            log_probs.new_empty((batch, steps, 2 * longest + 1)))


def _is_ctc_loss(func: Any) -> bool:
    return func is torch.ops.aten._ctc_loss.default


def _iterator_strides(positions: tuple[int, ...]) -> Strides:
    """``LAYOUT_FROM``'s rule: the strides eager's TensorIterator gives the output from the
    arguments at ``positions``, in that order (none: a contiguous output)."""
    from torch._prims_common import (
        compute_elementwise_output_strides,
        make_contiguous_strides_for,
    )

    def strides(args: tuple[Any, ...], out: torch.Tensor) -> tuple[int, ...] | None:
        operands = [args[i] for i in positions
                    if i < len(args) and isinstance(args[i], torch.Tensor)]
        if any(o.dim() > out.dim() for o in operands):
            return None
        if operands:
            return tuple(compute_elementwise_output_strides(
                *(o.expand(out.shape) for o in operands)))
        return tuple(make_contiguous_strides_for(out.shape))

    return strides


def _real_kernel_strides(real_of: Callable[[list[Any]], tuple[int, ...]]) -> Strides:
    """``layouts.KNOWN_RULES``' rule (``real_of`` of the positional arguments) as a
    ``Strides``."""
    def strides(args: tuple[Any, ...], out: torch.Tensor) -> tuple[int, ...] | None:
        try:
            return real_of(list(args))
        except (IndexError, AttributeError):  # called otherwise than the rule reads it
            return None

    return strides


def _laid_out_as_eager(original: Callable[..., Any], index: int,
                       strides_of: Strides) -> Callable[..., Any]:
    """A Meta kernel: ``original``'s outputs, output ``index`` with the strides eager gives
    it (``strides_of``; module doc); only the strides differ, and only of a fake or meta
    output (a real tensor keeps its values)."""
    from torch._subclasses.fake_tensor import FakeTensor

    @functools.wraps(original)  # the route fake tensors take (``_replace``) stays torch's
    def rule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        many = isinstance(out, (tuple, list))
        parts = list(out) if many else [out]
        t = parts[index] if index < len(parts) else None
        if not isinstance(t, torch.Tensor) or not (isinstance(t, FakeTensor) or t.is_meta):
            return out
        strides = strides_of(args, t)
        if strides is None or tuple(t.stride()) == strides:
            return out
        parts[index] = t.new_empty_strided(t.shape, strides)
        return type(out)(parts) if many else parts[0]

    return rule


def _replace(op: Any, make: Callable[[Callable[..., Any]], Callable[..., Any]],
             decomposed: bool = False) -> None:
    """Swap ``op``'s Python Meta kernel for ``make(torch's kernel)``; with ``decomposed``
    also its entry in torch's decomposition table, which fake tensors run instead of any
    Meta kernel for an op outside ``torch._decomp.meta_table``. Nothing where torch has
    neither (another torch).

    A replacement must carry its original's ``__name__`` and ``__module__``
    (``functools.wraps``): fake tensors run a table entry only when those name one of
    ``torch._decomp.decompositions`` (``torch_decomp_decompositions``, cached per op for the
    process), and otherwise take another route, which for ``_native_batch_norm_legit_
    no_training`` records batch statistics eager's kernel never returns."""
    from torch._decomp import decomposition_table

    places: list[tuple[dict[Any, Any], Any]] = [(op.py_kernels, DispatchKey.Meta)]
    if decomposed:
        places.append((decomposition_table, op))
    for table, key in places:
        original = table.get(key)
        if original is None:
            continue
        _REPLACED.append((op, table, original))
        table[key] = make(original)
    op._dispatch_cache.clear()


def _forget_cached() -> None:
    """Drop the fake-tensor dispatch cache's entries for the ops ``patch`` replaces: the
    cache (``FakeTensorMode.cache``, shared by every mode) keys on the op and its inputs'
    metadata, not on the kernel that answered, so an output sized by the other rule would
    be served again."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = {op for op, _, _ in _REPLACED}
    for key in [k for k in FakeTensorMode.cache if k.key and k.key[0] in ops]:
        FakeTensorMode.cache.pop(key, None)


def patch() -> None:
    """Install the rules of the module doc (the caller holds ``traced_as_eager``'s lock)."""
    _replace(torch.ops.aten._grouped_mm.default, _grouped_mm_rule)
    for name, positions in LAYOUT_FROM.items():
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        _replace(op, functools.partial(_laid_out_as_eager, index=0,
                                       strides_of=_iterator_strides(positions)),
                 decomposed=True)
    for name, (index, real_of) in KNOWN_RULES.items():
        _replace(getattr(torch.ops.aten, name).default,
                 functools.partial(_laid_out_as_eager, index=index,
                                   strides_of=_real_kernel_strides(real_of)),
                 decomposed=True)
    _forget_cached()
    from torch._subclasses import fake_impls

    fake_impls.op_implementations_checks.insert(0, (_is_ctc_loss, _ctc_loss_rule))


def restore() -> None:
    """Put back the kernels ``patch`` replaced (and forget what they sized)."""
    from torch._subclasses import fake_impls

    checks = fake_impls.op_implementations_checks
    while (_is_ctc_loss, _ctc_loss_rule) in checks:
        checks.remove((_is_ctc_loss, _ctc_loss_rule))
    _forget_cached()
    for op, table, original in reversed(_REPLACED):
        table[DispatchKey.Meta if table is op.py_kernels else op] = original
        op._dispatch_cache.clear()
    _REPLACED.clear()
