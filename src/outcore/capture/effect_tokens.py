"""Effect tokens out of a joint graph: an op PyTorch orders as a side effect runs plainly.

aot_autograd threads an *effect token* (an empty tensor: a ``ForwardTokenAOTInput``
placeholder, a ``ForwardTokenAOTOutput`` output) through every op registered as an ordered
side effect, calling it as ``with_effects(token, op, *args)``, which returns the next token
and the op's result. In PyTorch 2.13 those aten ops are ``aten._print`` and
``aten._linalg_check_errors``, the check that makes ``torch.linalg.cholesky``, ``inv``,
``solve`` (the variants without ``_ex``) raise on a matrix they cannot factor. A step
with one failed at its first run in outcore ("an input outcore cannot bind").

``strip_effect_tokens`` rewrites each ``with_effects(token, op, *args, **kwargs)`` into
``op(*args, **kwargs)`` and every use of the token it returns into the token it was given,
so the check runs where the traced step ran it (after the op whose ``info`` it reads: a data
dependence keeps the order) and raises as eager raises. The token placeholders and outputs
stay (the graph's signature is unchanged): capture binds the placeholder to an empty tensor
(a buffer of 0 bytes, never read) and ignores the output. Invariant: the rewritten graph
runs the same ops on the same values in the same order, less the token plumbing.
"""

from __future__ import annotations

import operator

from torch import fx

#: the descriptor classes of a token placeholder / graph output (matched by name: private)
TOKEN_INPUTS = frozenset({"ForwardTokenAOTInput", "BackwardTokenAOTInput"})
TOKEN_OUTPUTS = frozenset({"ForwardTokenAOTOutput", "BackwardTokenAOTOutput"})


def _is_with_effects(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "") == "with_effects"


def strip_effect_tokens(gm: fx.GraphModule) -> int:
    """Rewrite ``gm``'s ``with_effects`` calls in place (module docstring); the count."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not _is_with_effects(node):
            continue
        token, op, *args = node.args
        with gm.graph.inserting_before(node):
            plain = gm.graph.call_function(op, tuple(args), dict(node.kwargs))
        plain.meta = {k: v for k, v in node.meta.items() if k != "val"}
        values = node.meta.get("val")
        results = list(values[1:]) if isinstance(values, (tuple, list)) else []
        several = len(results) > 1
        if results and results != [None]:
            plain.meta["val"] = tuple(results) if several else results[0]
        for user in list(node.users):
            if user.op != "call_function" or user.target is not operator.getitem:
                raise ValueError(f"{node.name} is read by {user.name} other than by index")
            index = user.args[1]
            if index == 0:  # the next token: the one it was given
                user.replace_all_uses_with(token)  # type: ignore[arg-type]
            elif several:
                with gm.graph.inserting_before(user):
                    part = gm.graph.call_function(operator.getitem, (plain, index - 1))
                part.meta = dict(user.meta)
                user.replace_all_uses_with(part)
            else:
                user.replace_all_uses_with(plain)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
