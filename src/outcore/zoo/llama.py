"""A Llama-style decoder (the layout of Llama 2/3, Touvron et al. 2023), for fine-tuning plans.

Token embedding → ``n_layer`` pre-RMSNorm blocks (x + Wo(Attention(RMSNorm(x))) with rotary
position embeddings and grouped-query attention (``n_kv_head`` key/value heads shared by
``n_head`` query heads), then x + W2(SiLU(W1 x) * W3 x), the SwiGLU MLP) → final RMSNorm →
LM head (no bias; tied to the embedding when ``tie_weights``). No dropout. Attention is
``F.scaled_dot_product_attention`` (one fused op, as fine-tuning runs it).

``dtype`` ("bfloat16" by default, or "float16"/"float32") is the parameters' dtype, as a
mixed-precision fine-tune holds them on the device; the fp32 master weights and moments
are the optimizer's state (``outcore.weights.spec``). The zoo's ``llama-1b`` is Llama 3.2
1B's shape and ``llama-7b`` Llama 2 7B's; build them with ``fake=True`` (nothing is
allocated) to plan a fine-tune on a GPU profile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from outcore.zoo.layers import check_positive

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""

    def __init__(self, dim: int, dtype: torch.dtype, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query causal self-attention with rotary position embeddings."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, seq_len: int,
                 rope_base: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = d_model // n_head
        kv = n_kv_head * self.head_dim
        self.wq = nn.Linear(d_model, n_head * self.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(d_model, kv, bias=False, dtype=dtype)
        self.wv = nn.Linear(d_model, kv, bias=False, dtype=dtype)
        self.wo = nn.Linear(n_head * self.head_dim, d_model, bias=False, dtype=dtype)
        inv = 1.0 / rope_base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(seq_len).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class Block(nn.Module):
    """Pre-RMSNorm block: attention then the SwiGLU MLP, each added to the residual."""

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, ffn: int, seq_len: int,
                 rope_base: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d_model, dtype)
        self.attn = Attention(d_model, n_head, n_kv_head, seq_len, rope_base, dtype)
        self.mlp_norm = RMSNorm(d_model, dtype)
        self.w1 = nn.Linear(d_model, ffn, bias=False, dtype=dtype)
        self.w3 = nn.Linear(d_model, ffn, bias=False, dtype=dtype)
        self.w2 = nn.Linear(ffn, d_model, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """Decoder-only Llama; ``forward(idx)`` returns logits (batch, seq, vocab)."""

    def __init__(self, *, vocab: int, seq_len: int, n_layer: int, n_head: int, n_kv_head: int,
                 d_model: int, ffn: int, tie_weights: bool, rope_base: float,
                 dtype: str) -> None:
        super().__init__()
        check_positive(vocab=vocab, seq_len=seq_len, n_head=n_head, n_kv_head=n_kv_head,
                       d_model=d_model, ffn=ffn)
        if d_model % n_head or n_head % n_kv_head:
            raise ValueError(f"llama: d_model={d_model} must be divisible by n_head={n_head}, "
                             f"and n_head by n_kv_head={n_kv_head}")
        if dtype not in DTYPES:
            raise ValueError(f"llama: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        kind = DTYPES[dtype]
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab, d_model, dtype=kind)
        self.blocks = nn.ModuleList(Block(d_model, n_head, n_kv_head, ffn, seq_len, rope_base,
                                          kind) for _ in range(n_layer))
        self.norm = RMSNorm(d_model, kind)
        self.head = nn.Linear(d_model, vocab, bias=False, dtype=kind)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
        if tie_weights:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"llama: sequence of {t} tokens exceeds seq_len={self.seq_len}")
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_llama(*, vocab: int, seq_len: int, n_layer: int, n_head: int, n_kv_head: int,
                d_model: int, ffn: int, tie_weights: bool, rope_base: float,
                dtype: str) -> Llama:
    """A Llama with the given shape (see the module doc)."""
    return Llama(vocab=vocab, seq_len=seq_len, n_layer=n_layer, n_head=n_head,
                 n_kv_head=n_kv_head, d_model=d_model, ffn=ffn, tie_weights=tie_weights,
                 rope_base=rope_base, dtype=dtype)


#: Llama 3.2 1B (16 layers, d 2048, 32 heads / 8 kv heads, SwiGLU 8192, vocab 128256, tied)
LLAMA_1B = {"vocab": 128256, "seq_len": 2048, "n_layer": 16, "n_head": 32, "n_kv_head": 8,
            "d_model": 2048, "ffn": 8192, "tie_weights": True, "rope_base": 500000.0,
            "dtype": "bfloat16"}
#: Llama 2 7B (32 layers, d 4096, 32 heads, SwiGLU 11008, vocab 32000, untied)
LLAMA_7B = {"vocab": 32000, "seq_len": 2048, "n_layer": 32, "n_head": 32, "n_kv_head": 32,
            "d_model": 4096, "ffn": 11008, "tie_weights": False, "rope_base": 10000.0,
            "dtype": "bfloat16"}
#: the small version of both, for CPU tests (same topology)
SMALL = {"vocab": 64, "seq_len": 16, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
         "d_model": 32, "ffn": 64, "dtype": "float32"}
