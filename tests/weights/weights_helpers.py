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


def mlp_case(batch: int = 32):
    """A three-layer MLP captured at ``batch`` rows, its a100-40gb cost model and its AdamW
    state bytes: (graph, cost, state), the joint planner's small test case."""
    import outcore
    from outcore.api import cost_model_for
    from outcore.weights.spec import graph_state_bytes

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 8))
    data = (torch.randn(batch, 64), torch.randint(0, 8, (batch,)))
    graph = outcore.capture(net, F.cross_entropy, data)
    return graph, cost_model_for("a100-40gb", graph), graph_state_bytes(graph, "adamw")


def every_placement(facts, choose):
    """(held names, ``choose(held)``) for every subset of ``facts``' parameters whose
    placement fits (``choose`` raising InfeasibleBudgetError skips it): the brute force the
    chooser and its bound are checked against."""
    import itertools

    from outcore.errors import InfeasibleBudgetError

    names = [f.name for f in facts]
    for k in range(len(names) + 1):
        for held in itertools.combinations(names, k):
            try:
                yield held, choose(held)
            except InfeasibleBudgetError:
                continue
