"""What the CPU allocator holds over a step, from the profiler's allocation events.

outcore's own peak (``plan.memory``, the executor's ``peak_bytes``) counts tensors at the
dispatcher: a kernel's internal temporaries (convolution backward's column buffers, a
norm's or a loss's scratch) and storages that outlive their tensors are invisible to it.
The allocator sees every one of them. ``allocator_peak(step)`` runs ``step`` under
``torch.profiler`` with ``profile_memory=True`` and replays the allocation events (each
with its address and signed size) in time order:

* ``peak``: the most bytes allocated at once during the step, counted from the start of
  the step (whatever was allocated before, parameters included, is not counted);
* ``excluded``: allocations whose address is one of ``exclude()``'s tensors' data pointers
  after the step and that are still alive at its end are left out of every sample (pass
  the parameters' ``.grad`` to measure activations only: gradients left out, as
  ``loss.backward()`` and outcore's executor both allocate them during the step);
* ``held_at_end``: bytes still allocated when the step returns (excluded ones left out).

Frees of blocks allocated before the step (the previous step's gradients, say) are not
counted: they would lower the curve below its starting point and hide what the step itself
needs. Free such tensors before calling, as a training loop's ``zero_grad`` does.

CPU allocations only (on CUDA, ``cuda_allocator_peak`` reads the caching allocator's
counters). Invariant: ``peak >= held_at_end >= 0``; the numbers are exact allocator bytes,
not estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class AllocatorPeak:
    """The result of ``allocator_peak`` (module docstring)."""

    peak: int
    held_at_end: int
    excluded: int
    allocations: int
    result: Any = None


def _events(prof: Any) -> list[tuple[int, int, int]]:
    """(time ns, address, signed bytes) of every CPU allocation event, in time order."""
    return allocation_events(prof.profiler.kineto_results.experimental_event_tree())


def allocation_events(roots: Any) -> list[tuple[int, int, int]]:
    """(time ns, address, signed bytes) of every CPU allocation event under the profiler
    event nodes ``roots`` (and their descendants), in time order."""
    from torch._C._profiler import _ExtraFields_Allocation

    out: list[tuple[int, int, int]] = []
    stack = list(roots)
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if isinstance(fields, _ExtraFields_Allocation) and fields.device.type == "cpu":
            out.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(node.children)
    out.sort(key=lambda e: e[0])
    return out


def allocator_peak(step: Callable[[], Any],
                   exclude: Callable[[], Iterable[torch.Tensor | None]] = tuple
                   ) -> AllocatorPeak:
    """Run ``step`` once and measure what the CPU allocator held (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    events = _events(prof)
    ptrs = {t.untyped_storage().data_ptr() for t in exclude() if t is not None}
    last_alloc: dict[int, int] = {}  # address -> index of its latest allocation
    before: set[int] = set()  # frees of blocks allocated before the step: not counted
    for i, (_, ptr, size) in enumerate(events):
        if size > 0:
            last_alloc[ptr] = i
        elif size < 0:
            if ptr in last_alloc:
                last_alloc.pop(ptr)
            else:
                before.add(i)
    skip = {i for ptr, i in last_alloc.items() if ptr in ptrs} | before
    live = peak = 0
    for i, (_, _, size) in enumerate(events):
        if i in skip:
            continue
        live += size
        peak = max(peak, live)
    excluded = sum(events[i][2] for i in skip if events[i][2] > 0)
    return AllocatorPeak(peak=peak, held_at_end=live, excluded=excluded,
                         allocations=sum(1 for e in events if e[2] > 0), result=result)


def cuda_allocator_peak(step: Callable[[], Any]) -> AllocatorPeak:
    """Run ``step`` once and measure what the CUDA caching allocator held over it: the
    largest ``torch.cuda.max_memory_allocated`` during the step less ``memory_allocated``
    at its start (``peak``; the same "from the start of the step" as ``allocator_peak``),
    and what is still allocated at its end beyond the start (``held_at_end``).

    The device is synchronised before and after, so the window holds exactly the step's
    work. The counters are the allocator's block sizes (requests rounded up to 512 B, a
    cached block that is not split counted whole): they are at least the tensor bytes the
    memory rule counts. ``excluded`` and ``allocations`` are 0 (the caching allocator
    keeps no per-allocation log here)."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = max(0, torch.cuda.max_memory_allocated() - start)
    end = max(0, torch.cuda.memory_allocated() - start)
    return AllocatorPeak(peak=peak, held_at_end=end, excluded=0, allocations=0, result=result)


def held_before(graph: Any) -> int:
    """Bytes a step of ``graph`` finds allocated when it starts: the storages of its static
    tensors (parameters, buffers, the batch) less the loss seed, which the executor makes
    inside the step (so an ``allocator_peak`` of the step counts it). Added to
    ``allocator_peak(...).peak`` it gives the number the memory rule predicts."""
    from outcore.graph.ir import TensorKind

    return graph.static_bytes() - sum(t.nbytes for t in graph.tensors
                                      if t.kind is TensorKind.TANGENT and not t.is_view)
