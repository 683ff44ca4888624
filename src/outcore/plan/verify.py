"""Verify a Schedule against its Graph before anything runs it (plain Python).

``verify`` drains the one replay of the schedule (``outcore.plan.residency.Replay``, whose
module doc lists the rules) and raises the first rule broken, as a ``ScheduleError`` with
the instruction's index (-1 for a rule of the step's end) and the tensor named; the wording
of every rule is in ``outcore.plan.rules``.
"""

from __future__ import annotations

from collections import deque

from outcore.graph.ir import Graph
from outcore.plan.residency import checked_steps, no_workspace
from outcore.plan.schedule import Schedule


def verify(graph: Graph, schedule: Schedule) -> None:
    """Raise ScheduleError naming the first broken rule; return None when the schedule is sound."""
    deque(checked_steps(graph, schedule, no_workspace), maxlen=0)
