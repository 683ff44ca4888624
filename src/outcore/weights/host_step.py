"""The optimizer step of host-held parameters, overlapped with backward (runtime side).

``HostStepper`` watches a planned step run (as its executor's ``GradHook`` and through a
``LandingDevice``) and steps each parameter held in host memory whose gradient is sent
there on one worker thread, as soon as both have happened:

* the Wait(d2h) of its gradient's storage returned: the gradient is in host memory (read
  from that completed host copy, never before: ``host_tensor`` refuses an unfinished copy);
* the Wait(h2d) of its last prefetch of the step returned: the step updates the host copy
  in place, which that prefetch reads.

On a device whose Waits do not block the host (CUDA: a Wait only orders the compute
stream), "returned" is not "landed": the stepper also takes, at each of those Waits, the
copy's end event (``host_weights.copy_event``) and the worker synchronizes on all of them
before it reads the gradient or writes the parameter (the d2h copy of the gradient has
landed; the h2d copies reading the held parameter have finished).

Host steps run one at a time, in landing order, while the step's thread goes on with the
rest of backward. ``join()`` waits for them (the step's caller joins before anything else
touches the optimizer or the parameters, so the next step's prefetches read updated
weights). How a parameter is stepped keeps ``torch.optim`` semantics: the user's optimizer
is called (``optimizer.step()``) while that parameter (or its master, ``MasterWeights``) is
the only one with a gradient, so only it moves (torch's optimizers skip parameters whose
``.grad`` is None) with its own state, the group's hyper-parameters and LR. Consequences,
stated: ``optimizer.step()`` is called once per host-stepped parameter and once for the
rest (step hooks fire that often); the gradients must be cleared (None) when a step
starts; a parameter the device keeps is stepped after the planned step, on the step's
thread (on the emulated device its live tensor is read by the rest of backward).

``overlap=False`` (clipping, a GradScaler, gradient accumulation: they need every gradient
first) makes the stepper idle: the caller steps everything after the planned step.
``record = True`` keeps an ordered event log (``events``) that tests check the ordering
with.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from outcore.errors import OutcoreError
from outcore.graph.ir import Graph
from outcore.plan.schedule import Prefetch, Schedule, Wait
from outcore.plan.weights import gradients, parameters
from outcore.runtime.devices.base import untracked
from outcore.runtime.host_weights import copy_event, host_tensor
from outcore.weights.mixed import MasterWeights


class HostStepper:
    """Steps host-held parameters as their gradients land (module doc)."""

    def __init__(self, graph: Graph, schedule: Schedule, params: Mapping[str, torch.Tensor],
                 optimizer: torch.optim.Optimizer, master: MasterWeights | None = None,
                 *, wait_for_prefetch: bool = True) -> None:
        self.graph = graph
        self.params = params
        self.optimizer = optimizer
        self.master = master
        self.device: Any = None
        sent, held = set(schedule.host_outputs), set(schedule.host_static)
        pids = parameters(graph)
        waits: dict[tuple[str, int], int] = defaultdict(int)
        prefetched: set[int] = set()
        for ins in schedule.instructions:
            if isinstance(ins, Wait):
                waits[ins.direction, ins.tensor] += 1
            elif isinstance(ins, Prefetch):
                prefetched.add(ins.tensor)
        #: parameter name -> its gradient id, for the parameters stepped here
        self.grad_of: dict[str, int] = {}
        self._need: dict[str, int] = {}
        self._listeners: dict[tuple[str, int], list[str]] = defaultdict(list)
        for name, g in gradients(graph).items():
            p = pids.get(name)
            if p not in held or g not in sent or name not in params:
                continue
            storage = graph.tensors[g].storage
            self.grad_of[name] = g
            self._need[name] = waits["d2h", storage]
            self._listeners["d2h", storage].append(name)
            if wait_for_prefetch and p in prefetched:
                self._need[name] += waits["h2d", p]
                self._listeners["h2d", p].append(name)
        self._name_of_param = {pids[n]: n for n in self.grad_of}
        self.tensors = frozenset(self.grad_of.values())  # GradHook: told when each is made
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outcore-host-step")
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.overlap = False
        self.record = False
        self.events: list[tuple[int, str, str]] = []
        self._left: dict[str, int] = {}
        self._layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        self._futures: list[Future[str]] = []
        #: parameter name -> end events of the copies its host step waits for (CUDA)
        self._after: dict[str, list[Any]] = defaultdict(list)

    # -- the step's side (its thread) ----------------------------------------------------------
    def start(self, overlap: bool) -> None:
        """Before a planned step: arm the triggers (``overlap``) or stay idle."""
        if self._futures:
            raise OutcoreError("the previous step's host optimizer steps were not joined")
        self.overlap = overlap and bool(self.grad_of)
        if self.overlap:
            self._check_cleared()
        self._left = dict(self._need)
        self._layouts.clear()
        self._after.clear()

    def begin(self) -> None:  # GradHook
        pass

    def ready(self, tid: int, value: torch.Tensor) -> None:  # GradHook: after its Compute
        self._layouts[tid] = (tuple(value.size()), tuple(value.stride()),
                              int(value.storage_offset()))

    def finish(self, outputs: dict[int, torch.Tensor]) -> None:  # GradHook
        pass

    def abort(self, error: BaseException) -> None:  # GradHook: the step failed
        self.join(reraise=False)

    def landed(self, kind: str, tid: int) -> None:
        """``LandingDevice``'s report: a Wait of ``kind`` ("d2h"/"h2d") on ``tid`` returned,
        or ("h2d-start") a prefetch of ``tid`` started."""
        if self.record:
            name = self._name_of_param.get(tid) or next(
                iter(self._listeners.get((kind, tid), [])), str(tid))
            self._log(kind, name)
        if not self.overlap:
            return
        for name in self._listeners.get((kind, tid), ()):
            event = copy_event(self.device, kind, tid)
            if event is not None:
                self._after[name].append(event)
            self._left[name] -= 1
            if self._left[name] == 0:
                self._submit(name)

    def _submit(self, name: str) -> None:
        g = self.grad_of[name]
        size, stride, offset = self._layouts[g]
        with untracked():  # a view of the host copy: no device bytes
            grad = host_tensor(self.device, self.graph.tensors[g].storage).as_strided(
                size, stride, offset)
        after = self._after.pop(name, [])
        self._futures.append(self._pool.submit(self._step_one, name, grad, after))

    def join(self, *, reraise: bool = True) -> set[str]:
        """Wait for the host steps started this step; the names stepped. Re-raises the
        first failure (after waiting for all)."""
        futures, self._futures = self._futures, []
        done: set[str] = set()
        first: BaseException | None = None
        for f in futures:
            try:
                done.add(f.result())
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others
                first = first or exc
        self.overlap = False
        if first is not None and reraise:
            raise first
        return done

    def close(self) -> None:
        self.join(reraise=False)
        self._pool.shutdown(wait=True)

    # -- the worker's side ---------------------------------------------------------------------
    def _step_one(self, name: str, grad: torch.Tensor, after: list[Any]) -> str:
        for event in after:  # the copies have landed (a no-op list where Waits block)
            event.synchronize()
        if self.record:
            self._log("step-start", name)
        if self.master is not None:
            self.master.set_grad(name, grad)
            self.optimizer.step()
            self.master.set_grad(name, None)
            self.master.publish(name)
        else:
            p = self.params[name]
            p.grad = grad
            self.optimizer.step()
            p.grad = None
        if self.record:
            self._log("step-end", name)
        return name

    def _log(self, kind: str, name: str) -> None:
        with self._lock:
            self.events.append((next(self._seq), kind, name))

    def _check_cleared(self) -> None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    raise OutcoreError(
                        "train_step steps host-held parameters while backward runs, one at "
                        "a time, so every gradient must be None when it starts: call "
                        "optimizer.zero_grad() (set_to_none=True, the default) first, or use "
                        "trainer.step() to accumulate gradients and step yourself")
