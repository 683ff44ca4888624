"""Forward outputs and tangents of a compiled graph, held as a training step holds them
(``outcore.compiled.lifetimes``).

A tiny transformer is compiled with the inductor backend, its loss computed outside the
compiled region (the logits are the graph's forward output, their gradient its tangent), and
the plan's schedule is replayed under the memory rule: the logits' storage must leave at the
backward's start and the tangent arrive there and leave after its last read. Then the same
graph without the change (``release_forward_outputs``/``arrive_tangents_with_backward`` not
applied) is replayed: there the rule holds both to the step's end, so the test could fail.
"""

from __future__ import annotations

import copy

import pytest
import torch

import outcore
from outcore.compiled import InductorRoundingWarning
from outcore.compiled.lifetimes import (
    LOSS_HELD_BYTES,
    LOSS_SCALAR_BYTES,
    arrive_tangents_with_backward,
    as_in_a_training_step,
    hold_loss_at_boundary,
    release_forward_outputs,
)
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.plan.lower import lower
from outcore.plan.plan import Plan
from outcore.plan.residency import Replay
from outcore.plan.schedule import Compute, Schedule

TINY = {"seq_len": 32, "n_layer": 1, "n_head": 2, "d_model": 32}


def _resident_storages(graph: Graph, schedule: Schedule) -> list[set[int]]:
    """Per instruction, the storages resident after it (transients left out)."""
    replay = Replay(graph, schedule)
    steps = iter(replay)
    next(steps)
    return [{graph.tensors[t].storage for t in replay.resident_tensors()} for _ in steps]


def _first_backward(graph: Graph, schedule: Schedule) -> int:
    return next(i for i, ins in enumerate(schedule.instructions)
                if isinstance(ins, Compute) and graph.ops[ins.op].phase is Phase.BACKWARD)


@pytest.fixture(scope="module")
def part():
    torch._dynamo.reset()
    w = outcore.zoo.get("transformer", 2, vocab=256, dropout=0.0, tie_weights=False, **TINY)
    model = copy.deepcopy(w.model)
    be = outcore.inductor_backend(None, gpu="this-cpu")
    compiled = torch.compile(model, backend=be, dynamic=False)
    with pytest.warns(InductorRoundingWarning):
        w.loss_fn(compiled(w.batch[0]), w.batch[1]).backward()
    eager = copy.deepcopy(w.model)
    w.loss_fn(eager(w.batch[0]), w.batch[1]).backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)
    [part] = be.partitions
    yield part
    torch._dynamo.reset()


def test_logits_leave_and_tangent_arrives_at_the_backwards_start(part) -> None:
    graph, schedule = part.planned.graph, part.planned.schedule
    logits = [t for t in graph.tensors if t.shape[-1:] == (256,)  # vocab: the logits' storage
              and graph.tensors[t.storage].kind is TensorKind.ACTIVATION
              and graph.ops[t.producer].phase is Phase.FORWARD]
    [tangent] = [t for t in graph.tensors if t.name.startswith("tangents")]
    assert logits and not {t.id for t in logits} & set(graph.outputs)
    assert tangent.kind is TensorKind.GRADIENT
    first = _first_backward(graph, schedule)
    resident = _resident_storages(graph, schedule)
    held = {t.storage for t in logits}
    assert all(held <= r for r in resident[first - 1:first]), "held until the backward starts"
    assert not any(held & r for r in resident[first + 1:]), "gone once the backward runs"
    assert not any(tangent.id in r for r in resident[:first]), "no tangent in the forward"
    assert tangent.id in resident[first]
    aliases = {t.id for t in graph.tensors if t.storage == tangent.id}  # its views too
    last = max([first] + [i for i, ins in enumerate(schedule.instructions)
                          if isinstance(ins, Compute) and aliases & set(graph.ops[ins.op].inputs)])
    assert not any(tangent.id in r for r in resident[last + 1:]), "freed after its last read"
    first_op = graph.ops[schedule.instructions[first].op]
    assert first_op.temporaries >= graph.tensors[tangent.id].nbytes, "the loss's gradient"


def _wired(t: list[Tensor], ops: list[Op], outputs: list[int]) -> Graph:
    """The graph of ``t`` and ``ops``, each tensor's consumers filled in, validated."""
    for op in ops:
        for tid in op.inputs:
            t[tid].consumers.append(op.id)
    graph = Graph(tensors=t, ops=ops, outputs=outputs)
    graph.validate()
    return graph


