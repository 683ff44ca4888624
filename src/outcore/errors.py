"""Errors raised by outcore. Each message says what went wrong and what to change."""

from __future__ import annotations


class OutcoreError(Exception):
    """Base class of every error outcore raises on purpose."""


class CaptureError(OutcoreError):
    """The training step could not be captured as a dataflow graph."""


class GraphError(OutcoreError):
    """A Graph is malformed (dangling ids, cycles, bad JSON)."""


class InfeasibleBudgetError(OutcoreError):
    """A budget is below what a policy (or any policy) needs.

    Attributes:
        policy: the policy name that refused.
        budget: the budget asked for, in bytes.
        required: the least memory, in bytes, that would have worked.
    """

    def __init__(self, policy: str, budget: int, required: int, hint: str = "") -> None:
        from outcore.units import format_bytes

        self.policy = policy
        self.budget = budget
        self.required = required
        self.hint = hint
        msg = (
            f"policy {policy!r} cannot fit a budget of {format_bytes(budget)}: "
            f"it needs at least {format_bytes(required)} ({required} bytes)."
        )
        msg += " " + (hint or "Raise the budget, reduce the batch, or choose another policy.")
        super().__init__(msg)


class ScheduleError(OutcoreError):
    """A Schedule breaks an invariant (use before produce, free during copy, ...).

    Attributes:
        index: the position of the offending instruction, or -1 for the whole schedule.
    """

    def __init__(self, message: str, index: int = -1) -> None:
        self.index = index
        super().__init__(message if index < 0 else f"instruction {index}: {message}")


class DeviceOutOfMemory(OutcoreError):
    """An allocation on a (real or emulated) device went past its capacity.

    Attributes:
        tensor: the name of the tensor being allocated.
        wanted: bytes asked for.
        free: bytes free on the device at that moment.
    """

    def __init__(self, tensor: str, wanted: int, free: int, capacity: int) -> None:
        from outcore.units import format_bytes

        self.tensor = tensor
        self.wanted = wanted
        self.free = free
        self.capacity = capacity
        super().__init__(
            f"device out of memory allocating {tensor!r}: wanted {format_bytes(wanted)} "
            f"({wanted} B) but only {format_bytes(free)} ({free} B) of "
            f"{format_bytes(capacity)} is free. Plan with a smaller budget or a larger device."
        )


class ProfileError(OutcoreError):
    """A hardware or measured profile is missing fields or holds impossible values."""
