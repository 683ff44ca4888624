"""What a Trainer measured and counted (``TrainerStats``), and what it says when its plan
cache meets many shapes (``shapes_note``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from outcore.units import format_bytes


@dataclass
class TrainerStats:
    """What the last ``step`` measured, beside what its plan predicted.

    ``captures``: steps captured and planned (the first and every re-plan); ``replans``: those
    after the first (a new signature or a failed specialisation guard); ``cache_hits``: steps
    that reused a cached plan; ``evictions``: plans dropped from the full cache;
    ``transfers``: re-captures whose plan was carried from another shape's instead of
    searched (``outcore.plan_transfer``); ``promotions``: carried shapes planned for their
    own sizes after ``plan_transfer.PROMOTE_AFTER`` steps;
    ``eval_steps``: eager no-grad steps taken while the model was in eval mode;
    ``signature``: the batch signature of the last training step; ``notes``: what the plan
    changed in what the step computes (sub-batches) and how it was chosen.

    ``measured_peak``: on ``device="cpu"`` (one sub-batch) what the CPU allocator held at
    most during the step (``outcore.runtime.devices.allocator_peak``: kernel temporaries and
    host copies included, which share its RAM) plus the bytes held before it (parameters,
    buffers, batch); on ``device="cuda"`` the same from the caching allocator's
    ``torch.cuda.max_memory_allocated`` over the step (``cuda_allocator_peak``: block sizes,
    so at least 512 B a tensor). Both are measured on the first step of each plan and kept
    for its later steps (a planned step allocates the same every time). On
    ``"cpu-emulated"`` it is ``tensor_peak``: the step's tensors counted at the dispatcher
    (``MemoryTracker``; the emulated device enforces its capacity on that count).
    ``tensor_peak`` on ``"cpu"`` and ``"cuda"``: counted on the first step of each batch
    shape and reported for its later steps, which run without the tracker
    (``Executor.needs_measuring``; ``trainer.executor.measure_every_step = True`` counts
    every step).

    ``link_bandwidth``: on ``"cpu-emulated"`` with a link scaled from a GPU profile, the
    (d2h, h2d) bytes/s it is set to, so copies take the share of this model's compute they
    would take on that GPU (``outcore.runtime.link_calibration``): estimated from this CPU's
    analytic profile when the trainer is made, then from the compute measured in its first
    one-sub-batch steps. None on other devices.
    """

    predicted_peak: int = 0
    measured_peak: int = 0
    tensor_peak: int = 0
    step_seconds: float = 0.0
    steps: int = 0
    sub_batches: int = 1
    history: list[float] = field(default_factory=list)
    captures: int = 0
    replans: int = 0
    transfers: int = 0
    promotions: int = 0
    cache_hits: int = 0
    evictions: int = 0
    eval_steps: int = 0
    signature: str = ""
    link_bandwidth: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = (f"peak {format_bytes(self.measured_peak)} measured vs "
                f"{format_bytes(self.predicted_peak)} predicted; "
                f"step {self.step_seconds * 1e3:.1f} ms; {self.replans} re-plans")
        if self.transfers:
            text += f" ({self.transfers} carried from another shape's plan)"
        if self.sub_batches > 1:
            text += f"; {self.sub_batches} sub-batches (opted in)"
        return text


#: distinct batch signatures after which the Trainer suggests making fewer shapes
MANY_SHAPES = 8


def shapes_note(cache_size: int, seen: int, evicted: bool) -> str:
    """What the Trainer says, once, when the batch shapes it meets cost it captures: a
    signature it evicted from its full cache came back (``evicted``), or it has met
    ``MANY_SHAPES`` signatures."""
    what = (f"a batch signature whose plan the Trainer dropped from its full cache "
            f"(cache_size={cache_size}) came back, so it is captured again" if evicted else
            f"the Trainer has met {seen} batch signatures (sequence lengths?), each captured "
            "on its first step (its plan carried from a near one or searched)")
    return (f"{what}; {seen} signatures seen so far. Each new one costs a capture of the "
            "step (seconds). Make fewer shapes: pad sequences to a multiple of 8 or 64 "
            "(pad_to_multiple_of= in Hugging Face's collators) or bucket them by length, and "
            f"keep compile(..., cache_size=) (now {cache_size}) at least the number of shapes "
            "you train on.")


#: steps captured again after a failed specialisation guard before the Trainer says so
MANY_RESPECIALISATIONS = 3


def respecialised_note(count: int, seconds: float, last: str) -> str:
    """What the Trainer says, once, when values the model reads in Python keep changing:
    each change costs a capture and a plan of the step (``outcore.capture.specialize``)."""
    return (f"the step was captured and planned again {count} times because a tensor value "
            f"the model reads in Python (.tolist(), .item(), an `if` on a tensor) changed "
            f"({last.partition(';')[0]}); the last capture took {seconds:.1f} s besides the "
            "step. Each step is still computed as eager would, but a model that routes by "
            "values read this way (tokens per expert read with .tolist(), as Hugging "
            "Face's JetMoe does) is captured again at almost every step: route with fixed "
            "shapes (a capacity per expert, torch.where, index_add over all tokens) or "
            "train it eagerly.")