def _toy() -> Graph:
    """x -> (fwd) y = out (a graph output), z (kept); (bwd) g = f(tangent, z)."""
    t = [Tensor(0, "x", (4,), "float32", 16, TensorKind.INPUT, 0),
         Tensor(1, "y", (64,), "float32", 256, TensorKind.OUTPUT, 1, producer=0),
         Tensor(2, "z", (4,), "float32", 16, TensorKind.ACTIVATION, 2, producer=1),
         Tensor(3, "tangents_1", (64,), "float32", 256, TensorKind.TANGENT, 3),
         Tensor(4, "g", (4,), "float32", 16, TensorKind.GRADIENT, 4, producer=2),
         Tensor(5, "h", (4,), "float32", 16, TensorKind.GRADIENT, 5, producer=3)]
    ops = [Op(0, "y", "aten.mul", Phase.FORWARD, OpCategory.ELEMENTWISE, [0], [1]),
           Op(1, "z", "aten.mul", Phase.FORWARD, OpCategory.ELEMENTWISE, [0], [2]),
           Op(2, "g", "aten.mul", Phase.BACKWARD, OpCategory.ELEMENTWISE, [3, 2], [4]),
           Op(3, "h", "aten.mul", Phase.BACKWARD, OpCategory.ELEMENTWISE, [4], [5])]
    return _wired(t, ops, outputs=[1, 5])


def test_on_a_toy_graph_the_peak_drops_by_the_phantoms() -> None:
    """Unchanged, the rule holds ``y`` and the tangent through the backward (peak at ``h``:
    x, y, tangent, g, h); changed, ``h`` runs without them."""
    before = _toy()
    after = _toy()
    assert release_forward_outputs(after) == [1]
    assert arrive_tangents_with_backward(after) == [3]
    after.validate()
    assert after.outputs == [5] and after.ops[2].outputs == [3, 4]
    held = []
    for graph in (before, after):
        schedule = lower(graph, Plan(policy="test"))
        at_h = max(i for i, ins in enumerate(schedule.instructions)
                   if isinstance(ins, Compute) and ins.op == 3)
        held.append(_resident_storages(graph, schedule)[at_h])
    assert {1, 3} <= held[0]
    assert not {1, 3} & held[1]
    again = _toy()
    release_forward_outputs(again)
    assert arrive_tangents_with_backward(again) == [3]
    assert arrive_tangents_with_backward(again) == []  # idempotent: no tangent left


def test_the_loss_gradient_is_held_at_the_boundary_and_its_scalars_to_the_end() -> None:
    """``hold_loss_at_boundary`` adds one released output's bytes and the loss's scalars as
    temporaries of the first backward op, and the loss and its seed to every later backward
    op: the memory rule's peak at the first rises by the former, at the later ones by the
    latter, in the forward by nothing."""
    plain = _toy()
    release_forward_outputs(plain)
    arrive_tangents_with_backward(plain)
    held = _toy()
    as_in_a_training_step(held)
    added = 256 + LOSS_SCALAR_BYTES
    assert held.ops[2].temporaries == added and plain.ops[2].temporaries == 0
    assert [op.temporaries for op in held.ops if op.id != 2] == [0, 0, LOSS_HELD_BYTES]
    device = []
    for graph in (plain, held):
        schedule = lower(graph, Plan(policy="test"))
        steps = [st for st in Replay(graph, schedule) if st.at >= 0]
        device.append({schedule.instructions[st.at].op: st.device for st in steps
                       if isinstance(schedule.instructions[st.at], Compute)})
    assert device[1][2] == device[0][2] + added, "the first backward op holds the loss gradient"
    assert device[1][3] == device[0][3] + LOSS_HELD_BYTES, "the loss and its seed stay"
    assert all(device[1][op] == device[0][op] for op in (0, 1)), "the forward is unchanged"
    again = _toy()
    assert hold_loss_at_boundary(again, []) == 0
    assert hold_loss_at_boundary(again, release_forward_outputs(again)) == added


def _scalar_loss_toy() -> Graph:
    """As ``_toy`` with the loss computed in the graph: its forward output ``y`` and tangent
    are one-element tensors (the loss and ``backward()``'s seed)."""
    graph = _toy()
    for tid in (1, 3):
        graph.tensors[tid].shape, graph.tensors[tid].nbytes = (), 4
    graph.validate()
    return graph


def test_a_loss_and_its_seed_stay_to_the_end() -> None:
    """A one-element forward output is the loss the caller holds to call ``backward()`` and
    a one-element tangent the seed ``torch.autograd.backward`` holds until it returns: the
    rule keeps both to the step's end (released, the compiled GPT's step measured 8 B above
    its plan, session 15)."""
    graph = _scalar_loss_toy()
    assert release_forward_outputs(graph) == []
    assert arrive_tangents_with_backward(graph) == []
    assert graph.outputs == [1, 5] and graph.tensors[3].kind is TensorKind.TANGENT
    schedule = lower(graph, Plan(policy="test"))
    assert {1, 3} <= _resident_storages(graph, schedule)[-1]


