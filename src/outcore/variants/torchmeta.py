"""Turn real or fake tensor arguments into the plain ``arg_meta`` the registry reads.

A tensor becomes ``(shape, dtype_str, stride)``; an FX node becomes the same from its
``meta['val']``; lists and tuples are converted element-wise; anything else is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def value_meta(value: Any) -> Any:
    """Plain description of one argument (tensor, fx Node, list, or scalar)."""
    if isinstance(value, torch.fx.Node):
        return value_meta(value.meta.get("val"))
    if isinstance(value, torch.Tensor):
        return (tuple(int(s) for s in value.shape), str(value.dtype).removeprefix("torch."),
                tuple(int(s) for s in value.stride()))
    if isinstance(value, (list, tuple)):
        return type(value)(value_meta(v) for v in value)
    return value


def arg_meta_of(args: Sequence[Any]) -> tuple[Any, ...]:
    """``arg_meta`` for a call's positional args (tensors or fx Nodes)."""
    return tuple(value_meta(a) for a in args)


def kwarg_meta_of(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kwarg_meta`` for a call's keyword args."""
    return {k: value_meta(v) for k, v in (kwargs or {}).items()}
