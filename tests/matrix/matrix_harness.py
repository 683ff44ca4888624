"""One matrix cell: a model of ``matrix_models`` under one policy, against eager PyTorch.

``run_cell(case, policy)`` builds the model twice from one seed, trains one step eagerly and
one through ``outcore.compile`` on ``cpu-emulated`` at a budget between the layer-wise lower
bound and the in-core peak (60% of the way; a policy that refuses it runs at the least
budget it names, and the cell says so), with the same RNG seed, and returns every
difference (against eager run as the same sub-batches when the plan split the batch): the loss,
each parameter's ``.grad`` (None where eager has None), each batch tensor's ``.grad``, every
buffer (BatchNorm statistics), each module's ``training`` flag and the model's structure
(parameter objects, no traced tensors left behind), and the measured peak against the
predicted one. A cell that raises is a failure with its exception.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from matrix_models import Case
from torch import nn

import outcore
from outcore.errors import InfeasibleBudgetError, OutcoreError, OutcoreWarning
from outcore.graph.bounds import reference_peaks

FRACTION = 0.6
SEED = 11


@dataclass
class Cell:
    case: str
    policy: str
    budget: int = 0
    #: the policy refused the budget between bound and peak: run at the least it names
    at_minimum: bool = False
    sub_batches: int = 1
    predicted: int = 0
    measured: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def clone_batch(batch: Any) -> Any:
    """A copy whose leaves keep ``requires_grad`` (each run gets its own ``.grad``)."""
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        c = t.detach().clone()
        return c.requires_grad_(t.requires_grad)
    return tuple(one(t) for t in batch)


def budgets(case: Case) -> tuple[int, int]:
    """(between bound and peak, in-core peak) for the case's step."""
    graph = outcore.capture(case.build(), case.loss_fn, case.example())
    peak = outcore.plan(graph, None, policy="liveness", simulate=False).predicted_peak
    floor = reference_peaks(graph).layer_lower_bound
    return floor + int((peak - floor) * FRACTION), peak


def eager_step(model: nn.Module, case: Case, batch: Any, parts: int = 1) -> torch.Tensor:
    """One eager step; with ``parts`` sub-batches, as a sub-batched plan computes it (each
    part's mean loss weighted 1/parts, BatchNorm statistics per part: what the user opted
    into with moDNN or ``allow_sub_batches``)."""
    from outcore.runtime.subbatch import split_batch

    torch.manual_seed(SEED)
    if parts == 1:
        x, y = batch
        loss = case.loss_fn(model(x), y)
        loss.backward()
        return loss.detach()
    losses = []
    # (a tensor that requires grad is cut into views, so its .grad gathers every part's)
    xs, ys = (t.chunk(parts) if t.requires_grad else split_batch(t.detach(), parts)
              for t in batch)
    for x, y in zip(xs, ys, strict=True):
        loss = case.loss_fn(model(x), y)
        (loss / parts).backward()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


def compare(tag: str, got: torch.Tensor | None, want: torch.Tensor | None,
            tol: tuple[float, float] | None, problems: list[str]) -> None:
    if want is None or got is None:
        if (want is None) != (got is None):
            problems.append(f"{tag}: {'None' if got is None else 'set'} vs eager "
                            f"{'None' if want is None else 'set'}")
        return
    if got.shape != want.shape or got.dtype != want.dtype:
        problems.append(f"{tag}: {tuple(got.shape)} {got.dtype} vs eager "
                        f"{tuple(want.shape)} {want.dtype}")
        return
    same = (torch.equal(got, want) if tol is None
            else torch.allclose(got.float(), want.float(), rtol=tol[0], atol=tol[1]))
    if not same:
        err = (got.float() - want.float()).abs().max().item()
        problems.append(f"{tag}: differs from eager by {err:.3g}")


def compare_models(ours: nn.Module, ref: nn.Module, tol: tuple[float, float] | None,
                   problems: list[str]) -> None:
    """Every parameter's grad, every buffer, flags and structure, against ``ref``."""
    mine = dict(ours.named_parameters(remove_duplicate=False))
    theirs = dict(ref.named_parameters(remove_duplicate=False))
    for name, p in mine.items():
        if type(p) is not nn.Parameter:
            problems.append(f"parameter {name} is a {type(p).__name__} after the step")
        compare(f"{name}.grad", p.grad, theirs[name].grad, tol, problems)
        compare(f"{name} value", p.detach(), theirs[name].detach(), None, problems)
    bufs = dict(ref.named_buffers(remove_duplicate=False))
    for name, b in ours.named_buffers(remove_duplicate=False):
        compare(f"buffer {name}", b, bufs[name], tol, problems)
    flags = [(n, m.training) for n, m in ours.named_modules()]
    if flags != [(n, m.training) for n, m in ref.named_modules()]:
        problems.append("training flags differ from the model's own after the step")


def run_cell(case: Case, policy: str) -> Cell:
    """One cell (module docstring)."""
    cell = Cell(case.name, policy)
    try:
        _run(case, policy, cell)
    except Exception as exc:  # noqa: BLE001 - a failure is a cell, with its reason
        cell.problems.append(f"{type(exc).__name__}: {exc}")
    return cell


def _run(case: Case, policy: str, cell: Cell) -> None:
    between, _ = budgets(case)
    model, ref = case.build(), case.build()
    flags_before = [m.training for m in model.modules()]
    batch = case.example()
    ours_batch, ref_batch = clone_batch(batch), clone_batch(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutcoreWarning)
        trainer, budget = None, between
        for _ in range(3):  # a policy that cannot reach ``between`` runs at its own minimum
            try:
                trainer = outcore.compile(model, case.loss_fn, ours_batch, budget=budget,
                                          device="cpu-emulated", policy=policy)
                break
            except InfeasibleBudgetError as exc:
                budget = max(exc.required, budget + 1)
                cell.at_minimum = True
        if trainer is None:
            raise OutcoreError(f"{policy} refused every budget up to {budget}")
        cell.budget = budget
        with trainer:
            torch.manual_seed(SEED)
            got = trainer.step(*ours_batch)
            cell.predicted = trainer.stats.predicted_peak
            cell.measured = trainer.stats.measured_peak
            cell.sub_batches = trainer.stats.sub_batches
    coupled = any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                  for m in ref.modules())
    # sub-batches change what BatchNorm computes (documented, opted in): compare with eager
    # run the same way; anything else must equal the full batch's eager step
    want = eager_step(ref, case, ref_batch, cell.sub_batches if coupled else 1)
    if [m.training for m in model.modules()] != flags_before:
        cell.problems.append("training flags changed by compile/step")
    compare("loss", got, want, case.tol, cell.problems)
    compare_models(model, ref, case.tol, cell.problems)
    for i, (a, b) in enumerate(zip(ours_batch, ref_batch, strict=True)):
        if isinstance(a, torch.Tensor):
            compare(f"batch[{i}].grad", a.grad, b.grad, case.tol, cell.problems)
    if cell.measured != cell.predicted:
        cell.problems.append(f"measured peak {cell.measured} != predicted {cell.predicted}")
    if cell.measured > cell.budget:
        cell.problems.append(f"measured peak {cell.measured} over the budget {cell.budget}")
    eager_after = model(clone_batch(batch)[0])  # the user's model still runs eagerly
    if not torch.isfinite(eager_after.float()).all():
        cell.problems.append("the model's eager output after the step is not finite")