def _interleaved_toy() -> Graph:
    """As ``_toy`` with a backward op ``b`` (reads the tangent) standing before the forward
    op that makes the output ``y``, as in a ResNet's joint graph: y's reader must come after
    y's producer."""
    t = [Tensor(0, "x", (4,), "float32", 16, TensorKind.INPUT, 0),
         Tensor(1, "z", (4,), "float32", 16, TensorKind.ACTIVATION, 1, producer=0),
         Tensor(2, "tangents_1", (64,), "float32", 256, TensorKind.TANGENT, 2),
         Tensor(3, "b", (64,), "float32", 256, TensorKind.GRADIENT, 3, producer=1),
         Tensor(4, "y", (64,), "float32", 256, TensorKind.OUTPUT, 4, producer=2),
         Tensor(5, "g", (4,), "float32", 16, TensorKind.GRADIENT, 5, producer=3)]
    ops = [Op(0, "z", "aten.mul", Phase.FORWARD, OpCategory.ELEMENTWISE, [0], [1]),
           Op(1, "b", "aten.squeeze", Phase.BACKWARD, OpCategory.ELEMENTWISE, [2], [3]),
           Op(2, "y", "aten.addmm", Phase.FORWARD, OpCategory.ELEMENTWISE, [1], [4]),
           Op(3, "g", "aten.mul", Phase.BACKWARD, OpCategory.ELEMENTWISE, [3, 1], [5])]
    return _wired(t, ops, outputs=[4, 5])


def test_an_output_is_read_at_the_first_backward_op_after_the_forward() -> None:
    """The released output is read by the first backward op after the last forward op (here
    ``g``), not by a backward op that stands before its producer: the graph stays valid."""
    graph = _interleaved_toy()
    assert release_forward_outputs(graph) == [4]
    assert 4 in graph.ops[3].inputs and 4 not in graph.ops[1].inputs
    assert hold_loss_at_boundary(graph, [4]) == 256 + LOSS_SCALAR_BYTES
    assert graph.ops[3].temporaries == 256 + LOSS_SCALAR_BYTES
    assert arrive_tangents_with_backward(graph) == []  # read before the boundary: static
    graph.validate()


def _viewed_toy() -> Graph:
    """As ``_toy``, but the first backward op is a view of the tangent (Inductor's joint
    graphs start the backward with ``view(tangents_1)``): (bwd) v = view(tangent),
    g = f(v, z)."""
    t = [Tensor(0, "x", (4,), "float32", 16, TensorKind.INPUT, 0),
         Tensor(1, "y", (64,), "float32", 256, TensorKind.OUTPUT, 1, producer=0),
         Tensor(2, "z", (4,), "float32", 16, TensorKind.ACTIVATION, 2, producer=1),
         Tensor(3, "tangents_1", (64,), "float32", 256, TensorKind.TANGENT, 3),
         Tensor(4, "v", (8, 8), "float32", 0, TensorKind.GRADIENT, 3, producer=2),
         Tensor(5, "g", (4,), "float32", 16, TensorKind.GRADIENT, 5, producer=3)]
    ops = [Op(0, "y", "aten.mul", Phase.FORWARD, OpCategory.ELEMENTWISE, [0], [1]),
           Op(1, "z", "aten.mul", Phase.FORWARD, OpCategory.ELEMENTWISE, [0], [2]),
           Op(2, "v", "aten.view", Phase.BACKWARD, OpCategory.VIEW, [3], [4]),
           Op(3, "g", "aten.mul", Phase.BACKWARD, OpCategory.ELEMENTWISE, [4, 2], [5])]
    return _wired(t, ops, outputs=[1, 5])


def test_a_tangent_viewed_by_the_first_backward_op_is_counted_once() -> None:
    """The tangent arrives as an output of the first backward op before that op's own view
    of it: made after the view, the rule counted it a second time, as a re-made storage (a
    transient the size of the logits: the plan's boundary one logits too high, session 12)."""
    graph = _viewed_toy()
    release_forward_outputs(graph)
    assert arrive_tangents_with_backward(graph) == [3]
    graph.validate()
    schedule = lower(graph, Plan(policy="test"))
    steps = {schedule.instructions[st.at].op: st for st in Replay(graph, schedule)
             if st.at >= 0 and isinstance(schedule.instructions[st.at], Compute)}
    assert steps[2].transient == 0
    # x, y (released at the boundary, still held), z, the tangent: each storage once
    assert steps[2].device == 16 + 256 + 16 + 256
    assert graph.ops[2].outputs == [3, 4]
