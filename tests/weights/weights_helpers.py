"""A small GPT (outcore.zoo's transformer) and its eager reference, for host-held weights."""

import copy

import torch
import torch.nn.functional as F

from outcore.zoo.transformer import build_transformer


def token_loss(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def make_gpt(seed=0, dropout=0.0, n_layer=2, d_model=32, vocab=64, seq=16, batch=2):
    torch.manual_seed(seed)
    model = build_transformer(vocab=vocab, seq_len=seq, n_layer=n_layer, n_head=2,
                              d_model=d_model, dropout=dropout, tie_weights=False,
                              attention="math")
    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))
    return model, (x, y)


def eager_grads(model, batch, seed=11):
    """A deep copy of ``model`` after one eager backward (dropout drawn from ``seed``)."""
    ref = copy.deepcopy(model)
    torch.manual_seed(seed)
    loss = token_loss(ref(batch[0]), batch[1])
    loss.backward()
    return ref, loss.detach()
