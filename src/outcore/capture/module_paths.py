"""Which of the user's modules each captured op comes from (``layer3.1.conv2``).

While the step is exported, a forward pre-hook on every submodule opens a
``torch.fx.traceback.annotate({"module": path})`` region and a forward hook closes it; with
``preserve_node_meta`` the joint graph's nodes carry the innermost path in
``node.meta["custom"]``, and autograd copies it onto the backward nodes of the same op.
Ops outside every submodule (the loss, the model's own forward body) get "".

The result is stored as ``graph.meta["module_paths"]``: one string per op, by op id (plain
JSON, so it survives ``Graph.to_json``). The hooks are removed when the export ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.fx.traceback as fx_traceback
from torch import fx, nn


@contextlib.contextmanager
def recording(model: nn.Module) -> Iterator[None]:
    """Annotate every node traced inside a submodule of ``model`` with its path."""
    opened: list[Any] = []
    handles = []

    def enter(name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            region = fx_traceback.annotate({"module": name})
            region.__enter__()
            opened.append(region)
        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if opened:
            opened.pop().__exit__(None, None, None)

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave))
    try:
        with fx_traceback.preserve_node_meta():
            try:
                yield
            finally:  # regions a failed forward left open close inside the preserved meta
                while opened:
                    opened.pop().__exit__(None, None, None)
    finally:
        for handle in handles:
            handle.remove()


def op_module_paths(gm: fx.GraphModule, op_names: list[str]) -> list[str]:
    """The module path of each op, in the order of ``op_names`` (the IR's op names, which
    are the FX node names)."""
    by_node = {}
    for node in gm.graph.nodes:
        custom = node.meta.get("custom") or {}
        by_node[node.name] = str(custom.get("module", ""))
    return [by_node.get(name, "") for name in op_names]
