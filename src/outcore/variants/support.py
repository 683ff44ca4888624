"""Which variant can run which op: refusals with reasons, at planning time (no torch import).

``check(target, variant, arg_meta, kwarg_meta)`` raises ``VariantUnsupported`` naming the
first reason the variant cannot run the op; the framework variant runs everything. A
convolution variant's refusals come from its declaration (``capability``: dimensionality,
groups, dilation, stride, padding, dtype, memory format). Strides, when the planner passes
them as a third element of a tensor's meta, are checked too: the variants assume dense
row-major tensors (that is what makes their workspace formulas exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outcore.variants.capability import CONV_CAPABILITIES
from outcore.variants.errors import VariantUnsupported
from outcore.variants.meta import (
    CONV,
    CONV_BACKWARD,
    SDPA,
    SDPA_BACKWARD,
    AttentionMeta,
    ConvMeta,
    TensorMeta,
    attention_meta,
    conv_meta,
    tensor_meta,
)
from outcore.variants.names import is_framework

FLOAT_DTYPES = ("float32", "float64")


def conv_refusal(target: str, variant: str, m: ConvMeta,
                 grad_output: TensorMeta | None) -> str | None:
    """The reason ``variant`` cannot run this convolution, or None: what its declaration in
    ``capability.CONV_CAPABILITIES`` does not cover."""
    declared = CONV_CAPABILITIES.get(variant)
    if declared is None:
        return f"no convolution variant named {variant!r} (known: {sorted(CONV_CAPABILITIES)})"
    return declared.refusal(m, grad_output)


def attention_refusal(m: AttentionMeta, extra: Sequence[tuple[str, TensorMeta]]) -> str | None:
    """The reason a non-framework variant cannot run this attention op, or None."""
    if m.dropout_p != 0.0:
        return f"dropout_p={m.dropout_p}: dropout needs the framework kernel's RNG stream"
    tensors = [("query", m.query), ("key", m.key), ("value", m.value), *extra]
    for name, t in tensors[:3]:
        if len(t.shape) != 4:
            return f"{name} must be 4-d (B, H, L, D), got shape {t.shape}"
    if not (m.query.shape[:2] == m.key.shape[:2] == m.value.shape[:2]):
        return (f"batch and head counts differ (query {m.query.shape[:2]}, key "
                f"{m.key.shape[:2]}, value {m.value.shape[:2]}); grouped-query attention "
                "is not implemented")
    if m.key.shape[2] != m.value.shape[2]:
        return f"key length {m.key.shape[2]} differs from value length {m.value.shape[2]}"
    if not (m.query.shape[3] == m.key.shape[3] == m.value.shape[3]):
        return "query, key and value must have the same head size (as the framework kernel)"
    if m.attn_mask is not None:
        tensors.append(("attn_mask", m.attn_mask))
        if len(m.attn_mask.shape) > 4:
            return f"attn_mask has {len(m.attn_mask.shape)} dims, at most 4 are allowed"
    for name, t in tensors:
        if t.dtype not in FLOAT_DTYPES:
            return f"{name} dtype {t.dtype} is not one of {FLOAT_DTYPES}"
        if t.dtype != m.query.dtype:
            return f"{name} dtype {t.dtype} differs from the query's {m.query.dtype}"
    return None


def refusal(target: str, variant: str, arg_meta: Sequence[Any],
            kwarg_meta: Mapping[str, Any] | None = None) -> str | None:
    """Why ``variant`` cannot run ``target`` with these args, or None when it can."""
    if is_framework(variant):
        return None
    if target in (CONV, CONV_BACKWARD):
        grad = tensor_meta(arg_meta[0]) if target == CONV_BACKWARD else None
        return conv_refusal(target, variant, conv_meta(target, arg_meta), grad)
    if target in (SDPA, SDPA_BACKWARD):
        m = attention_meta(target, arg_meta, kwarg_meta)
        extra: list[tuple[str, TensorMeta]] = []
        if target == SDPA_BACKWARD:
            for i, name in ((0, "grad_out"), (4, "out")):
                t = tensor_meta(arg_meta[i])
                if t is not None:
                    extra.append((name, t))
        return attention_refusal(m, extra)
    return f"no variants other than 'framework' exist for {target}"


def check(target: str, variant: str, arg_meta: Sequence[Any],
          kwarg_meta: Mapping[str, Any] | None = None) -> None:
    """Raise ``VariantUnsupported`` if ``variant`` cannot run ``target`` with these args."""
    reason = refusal(target, variant, arg_meta, kwarg_meta)
    if reason is not None:
        raise VariantUnsupported(target, variant, reason)
