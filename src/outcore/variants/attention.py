"""Attention variants for ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward.

PyTorch 2.13 on CPU captures ``F.scaled_dot_product_attention`` in the joint graph as

* ``_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p=0., is_causal=False, *,
  attn_mask=None, scale=None) -> (out, logsumexp)`` and
* ``_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, logsumexp,
  dropout_p, is_causal, *, attn_mask=None, scale=None) -> (grad_q, grad_k, grad_v)``,

with q, k, v of shape (B, H, L, D), ``logsumexp`` (B, H, Lq) the natural-log row sums of
``exp(scale * q k^T + mask)``, a float ``attn_mask`` (SDPA turns a bool mask into an additive
one before this op) and causal masking aligned top-left (key j visible to query i iff j <= i).
These functions are drop-in for those ops: same arguments, same outputs, same strides
(``out`` like ``empty_like(q)``, ``logsumexp`` and the gradients laid out (B, L, H, ...) and
transposed), and the same ``logsumexp`` meaning, so a forward of one variant can be paired
with a backward of any other.

Two variants:

* materialised: the full score matrix S (B, H, Lq, Lk) is built, softmax is taken in place,
  and the backward rebuilds P from S and ``logsumexp`` and holds P and dP at once.
* chunked: online softmax over blocks of ``KEY_BLOCK`` keys (flash-attention style): the
  forward keeps a running max and sum per query row and rescales the output; the backward
  recomputes each block's P from ``logsumexp``. Workspace is one or two (B, H, Lq, block)
  buffers instead of (B, H, Lq, Lk).

Rows whose every key is masked give zero output and zero gradients, as the framework does;
their ``logsumexp`` is a huge negative number instead of the framework's 0 (both give P = 0).
Preconditions: ``check_supported`` passed (dropout 0, same head count, float32/float64,
float mask of the query's dtype). Scores go through per-batch ``bmm`` into preallocated
buffers, so no hidden reshape copy depends on the input strides.
"""

from __future__ import annotations

import math

import torch

from outcore.variants.workspace import KEY_BLOCK


def _softmax_scale(query: torch.Tensor, scale: float | None) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(query.shape[-1])


def _bl_layout(like: torch.Tensor, rows: int, cols: int | None = None) -> torch.Tensor:
    """An empty (B, H, rows[, cols]) tensor stored as (B, rows, H[, cols]) and transposed."""
    b, h = like.shape[0], like.shape[1]
    shape = (b, rows, h) if cols is None else (b, rows, h, cols)
    return torch.empty(shape, dtype=like.dtype, device=like.device).transpose(1, 2)


def _block(flat: torch.Tensor, b: int, h: int, rows: int, width: int) -> torch.Tensor:
    """A contiguous (b, h, rows, width) view on the front of a flat buffer."""
    return flat[: b * h * rows * width].view(b, h, rows, width)


def _scores_into(s: torch.Tensor, query: torch.Tensor, key: torch.Tensor, j0: int,
                 scale: float, attn_mask: torch.Tensor | None, is_causal: bool) -> None:
    """Fill ``s`` (B, H, Lq, w) with scale * q k[j0:j0+w]^T + mask, causal entries -inf."""
    width = s.shape[-1]
    for b in range(s.shape[0]):
        torch.bmm(query[b], key[b, :, j0 : j0 + width].transpose(1, 2), out=s[b])
    s.mul_(scale)
    if attn_mask is not None:
        s.add_(attn_mask[..., j0 : j0 + width])
    if is_causal:
        hidden = torch.ones((s.shape[2], width), dtype=torch.bool, device=s.device)
        hidden.triu_(1 - j0)  # key j0+jj is hidden from query i iff j0+jj > i
        s.masked_fill_(hidden, float("-inf"))


def _lse_output(query: torch.Tensor, row_max: torch.Tensor, row_sum: torch.Tensor) -> torch.Tensor:
    """logsumexp = row_max + log(row_sum), laid out (B, Lq, H) and transposed."""
    lse = _bl_layout(query, query.shape[2])
    torch.log(row_sum.squeeze(-1), out=lse)
    lse.add_(row_max.squeeze(-1))
    return lse


