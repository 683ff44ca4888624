"""``outcore.inductor_backend`` on a small residual convolution network with BatchNorm.

Checks what a ResNet's graph adds to the transformer's: BatchNorm's running statistics
(buffers mutated in the forward), convolution backward, and Inductor's channels-last layout
optimisation, which the backend turns off by default (on the CPU it made the forward hold
converted weight copies outside the plan's saved set). One unbounded compile finds the
lowest recompute-only budget of Inductor's graph; the test compiles at that budget.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import outcore
from outcore.compiled import InductorRoundingWarning


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(channels)
        self.c2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), _Block(16), _Block(16),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_step(net: nn.Module, budget: int | None):
    be = outcore.inductor_backend(budget=budget, gpu="this-cpu")
    compiled = torch.compile(lambda x, y: nn.functional.cross_entropy(net(x), y),
                             backend=be, dynamic=False)
    return be, compiled


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    return x, y


def _first_step(net: nn.Module, budget: int | None, x: torch.Tensor, y: torch.Tensor):
    """``_compiled_step`` and its first step (the compile, with the rounding warning)."""
    be, compiled = _compiled_step(net, budget)
    with pytest.warns(InductorRoundingWarning):
        compiled(x, y).backward()
    return be, compiled


def _lowest(graph) -> int:
    budget = graph.static_bytes()
    for _ in range(8):
        try:
            outcore.plan(graph, budget, gpu="this-cpu", simulate=False, host_budget=0)
            return budget
        except outcore.InfeasibleBudgetError as exc:
            budget = max(budget + 1, int(exc.required))
    raise AssertionError("no recompute-only budget found")


def test_a_batchnorm_convnet_at_its_lowest_budget_matches_eager():
    x, y = _batch()
    be, _ = _first_step(_net(), None, x, y)
    [top] = be.partitions
    floor = _lowest(top.planned.graph)
    assert floor < top.predicted_peak, "a plan below the unbounded one must exist"

    torch._dynamo.reset()
    net, eager = _net(), _net()
    be, compiled = _compiled_step(net, floor)
    with pytest.warns(InductorRoundingWarning):
        loss = compiled(x, y)
    loss.backward()
    reference = nn.functional.cross_entropy(eager(x), y)
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    for got, want in zip(net.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
    for got, want in zip(net.buffers(), eager.buffers(), strict=True):  # running stats
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    [part] = be.partitions
    assert part.recomputed > 0 and part.predicted_peak <= floor
    assert not part.outside_plan and not part.forced
    assert 0 < part.saved_bytes <= part.plan_kept_bytes
    assert part.saved_bytes < top.saved_bytes


def _measured_and_predicted(budget: int | None, x: torch.Tensor, y: torch.Tensor):
    """(the compiled step's allocator peak, the plan's peak less what the step finds
    allocated, the partition) for a fresh network compiled at ``budget``."""
    from outcore.runtime.devices.allocator_peak import allocator_peak, held_before

    net = _net()
    be, compiled = _first_step(net, budget, x, y)

    def step():
        compiled(x, y).backward()

    for p in net.parameters():
        p.grad = None
    step()  # warm
    for p in net.parameters():
        p.grad = None
    measured = allocator_peak(step).peak
    [part] = be.partitions
    return measured, part.predicted_peak - held_before(part.planned.graph), part


def test_the_plan_bounds_the_compiled_convnet_step(one_thread):
    """The library kernels' scratch is measured on real tensors although Inductor's
    partitioner runs under a FakeTensorMode (it was measured on fake tensors, 0 bytes
    everywhere, and the step ran 131,584 B above its plan), so the plan's peak bounds the
    compiled step's allocator peak, unbounded and at the lowest budget. At the lowest, the
    step measured 512 B above its plan while the fusion model took the ReLU's gradient
    (read by three kernels) as materialised, and freed the pooled features' gradient it
    is computed from after its producer: Inductor inlines it into each reader and holds
    that gradient to the last (``fusion._inline_shared``)."""
    x, y = _batch()
    measured, predicted, part = _measured_and_predicted(None, x, y)
    graph = part.planned.graph
    backward_convs = [op for op in graph.ops if op.target.endswith("convolution_backward.default")]
    assert backward_convs and all(op.temporaries > 0 for op in backward_convs)
    assert 0 < measured <= predicted

    torch._dynamo.reset()
    floor = _lowest(graph)
    measured, predicted, part = _measured_and_predicted(floor, x, y)
    assert part.recomputed > 0
    assert 0 < measured <= predicted
