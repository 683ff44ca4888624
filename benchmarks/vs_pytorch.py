"""outcore-auto against PyTorch's own memory tools, at equal memory, on this CPU.

For each model (a GPT-style decoder, a ResNet-18 on 64x64 images, a tiny Hugging Face
GPT-2), one training step per tool:

* ``eager``: ``loss.backward()``;
* ``checkpoint``: ``torch.utils.checkpoint`` (non-reentrant) around every repeated block;
* ``selective``: the same with ``create_selective_checkpoint_contexts`` and an op-list
  policy in the manner of torchtitan's "op" mode (outputs of matmuls, convolutions and
  attention saved, everything else recomputed);
* ``compile``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget``
  (``--compile-budget``, default 0.5); ``--compile-fallback-random``: with Inductor's
  ``fallback_random`` (dropout on eager's generator, as the eager peers and the
  outcore+inductor rows draw it by default);
* ``outcore @ <peer>``: outcore-auto planned for this CPU (``gpu="this-cpu"``,
  ``host_budget=0``: recompute only, the host is the device's own memory), its budget
  searched so that its measured peak is at most the peer's (``match_budget``), by the
  ``--match`` measure (default ``step``), run by outcore's executor (one ATen op at a time).
  Under ``--match activation`` every outcore plan is made with ``scope="activations"``
  (``outcore.plan.scope``): its budget bounds the activations only, parameters, inputs and
  the parameters' gradients left out, as the measure leaves them out;
* ``outcore+inductor @ <peer>``: the same model under ``torch.compile(model,
  backend=outcore.inductor_backend(budget))``: outcore-auto's recompute-only plan decides
  what the forward saves, Inductor compiles the fused kernels (``outcore.compiled``). Its
  budget is matched to the peer's measured peak, each try a fresh compile
  (``InductorMatcher``: down by the measured excess, then once up by the slack left under
  the peer, keeping the largest peak at most the peer's); the loss runs eagerly outside the
  compiled model, as for ``compile``. The backend's defaults: the graph planned as Inductor
  fuses it (``--inductor-no-fusion``: op by op), Inductor's layout optimisation off, its
  buffer reuse off (``--inductor-buffer-reuse``: on; the compile peer keeps Inductor's
  default, on), dropout on eager's generator (``fallback_random``: the masks the eager
  peers draw at the same seed; ``--inductor-own-random``: Inductor's inline generator, as
  the compile peer's default).
  Gradients match eager's to Inductor's rounding (a warning says so; silenced here).

Two peaks, both from the CPU allocator's own events (``torch.profiler``,
``profile_memory=True``, ``outcore.runtime.devices.allocator_peak``), parameters left out
(they are allocated before the step):

* **step peak** (``--match step``, the default): everything the step allocates,
  activations and the gradients it makes: what the device must hold beyond the model, and
  what outcore's budget bounds (less the parameters);
* **activation peak** (``--match activation``): the same with the gradients left out. A
  planner that uses its budget holds activations early in backward, where few gradients
  exist yet, so this measure penalises it for memory the peers leave empty at that point
  and fill with gradients later; it is shown beside the step peak.
**Step time**: the median of ``--rounds`` interleaved rounds (every tool once per round;
each peer and the outcore rows matched to it run back to back as one block, the blocks and
each block's members in a shuffled order), with the spread (min-max) over rounds; ratios are
to eager in the same run. The verdicts give, per peer, two comparisons of outcore's time:
the old **spread** test (resolved when outcore's slowest round beats the peer's fastest, or
the reverse) and the **paired** statistic (``paired.py``): the per-round ratio outcore/peer
over every round, its median and an order-statistic confidence interval for that median
(95%, or the whole range's coverage when there are too few rounds: 93.8% at 5 rounds);
resolved when the interval excludes 1. Pairing by round removes machine-load drift between
rounds, which the spread test counts as noise. Run:

    python benchmarks/vs_pytorch.py                # the three models, full size
    python benchmarks/vs_pytorch.py --quick        # scaled down (2-layer GPT), minutes
    python benchmarks/vs_pytorch.py --models gpt --rounds 15 --json out.json
    python benchmarks/vs_pytorch.py --skip-inductor   # without the outcore+inductor rows
    python benchmarks/vs_pytorch.py --skip-executor   # without the outcore @ rows
    python benchmarks/vs_pytorch.py --device cuda --large --skip-inductor  # on a GPU

On a GPU (``--device cuda``, bench_device.py) outcore plans with the GPU's catalogue profile,
its executor runs on ``CudaDevice``, the peaks are CUDA's caching allocator's over the step and
each timed step ends with a device synchronisation; ``--allow-offload`` lets outcore's plans
use the host link (recompute only by default, as the peers).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import outcore
from outcore.compiled import InductorRoundingWarning
from outcore.cost.measure_temporaries import measure_temporaries
from outcore.runtime.devices.allocator_peak import held_before
from outcore.runtime.executor import Executor

sys.path.insert(0, str(Path(__file__).parent))
from bench_device import Target  # sibling modules of this script
from paired import round_order
from peer_gradients import peer_note, zero_grad
from vs_peers import wrap_blocks
from vs_pytorch_report import Row, table, verdicts, write_json
from vs_workloads import WORKLOADS, Workload

#: where the steps run (``--device``; bench_device.py)
TARGET = [Target()]
#: host bytes outcore's plans may offload into (``--allow-offload``: unbounded, None)
HOST_BUDGET: list[int | None] = [0]
#: ``--measured-ops``: the workload's measured per-op profile (``Target.measured_cost``).
COST: list[Any] = [None]
MEASURED_OPS = [False]
#: what outcore's budgets bound (``outcore.plan``'s ``scope``): "activations" under
#: ``--match activation``, so a budget compares directly to the peer's activation peak
SCOPE = ["step"]


def eager_step(model: nn.Module, w: Workload) -> Callable[[], Any]:
    def step() -> Any:
        loss = w.loss_fn(model(w.batch[0]), w.batch[1])
        loss.backward()
        return loss.detach()

    return step


def outcore_step(w: Workload, graph: Any, budget: int) -> tuple[Callable[[], Any], Any]:
    planned = outcore.plan(graph, budget, gpu=TARGET[0].gpu, simulate=False,
                           host_budget=HOST_BUDGET[0], cost=COST[0], scope=SCOPE[0])
    device = TARGET[0].executor_device()
    if device is not None:
        device.reserve_host(planned.host_sizes)
    executor = Executor(planned.graph, planned.schedule, device)
    def step() -> Any:
        return executor.run(w.batch).loss

    return step, planned


def peaks(step: Callable[[], Any], model: nn.Module) -> tuple[int, int]:
    """The step's (activation peak, step peak): allocator bytes over the step, with and
    without the gradients it makes (they are freed before the step, as
    ``zero_grad(set_to_none=True)`` does; module docstring)."""
    zero_grad(model)
    step()  # warm up (allocator caches, lazy inits)
    zero_grad(model)
    return TARGET[0].step_peaks(step, model, zero_grad)


#: What ``match_budget`` compares: index into ``peaks``'s pair (set by ``--match``).
MATCH = {"activation": 0, "step": 1}


def lowest_budget(graph: Any, static: int, bisect: int = 4) -> int:
    """The lowest budget outcore-auto accepts on this CPU (from its infeasibility error),
    climbing from ``static`` (from 1 byte under an activation scope: ``SCOPE``), then
    ``bisect`` halvings between the last refused budget and the first accepted one (a
    refusal names what its first candidate needs, which another may undercut). A plan that
    fails otherwise (``OutcoreError``) counts as refused."""
    def fits(budget: int) -> int | None:  # None: accepted; else what the refusal needs
        try:
            outcore.plan(graph, budget, gpu=TARGET[0].gpu, simulate=False,
                         host_budget=HOST_BUDGET[0], cost=COST[0], scope=SCOPE[0])
            return None
        except outcore.InfeasibleBudgetError as exc:
            return int(exc.required)
        except outcore.OutcoreError:
            return budget + 1

    refused, budget = 0, static if SCOPE[0] == "step" else 1
    for _ in range(6):  # each refusal names what its first candidate needs: climb to it
        needs = fits(budget)
        if needs is None:
            break
        refused, budget = budget, max(budget + 1, needs)
    for _ in range(bisect if refused else 0):
        mid = (refused + budget) // 2
        if mid <= refused:
            break
        if fits(mid) is None:
            budget = mid
        else:
            refused = mid
    return budget


def match_budget(w: Workload, graph: Any, target: int, lo: int, hi: int, match: int,
                 tries: int = 5) -> tuple[Callable[[], Any] | None, tuple[int, int], str]:
    """The plan with the largest measured peak (``peaks(...)[match]``) at most ``target``
    among budgets
    bisected in ``[lo, hi]`` (outcore-auto's lowest budget, its in-core peak). The planned
    peak holds the kernels' measured temporaries, but the peer's number leaves gradients
    out and outcore's budget counts them, so each budget is measured. The next budget is
    the last one moved by ``target`` less its measured peak (a plan's measured peak follows
    its budget nearly one for one: the budget also counts what the step holds before it
    starts), bisection where that step leaves ``(lo, hi)``. Returns the lowest plan, marked,
    when even that is above ``target``."""
    best: tuple[Callable[[], Any], tuple[int, int], str] | None = None
    lowest: tuple[Callable[[], Any], tuple[int, int], str] | None = None
    budget = lo
    for i in range(tries):
        step, planned = outcore_step(w, graph, budget)
        both = peaks(step, w.model)
        act = both[match]
        note = f"{_budget_words(budget)}, {planned.plan.policy}"
        if i == 0:
            lowest = (step, both, note + "; ABOVE the peer: outcore's lowest")
        if act <= target:
            if best is None or act > best[1][match]:
                best = (step, both, note)
            lo = budget
            if target - act < 0.02 * target:
                break
        else:
            if i == 0:
                break
            hi = budget
        guess = budget + target - act
        budget = guess if lo < guess < hi else (lo + hi) // 2
    return best or lowest or (None, (0, 0), "no plan")


# ---- outcore's plan with Inductor's kernels ---------------------------------------------------

Tool = tuple[Callable[[], Any], tuple[int, int], str]


#: ``outcore.inductor_backend``'s ``fusion`` (``--inductor-no-fusion`` turns it off).
FUSION = [True]
#: ``outcore.inductor_backend``'s ``fallback_random`` (``--inductor-own-random``: False).
FALLBACK_RANDOM = [True]
#: Inductor's ``fallback_random`` for the compile peer (``--compile-fallback-random``).
PEER_FALLBACK_RANDOM = [False]
#: ``outcore.inductor_backend``'s ``buffer_reuse`` (``--inductor-buffer-reuse``).
BUFFER_REUSE = [False]


def inductor_step(w: Workload, budget: int | None) -> tuple[Callable[[], Any], nn.Module, Any]:
    """A fresh copy of the model compiled with ``outcore.inductor_backend(budget)``, its first
    step run (the compile); returns the step, the copy and the graph's ``Partition``."""
    m = copy.deepcopy(w.model)
    be = outcore.inductor_backend(budget, gpu=TARGET[0].gpu, fusion=FUSION[0],
                                  fallback_random=FALLBACK_RANDOM[0],
                                  buffer_reuse=BUFFER_REUSE[0], scope=SCOPE[0])
    s = eager_step(torch.compile(m, backend=be, dynamic=False), w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InductorRoundingWarning)
        s()
    if not be.partitions:
        raise RuntimeError("no graph was partitioned: the row would not be outcore's plan")
    return s, m, be.partitions[0] if len(be.partitions) == 1 else _Joined(be.partitions)


class _Joined:
    """Several graphs (graph breaks): their partitions read as one for the notes and the
    budget search (peaks and bytes summed, as the graphs' budgets each apply separately)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.saved = [n for p in parts for n in p.saved]
        self.forced = [n for p in parts for n in p.forced]
        self.recomputed = sum(p.recomputed for p in parts)
        self.planned = parts[0].planned
        self.predicted_peak = max(p.predicted_peak for p in parts)
        self.scoped_peak = max(p.planned.scoped_peak for p in parts)


def _scoped_peak(part: Any) -> int:
    """What a ``Partition``'s budget bounded at its plan's peak (``SCOPE``'s peak)."""
    return int(part.scoped_peak if isinstance(part, _Joined) else part.planned.scoped_peak)


def _budget_words(budget: int) -> str:
    """``budget`` as the notes give it, naming an activation scope (``SCOPE``)."""
    return ("activation " if SCOPE[0] == "activations" else "") + \
        f"budget {budget / 2**20:.1f} MiB"


def _inductor_note(budget: int | None, part: Any) -> str:
    where = "unbounded" if budget is None else _budget_words(budget)
    return (f"{where}, {part.planned.plan.policy}, saves {len(part.saved)} "
            f"(forced {len(part.forced)}), recomputes {part.recomputed} ops")


class InductorMatcher:
    """Budgets for ``outcore+inductor`` rows matched to a peer's measured peak.

    The unbounded compile gives the graph outcore plans (Inductor's joint graph) and the gap
    between its measured peak and the plan's prediction (less what is held before the step);
    a target's first budget assumes that gap, and each try that measures above the target
    lowers the budget by the excess, at least 2% of the target (4 tries, each a compile;
    the last at the lowest budget)."""

    def __init__(self, w: Workload, match: int, log: Callable[[str], None]) -> None:
        self.w, self.match, self.log = w, match, log
        t0 = time.perf_counter()
        step, model, part = inductor_step(w, None)
        self.top: tuple[Tool, nn.Module] = (
            (step, peaks(step, model), _inductor_note(None, part)), model)
        graph = part.planned.graph
        # under an activation scope the budget and the measure both leave out what the
        # step finds allocated (parameters, inputs) and the gradients: no offset
        self.held = held_before(graph) if SCOPE[0] == "step" else 0
        self.ceiling = _scoped_peak(part)
        self.gap = self.top[0][1][match] - (self.ceiling - self.held)
        self.floor = lowest_budget(graph, graph.static_bytes())
        self.tried: dict[int, tuple[Tool, nn.Module]] = {}
        log(f"  outcore+inductor unbounded: {self.top[0][1][0] / 2**20:.1f} / "
            f"{self.top[0][1][1] / 2**20:.1f} MiB, predicted {part.predicted_peak / 2**20:.1f}"
            f" MiB ({SCOPE[0]} scope: {self.ceiling / 2**20:.1f}), lowest budget "
            f"{self.floor / 2**20:.1f} MiB "
            f"({time.perf_counter() - t0:.0f} s)")

    def _compiled(self, budget: int) -> tuple[Tool, nn.Module]:
        """The model compiled and measured at ``budget`` (each budget compiled once)."""
        if budget not in self.tried:
            step, model, part = inductor_step(self.w, budget)
            self.tried[budget] = ((step, peaks(step, model), _inductor_note(budget, part)),
                                  model)
        return self.tried[budget]

    def at(self, target: int, tries: int = 4, closer: int = 3) -> tuple[Tool, nn.Module]:
        """The compile whose measured peak is the largest found at most ``target``: up to
        ``tries`` compiles lowering the budget by the measured excess (the last one, or one
        after a try that measured no lower, at the lowest budget), then up to ``closer``
        above the fitting budget while the slack left under ``target`` is over 2% (more
        memory, less recomputation; ``_closer``); the lowest one, marked, when none is at most
        ``target``."""
        if self.top[0][1][self.match] <= target:
            return self.top
        if self.floor >= self.ceiling:  # no plan below the unbounded one
            (step, both, note), model = self.top
            return (step, both, note + "; ABOVE the peer (no lower plan)"), model
        budget = min(max(target + self.held - self.gap, self.floor), self.ceiling)
        best: tuple[Tool, nn.Module] | None = None
        fits: tuple[tuple[Tool, nn.Module], int] | None = None
        for attempt in range(tries):
            try:
                tool, model = self._compiled(budget)
            except outcore.InfeasibleBudgetError as exc:  # the floor was an estimate
                self.floor = budget = min(max(budget + 1, int(exc.required)), self.ceiling)
                continue
            both = tool[1]
            if both[self.match] <= target:
                fits = (tool, model), budget
                break
            if best is not None and both[self.match] >= best[0][1][self.match]:
                budget = self.floor  # a lower budget measured no lower: go to the floor
                continue
            if best is None or both[self.match] < best[0][1][self.match]:
                best = (tool[0], tool[1], tool[2].removesuffix("; ABOVE the peer")
                        + "; ABOVE the peer"), model
            if budget == self.floor:
                break
            # lowered by the excess, at least 2% of the target: a few bytes over lower the
            # budget by too little to change the plan (the same compile would measure again)
            budget = max(self.floor, budget - max(both[self.match] - target, target // 50))
            if attempt == tries - 2:
                budget = self.floor  # the last try: the lowest plan
        if fits is None:
            assert best is not None
            return best
        return self._closer(target, fits, closer)

    def _closer(self, target: int, fits: tuple[tuple[Tool, nn.Module], int],
                closer: int) -> tuple[Tool, nn.Module]:
        """Up to ``closer`` compiles above a fitting budget: the first raised by the slack
        left under ``target``, then bisecting between the highest budget that fitted and the
        lowest that measured above ``target`` (the measured peak is not monotone in the budget:
        a plan's real peak may sit where outcore's model does not put it). Returns the compile
        with the largest measured peak at most ``target``."""
        (best, budget), over = fits, self.ceiling + 1
        step = target - best[0][1][self.match]
        for _ in range(closer):
            if target - best[0][1][self.match] <= 0.02 * target:
                break
            higher = min(budget + step, self.ceiling) if over > self.ceiling \
                else (budget + over) // 2
            if higher <= budget or higher >= over:
                break
            try:
                tried = self._compiled(higher)
            except outcore.InfeasibleBudgetError:
                break
            measured = tried[0][1][self.match]
            if measured > target:
                over = higher
                continue
            budget = higher
            if measured > best[0][1][self.match]:
                best = tried
            step = max(target - measured, 1)
        return best


# ---- the run --------------------------------------------------------------------------------

def run_model(w: Workload, rounds: int, compile_budget: float, skip_compile: bool,
              log: Callable[[str], None], match: int = MATCH["step"],
              skip_inductor: bool = False, skip_executor: bool = False) -> list[Row]:
    tools: dict[str, tuple[Callable[[], Any], tuple[int, int], str]] = {}
    models: dict[str, nn.Module] = {}
    eager_model = w.model
    s = eager_step(eager_model, w)
    tools["eager"] = (s, peaks(s, eager_model), "")
    for name, sel in (("checkpoint", False), ("selective", True)):
        m, n = wrap_blocks(w.model, sel)
        s = eager_step(m, w)
        tools[name] = (s, peaks(s, m), f"{n} blocks")
        models[name] = m
    if not skip_compile:
        import torch._functorch.config as fconfig

        torch._dynamo.reset()
        fconfig.activation_memory_budget = compile_budget
        m = copy.deepcopy(w.model)
        cm = torch.compile(m, options={"fallback_random": True} if PEER_FALLBACK_RANDOM[0]
                           else None)
        t0 = time.perf_counter()
        s = eager_step(cm, w)
        s()
        took = time.perf_counter() - t0
        grads = peer_note(s, m, w.model, lambda mod: eager_step(mod, w),
                          PEER_FALLBACK_RANDOM[0])
        log(f"  torch.compile took {took:.0f} s; {grads}")
        tools[f"compile {compile_budget}"] = (s, peaks(s, m), f"compiled in {took:.0f} s; "
                                              + grads)
        models[f"compile {compile_budget}"] = m
    log("  " + ", ".join(f"{k}: {v[1][0] / 2**20:.1f} / {v[1][1] / 2**20:.1f} MiB"
                         for k, v in tools.items()) + " (activation / step peak)")
    peers = [] if skip_executor else [k for k in tools if k != "eager"]
    if peers:
        graph = outcore.capture(w.model, w.loss_fn, w.batch)
        # the plans budget the kernels' temporaries
        measure_temporaries(graph, w.batch, device=TARGET[0].kind)
        COST[0] = TARGET[0].measured_cost(graph, w.batch) if MEASURED_OPS[0] else None
        static = sum(p.numel() * p.element_size() for p in w.model.parameters())
        lo = lowest_budget(graph, static)
        hi = outcore.plan(graph, None, gpu=TARGET[0].gpu, simulate=False,
                          host_budget=HOST_BUDGET[0], cost=COST[0],
                          scope=SCOPE[0]).scoped_peak
    for peer in peers:
        t0 = time.perf_counter()
        step, act, note = match_budget(w, graph, tools[peer][1][match], lo, hi, match)
        log(f"  outcore @ {peer}: {act[0] / 2**20:.1f} / {act[1] / 2**20:.1f} MiB ({note}; "
            f"{time.perf_counter() - t0:.0f} s to match)")
        if step is not None:
            tools[f"outcore @ {peer}"] = (step, act, note)
    if not skip_inductor:
        matcher = InductorMatcher(w, match, log)
        for peer in [k for k in tools if k != "eager" and not k.startswith("outcore")]:
            t0 = time.perf_counter()
            tool, model = matcher.at(tools[peer][1][match])
            log(f"  outcore+inductor @ {peer}: {tool[1][0] / 2**20:.1f} / "
                f"{tool[1][1] / 2**20:.1f} MiB ({tool[2]}; "
                f"{time.perf_counter() - t0:.0f} s to match)")
            tools[f"outcore+inductor @ {peer}"] = tool
            models[f"outcore+inductor @ {peer}"] = model
    rows = {k: Row(w.name, k, act, whole, note=note)
            for k, (_, (act, whole), note) in tools.items()}
    for _ in range(rounds):
        for k in round_order(list(tools)):
            zero_grad(models.get(k, w.model))
            rows[k].seconds.append(TARGET[0].timed(tools[k][0]))
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--large", action="store_true",
                        help="GPU-sized models (bench_device.LARGE); meant for --device cuda")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where every tool's steps run (bench_device.py)")
    parser.add_argument("--allow-offload", action="store_true",
                        help="outcore's plans may offload to host memory (default: recompute "
                             "only, host_budget=0; on the CPU offloading saves nothing)")
    parser.add_argument("--measured-ops", action="store_true",
                        help="outcore @ rows plan with each op's time measured in a step on "
                             "the device (bench_device.Target.measured_cost), not the profile")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile-budget", type=float, default=0.5)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-inductor", action="store_true",
                        help="leave out the outcore+inductor rows (each is a compile)")
    parser.add_argument("--skip-executor", action="store_true",
                        help="leave out the outcore @ rows (outcore's own executor)")
    parser.add_argument("--inductor-no-fusion", action="store_true",
                        help="outcore+inductor planned op by op (fusion=False)")
    parser.add_argument("--inductor-own-random", action="store_true",
                        help="outcore+inductor rows draw dropout with Inductor's inline "
                             "generator (fallback_random=False; the default is eager's, "
                             "outcore.inductor_backend's default)")
    parser.add_argument("--inductor-fallback-random", action="store_true",
                        help="accepted for old commands: eager's generator is the default")
    parser.add_argument("--compile-fallback-random", action="store_true",
                        help="the compile peer draws dropout with eager's generator "
                             "(Inductor's fallback_random)")
    parser.add_argument("--inductor-buffer-reuse", action="store_true",
                        help="outcore+inductor rows with Inductor's buffer reuse on "
                             "(allow_buffer_reuse; off by default: outcore.inductor_backend)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--match", choices=list(MATCH), default="step",
                        help="the peak outcore's budget is matched on (module docstring)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    FUSION[0] = not args.inductor_no_fusion
    if args.inductor_own_random and args.inductor_fallback_random:
        parser.error("--inductor-own-random and --inductor-fallback-random contradict")
    FALLBACK_RANDOM[0] = not args.inductor_own_random
    PEER_FALLBACK_RANDOM[0] = args.compile_fallback_random
    BUFFER_REUSE[0] = args.inductor_buffer_reuse
    # every compiled copy of a model is a new dynamo cache entry for the same code: keep all
    # (past the default limit dynamo would silently run the newest copies eagerly)
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    rounds = args.rounds or (5 if args.quick else 15)
    TARGET[0] = Target.of(args.device)
    HOST_BUDGET[0] = None if args.allow_offload else 0
    MEASURED_OPS[0] = args.measured_ops
    SCOPE[0] = "activations" if args.match == "activation" else "step"
    size = "quick" if args.quick else "large" if args.large else "full"

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows: list[Row] = []
    for name in args.models:
        w = WORKLOADS[name](size)
        w.model, w.batch = TARGET[0].move(w.model, w.batch)
        log(f"{name}: {w.about}")
        done = run_model(w, rounds, args.compile_budget, args.skip_compile, log,
                         MATCH[args.match], args.skip_inductor, args.skip_executor)
        log(table(done))  # each model's table as soon as it is done (long runs get cut)
        rows.extend(done)
    where = (torch.cuda.get_device_name() + f" (profile {TARGET[0].gpu})" if TARGET[0].cuda
             else f"{torch.get_num_threads()} threads")
    draws = "eager's" if FALLBACK_RANDOM[0] else "Inductor's"
    peer_draws = "eager's" if PEER_FALLBACK_RANDOM[0] else "Inductor's"
    print(f"torch {torch.__version__}, {where}, {rounds} rounds; dropout: outcore+inductor "
          f"on {draws} generator, compile peer on {peer_draws}\n")
    print(table(rows))
    print()
    for line in verdicts(rows, args.match):
        print("* " + line)
    if args.json:
        write_json(rows, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
