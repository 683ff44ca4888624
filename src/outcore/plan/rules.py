"""The wording of every rule a Schedule can break: one sentence per rule, used by every
consumer of the replay (``outcore.plan.residency``): the verifier, the simulator, the executor.

A ``Violation`` names the instruction index (``at``; None for a rule checked at the end of the step)
and the tensor (or op) involved; ``error()`` turns it into the ``ScheduleError`` raised.
Each message says what to change.
"""

from __future__ import annotations

from typing import NamedTuple

from outcore.errors import ScheduleError


class Violation(NamedTuple):
    """One broken rule: where (``at``, the instruction index; None at the end of the step),
    which tensor (its id, or -1 when the rule is about an op or the instruction itself) and
    the sentence."""

    at: int | None
    tensor: int
    message: str

    def error(self) -> ScheduleError:
        return ScheduleError(self.message, -1 if self.at is None else self.at)


def unknown_op(op: int) -> str:
    return f"Compute names unknown op {op}"


def unknown_tensor(kind: str, tensor: int) -> str:
    return f"{kind} names unknown tensor {tensor}"


def unknown_instruction(ins: object) -> str:
    return f"unknown instruction {ins!r}"


def bad_direction(direction: object) -> str:
    return f"Wait direction must be 'd2h' or 'h2d', got {direction!r}"


def recompute_before_run(op: str) -> str:
    return f"recompute of op {op!r} before it ever ran: compute it once before recomputing it"


def random_out_of_order(op: str, later: str) -> str:
    return (f"random op {op} first runs after random op {later}, which the step traced after "
            "it: each would draw other numbers from the generator than eager's (dropout masks "
            "differ); run random ops in their traced order (outcore.graph.order keeps it)")


def reads_pending_prefetch(op: str, name: str, prefetch_at: int) -> str:
    return (f"Compute of op {op!r} reads {name!r} while its prefetch is in flight (Prefetch "
            f"at instruction {prefetch_at}); add Wait({name!r}, 'h2d') before this Compute")


def reads_absent(op: str, recompute: bool, name: str, why: str) -> str:
    what = "recomputed" if recompute else "run"
    return (f"Compute of op {op!r}: it is {what} but its input {name!r} is not resident (not "
            f"on the device): {why}")


def why_absent(freed_at: int | None, offloaded_base: str | None, produced: bool) -> str:
    """Why a tensor is not on the device, for ``reads_absent`` and ``free_absent``."""
    if freed_at is not None:
        if offloaded_base is not None:
            return (f"it was freed at instruction {freed_at} after its offload; "
                    f"Prefetch({offloaded_base!r}) and Wait({offloaded_base!r}, 'h2d') before "
                    "this")
        return f"it was freed at instruction {freed_at}"
    if produced:
        return "its producer has not run yet (used before produced)"
    return "it was never made resident"


def free_during_offload(name: str, base: str, offload_at: int) -> str:
    return (f"Free of {name!r} while its offload is in flight (Offload at instruction "
            f"{offload_at} may still be reading it); add Wait({base!r}, 'd2h') before the Free")


def free_during_prefetch(name: str, base: str, prefetch_at: int) -> str:
    return (f"Free of {name!r} while its prefetch is in flight (Prefetch at instruction "
            f"{prefetch_at} may still be writing it); add Wait({base!r}, 'h2d') before the Free")


def free_absent(name: str, why: str) -> str:
    return f"Free of {name!r}, which is not resident (not on the device): {why}"


def move_of_view(kind: str, name: str, base: str) -> str:
    return (f"{kind} of view {name!r}: only base tensors move between device and host; "
            f"{kind} its base {base!r} instead")


def offload_absent(name: str, why: str) -> str:
    return f"Offload of {name!r}, which is not resident (not on the device): {why}"


def offload_twice(name: str, offload_at: int) -> str:
    return (f"Offload of {name!r} while its previous offload (instruction {offload_at}) has not "
            f"been waited for; add Wait({name!r}, 'd2h') between the two")


def prefetch_resident(name: str) -> str:
    return (f"Prefetch of {name!r}, which is already on the device; drop the Prefetch or Free "
            "the tensor before it")


def prefetch_under_view(name: str) -> str:
    return (f"Prefetch of {name!r} while a view of it still holds the old copy (two copies "
            "would be on the device): free every view before prefetching")


def prefetch_without_host_copy(name: str) -> str:
    return (f"Prefetch of {name!r}, which has no completed host copy; Offload it and "
            f"Wait({name!r}, 'd2h') for that copy first")


def wait_not_in_flight(direction: str, name: str) -> str:
    verb = "Offload" if direction == "d2h" else "Prefetch"
    return (f"Wait({name!r}, {direction!r}) with no copy in flight: the {direction} copy is "
            f"not in flight (no {verb} of {name!r} since its last Wait)")


def in_flight_at_end(names: list[str]) -> str:
    return (f"copies of {names} are still in flight when the step ends; add their Wait before "
            "the end")


def absent_at_end(name: str) -> str:
    return (f"step output {name!r} is not resident at the end (keep_at_end): do not Free it, "
            "or prefetch it back")


def not_on_host_at_end(name: str) -> str:
    return (f"step output {name!r} is listed in host_outputs but has no completed host copy "
            "at the end: Offload its storage and Wait(d2h) for it before the step ends")


def host_static_not_static(name: str, kind: str) -> str:
    return (f"host_static names {name!r}, a {kind}: only parameters, buffers and inputs "
            "(base tensors) can start the step in host memory")
