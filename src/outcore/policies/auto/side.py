"""Portfolio candidates run beside the others in a forked child process (planning time).

On a machine with two cores or more, ``run_portfolio`` may hand the candidates of
``SIDE`` (PoocH, the cheap seed policies and outcore-checkpoint: pure Python, no HiGHS) to
one child process made with ``os.fork`` when it starts, while the parent runs the other
candidates (outcore-optimal's HiGHS solves above all), ahead of reading the child's. The
child inherits the Graph, the cost model and the runners (nothing is pickled on the way in:
the Graph is a pybind11 object);
only each candidate's outcome travels back, pickled, in the child's order. Objects the
parent already holds (the Graph, the cost model and its attributes: ``shared_objects``)
travel as their index in a list both processes have (a fork keeps every object where it
was), so the parent's outcome references its own Graph, as if it had run the candidate.

Invariants (why the result is the result of running every candidate in the parent):

* The parent decides every skip exactly as before, in ``candidates``' order, from the
  entries it has; the child computes outcomes only. A side candidate the parent skips is
  never read (the child's work for it is discarded); one it does not skip is read with
  ``take``, which blocks until the child has sent it.
* The child computes an outcome with the very function the parent would call
  (``evaluate``: run the candidate on a fresh context, drop its variants, replay its
  memory, simulate it); the planners are deterministic, so the outcome is the parent's.
* Whatever the child cannot send (a policy error that is not an InfeasibleBudgetError, a
  result that does not pickle, a plan on another graph than the input, a child that died)
  comes back as "none", and the parent then runs that candidate itself: an error is raised
  in the parent as it would have been, and nothing is ever lost.
* The child never returns into the caller's code: it leaves with ``os._exit`` whatever
  happens, and writes nothing but its pipe (progress display off). The parent kills and
  reaps it when the portfolio is done (``close``, also on an exception), so no process
  outlives ``run_portfolio``.
* The child runs no HiGHS (a solver's thread pool does not survive ``fork``): only names
  in ``SIDE`` go there, and none of them solves an LP.

Off where ``os.fork`` is missing, where this process may use one core only, on graphs of
fewer than ``MIN_ACTIVATIONS`` movable activations (a fork costs more than it saves
there), and when the caller says ``parallel=False`` (outcore-auto's option ``parallel``).
The CPU seconds of the child are the process's children's (``os.times``), not
``time.process_time``'s.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Callable, Sequence
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

from outcore.errors import InfeasibleBudgetError

#: Candidates that may run in the child: pure-Python planners that never call HiGHS, in the
#: order the child computes them, while the parent runs the others (outcore-optimal's HiGHS
#: solves above all; ``portfolio._run_ahead``). PoocH first: the parent never skips it but
#: at the compute floor; then the cheap seed policies (2 s CPU together on ResNet-152 b256
#: v100-pcie); outcore-checkpoint last: it is often skipped once outcore-optimal's plan is
#: known (the recompute-only bound, ``portfolio``), so its run is then wasted, and
#: computed last it costs the parent no wait (5.1 s CPU there).
SIDE: tuple[str, ...] = ("pooch", "vdnn-dyn", "superneurons", "modnn", "dymem", "offload-all",
                         "outcore-checkpoint")
#: Below this many movable activations the portfolio runs in one process.
MIN_ACTIVATIONS = 300

def usable_cores() -> int:
    """Cores this process may run on (the affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a side process can help here: ``os.fork`` exists and two cores are usable."""
    return hasattr(os, "fork") and usable_cores() >= 2


def shared_objects(*roots: Any) -> list[Any]:
    """``roots`` and their attributes' values (a cost model's profile, its tables): objects
    the parent holds before the fork, which an outcome may reference (PoocH's output holds
    its timeline, on the graph and a bound copy of the cost model) and which are sent as
    their index here instead of pickled (a Graph does not pickle; a profile's dtype table
    is a mappingproxy)."""
    found = list(roots)
    for root in roots:
        found += list(getattr(root, "__dict__", {}).values())
    return found


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: Sequence[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.index = {id(o): i for i, o in enumerate(shared)}

    def persistent_id(self, obj: Any) -> int | None:
        return self.index.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: Sequence[Any]) -> None:
        super().__init__(file)
        self.shared = shared

    def persistent_load(self, pid: Any) -> Any:
        return self.shared[int(pid)]


def _pack(outcome: Any, shared: Sequence[Any]) -> bytes:
    """``outcome`` (an Entry) pickled, ``shared`` objects by their index; an
    InfeasibleBudgetError goes as its fields (it does not unpickle from its message).
    Raises on anything else that does not pickle (e.g. a re-captured sub-batch Graph)."""
    import dataclasses

    fields = None
    error = outcome.error
    if error is not None:
        fields = (error.policy, error.budget, error.required, error.hint, vars(error))
        outcome = dataclasses.replace(outcome, error=None)
    buf = io.BytesIO()
    _Pickler(buf, shared).dump((outcome, fields))
    return buf.getvalue()


def _unpack(data: bytes, shared: Sequence[Any]) -> Any:
    """The Entry ``_pack`` sent, on the parent's own ``shared`` objects."""
    import dataclasses

    outcome, fields = _Unpickler(io.BytesIO(data), shared).load()
    if fields is not None:
        policy, budget, required, hint, state = fields
        error = InfeasibleBudgetError(policy, budget, required, hint)
        vars(error).update(state)
        outcome = dataclasses.replace(outcome, error=error)
    return outcome