def materialised_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         dropout_p: float = 0.0, is_causal: bool = False, *,
                         attn_mask: torch.Tensor | None = None, scale: float | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v with the full (B, H, Lq, Lk) matrix; returns (out, lse)."""
    b, h, lq = query.shape[0], query.shape[1], query.shape[2]
    lk = key.shape[2]
    alpha = _softmax_scale(query, scale)
    finfo = torch.finfo(query.dtype)
    p = torch.empty((b, h, lq, lk), dtype=query.dtype, device=query.device)
    _scores_into(p, query, key, 0, alpha, attn_mask, is_causal)
    row_max = p.amax(dim=-1, keepdim=True)
    row_max.clamp_(min=finfo.min)  # fully masked rows: keep exp(-inf - max) = 0, not NaN
    p.sub_(row_max).exp_()
    row_sum = p.sum(dim=-1, keepdim=True)
    row_sum.clamp_(min=finfo.tiny)  # >= 1 unless the row is fully masked
    p.div_(row_sum)
    lse = _lse_output(query, row_max, row_sum)
    del row_max, row_sum
    out = torch.empty_like(query)
    for i in range(b):
        torch.bmm(p[i], value[i], out=out[i])
    return out, lse


def _row_dot(grad_out: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """D_i = sum_d dO_id * O_id, shape (B, H, Lq, 1) (the softmax-backward row term)."""
    prod = grad_out * out
    return prod.sum(dim=-1, keepdim=True)


def materialised_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                          dropout_p: float, is_causal: bool, *,
                          attn_mask: torch.Tensor | None = None, scale: float | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients with P and dP materialised: dV = P^T dO, dS = P * (dO V^T - D), dQ, dK."""
    b, h, lq, lk = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    alpha = _softmax_scale(query, scale)
    row_dot = _row_dot(grad_out, out)
    p = torch.empty((b, h, lq, lk), dtype=query.dtype, device=query.device)
    _scores_into(p, query, key, 0, alpha, attn_mask, is_causal)
    p.sub_(logsumexp.unsqueeze(-1)).exp_()
    grad_v = _bl_layout(value, lk, value.shape[3])
    for i in range(b):
        torch.bmm(p[i].transpose(1, 2), grad_out[i], out=grad_v[i])
    ds = torch.empty((b, h, lq, lk), dtype=query.dtype, device=query.device)
    for i in range(b):
        torch.bmm(grad_out[i], value[i].transpose(1, 2), out=ds[i])
    ds.sub_(row_dot).mul_(p)
    del p, row_dot
    grad_q = _bl_layout(query, lq, query.shape[3])
    grad_k = _bl_layout(key, lk, key.shape[3])
    for i in range(b):
        torch.bmm(ds[i], key[i], out=grad_q[i])
        torch.bmm(ds[i].transpose(1, 2), query[i], out=grad_k[i])
    grad_q.mul_(alpha)
    grad_k.mul_(alpha)
    return grad_q, grad_k, grad_v


def chunked_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    dropout_p: float = 0.0, is_causal: bool = False, *,
                    attn_mask: torch.Tensor | None = None, scale: float | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Online softmax over key blocks; returns (out, lse) without a (Lq, Lk) matrix."""
    b, h, lq, lk = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    alpha = _softmax_scale(query, scale)
    finfo = torch.finfo(query.dtype)
    out = torch.zeros_like(query)
    row_max = torch.full((b, h, lq, 1), float("-inf"), dtype=query.dtype, device=query.device)
    row_sum = torch.zeros((b, h, lq, 1), dtype=query.dtype, device=query.device)
    block = torch.empty(b * h * lq * min(KEY_BLOCK, lk), dtype=query.dtype, device=query.device)
    for j0 in range(0, lk, KEY_BLOCK):
        s = _block(block, b, h, lq, min(KEY_BLOCK, lk - j0))
        _scores_into(s, query, key, j0, alpha, attn_mask, is_causal)
        new_max = s.amax(dim=-1, keepdim=True)
        torch.maximum(new_max, row_max, out=new_max)
        new_max.clamp_(min=finfo.min)
        s.sub_(new_max).exp_()
        rescale = row_max.sub_(new_max).exp_()  # exp(old max - new max), in place
        row_sum.mul_(rescale).add_(s.sum(dim=-1, keepdim=True))
        out.mul_(rescale)
        del rescale
        row_max = new_max
        for i in range(b):
            out[i].baddbmm_(s[i], value[i, :, j0 : j0 + s.shape[-1]])
        del s, new_max
    del block
    row_sum.clamp_(min=finfo.tiny)
    out.div_(row_sum)
    lse = _lse_output(query, row_max, row_sum)
    return out, lse


def chunked_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                     dropout_p: float, is_causal: bool, *,
                     attn_mask: torch.Tensor | None = None, scale: float | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients block by block, recomputing each block's P from ``logsumexp``."""
    b, h, lq, lk = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    alpha = _softmax_scale(query, scale)
    row_dot = _row_dot(grad_out, out)
    lse = logsumexp.unsqueeze(-1)
    grad_q = _bl_layout(query, lq, query.shape[3])
    grad_q.zero_()
    grad_k = _bl_layout(key, lk, key.shape[3])
    grad_v = _bl_layout(value, lk, value.shape[3])
    width0 = min(KEY_BLOCK, lk)
    p_block = torch.empty(b * h * lq * width0, dtype=query.dtype, device=query.device)
    ds_block = torch.empty(b * h * lq * width0, dtype=query.dtype, device=query.device)
    for j0 in range(0, lk, KEY_BLOCK):
        width = min(KEY_BLOCK, lk - j0)
        p, ds = _block(p_block, b, h, lq, width), _block(ds_block, b, h, lq, width)
        _scores_into(p, query, key, j0, alpha, attn_mask, is_causal)
        p.sub_(lse).exp_()
        for i in range(b):
            keys = slice(j0, j0 + width)
            torch.bmm(p[i].transpose(1, 2), grad_out[i], out=grad_v[i, :, keys])
            torch.bmm(grad_out[i], value[i, :, keys].transpose(1, 2), out=ds[i])
        ds.sub_(row_dot).mul_(p)
        for i in range(b):
            keys = slice(j0, j0 + width)
            grad_q[i].baddbmm_(ds[i], key[i, :, keys], alpha=alpha)
            torch.bmm(ds[i].transpose(1, 2), query[i], out=grad_k[i, :, keys])
        del p, ds
    grad_k.mul_(alpha)
    return grad_q, grad_k, grad_v
