"""Policies: each turns a Graph, a budget and a cost model into a Plan and a Schedule.

One subpackage per paper (``vdnn``, ``superneurons``, ``modnn``, ``pooch``, ``dymem``), the
baselines (``baseline``), outcore's own (``auto``) and what they share (``common``). The
function ``outcore.policies()`` lists the registered names (``names`` here).
"""

from outcore.policies.registry import PolicyContext, PolicyInfo, PolicyOutput, get, names, register

__all__ = ["PolicyContext", "PolicyInfo", "PolicyOutput", "get", "names", "register"]