class SideRun:
    """One forked child computing ``evaluate(name)`` for each of ``names`` in order."""

    def __init__(self, names: Sequence[str], shared: Sequence[Any],
                 evaluate: Callable[[str], Any]) -> None:
        self.names = tuple(names)
        self.shared = list(shared)  # held here, so their ids stay theirs until ``close``
        self.received: dict[str, Any] = {}
        self._next = 0  # index in ``names`` of the next outcome the child sends
        reader, writer = Pipe(duplex=False)
        self.pid = os.fork()
        if self.pid == 0:  # the child: compute, send, leave
            reader.close()
            _child(self.names, self.shared, evaluate, writer)
        writer.close()
        self._reader: Connection | None = reader

    def take(self, name: str) -> Any | None:
        """``name``'s Entry from the child (waiting for it), or None when the child could
        not compute or send it (the caller then runs ``name`` itself)."""
        while name not in self.received and self._reader is not None:
            try:
                data = self._reader.recv_bytes()
            except (EOFError, OSError):  # the child is gone
                self._drop()
                break
            sent = self.names[self._next]
            self._next += 1
            try:
                self.received[sent] = None if data == b"none" else _unpack(data, self.shared)
            except Exception:  # noqa: BLE001 - an outcome that does not unpickle: run it here
                self.received[sent] = None
        return self.received.get(name)

    def _drop(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        """Kill the child if it still runs and reap it (idempotent)."""
        self._drop()
        if self.pid > 0:
            import signal

            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: reaped already
                os.waitpid(self.pid, 0)
            self.pid = -1


def _child(names: Sequence[str], shared: Sequence[Any], evaluate: Callable[[str], Any],
           writer: Connection) -> None:
    """The child's whole life: one message per name, in order; never returns. A thread
    sends, so the next candidate is computed while the parent has not read the last one
    yet (an outcome is larger than a pipe's buffer, and the parent reads only when it needs
    it)."""
    import queue
    import threading

    try:
        from outcore import progress

        progress.configure(False)
        outbox: queue.Queue[bytes | None] = queue.Queue()
        sender = threading.Thread(target=_send_all, args=(outbox, writer), daemon=True)
        sender.start()
        for name in names:
            try:
                data = _pack(evaluate(name), shared)
            except Exception:  # noqa: BLE001 - the parent runs it again and sees the error
                data = b"none"
            outbox.put(data)
        outbox.put(None)
        sender.join()
    finally:
        os._exit(0)


def _send_all(outbox: Any, writer: Connection) -> None:
    """Send what ``outbox`` holds, in order, until None; then close ``writer``."""
    try:
        while (data := outbox.get()) is not None:
            writer.send_bytes(data)
    except OSError:  # the parent closed its end: nothing more is wanted
        pass
    finally:
        writer.close()
