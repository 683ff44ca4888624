"""Policies: each turns a Graph, a budget and a cost model into a Plan and a Schedule."""

from outcore.policies.registry import PolicyContext, PolicyInfo, PolicyOutput, get, names, register

__all__ = ["PolicyContext", "PolicyInfo", "PolicyOutput", "get", "names", "register"]

from outcore._callable_module import make_callable

# ``outcore.policies()`` lists the policy names (see outcore._callable_module).
make_callable(__name__, lambda: names)
