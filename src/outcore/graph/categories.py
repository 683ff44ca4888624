"""Map an ATen op name (e.g. "aten.convolution.default") to an OpCategory (plain Python)."""

from __future__ import annotations

from outcore.graph.ir import OpCategory

_RULES: list[tuple[OpCategory, tuple[str, ...]]] = [
    (OpCategory.CONV, ("convolution", "conv2d", "conv1d", "conv3d")),
    (OpCategory.ATTENTION, ("scaled_dot_product", "flash_attention", "efficient_attention")),
    (OpCategory.MATMUL, ("addmm", "mm", "bmm", "baddbmm", "matmul", "linear")),
    (OpCategory.NORM, ("batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm")),
    (OpCategory.POOL, ("pool", "adaptive_avg", "adaptive_max")),
    (OpCategory.DROPOUT, ("dropout", "bernoulli")),
    (OpCategory.LOSS, ("nll_loss", "cross_entropy", "mse_loss", "log_softmax", "softmax",
                       "binary_cross_entropy", "smooth_l1", "l1_loss")),
    (OpCategory.CONCAT, ("cat", "stack")),
    (OpCategory.VIEW, ("view", "reshape", "_unsafe_view", "expand", "permute", "transpose",
                       "squeeze", "unsqueeze", "slice", "select", "detach", "alias", ".t.",
                       "as_strided", "split", "chunk", "unbind", "narrow", "flatten")),
    (OpCategory.REDUCTION, ("sum", "mean", "amax", "amin", "max", "min", "var", "std",
                            "norm", "prod", "argmax", "argmin")),
    (OpCategory.ELEMENTWISE, ("add", "sub", "mul", "div", "relu", "threshold", "gelu", "tanh",
                              "sigmoid", "silu", "exp", "log", "sqrt", "rsqrt", "pow", "neg",
                              "where", "clamp", "hardtanh", "leaky", "abs", "fill", "zeros",
                              "ones", "full", "copy", "clone", "to_copy", "empty", "scalar",
                              "embedding", "gather", "scatter", "index", "masked", "erf",
                              "eq", "ne", "lt", "gt", "le", "ge", "logical", "arange", "tril",
                              "triu", "constant_pad", "cumsum", "sign", "reciprocal", "lerp")),
]


def categorize(target: str) -> OpCategory:
    """Coarse category of an ATen op; OTHER when no rule matches.

    Rules are tried in order, so "addmm" is MATMUL before "add" would make it ELEMENTWISE,
    and "_log_softmax_backward_data" is LOSS-like (softmax family).
    """
    name = target.lower()
    base = name.split(".")[1] if name.startswith("aten.") and name.count(".") >= 1 else name
    for category, keys in _RULES:
        for key in keys:
            if key == ".t.":
                if name in ("aten.t.default", "aten.numpy_t.default"):
                    return category
                continue
            if base == key or base.startswith((key + "_", "_" + key)) or key in base:
                return category
    return OpCategory.OTHER
