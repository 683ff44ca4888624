"""Planning data and passes: Plan, Schedule, lowering, verification, the memory rule.

Calling the package, ``outcore.plan(graph, budget, policy=..., gpu=...)``, is
``outcore.api.plan`` (see ``outcore._callable_module``).
"""

from outcore._callable_module import make_callable


def _api_plan():
    from outcore.api import plan

    return plan


make_callable(__name__, _api_plan)
