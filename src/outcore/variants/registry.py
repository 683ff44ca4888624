"""The variant catalogue: names, implementations, workspace and support per ATen op.

This is the module the planner and the executor use. Everything except ``implementation``
is plain Python (torch is imported only when an implementation is asked for), so planners
can enumerate candidates and their workspace without torch.

* ``variants_for(target)``: the variant names, "framework" first (the framework's kernel,
  accounted as zero workspace; for convolutions it plays the memory-optimal role that
  implicit GEMM plays in vDNN / moDNN).
* ``implementation(target, variant)``: a callable with exactly the ATen op's signature and
  return structure, to substitute for ``node.target``. Run it under ``torch.no_grad()``.
* ``workspace_bytes(target, variant, arg_meta, kwarg_meta=None)``: transient bytes beyond the
  outputs, exact for the tracker (see ``workspace``). ``arg_meta`` is the node's args with
  tensors replaced by ``(shape, dtype_str)`` tuples; ``kwarg_meta`` the same for kwargs
  (attention's ``attn_mask`` and ``scale`` are keyword-only).
* ``check_supported(...)``: raises ``VariantUnsupported`` with the reason.
* ``supported_variants(...)``: ``{variant: workspace_bytes}`` for the variants that can run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outcore.variants import support, workspace
from outcore.variants.errors import VariantUnsupported
from outcore.variants.meta import (
    CONV,
    CONV_BACKWARD,
    SDPA,
    SDPA_BACKWARD,
    attention_meta,
    conv_meta,
)
from outcore.variants.names import Variant, is_framework

#: The framework's kernel (the one spelling; ``names.Variant.FRAMEWORK``).
FRAMEWORK = Variant.FRAMEWORK
_IM2COL, _FFT, _MAT, _CHUNK = Variant.IM2COL, Variant.FFT, Variant.MATERIALISED, Variant.CHUNKED

_VARIANTS: dict[str, tuple[Variant, ...]] = {
    CONV: (FRAMEWORK, _IM2COL, _FFT),
    CONV_BACKWARD: (FRAMEWORK, _IM2COL, _FFT),
    SDPA: (FRAMEWORK, _MAT, _CHUNK),
    SDPA_BACKWARD: (FRAMEWORK, _MAT, _CHUNK),
}

# (target, variant) -> (module under outcore.variants, function name)
_IMPLEMENTATIONS: dict[tuple[str, Variant], tuple[str, str]] = {
    (CONV, _IM2COL): ("conv_im2col", "conv_forward"),
    (CONV_BACKWARD, _IM2COL): ("conv_im2col", "conv_backward"),
    (CONV, _FFT): ("conv_fft", "conv_forward"),
    (CONV_BACKWARD, _FFT): ("conv_fft", "conv_backward"),
    (SDPA, _MAT): ("attention", "materialised_forward"),
    (SDPA_BACKWARD, _MAT): ("attention", "materialised_backward"),
    (SDPA, _CHUNK): ("attention", "chunked_forward"),
    (SDPA_BACKWARD, _CHUNK): ("attention", "chunked_backward"),
}

_WORKSPACE: dict[tuple[str, Variant], Callable[[Any], int]] = {
    (CONV, _IM2COL): workspace.conv_im2col_forward,
    (CONV_BACKWARD, _IM2COL): workspace.conv_im2col_backward,
    (CONV, _FFT): workspace.conv_fft_forward,
    (CONV_BACKWARD, _FFT): workspace.conv_fft_backward,
    (SDPA, _MAT): workspace.attention_materialised_forward,
    (SDPA_BACKWARD, _MAT): workspace.attention_materialised_backward,
    (SDPA, _CHUNK): workspace.attention_chunked_forward,
    (SDPA_BACKWARD, _CHUNK): workspace.attention_chunked_backward,
}


def variants_for(target: str) -> list[str]:
    """Variant names for an op, "framework" first; ["framework"] for ops without others.

    Plain strings (each a ``Variant``'s value), as plans and ``Op.variant_options`` hold them.
    """
    return [v.value for v in _VARIANTS.get(target, (FRAMEWORK,))]


def _known(target: str, variant: str) -> None:
    if variant not in variants_for(target):
        raise VariantUnsupported(target, variant,
                                 f"unknown variant; known for this op: {variants_for(target)}")


def implementation(target: str, variant: str) -> Callable[..., Any]:
    """The callable that computes ``target`` with ``variant`` (the OpOverload for framework)."""
    _known(target, variant)
    import importlib

    if is_framework(variant):
        import torch

        namespace, name, overload = target.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    module_name, function = _IMPLEMENTATIONS[(target, Variant(variant))]
    module = importlib.import_module(f"outcore.variants.{module_name}")
    return getattr(module, function)


def workspace_bytes(target: str, variant: str, arg_meta: Sequence[Any],
                    kwarg_meta: Mapping[str, Any] | None = None) -> int:
    """Transient bytes of ``variant`` on this op beyond its outputs (0 for framework).

    Does not check support; call ``check_supported`` (or use ``supported_variants``) first.
    """
    _known(target, variant)
    if is_framework(variant):
        return 0
    if target in (CONV, CONV_BACKWARD):
        return _WORKSPACE[(target, Variant(variant))](conv_meta(target, arg_meta))
    return _WORKSPACE[(target, Variant(variant))](attention_meta(target, arg_meta, kwarg_meta))


def check_supported(target: str, variant: str, arg_meta: Sequence[Any],
                    kwarg_meta: Mapping[str, Any] | None = None) -> None:
    """Raise ``VariantUnsupported`` (with the reason) if ``variant`` cannot run this op."""
    _known(target, variant)
    support.check(target, variant, arg_meta, kwarg_meta)


def supported_variants(target: str, arg_meta: Sequence[Any],
                       kwarg_meta: Mapping[str, Any] | None = None) -> dict[str, int]:
    """``{variant: workspace_bytes}`` for every variant that can run this op, framework first."""
    result: dict[str, int] = {}
    for variant in variants_for(target):
        if support.refusal(target, variant, arg_meta, kwarg_meta) is None:
            result[variant] = workspace_bytes(target, variant, arg_meta, kwarg_meta)
    return result
