"""The Schedule: one instruction list that both the simulator and the executor run.

Instructions (all plain, frozen data):

* ``Compute(op, recompute)``: run op ``op``; its outputs become resident on the device.
  A recompute is a Compute placed in backward for an op that already ran in forward.
* ``Free(tensor)``: drop the device reference to ``tensor``. Its storage's memory is released
  when no tensor of that storage is resident any more.
* ``Offload(tensor)``: start copying ``tensor``'s storage device -> host on the D2H engine.
* ``Prefetch(tensor)``: allocate device memory for ``tensor``'s storage and start copying it
  host -> device on the H2D engine.
* ``Wait(tensor, direction)``: block the compute stream until the copy of ``tensor`` in
  ``direction`` ("d2h" or "h2d") has finished.

Only base tensors (storage owners) are offloaded or prefetched; views of them are re-made
by a recompute of the (free) view op after the base is back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from outcore.errors import ScheduleError

Direction = Literal["d2h", "h2d"]


@dataclass(frozen=True)
class Compute:
    op: int
    recompute: bool = False


@dataclass(frozen=True)
class Free:
    tensor: int


@dataclass(frozen=True)
class Offload:
    tensor: int


@dataclass(frozen=True)
class Prefetch:
    tensor: int


@dataclass(frozen=True)
class Wait:
    tensor: int
    direction: Direction


Instruction = Compute | Free | Offload | Prefetch | Wait
_KINDS: dict[str, type] = {c.__name__: c for c in (Compute, Free, Offload, Prefetch, Wait)}


@dataclass
class Schedule:
    """An instruction list for one graph, plus what the planner predicted for it.

    ``keep_at_end`` lists tensors that must be resident when the step ends (loss, gradients,
    buffer updates). ``variants`` maps op id -> operator algorithm (see outcore.variants);
    ops absent from it use the framework's kernel. ``sub_batches`` > 1 means the graph was
    captured for one sub-batch and the executor accumulates gradients over that many.
    ``host_static`` lists static tensors (parameters) held in host memory at the step's
    start, brought to the device by ``Prefetch`` only; ``host_outputs`` lists tensors of
    ``keep_at_end`` (gradients) that end the step in host memory (their storage offloaded
    and waited for) instead of on the device (``outcore.plan.weights``).
    """

    instructions: list[Instruction]
    keep_at_end: list[int] = field(default_factory=list)
    variants: dict[int, str] = field(default_factory=dict)
    sub_batches: int = 1
    policy: str = ""
    host_static: list[int] = field(default_factory=list)
    host_outputs: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def count(self, kind: type) -> int:
        """How many instructions of ``kind`` (e.g. Offload) the schedule holds."""
        return sum(1 for ins in self.instructions if isinstance(ins, kind))

    def recomputed_ops(self) -> list[int]:
        """Op ids that run a second time, in schedule order (with repeats)."""
        return [i.op for i in self.instructions if isinstance(i, Compute) and i.recompute]

    def to_json(self) -> str:
        """Serialise; ``from_json`` reads it back."""
        return json.dumps({
            "policy": self.policy,
            "sub_batches": self.sub_batches,
            "keep_at_end": self.keep_at_end,
            "host_static": self.host_static,
            "host_outputs": self.host_outputs,
            "variants": {str(k): v for k, v in self.variants.items()},
            "instructions": [[type(i).__name__, asdict(i)] for i in self.instructions],
        })

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            doc = json.loads(text)
            instructions = [_KINDS[kind](**fields) for kind, fields in doc["instructions"]]
            return cls(instructions=instructions, keep_at_end=list(doc["keep_at_end"]),
                       variants={int(k): v for k, v in doc.get("variants", {}).items()},
                       sub_batches=int(doc.get("sub_batches", 1)), policy=doc.get("policy", ""),
                       host_static=list(doc.get("host_static", [])),
                       host_outputs=list(doc.get("host_outputs", [])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"not a valid schedule document: {exc}") from exc
