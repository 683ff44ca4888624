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

Agreement (``RankContext.agree``): where a rank may refuse on its own (its planning, its
step's checks and re-plan), every rank enters one small all-reduce of a status flag
whether its own part succeeded or raised, so a refusal on one rank reaches the others at
once instead of at their next collective (the group's timeout when the refusing process
lives on). A refusing rank then raises its own error, the others ``DistributedError``
naming it and its reason; the ranks have issued the same collectives, so the group stays
usable (a caller that skips the refused batch on every rank can go on).

Arrival (``RankContext.arrive``): before the agreement at the end of planning, the ranks
wait for one another through the store, up to ``PLANNING_WAIT`` rather than the group's
collective timeout: ranks capture and plan at their own speed (a slower CPU, a loaded
machine, a side process of the planner), and a short group timeout (chosen for hung steps)
must not end the rank that is still planning. The all-reduce that follows then meets every
rank already there.
"""

from __future__ import annotations

import collections
import datetime
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from outcore.errors import OutcoreError

#: Collective timeout when outcore initialises the group (torch's default is 30 minutes).
DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
_KEY = "outcore/failed/{}"
#: How long a rank waits at the end of planning for the others to finish theirs (``arrive``).
PLANNING_WAIT = datetime.timedelta(hours=1)
_ARRIVED = "outcore/arrived/{}/{}/{}"  # point, its arrival's number in this process, rank
#: arrivals at each point in this process: the same sequence on every rank (every rank
#: arrives at the same points in the same order), so a stale key never meets a new wait
_ARRIVALS: collections.Counter[str] = collections.Counter()
_SLICE_S = 1.0  # how often a waiting rank looks for the others' failure reports


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
    _device: torch.device | None = field(default=None, repr=False, compare=False)
    _arrived: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

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

    def agree(self, what: str, failure: BaseException | None = None) -> None:
        """The agreement point ``what`` (module doc): every rank calls it at the same point
        of its work, with ``failure`` the exception its own part raised (``None``: it
        succeeded). Costs one all-reduce of one integer when every rank succeeded (and a
        gather of the reasons when one did not).

        Returns on a rank that succeeded when every rank did, and always on a failed rank
        (the caller raises its own error; a broken group must not hide it). Raises
        ``DistributedError`` on a rank that succeeded when another failed, naming every
        failed rank and its error, or when the all-reduce itself fails (``error``)."""
        if self.world_size == 1:
            return
        flag = torch.full((1,), 0 if failure is None else 1, dtype=torch.int32,
                          device=self._flag_device())
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            self._depart(what)
            if int(flag.item()) == 0:
                return
            reasons: list[Any] = [None] * self.world_size
            mine = None if failure is None else f"{type(failure).__name__}: {failure}"
            dist.all_gather_object(reasons, mine, group=self.group)
        except RuntimeError as exc:
            if failure is not None:
                return
            raise self.error(what, exc) from exc
        if failure is not None:
            return
        who = "; ".join(f"rank {r} failed with {m}" for r, m in enumerate(reasons)
                        if m is not None)
        raise DistributedError(
            f"rank {self.rank}/{self.world_size}: {what} failed on another rank ({who}), and "
            "every rank stopped there: nothing of it was applied on any rank. Fix that "
            "rank's error.")

    def arrive(self, what: str, wait: datetime.timedelta = PLANNING_WAIT) -> None:
        """Block until every rank of the group has called ``arrive(what)`` (module doc),
        waiting up to ``wait`` through the store instead of the group's collective timeout.
        Returns at once for one rank, or without a store (a user's ProcessGroup whose
        store is unknown: the group's own timeout then bounds the wait). Raises
        ``DistributedError`` when the others have not all arrived within ``wait``.

        Invariant: every rank calls ``arrive`` and then ``agree`` for the same ``what``,
        the same number of times (the keys are numbered by ``_ARRIVALS``, so reaching the
        point again, another ``compile`` in the same group, never meets a stale key); each
        rank removes its key after that agreement (``_depart``)."""
        if self.world_size == 1 or self.store is None:
            return
        me = dist.get_rank()  # global ranks: subgroups of one default store do not collide
        _ARRIVALS[what] += 1
        n = _ARRIVALS[what]
        keys = [_ARRIVED.format(what, n, r)
                for r in dist.get_process_group_ranks(self.group)]
        end = time.monotonic() + wait.total_seconds()
        try:
            self.store.set(_ARRIVED.format(what, n, me), "1")
            reported = False
            while True:  # in slices: a rank that reported a failure and did not arrive
                try:     # one slice later (interrupted, or gone) ends the wait
                    self.store.wait(keys, datetime.timedelta(seconds=_SLICE_S))
                    break
                except dist.DistStoreError:
                    if reported or time.monotonic() > end:
                        raise
                    reported = bool(self.failures())
        except Exception as exc:  # the wait ran out, or the store is gone
            raise self.error(what, exc) from exc
        self._arrived[what] = _ARRIVED.format(what, n, me)

    def _depart(self, what: str) -> None:
        """Remove this rank's arrival at ``what``: called after the agreement that follows
        it, when every rank has passed its wait (best effort: never raises)."""
        key = self._arrived.pop(what, None)
        if key is None:
            return
        try:
            self.store.delete_key(key)
        except Exception:  # noqa: BLE001 - the store may be gone with rank 0
            return

    def _flag_device(self) -> torch.device:
        """Where the agreement's flag lives: the current CUDA device for nccl, else the CPU
        (gloo; a mixed ``cpu:gloo,cuda:nccl`` group reduces CPU tensors with gloo)."""
        if self._device is None:
            backend = str(dist.get_backend(self.group))
            cuda = "nccl" in backend and "gloo" not in backend
            self._device = (torch.device("cuda", torch.cuda.current_device()) if cuda
                            else torch.device("cpu"))
        return self._device


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
