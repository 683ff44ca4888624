"""``outcore.inductor_backend``: outcore's recompute plan run by Inductor's fused kernels.

Differential tests: gradients against eager PyTorch (to Inductor's rounding, which the
backend announces) and, with dropout under ``fallback_random=False``, against plain
``torch.compile`` at the same seed (both draw from Inductor's RNG, so the masks must be the
same draws; the default, eager's generator, is tested in ``test_dropout.py``); the saved
set against the plan's kept set; the CPU allocator's peak against the plan's predicted peak.
Each compile takes seconds (Inductor generates C++), so the models are tiny and each test
compiles once.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore.compiled import InductorRoundingWarning, OffloadNotCompiledError
from outcore.compiled.partition import planned_draws
from outcore.runtime.devices.allocator_peak import allocator_peak, held_before

TINY = {"seq_len": 64, "n_layer": 2, "n_head": 2, "d_model": 64}


def _workload(dropout: float):
    return outcore.zoo.get("transformer", 4, vocab=128, dropout=dropout, tie_weights=False,
                           **TINY)


def _whole_step(model: nn.Module, loss_fn):
    """The compiled function holds the loss too, so the plan covers the whole step."""

    def step(x, y):
        return loss_fn(model(x), y)

    return step


def _compiled_step(w, backend):
    """One training step of ``w`` (forward, loss, backward) compiled whole with ``backend``;
    returns the detached loss."""
    compiled = torch.compile(_whole_step(w.model, w.loss_fn), backend=backend, dynamic=False)

    def step():
        loss = compiled(*w.batch)
        loss.backward()
        return loss.detach()

    return step


def _measured_compile(w, backend) -> tuple[int, object]:
    """Compile ``w``'s step with ``backend`` (the first call, warning of Inductor's rounding),
    then measure one step's allocator peak; returns it and the one ``Partition``."""
    step = _compiled_step(w, backend)
    with pytest.warns(InductorRoundingWarning):
        step()
    _zero(w.model)
    measured = allocator_peak(step).peak
    [part] = backend.partitions
    return measured, part


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _zero(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _lowest_recompute_budget(w, share: float = 0.5) -> int:
    """A budget ``share`` of the way from the lowest recompute-only plan to the in-core peak
    (halfway by default), so the plan must recompute (found on outcore's own capture of the
    same step)."""
    graph = outcore.capture(w.model, w.loss_fn, w.batch)
    top = outcore.plan(graph, None, gpu="this-cpu", simulate=False,
                       host_budget=0).predicted_peak
    low = top // 4
    for _ in range(6):  # each refusal names what its first candidate needs: climb to it
        try:
            outcore.plan(graph, low, gpu="this-cpu", simulate=False, host_budget=0)
            break
        except outcore.InfeasibleBudgetError as exc:
            low = max(low + 1, int(exc.required))
    return low + int((top - low) * share)


def test_gradients_match_eager_and_the_saved_set_is_the_plans():
    w = _workload(0.0)
    eager = copy.deepcopy(w.model)
    be = outcore.inductor_backend(budget=_lowest_recompute_budget(w), gpu="this-cpu")
    compiled = torch.compile(_whole_step(w.model, w.loss_fn), backend=be, dynamic=False)
    with pytest.warns(InductorRoundingWarning, match="not bit for bit"):
        loss = compiled(*w.batch)
    loss.backward()
    reference = w.loss_fn(eager(w.batch[0]), w.batch[1])
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    for got, want in zip(_grads(w.model), _grads(eager), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

    [part] = be.partitions
    assert part.recomputed > 0, "the budget should make the plan recompute"
    # what the forward graph returns beyond the loss is exactly the saved set
    assert set(part.saved) == set(part.forward_saved)
    # the forward saves nothing the plan does not hold at the cut, besides graph inputs and
    # forced nodes (RNG seeds, none here), and no more bytes than the plan holds there
    assert not part.outside_plan
    assert not part.forced
    assert set(part.kept) <= part.plan_kept
    extra = set(part.saved) - set(part.kept)
    assert all(name.startswith("primals") for name in extra), extra
    assert 0 < part.saved_bytes <= part.plan_kept_bytes


@pytest.mark.parametrize("share", [0.5, 0.75])
def test_dropout_draws_as_plain_torch_compile_at_the_same_seed(share):
    """With ``fallback_random=False`` (the default is eager's generator) both draw from
    Inductor's RNG; the dropout masks must be the same draws, kept or drawn again in the
    backward. The two partitions fuse differently, so the gradients agree to rounding;
    another seed's masks move them far beyond that tolerance (checked, so the tolerance can
    fail). The compiled backward draws again exactly where the plan does: at 75% of the way
    to the in-core peak the plan keeps every mask (fused-first keeps what Inductor would
    draw again first), where plain torch.compile's min-cut re-draws them; at 50% it must
    draw one again (the light point-wise values Inductor inlines into several kernels hold
    their inputs to the last of them, ``fusion._inline_shared``)."""
    w = _workload(0.1)
    twin = copy.deepcopy(w.model)
    be = outcore.inductor_backend(budget=_lowest_recompute_budget(w, share), gpu="this-cpu",
                                  fallback_random=False)
    ours = torch.compile(_whole_step(w.model, w.loss_fn), backend=be, dynamic=False)
    plain = torch.compile(_whole_step(twin, w.loss_fn), dynamic=False)
    torch.manual_seed(5)
    with pytest.warns(InductorRoundingWarning):
        ours(*w.batch).backward()
    torch.manual_seed(5)
    plain(*w.batch).backward()
    [part] = be.partitions
    redrawn = part.recomputed_targets.get("prims.inductor_random.default", 0)
    assert (redrawn > 0) == (planned_draws(part.planned) > 0)
    assert (redrawn == 0) == (share == 0.75)
    assert part.recomputed_targets  # the plan recomputes at either budget
    assert sum(part.planned.graph.meta["inline_draws"].values()) > 0
    assert set(part.forced) <= {"inductor_seeds_default"}, part.forced
    ours_grads = _grads(w.model)
    for got, want in zip(ours_grads, _grads(twin), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    _zero(twin)
    torch.manual_seed(6)
    plain(*w.batch).backward()
    assert any(not torch.allclose(got, want, rtol=1e-4, atol=1e-6)
               for got, want in zip(ours_grads, _grads(twin), strict=True))


def test_the_allocator_peak_is_within_the_op_by_op_plans_prediction():
    """Planned op by op (``fusion=False``: every value of the decomposed graph a buffer),
    the prediction bounds what Inductor's step allocates on this model. The fused model
    (the default) bounds it only with Inductor's buffer reuse off, the backend's default
    (``test_buffer_reuse.py``; docs/guide.md, "Memory")."""
    w = _workload(0.0)
    budget = _lowest_recompute_budget(w)
    be = outcore.inductor_backend(budget=budget, gpu="this-cpu", fusion=False)
    measured, part = _measured_compile(w, be)
    predicted = part.predicted_peak - held_before(part.planned.graph)
    assert part.predicted_peak <= budget
    assert 0 < measured <= predicted


def test_a_budget_below_every_recompute_plan_is_refused_at_the_first_call():
    w = _workload(0.0)
    be = outcore.inductor_backend(budget="64KiB", gpu="this-cpu")
    compiled = torch.compile(_whole_step(w.model, w.loss_fn), backend=be, dynamic=False)
    with pytest.warns(InductorRoundingWarning), pytest.raises(outcore.InfeasibleBudgetError):
        compiled(*w.batch)
    assert not be.partitions


def test_a_plan_that_offloads_is_refused():
    """A policy that offloads (the host allowed): Inductor's graphs cannot run copies."""
    w = _workload(0.0)
    be = outcore.inductor_backend(budget=None, gpu="v100", policy="offload-all",
                                  host_budget=None)
    compiled = torch.compile(_whole_step(w.model, w.loss_fn), backend=be, dynamic=False)
    with pytest.warns(InductorRoundingWarning), \
            pytest.raises(OffloadNotCompiledError, match="host memory"):
        compiled(*w.batch)


def test_arguments_are_checked_at_once():
    with pytest.raises(outcore.errors.InvalidArgumentError):
        outcore.inductor_backend(budget="lots")
    with pytest.raises(outcore.errors.InvalidArgumentError):
        outcore.inductor_backend(budget="1GiB", policy="no-such-policy")
