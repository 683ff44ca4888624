"""The process group a data-parallel Trainer runs on, its timeout, and failure reports.

``rank_context(distributed, device)``:

* ``True``: the default group; initialised here from torchrun's environment (``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) when it is not yet, with ``gloo`` on the
  CPU and ``nccl`` on CUDA, and a timeout (``DEFAULT_TIMEOUT`` unless given) so that a
  collective whose peer is gone raises instead of waiting forever;
* a ``ProcessGroup`` the user created: used as it is (its own timeout applies).

Failure reports: a rank whose step raises writes ``"<ExceptionType>: <message>"`` under
``outcore/failed/<rank>`` in the group's store (the default group's TCPStore), and a rank
whose collective fails reads those keys to say *which* rank failed and why.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from outcore.errors import OutcoreError

#: Collective timeout when outcore initialises the group (torch's default is 30 minutes).
DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
_KEY = "outcore/failed/{}"


class DistributedError(OutcoreError):
    """A collective of a data-parallel step failed: another rank failed or stopped."""


@dataclass
class RankContext:
    """This process's place in the group."""

    group: Any  # a torch.distributed ProcessGroup
    rank: int
    world_size: int
    local_rank: int
    store: Any = None  # the group's store (failure reports), None when unknown

    def report_failure(self, error: BaseException) -> None:
        """Tell the other ranks why this one failed (best effort: never raises)."""
        if self.store is None:
            return
        try:
            self.store.set(_KEY.format(self.rank), f"{type(error).__name__}: {error}")
        except Exception:  # noqa: BLE001 - the store may be gone with rank 0; nothing to do
            return

    def clear_failure(self) -> None:
        """Withdraw this rank's report (it recovered, e.g. re-planned after a refusal)."""
        if self.store is None:
            return
        try:
            self.store.delete_key(_KEY.format(self.rank))
        except Exception:  # noqa: BLE001 - best effort, as report_failure
            return

    def failures(self) -> dict[int, str]:
        """Failures other ranks reported (rank -> message), without blocking."""
        found: dict[int, str] = {}
        if self.store is None:
            return found
        for r in range(self.world_size):
            key = _KEY.format(r)
            try:
                if r != self.rank and self.store.check([key]):
                    found[r] = self.store.get(key).decode(errors="replace")
            except Exception:  # noqa: BLE001 - the store may be gone with rank 0
                break
        return found

    def error(self, what: str, cause: BaseException) -> DistributedError:
        """A DistributedError for a failed collective, naming the ranks that reported."""
        failed = self.failures()
        if failed:
            who = "; ".join(f"rank {r} failed with {m}" for r, m in sorted(failed.items()))
        else:
            who = ("no rank reported a failure: one stopped, hung or ran past the group's "
                   "timeout")
        return DistributedError(f"rank {self.rank}/{self.world_size}: {what} failed ({who}). "
                                f"Fix that rank's error; the others cannot go on without it. "
                                f"Cause here: {type(cause).__name__}: {cause}")


def backend_for(device: str) -> str:
    """``nccl`` for CUDA, ``gloo`` otherwise (the CPU and the CPU-emulated device)."""
    return "nccl" if device == "cuda" else "gloo"


def rank_context(distributed: Any, device: str,
                 timeout: datetime.timedelta | None = None) -> RankContext:
    """The RankContext for ``compile(..., distributed=...)`` (module doc)."""
    if not dist.is_available():
        raise OutcoreError("this torch was built without torch.distributed; data parallel "
                           "needs it")
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        # torchrun: one GPU per local rank, chosen before nccl makes its communicator
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if distributed is True:
        if not dist.is_initialized():
            missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                       if k not in os.environ]
            if missing:
                raise OutcoreError(
                    f"distributed=True but no process group exists and {missing} are not "
                    "set: start the script with `torchrun --nproc-per-node N script.py` (or "
                    "`outcore run --nproc N`), or call torch.distributed.init_process_group "
                    "first, or pass your ProcessGroup as distributed=")
            dist.init_process_group(backend_for(device), timeout=timeout or DEFAULT_TIMEOUT)
        group = dist.group.WORLD
        store = _default_store()
    elif isinstance(distributed, dist.ProcessGroup):
        group, store = distributed, (_default_store() if dist.is_initialized() else None)
    else:
        raise TypeError(f"distributed must be True or a torch.distributed ProcessGroup, got "
                        f"{type(distributed).__name__}")
    rank = dist.get_rank(group)
    local = int(os.environ.get("LOCAL_RANK", rank))
    return RankContext(group, rank, dist.get_world_size(group), local, store)


def _default_store() -> Any:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        return None
