"""Planning data and passes: Plan, Schedule, lowering, verification, the memory rule.

The function ``outcore.plan(graph, budget, ...)`` is ``outcore.planned.plan``; this package
is reached by its modules (``from outcore.plan.lower import lower``).
"""
