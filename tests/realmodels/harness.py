"""One corpus model, one training step under one policy, compared with eager PyTorch.

``check(case, policy)`` builds the model twice from one seed, runs one eager step and one step
through ``outcore.compile`` on ``cpu-emulated`` halfway between the model's layer-wise lower
bound and its in-core peak (``liveness``: everything kept, freed at last use; ``in_core_peak``
says why not half the peak itself), and returns what differs: the loss, each gradient, each
buffer (BatchNorm statistics updated once), and whether the measured peak equals the
predicted one within the budget. ``policy="backend"`` runs the step through
``torch.compile(model, backend=outcore.backend(...))`` instead, and is compared bit-exact
with the same model through ``torch.compile(backend="aot_eager")``: the same dynamo graphs and
the same joint ATen graphs, run by PyTorch without outcore. Those may differ from eager in
rounding before outcore runs (Hugging Face builds an explicit causal mask under dynamo where
eager uses SDPA's ``is_causal``; across a graph break a gradient's contributions are summed in
another order), so against eager the backend is held to ``rtol=1e-3`` only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import outcore
from outcore.capture.batching import call_model, loss_of, step_loss

from corpus import Case

POLICIES = ["outcore-auto", "offload-all", "recompute-cheap", "superneurons", "pooch", "modnn",
            "backend"]


@dataclass
class Outcome:
    """What one (model, policy) pair showed; ``ok`` when nothing differs."""

    case: str
    policy: str
    budget: int = 0
    predicted: int = 0
    measured: int = 0
    problems: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    #: set when float32 differences were judged by the float64 run (``float64_verdict``)
    float64: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def in_core_peak(case: Case) -> tuple[int, int, int]:
    """(ops, in-core peak, budget): the peak with everything kept and freed at last use, and
    the budget the corpus runs at: halfway between the layer-wise lower bound (parameters,
    inputs, the largest op) and that peak. At tiny sizes parameters and gradients are most
    of the peak, so half the peak itself is below what any policy can reach."""
    from outcore.graph.bounds import reference_peaks

    model = case.build()
    graph = outcore.capture(model, case.loss_fn, case.batch())
    planned = outcore.plan(graph, None, policy="liveness", simulate=False)
    floor = reference_peaks(graph).layer_lower_bound
    peak = planned.predicted_peak
    return len(graph.ops), peak, floor + (peak - floor) // 2


def _compiled_loss(model: nn.Module, case: Case, batch: Any) -> torch.Tensor:
    """The loss of ``model`` (a ``torch.compile``d module) on ``batch``."""
    if case.loss_fn is None:
        return loss_of(call_model(model, batch))
    x, y = batch
    return case.loss_fn(call_model(model, x), y)


def aot_eager_step(model: nn.Module, case: Case, batch: Any) -> torch.Tensor:
    """One step through ``torch.compile(backend="aot_eager")``: PyTorch's own reference
    backend, which runs the joint graphs outcore's backend plans, without outcore."""
    torch._dynamo.reset()
    model.train()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    try:
        torch.manual_seed(7)
        loss = _compiled_loss(compiled, case, batch)
        loss.backward()
    finally:
        torch._dynamo.reset()
    return loss.detach()


def eager_step(model: nn.Module, case: Case, batch: Any, parts: int = 1,
               full_draws: bool = False) -> torch.Tensor:
    """One eager step; with ``parts`` sub-batches, as moDNN's gradient accumulation runs it
    (each sub-batch's loss weighted 1/parts, BatchNorm statistics per sub-batch). With
    ``full_draws`` (outcore said its random ops draw eager's numbers), each sub-batch's
    random ops use their rows of the full batch's draws (``eager_draws``)."""
    from eager_draws import Replay, record_draws

    from outcore.runtime.subbatch import split_batch

    model.train()
    torch.manual_seed(7)
    draws: list[torch.Tensor] | None = None
    if parts > 1 and full_draws:
        twin = copy.deepcopy(model)  # the recording forward must not touch BatchNorm's stats
        draws = record_draws(lambda: step_loss(twin, case.loss_fn, batch))
    losses = []
    for i, sub in enumerate(split_batch(batch, parts) if parts > 1 else [batch]):
        if draws is not None:
            with Replay(draws, i, parts):
                loss = step_loss(model, case.loss_fn, sub)
        else:
            loss = step_loss(model, case.loss_fn, sub)
        (loss * (1.0 / parts) if parts > 1 else loss).backward()
        losses.append(loss.detach())
    return losses[0] if parts == 1 else torch.stack(losses).mean()


def _same_grad(p: torch.Tensor, q: torch.Tensor, loose: bool) -> bool:
    """Bit-exact, except (``loose``) for plans that chose operator algorithms other than the
    framework's (another summation order by design). A tied parameter used three times or
    more is bit-exact too (its contributions are summed in autograd's order since session
    29; BART's and T5's shared embedding had been let off by a tolerance before)."""
    if torch.equal(p, q):
        return True
    return loose and torch.allclose(p, q, rtol=1e-3, atol=1e-5)


