"""Policies: each turns a Graph, a budget and a cost model into a Plan and a Schedule.

One subpackage per paper (``vdnn``, ``superneurons``, ``modnn``, ``pooch``, ``dymem``), the
baselines (``baseline``), outcore's own (``auto``) and what they share (``common``). The
function ``outcore.policies()`` lists the registered names (``names`` here);
``config_for(name, options)`` validates a policy's options (a typed, frozen config per
policy) before anything is captured.
"""

from outcore.policies.config import PolicyConfig
from outcore.policies.registry import (
    PolicyContext,
    PolicyInfo,
    PolicyOutput,
    config_for,
    get,
    names,
    register,
)

__all__ = ["PolicyConfig", "PolicyContext", "PolicyInfo", "PolicyOutput", "config_for", "get",
           "names", "register"]
