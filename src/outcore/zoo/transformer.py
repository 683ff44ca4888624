"""A GPT-style decoder-only transformer (the layout of GPT-2, Radford et al. 2019).

Token embedding + learned position embedding → dropout → ``n_layer`` pre-LayerNorm blocks
(x + Dropout(Proj(CausalSelfAttention(LN(x)))), then x + Dropout(MLP(LN(x))) with a 4x GELU
MLP) → final LayerNorm → LM head (no bias; tied to the token embedding when ``tie_weights``).
Attention drops out attention probabilities too. The model maps token ids (batch, seq) to
logits (batch, seq, vocab); the loss is token-level cross-entropy (``lm_loss``).

``attention="math"`` (the default) writes attention as matmul → scale → causal mask → softmax →
dropout → matmul, so the captured graph holds the (batch, heads, seq, seq) score and
probability tensors, the activations that dominate memory at long sequences.
``attention="sdpa"`` calls ``F.scaled_dot_product_attention`` instead (one fused op).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from outcore.zoo.layers import check_positive


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    mask: torch.Tensor  # registered buffer (seq_len x seq_len, lower-triangular, bool)

    def __init__(
        self, d_model: int, n_head: int, seq_len: int, dropout: float, attention: str
    ) -> None:
        super().__init__()
        self.n_head = n_head
        self.attention = attention
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = self.attn_drop(scores.softmax(dim=-1)) @ v
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-LN transformer block: attention then MLP, each added to the residual stream."""

    def __init__(
        self, d_model: int, n_head: int, seq_len: int, dropout: float, attention: str
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, seq_len, dropout, attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx)`` returns logits (batch, seq, vocab)."""

    def __init__(
        self,
        *,
        vocab: int,
        seq_len: int,
        n_layer: int,
        n_head: int,
        d_model: int,
        dropout: float,
        tie_weights: bool,
        attention: str,
    ) -> None:
        super().__init__()
        check_positive(vocab=vocab, seq_len=seq_len, n_head=n_head, d_model=d_model)
        if n_layer < 0:
            raise ValueError(f"transformer: n_layer must be >= 0, got {n_layer}")
        if d_model % n_head:
            raise ValueError(f"transformer: d_model={d_model} must be divisible by n_head={n_head}")
        if attention not in ("math", "sdpa"):
            raise ValueError(f"transformer: attention must be 'math' or 'sdpa', got {attention!r}")
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, n_head, seq_len, dropout, attention) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self._init_weights(n_layer)
        if tie_weights:
            self.head.weight = self.tok.weight

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer)."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # biases stay 0, LayerNorm weights stay 1
            residual = name.endswith(("proj.weight", "mlp.2.weight"))
            std = 0.02 / math.sqrt(2 * max(n_layer, 1)) if residual else 0.02
            nn.init.normal_(p, 0.0, std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"transformer: sequence of {t} tokens exceeds seq_len={self.seq_len}")
        positions = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_transformer(
    *,
    vocab: int,
    seq_len: int,
    n_layer: int,
    n_head: int,
    d_model: int,
    dropout: float,
    tie_weights: bool,
    attention: str,
) -> GPT:
    """A GPT; with the defaults of the zoo's "transformer" entry it is GPT-2 small (124M)."""
    return GPT(
        vocab=vocab, seq_len=seq_len, n_layer=n_layer, n_head=n_head, d_model=d_model,
        dropout=dropout, tie_weights=tie_weights, attention=attention,
    )  # fmt: skip