def _compare(outcome: Outcome, model: nn.Module, reference: nn.Module, loss: torch.Tensor,
             expected: torch.Tensor) -> None:
    loose = bool(outcome.variants)
    if not (torch.equal(loss, expected) or (loose and torch.allclose(loss, expected, rtol=1e-3))):
        outcome.problems.append(f"loss {float(loss)} != eager {float(expected)}")
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if (p.grad is None) != (q.grad is None):
            outcome.problems.append(f"grad of {name}: {p.grad is None} vs eager "
                                    f"{q.grad is None} for None")
        elif p.grad is not None and not _same_grad(p.grad, q.grad, loose):
            diff = float((p.grad - q.grad).abs().max())
            outcome.problems.append(f"grad of {name} differs by {diff:.3g}")
    for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        if not (torch.equal(b, c) or (loose and b.is_floating_point()
                                       and torch.allclose(b, c, rtol=1e-3, atol=1e-5))):
            outcome.problems.append(f"buffer {name} differs from eager")


def check(case: Case, policy: str, budget: int) -> Outcome:
    """One step of ``case`` under ``policy`` within ``budget`` bytes, against eager.

    A policy that cannot reach ``budget`` (InfeasibleBudgetError) is run again at the least
    budget it named (a few times: some policies name a lower estimate); ``Outcome.budget``
    records the budget the step ran at."""
    for _ in range(4):
        try:
            return _check(case, policy, budget)
        except outcore.InfeasibleBudgetError as err:
            budget = max(err.required, budget + 1)
    return _check(case, policy, budget)


def _check(case: Case, policy: str, budget: int) -> Outcome:
    model = case.build()
    reference = copy.deepcopy(model)
    batch = case.batch()
    outcome = Outcome(case.name, policy, budget)
    full_draws = rounding = False
    if policy == "backend":
        loss, variants, parts = _backend_step(model, case, batch, budget, outcome)
    else:
        trainer = outcore.compile(model, case.loss_fn, batch, budget=budget,
                                  device="cpu-emulated", policy=policy)
        try:
            torch.manual_seed(7)
            loss = trainer.step(batch)
        finally:
            trainer.close()
        outcome.predicted = trainer.stats.predicted_peak
        outcome.measured = trainer.stats.measured_peak
        variants = _variants([trainer.planned.schedule])
        parts = trainer.stats.sub_batches
        full_draws = any("same masks as eager" in n for n in trainer.stats.notes)
        # an op traced otherwise than eager's kernel, said (RoundingWarning): an LSTM
        rounding = any("by float rounding" in n for n in trainer.stats.notes)
    if policy == "backend":
        eager = copy.deepcopy(reference)
        expected = aot_eager_step(reference, case, batch)
        _against_eager(outcome, reference, eager, expected, eager_step(eager, case, batch))
    else:
        expected = eager_step(reference, case, batch, parts, full_draws)
    if outcome.measured != outcome.predicted:
        outcome.problems.append(f"measured peak {outcome.measured} != predicted "
                                f"{outcome.predicted}")
    if outcome.predicted > budget:
        outcome.problems.append(f"predicted peak {outcome.predicted} > budget {budget}")
    # another summation order by design, said: compared as a variant's (loosely)
    outcome.variants = variants + (["rnn-decomposition"] if rounding else [])
    _compare(outcome, model, reference, loss, expected)
    values = ("loss ", "grad of ", "buffer ")
    if variants and outcome.problems and all(p.startswith(values) for p in outcome.problems):
        verdict = float64_verdict(case, policy, budget)
        outcome.float64 = verdict or "float64 run agrees with eager float64"
        if verdict is None:
            outcome.problems = []
        else:
            outcome.problems.append(verdict)
    return outcome


def _against_eager(outcome: Outcome, compiled: nn.Module, eager: nn.Module,
                   loss: torch.Tensor, expected: torch.Tensor) -> None:
    """torch.compile's own reference (``compiled``, after its step) within rtol 1e-3 of
    eager: what dynamo and AOT autograd change is rounding, never the result."""
    if not torch.allclose(loss, expected, rtol=1e-3):
        outcome.problems.append(f"aot_eager loss {float(loss)} far from eager {float(expected)}")
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        if p.grad is not None and q.grad is not None \
                and not torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5):
            outcome.problems.append(f"aot_eager grad of {name} far from eager")


def _variants(schedules: list[Any]) -> list[str]:
    """The operator algorithms other than the framework's a plan chose (opted in by the
    policy: SuperNeurons and moDNN pick convolution/attention algorithms by workspace)."""
    return sorted({v for s in schedules for v in s.variants.values() if v != "framework"})


