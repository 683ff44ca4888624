"""Discrete-event simulation of a Schedule: step time, memory, copies (plain Python)."""

from outcore.sim.result import Lifetime, SimResult
from outcore.sim.simulator import Placement, simulate

__all__ = ["Lifetime", "Placement", "SimResult", "simulate"]
