"""Errors raised by outcore. Each message says what went wrong and what to change."""

from __future__ import annotations


class OutcoreError(Exception):
    """Base class of every error outcore raises on purpose."""


class CaptureError(OutcoreError):
    """The training step could not be captured as a dataflow graph."""


class HostRandomError(CaptureError):
    """The step depends on numbers the model draws from NumPy's or Python's random generator
    while it runs, which a captured step cannot draw again (``outcore.capture.host_random``)."""


class GraphError(OutcoreError):
    """A Graph is malformed (dangling ids, cycles, bad JSON)."""


class InfeasibleBudgetError(OutcoreError):
    """A budget is below what a policy (or any policy) needs.

    Attributes:
        policy: the policy name that refused.
        budget: the budget asked for, in bytes.
        required: the least memory, in bytes, that would have worked.
        lowest: where known (``outcore.plan`` fills it), the lowest peak any plan of
            keep/offload/recompute decisions on the activations reaches at this batch
            (``outcore.refusal``; moDNN, which also offloads gradients, can go below it).
        split_refused: moDNN's reasons for the sub-batch sizes it could not use ("" when
            none), which outcore-auto's refusal repeats.
    """

    def __init__(self, policy: str, budget: int, required: int, hint: str = "") -> None:
        from outcore.units import format_bytes

        self.policy = policy
        self.budget = budget
        self.required = required
        self.hint = hint
        self.lowest: int | None = None
        #: why smaller sub-batches were not used (moDNN's), for outcore-auto's refusal
        self.split_refused = ""
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


# -- bad arguments: one type per cause, each naming the value, what is accepted, what to do --
class InvalidArgumentError(OutcoreError, ValueError):
    """An argument outcore cannot use, caught before any capture or planning.

    Also a ``ValueError`` (what Python code catches for a bad value). The CLI exits with
    code 2 for every subclass.

    Attributes:
        value: the value given.
        accepted: what would have been accepted (a sentence or a list of names).
    """

    what = "argument"
    template = "{what} {value!r} is not accepted; expected {accepted}."

    def __init__(self, value: object, accepted: str, hint: str = "") -> None:
        self.value = value
        self.accepted = accepted
        msg = self.template.format(what=self.what, value=value, accepted=accepted)
        super().__init__(msg + (f" {hint}" if hint else ""))


class UnknownPolicyError(InvalidArgumentError):
    """A policy name that is not registered (``outcore.policies()`` lists the names)."""

    what = "policy"
    template = "unknown {what} {value!r}; expected {accepted}."


class UnknownGPUError(InvalidArgumentError):
    """A hardware profile name that is not in the catalogue (``outcore gpus`` lists them)."""

    what = "GPU profile"
    template = "unknown {what} {value!r}; expected {accepted}."


class UnknownModelError(InvalidArgumentError):
    """A model that is neither a zoo name nor a loadable ``module:function``."""

    what = "model"
    template = "unknown {what} {value!r}; expected {accepted}."


class BatchMismatchError(InvalidArgumentError):
    """A batch passed to ``Trainer.step`` whose shapes or dtypes differ from the captured
    example's."""

    what = "batch"
    template = "the {what}'s {value} does not match the captured step: expected {accepted}."


class UnknownPaperError(InvalidArgumentError):
    """A paper ``outcore reproduce`` does not know."""

    what = "paper"
    template = "unknown {what} {value!r}; expected {accepted}."


class UnknownDeviceError(InvalidArgumentError):
    """A device other than "cuda", "cpu-emulated" or "cpu"."""

    what = "device"
    template = "unknown {what} {value!r}; expected {accepted}."


class InvalidBudgetError(InvalidArgumentError):
    """A budget outcore cannot plan for (base of the three causes below)."""

    what = "budget"


class UnreadableBudgetError(InvalidBudgetError):
    """A budget that is not a number of bytes nor a string such as "12GB"."""

    template = "cannot read {value!r} as a budget; expected {accepted}."


class NonPositiveBudgetError(InvalidBudgetError):
    """A budget that is zero or negative."""


class NonFiniteBudgetError(InvalidBudgetError):
    """A budget that is infinite or NaN (including "1e400", which overflows)."""


class PolicyOptionError(InvalidArgumentError):
    """A policy option the policy does not have, or a bad value for one (the message, from
    the policy's typed configuration, lists the options it has)."""

    what = "policy option"
    template = "{value}"


class InvalidOptionError(InvalidArgumentError):
    """A command-line ``--option key=value`` that is not of that form, or another bad
    numeric argument (``--batch 0``, ``--steps 0``)."""

    what = "option"


class OutputPathError(OutcoreError):
    """A report or profile could not be written where asked (unwritable folder, a name that
    leaves the requested folder)."""


class UnsupportedModelError(OutcoreError):
    """The model or batch uses a feature whose effect a planned step cannot reproduce as
    eager PyTorch would (a module backward hook, a gradient hook in the data-parallel or
    weights trainers, an input gradient too large to assemble after a split step); raised
    before anything is written, with what to change."""


class NothingToTrainError(OutcoreError, RuntimeError):
    """A training step where nothing requires grad: every parameter is frozen and no batch
    tensor requires grad. ``loss.backward()`` raises there in eager PyTorch (a RuntimeError,
    which this is too), so outcore does not return a loss with no gradient behind it."""


class OutcoreWarning(UserWarning):
    """Base of outcore's warnings (each is also logged on the ``outcore`` logger)."""


class SubBatchWarning(OutcoreWarning):
    """The batch is split into sub-batches: BatchNorm statistics (and anything else that
    couples the samples of a batch) are computed per sub-batch, so gradients and running
    statistics differ from eager PyTorch's."""


class VariantWarning(OutcoreWarning):
    """The plan runs operator variants (an FFT or im2col convolution, a chunked attention)
    instead of PyTorch's kernels on some ops: they compute the same function with sums in
    another order, so the loss and gradients differ from eager PyTorch's by rounding."""


class RoundingWarning(OutcoreWarning):
    """The step computes an op with another kernel than eager PyTorch's, which rounds
    differently (an LSTM, whose eager training kernel a trace cannot call, traced through
    its decomposition): the loss and gradients differ from eager's by float rounding."""


class ReplanWarning(OutcoreWarning):
    """outcore captured and planned again (a new input shape, a recompilation)."""


class BudgetUnitWarning(OutcoreWarning):
    """A budget given as a bare number in a string ("12"): read as bytes."""


class EvalModeWarning(OutcoreWarning):
    """A training step on a model in eval mode: gradients of the eval-mode model are
    computed (as ``loss.backward()`` would); evaluation belongs under ``torch.no_grad()``."""


class CheckpointWarning(OutcoreWarning):
    """The model checkpoints a region itself (``torch.utils.checkpoint``), traced as a plain
    call (``outcore.capture.checkpoints``), where eager's recompute computes something else:
    a BatchNorm in a region updates its running statistics twice a step in eager and once
    here; ``preserve_rng_state=False`` makes eager's recompute draw new random numbers."""


class PlannerBugWarning(OutcoreWarning):
    """A candidate of outcore-auto's portfolio returned a schedule the verifier refuses (a
    bug of that policy): it is left out and the others compete."""


class ProfileDtypeWarning(OutcoreWarning):
    """A hardware profile has no peak for a dtype; the nearest dtype it has prices it."""
