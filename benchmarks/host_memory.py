"""Host memory held for offloaded activations, over the bytes offloaded (issue 19, item 3).

For each workload and plan, the schedule's Offloads are replayed, in order, for two steps
(every host copy dropped at the end of a step, as the executor does) through two ways of
holding host copies:

* ``pin_memory`` per tensor, as a naive CUDA offloader does: PyTorch 2.13's caching host
  allocator rounds every block up to the next power of two, so each copy costs
  ``2^ceil(log2 n)`` bytes. Without a GPU this column is that rule applied to the real
  sizes; with ``--cuda`` it is measured (``torch.cuda.host_memory_stats``' reserved bytes
  after pinning each copy with ``torch.empty(n, pin_memory=True)``).
* outcore's host pool (``HostPool``): one segment reserved for the plan's offloads
  (``PlannedStep.host_sizes``), slots carved at 64-byte offsets. Without a GPU the
  segments are meta tensors (the pool's bookkeeping is the real code, no memory is
  touched); with ``--cuda`` they are pinned for exactly their size (``pin_exact``).

Plans that offload nothing (outcore-auto may recompute instead) have no row. ``ratio`` is
the bytes held over the plan's host peak (``PlannedStep.host_peak``, the
bytes offloaded); the pool's must be at most 1.05 and must not grow in the second step.

    .venv/bin/python benchmarks/host_memory.py            # paper-scale shapes, no memory
    python benchmarks/host_memory.py --cuda --small       # on a GPU machine, measured
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

import outcore
import outcore.api
from outcore import zoo
from outcore.graph.bounds import reference_peaks
from outcore.runtime.devices.host_pool import HostPool, align_up
from outcore.units import format_bytes

#: (zoo name, batch, options): paper-scale shapes, captured fake (no memory).
WORKLOADS = [("vgg16", 64, {}), ("resnet50", 64, {}), ("transformer", 8, {}),
             ("densenet121", 32, {})]
SMALL = [("vgg16", 8, {"small": True}), ("resnet50", 8, {"small": True}),
         ("transformer", 4, {"small": True})]
ALIGNMENT = 64
LIMIT = 1.05


@dataclass
class Row:
    workload: str
    plan: str
    offloads: int
    host_peak: int
    pinned: int
    pool: int
    pool_grew: bool


def pow2(n: int) -> int:
    """What PyTorch 2.13's caching host allocator holds for a block of ``n`` bytes."""
    return 1 << max(0, (n - 1).bit_length())


def per_tensor_pinned(sizes: list[int], cuda: bool) -> int:
    """Host bytes held when each copy is its own ``pin_memory`` block (see module doc)."""
    if not cuda:
        return sum(pow2(n) for n in sizes)
    before = _host_reserved()
    blocks = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    held = _host_reserved() - before
    del blocks
    torch._C._host_emptyCache()
    return held


def _host_reserved() -> int:
    stats = torch.cuda.host_memory_stats()
    for key in ("reserved_bytes.current", "segment_bytes.current", "allocated_bytes.current"):
        if key in stats:
            return int(stats[key])
    raise RuntimeError(f"torch.cuda.host_memory_stats() has no byte counter: {sorted(stats)}")


def pooled(sizes: list[int], cuda: bool) -> tuple[int, bool]:
    """(bytes the reserved pool holds, whether it grew) over two steps of these copies."""
    allocate: Callable[[int], torch.Tensor]
    release: Callable[[torch.Tensor], None] | None = None
    if cuda:
        from outcore.runtime.devices.cuda import pin_exact, unpin_exact

        allocate, release = pin_exact, unpin_exact
    else:
        def allocate(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.uint8, device="meta")
    pool = HostPool(1 << 20, allocate, ALIGNMENT, release=release)
    pool.reserve(sum(align_up(n, ALIGNMENT) for n in sizes))
    reserved = pool.segments_allocated
    for _ in range(2):
        slots = [pool.alloc(n) for n in sizes]
        for slot in slots:
            pool.free(slot)
    held, grew = pool.capacity, pool.segments_allocated != reserved
    pool.close()
    return held, grew


def rows_for(name: str, batch: int, options: dict, cuda: bool) -> list[Row]:
    work = zoo.get(name, batch, fake=not cuda, **options)
    graph = outcore.capture(work.model, work.loss_fn, work.batch, fake=not cuda)
    budget = int(reference_peaks(graph).liveness * 0.5)
    plans = [("offload-all", None, "offload-all"), ("outcore-auto 50%", budget, "auto")]
    rows = []
    for label, limit, policy in plans:
        try:
            planned = outcore.api.plan(graph, limit, policy=policy, simulate=False,
                                       host_budget=None)
        except outcore.InfeasibleBudgetError:
            continue
        if not planned.host_sizes:
            continue
        held, grew = pooled(planned.host_sizes, cuda)
        rows.append(Row(f"{name} b{batch}", label, len(planned.host_sizes), planned.host_peak,
                        per_tensor_pinned(planned.host_sizes, cuda), held, grew))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="measure real pinned memory")
    parser.add_argument("--small", action="store_true", help="small shapes (real tensors)")
    args = parser.parse_args()
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda needs a CUDA GPU")
    where = "measured on " + torch.cuda.get_device_name() if args.cuda else "modelled, no GPU"
    table = Table(title=f"host bytes held / bytes offloaded (pin_memory: {where})")
    for col in ("workload", "plan", "offloads", "offloaded", "pin_memory held", "ratio",
                "pool held", "ratio", f"<= {LIMIT}", "pool grew"):
        table.add_column(col, justify="left" if col in ("workload", "plan") else "right")
    worst = 0.0
    for name, batch, options in SMALL if args.small else WORKLOADS:
        for r in rows_for(name, batch, options, args.cuda):
            ratio = r.pool / r.host_peak
            worst = max(worst, ratio)
            table.add_row(r.workload, r.plan, str(r.offloads), format_bytes(r.host_peak),
                          format_bytes(r.pinned), f"{r.pinned / r.host_peak:.3f}",
                          format_bytes(r.pool), f"{ratio:.5f}",
                          "yes" if ratio <= LIMIT else "NO", "YES" if r.pool_grew else "no")
    Console(width=160).print(table)
    print(f"worst pool ratio {worst:.5f} (limit {LIMIT})")
    if worst > LIMIT:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
