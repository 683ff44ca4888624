"""``torch.compile(model, backend=outcore.inductor_backend(budget=...))``.

The backend hands each graph dynamo captured to Inductor (``compile_fx``) with one change:
the partitioner that decides what the forward saves for the backward is
``OutcorePartitioner`` (``outcore.compiled.partition``), so the saved set is outcore's plan
under ``budget`` (recompute only, any depth) and every kernel is Inductor's fused code.

    >>> import torch, outcore
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> be = outcore.inductor_backend(budget="64KiB", gpu="this-cpu")
    >>> compiled = torch.compile(net, backend=be, dynamic=False)      # doctest: +SKIP
    >>> torch.nn.functional.cross_entropy(compiled(torch.randn(4, 8)),
    ...                                   torch.tensor([0, 1, 1, 0])).backward()  # doctest: +SKIP
    >>> be.partitions[0].saved                                        # doctest: +SKIP

Gradients: Inductor's fused kernels round differently from eager PyTorch's (reassociated
reductions, fused multiply-adds), so gradients match eager's to a tolerance (about 1e-5
relative in float32), not bit for bit. Random ops (dropout) draw from eager PyTorch's
generator by default (``fallback_random=True``): the masks are eager's at the same seed, so
what the step computes is eager's up to rounding; ``fallback_random=False`` draws from
Inductor's own RNG, as plain ``torch.compile`` does. The backend warns of the rounding once,
at its first graph.

Refused, from the first call of the compiled model (dynamo would otherwise hide the reason in
its own ``BackendCompilerFailed``): a budget below what a recompute-only plan reaches
(``InfeasibleBudgetError``), a plan that needs host memory (``OffloadNotCompiledError``), a
shape-dynamic graph (``CaptureError``: pass ``dynamic=False``). Graphs that need no gradient
(inference) are compiled by Inductor without a partition, unplanned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch
from torch import fx

from outcore.errors import OutcoreError, OutcoreWarning

from .partition import OutcorePartitioner, Partition


class InductorRoundingWarning(OutcoreWarning):
    """Inductor's fused kernels round differently from eager PyTorch: gradients match eager's
    to a tolerance, not bit for bit."""


class _Raiser:
    """What the backend returns for a graph it could not plan: raises the reason when called."""

    def __init__(self, error: OutcoreError) -> None:
        self.error = error

    def __call__(self, *args: Any) -> Any:
        raise self.error.with_traceback(None)


def _outcore_cause(err: BaseException) -> OutcoreError | None:
    """The OutcoreError inside a chain of wrapping exceptions, if any."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OutcoreError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class InductorBackend:
    """A torch.compile backend: Inductor's kernels, outcore's saved set (module docstring).

    Attributes:
        partitioner: the ``OutcorePartitioner`` every graph is split with.
        config_patches: Inductor config settings applied to every graph's compile (besides
            the partitioner), e.g. ``{"layout_optimization": False}``.
        recompute_in_place: compile each graph with ``recompute_order.KeepRecomputeInPlace``
            (its backward then compiled with the forward, not at the first ``backward()``).
        partitions: one ``Partition`` per joint graph, in compile order (property).
    """

    def __init__(self, partitioner: OutcorePartitioner,
                 config_patches: dict[str, Any] | None = None,
                 recompute_in_place: bool = True) -> None:
        self.partitioner = partitioner
        self.config_patches = dict(config_patches or {})
        self.recompute_in_place = recompute_in_place
        self._warned = False

    @property
    def partitions(self) -> list[Partition]:
        return self.partitioner.partitions

    def _recompute_order(self) -> AbstractContextManager[Any]:
        """The context a graph compiles in: ``KeepRecomputeInPlace`` set and the backward
        compiled eagerly, under it (``recompute_in_place``), or nothing."""
        if not self.recompute_in_place:
            return nullcontext()
        from torch._functorch import config as functorch_config
        from torch._inductor.virtualized import V

        from .recompute_order import KeepRecomputeInPlace

        if not (hasattr(functorch_config, "force_non_lazy_backward_lowering")
                and hasattr(V, "set_choices_handler")):
            # torch 2.13 has both; an older torch (a GPU image's) compiles as Inductor likes
            warnings.warn(f"outcore.inductor_backend: torch {torch.__version__} lacks "
                          "Inductor's choices handler or eager backward lowering; "
                          "recompute_in_place has no effect", OutcoreWarning, stacklevel=3)
            return nullcontext()
        stack = ExitStack()
        stack.enter_context(functorch_config.patch(force_non_lazy_backward_lowering=True))
        stack.enter_context(V.set_choices_handler(KeepRecomputeInPlace()))
        return stack

    def __call__(self, gm: fx.GraphModule,
                 example_inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        from outcore.capture.traced_as_eager import eager_decompositions, traced_as_eager

        if not self._warned and torch.is_grad_enabled():
            self._warned = True
            warnings.warn("outcore.inductor_backend: Inductor's fused kernels round "
                          "differently from eager PyTorch; gradients match eager's to a "
                          "tolerance (about 1e-5 relative in float32), not bit for bit",
                          InductorRoundingWarning, stacklevel=2)
        with inductor_config.patch(self.config_patches):  # fallback_random picks the table
            decompositions = eager_decompositions()
        try:
            with self._recompute_order(), traced_as_eager():  # capture/traced_as_eager.py
                compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
                    gm, list(example_inputs),
                    config_patches={**self.config_patches,
                                    "custom_partitioner_fn": self.partitioner},
                    decompositions=decompositions)
            return compiled
        except Exception as err:
            cause = _outcore_cause(err)
            if cause is None:
                raise
            return _Raiser(cause)


