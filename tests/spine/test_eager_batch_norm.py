"""Training BatchNorm replayed through eager's backend choice (``runtime.eager_batch_norm``).

On CUDA the replay must pick cuDNN's kernels exactly where eager does (checked bit for bit by
the CUDA oracle, tests/cuda); here, on the CPU, the same code path (``everywhere=True``: the
forward through ``_batch_norm_impl_index``, the backward through
``_batch_norm_impl_index_backward`` with the forward's record) must give eager's loss,
gradients and running statistics bit for bit under keep, offload and recompute, return the
captured op's output structure (masked gradient slots too) and leave no record behind.
"""

import copy

import pytest
import torch
from torch import nn

import outcore.runtime.eager_batch_norm as ebn
from outcore import zoo
from outcore.capture import capture
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.policies import baseline
from outcore.runtime.executor import Executor

POLICIES = [baseline.liveness, baseline.offload_all, baseline.recompute_cheap]


class SequenceNorm(nn.Module):
    """BatchNorm1d over a (batch, channels, length) sequence, one without affine parameters
    (its backward's weight and bias gradients are masked off), and a second use of a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, padding=1)
        self.norm = nn.BatchNorm1d(6)
        self.plain = nn.BatchNorm1d(6, affine=False)
        self.head = nn.Linear(6 * 10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv(x)))
        y = self.plain(y) + self.norm(y)
        return self.head(y.flatten(1))


class Counting:
    """Stands in for ``torch.ops.aten`` in the module: counts the eager-path calls."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        self.calls[name] = self.calls.get(name, 0) + 1
        return getattr(torch.ops.aten, name)


def _cases():
    work = zoo.get("resnet20-cifar", 2, small=True)
    yield "resnet20-cifar", work.model, work.loss_fn, tuple(work.batch)
    torch.manual_seed(0)
    yield ("sequence-norm", SequenceNorm(), nn.functional.cross_entropy,
           (torch.randn(5, 4, 10), torch.randint(0, 3, (5,))))


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_eager_backend_path_matches_eager_bit_for_bit(case, monkeypatch):
    name, model, loss_fn, batch = case
    reference = copy.deepcopy(model)
    expected = loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    state = copy.deepcopy(model.state_dict())
    graph = capture(model, loss_fn, batch)
    norms = [op for op in graph.ops if op.target in (ebn.FORWARD, ebn.BACKWARD)]
    assert norms, name
    for policy in POLICIES:
        model.load_state_dict(state)
        for p in model.parameters():
            p.grad = None
        counting = Counting()
        monkeypatch.setattr(ebn, "_aten", counting)
        impls = ebn.batch_norm_impls(graph, everywhere=True)
        assert sorted(impls) == sorted(op.id for op in norms), name
        schedule = lower(graph, policy(graph))
        result = Executor(graph, schedule, impls=impls).run(batch)
        label = f"{name}/{policy.__name__}"
        assert counting.calls.get("_batch_norm_impl_index", 0) >= 1, label
        assert counting.calls.get("_batch_norm_impl_index_backward", 0) >= 1, label
        assert "native_batch_norm_backward" not in counting.calls, label  # records were found
        assert torch.equal(result.loss, expected.detach()), label
        for (pname, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), f"{label}: {pname}"
        for (bname, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
            assert torch.equal(b, c), f"{label}: buffer {bname}"
        assert result.peak_bytes == predicted_peak(graph, schedule), label


def test_off_cuda_the_captured_ops_run_unchanged(monkeypatch):
    """Without ``everywhere`` a CPU input takes the captured ops: no eager-path call at all."""
    work = zoo.get("resnet20-cifar", 2, small=True)
    graph = capture(work.model, work.loss_fn, tuple(work.batch))
    counting = Counting()
    monkeypatch.setattr(ebn, "_aten", counting)
    schedule = lower(graph, baseline.liveness(graph))
    Executor(graph, schedule).run(tuple(work.batch))
    assert set(counting.calls) == {"_native_batch_norm_legit_functional",
                                   "native_batch_norm_backward"}


def test_host_tensors_are_never_a_policys_to_move():
    """A tensor an op returns in host memory on an accelerator step (the philox seed and
    offset of CUDA's fused attention) is not an activation: no policy offloads or recomputes
    it, and the flag survives the graph's JSON form."""
    from outcore.graph.ir import Graph
    from outcore.plan.schedule import Offload

    work = zoo.get("resnet20-cifar", 2, small=True)
    graph = capture(work.model, work.loss_fn, tuple(work.batch))
    offloaded = {i.tensor for i in lower(graph, baseline.offload_all(graph)).instructions
                 if isinstance(i, Offload)}
    chosen = next(t for t in graph.activations() if t.id in offloaded)
    chosen.host = True
    assert chosen.id not in {t.id for t in graph.activations()}
    for policy in POLICIES:
        schedule = lower(graph, policy(graph))
        assert chosen.id not in {i.tensor for i in schedule.instructions
                                 if isinstance(i, Offload)}, policy.__name__
    again = Graph.from_json(graph.to_json())
    assert again.tensors[chosen.id].host and not again.tensors[0].host