def _backend_step(model: nn.Module, case: Case, batch: Any, budget: int,
                  outcome: Outcome) -> tuple[torch.Tensor, list[str], int]:
    torch._dynamo.reset()
    be = outcore.backend(budget, device="cpu-emulated")
    compiled = torch.compile(model, backend=be, dynamic=False)
    try:
        torch.manual_seed(7)
        loss = _compiled_loss(compiled, case, batch)
        loss.backward()
    finally:
        be.close()
        torch._dynamo.reset()
    if be.graphs:
        outcome.predicted = max(g.stats.predicted_peak for g in be.graphs)
        outcome.measured = max(g.stats.measured_peak for g in be.graphs)
    return loss.detach(), _variants([g.planned.schedule for g in be.graphs]), 1


#: Float64 loss and gradients of a plan with variants, relative to eager float64's: at
#: least this, and ``CONDITIONING`` times what a 1e-15 relative change of the parameters
#: moves eager float64 by (``float64_sensitivity``).
FLOAT64_RTOL = 1e-6
CONDITIONING = 100.0


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _double(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_double(v) for v in value)
    return value


def _relative_errors(pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """name -> max|got - want| / max|want|; a gradient that is zero but for rounding (a bias
    before a normalisation) is measured against a millionth of the largest gradient."""
    grads = [float(w.abs().max()) for name, _, w in pairs if name != "loss"]
    floor = 1e-6 * max(grads, default=0.0)
    return {name: float((got - want).abs().max()) / (max(float(want.abs().max()), floor) or 1.0)
            for name, got, want in pairs}


def _eager64(case: Case, model: nn.Module, batch: Any, parts: int
             ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    loss = eager_step(model, case, batch, parts)
    return [("loss", loss, loss)] + [(f"grad of {n}", p.grad, p.grad)
                                     for n, p in model.named_parameters() if p.grad is not None]


def float64_sensitivity(case: Case, batch: Any, parts: int) -> float:
    """How far eager float64 itself moves when every parameter changes by 1e-15 (relative):
    the model's conditioning, the scale of any other last-bit change such as a variant's."""
    base = case.build().double()
    nudged = copy.deepcopy(base)
    with torch.no_grad():
        for p in nudged.parameters():
            if p.is_floating_point():
                p.mul_(1 + 1e-15)
    a, b = _eager64(case, base, batch, parts), _eager64(case, nudged, batch, parts)
    pairs = [(name, y, x) for (name, x, _), (_, y, _) in zip(a, b, strict=True)]
    return max(_relative_errors(pairs).values(), default=0.0)


def float64_verdict(case: Case, policy: str, budget: int) -> str | None:
    """Judge a float32 difference of a plan that chose operator variants.

    Tiny random-init CNNs with BatchNorm over two samples are ill-conditioned: at 1x1
    spatial size a BatchNorm's output is the sign of a difference of two nearly equal
    values, so a last-bit change (another summation order, which is what a variant is)
    moves eager float32's own loss further from the float64 truth than any tolerance
    (tv_resnet50: float32 4.22, float64 3.47). A wrong variant or plan is wrong in float64
    as well; a rounding difference shrinks there by float64's precision. So the same policy
    runs the model in float64 at twice the budget (every size doubles), must choose variants
    again, and must give eager float64's loss and gradients within
    ``max(FLOAT64_RTOL, CONDITIONING * float64_sensitivity)`` (the most ill-conditioned
    corpus models move by 2e-5 in float64 from a 1e-15 change of their parameters).
    Returns None when it does, else the problem.
    """
    model = case.build().double()
    reference = copy.deepcopy(model)
    batch = _double(case.batch())
    try:
        with outcore.compile(model, case.loss_fn, batch, budget=2 * budget,
                             device="cpu-emulated", policy=policy) as trainer:
            torch.manual_seed(7)
            loss = trainer.step(batch)
            variants = _variants([trainer.planned.schedule])
            parts = trainer.stats.sub_batches
    except outcore.OutcoreError as err:
        return f"float64 run failed: {type(err).__name__}: {str(err)[:120]}"
    if not variants:
        return "float64 run chose no operator variants, so it cannot judge them"
    expected = eager_step(reference, case, batch, parts)
    pairs = [("loss", loss, expected)] + [
        (f"grad of {n}", p.grad, q.grad)
        for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True)
        if p.grad is not None and q.grad is not None]
    errors = _relative_errors(pairs)
    worst = max(errors, key=errors.__getitem__)
    if errors[worst] <= FLOAT64_RTOL:
        return None
    allowed = max(FLOAT64_RTOL, CONDITIONING * float64_sensitivity(case, batch, parts))
    if errors[worst] <= allowed:
        return None
    return (f"float64: {worst} differs by {errors[worst]:.3g} (relative; allowed {allowed:.3g} "
            f"from the model's conditioning) with {variants}")