def inductor_backend(budget: int | str | None, *, policy: str = "auto",
                     gpu: str | None = None, host_budget: int | str | None = 0,
                     fusion: bool = True, layout_optimization: bool = False,
                     buffer_reuse: bool = False, fallback_random: bool = True,
                     recompute_in_place: bool = True, scope: str = "step",
                     **options: Any) -> InductorBackend:
    """A ``torch.compile`` backend running outcore's plan with Inductor's fused kernels.

    Args:
        budget: device memory per compiled graph (bytes, "64MB", "11.5GiB"), parameters and
            inputs included, as ``outcore.plan``'s; None = unbounded (outcore keeps what
            makes the step fastest).
        policy: a name from ``outcore.policies()``; "auto": outcore-auto's plan (recompute
            chains of any depth) or fused-first's, whichever recomputes fewer matmul,
            convolution and attention flops (``outcore.compiled.partition``).
        gpu: the hardware profile the plan is priced on (``"this-cpu"`` for a CPU run).
        host_budget: as ``outcore.plan``'s; 0 (the default) plans recompute only. A plan
            that still uses host memory is refused (``OffloadNotCompiledError``).
        fusion: plan the joint graph as Inductor fuses it (``outcore.compiled.fusion``):
            an element-wise value read once by a point-wise op or a reduction of the same
            half is inlined into that kernel, so it costs no memory and its recompute no
            kernel of its own. False plans the decomposed graph op by op (every value a
            buffer): the plans keep more at the forward/backward cut. Neither prediction
            bounds the allocator's peak under Inductor (docs/guide.md, "Memory"); the fused
            one measured up to 2.7% under it on the tests' GPT, the op-by-op one above it.
        layout_optimization: Inductor's own ``layout_optimization`` (channels-last
            convolutions). Off by default: on the CPU it is always on for a graph with
            convolutions, and its forward then holds channels-last copies of the
            convolution weights into the backward, outside the saved set the plan chose
            (ResNet-18, 32x32, batch 8: the step's allocator peak 72.7 MiB with it, 44.9
            MiB without, against a plan that predicts 45.2). True lets Inductor decide.
        buffer_reuse: Inductor's own ``allow_buffer_reuse``. Off by default: Inductor's
            generated code then frees each buffer after its last use, as outcore's memory
            rule does. On, a freed buffer is held until a later buffer of the same size
            reuses it, whenever that stays under Inductor's own estimate of the graph's
            peak; that estimate counts each saved tensor at its own storage size, so
            views of one storage (the q, k, v of an attention's fused projection) and
            transposed parameters are counted several times, and the held buffers push the
            real backward above the plan (the quick GPT of ``benchmarks/vs_pytorch.py`` at
            a 6.32 MiB budget: Inductor's estimate 5.89 MiB, the step's allocator peak 4.78
            MiB with reuse, 3.77 without, the plan 4.26).
        fallback_random: Inductor's own ``fallback_random``, on by default: dropout draws
            with eager PyTorch's generator (``native_dropout``), so at the same seed the
            masks are eager's and the step computes what the user's eager step computes, up
            to Inductor's rounding (not a different dropout pattern). Eager's generator is
            also far cheaper per element on the CPU than Inductor's inline one (the full GPT
            of ``benchmarks/vs_pytorch.py``: plain ``torch.compile`` 0.83x its default step
            time). Its masks cannot be drawn again in the backward, so each dropout's mask
            is kept by the plan (one byte per element, counted in its predicted peak; never
            recomputed, never in ``Partition.forced``) and its output recomputed from input
            and mask where the backward needs it (``outcore.compiled.dropout``). False:
            Inductor's inline generator, the same draws as plain ``torch.compile`` at the
            same seed (masks then re-drawable in the backward from a few bytes of seed).
            Set either way, whatever the process's Inductor config says. The speed
            figures above are the CPU's; on a GPU Inductor's inline generator fuses into
            its neighbours and needs no kept mask, so ``False`` may be faster there (not
            measured yet: the default is chosen for what the step computes).
        recompute_in_place: keep each recompute where the plan put it: Inductor may not
            fuse a recompute kernel with backward work that reads the same buffers, which
            would make that work's buffers before the kernels the plan ran between them
            (``outcore.compiled.recompute_order``; the backward is then compiled with the
            forward). False: Inductor fuses as it likes (the prediction then bounds the
            step less often).
        scope: what ``budget`` bounds, as ``outcore.plan``'s: "step" (default), every byte
            of the compiled graph's step; "activations", those bytes less the parameters,
            inputs and the parameters' gradients (``outcore.plan.scope``), the measure of
            PyTorch's ``activation_memory_budget``. ``Partition.planned.scoped_peak`` is the
            planned activation peak.
        options: policy-specific options (see each policy's docstring).

    Returns:
        An ``InductorBackend``: pass it as ``torch.compile(model, backend=...,
        dynamic=False)``; ``.partitions[i]`` says what each graph saves and what the plan
        predicted.

    Raises:
        InvalidArgumentError: (a ValueError) an unknown policy, GPU or scope, or an
            unreadable, non-positive or non-finite budget (at once).
        InfeasibleBudgetError, OffloadNotCompiledError, CaptureError: from the first call of
            the compiled model (module docstring).
    """
    from outcore.plan.scope import check_scope
    from outcore.validation import check_budget, check_gpu, check_policy

    limit = check_budget(budget)
    check_policy(policy, options)
    check_scope(scope)
    patches: dict[str, Any] = {} if layout_optimization else {"layout_optimization": False}
    patches["allow_buffer_reuse"] = buffer_reuse  # either way: not the process's setting
    patches["fallback_random"] = fallback_random  # either way, as allow_buffer_reuse
    return InductorBackend(OutcorePartitioner(limit, policy, check_gpu(gpu),
                                              host_budget=host_budget, fusion=fusion,
                                              scope=scope, **options), patches,
                           recompute_in_place=recompute_in_place)
