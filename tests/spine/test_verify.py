"""The verifier rejects every kind of broken schedule, naming the instruction."""

import pytest

from outcore.capture import capture
from outcore.errors import ScheduleError
from outcore.plan.lower import lower
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.plan.verify import verify
from outcore.policies import baseline

from models import make


@pytest.fixture(scope="module")
def vgg():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch)
    GRAPH[:] = [graph]
    return graph, lower(graph, baseline.offload_all(graph))


def mutate(schedule, fn):
    return Schedule(instructions=fn(list(schedule.instructions)),
                    keep_at_end=schedule.keep_at_end, policy="mutated")


def index_of(instructions, kind, pred=lambda i: True):
    return next(k for k, i in enumerate(instructions) if isinstance(i, kind) and pred(i))


def drop_first(kind, pred, then):
    """Drop the first ``kind`` instruction matching ``pred``; the broken rule is expected at
    the first later instruction ``then(instruction, dropped)`` accepts (index after the drop)."""
    def fn(instructions):
        k = index_of(instructions, kind, pred)
        dropped = instructions.pop(k)
        expected = next(j for j in range(k, len(instructions)) if then(instructions[j], dropped))
        return instructions, expected
    return fn


def is_d2h(ins):
    return ins.direction == "d2h"


def is_h2d(ins):
    return ins.direction == "h2d"


def free_of(ins, dropped):
    return isinstance(ins, Free) and ins.tensor == dropped.tensor


def reader_or_free_of(ins, dropped):
    graph = GRAPH[0]
    reads = isinstance(ins, Compute) and dropped.tensor in graph.ops[ins.op].inputs
    return reads or free_of(ins, dropped)


def wait_of(direction):
    def then(ins, dropped):
        return isinstance(ins, Wait) and ins.tensor == dropped.tensor and ins.direction == direction
    return then


def use_before_produce(instructions):
    # the first compute that reads a produced tensor, moved to the front
    graph = GRAPH[0]
    k = next(i for i, s in enumerate(instructions) if isinstance(s, Compute) and any(
        graph.tensors[t].producer is not None for t in graph.ops[s.op].inputs))
    instructions.insert(0, instructions.pop(k))
    return instructions, 0


GRAPH: list = []


def recompute_first(instructions):
    return [Compute(0, recompute=True), *instructions], 0


CASES = [
    ("missing wait d2h", drop_first(Wait, is_d2h, free_of), "offload is in flight"),
    ("missing wait h2d", drop_first(Wait, is_h2d, reader_or_free_of), "prefetch is in flight"),
    ("wait without offload", drop_first(Offload, lambda i: True, wait_of("d2h")),
     "no copy in flight"),
    ("use before produce", use_before_produce, "not resident"),
    ("recompute before run", recompute_first, "before it ever ran"),
    ("missing prefetch", drop_first(Prefetch, lambda i: True, wait_of("h2d")),
     "no copy in flight"),
]


@pytest.mark.parametrize("label,fn,words", CASES, ids=[c[0] for c in CASES])
def test_broken_schedules_are_rejected(vgg, label, fn, words):
    graph, schedule = vgg
    verify(graph, schedule)
    instructions, expected = fn(list(schedule.instructions))
    with pytest.raises(ScheduleError) as err:
        verify(graph, mutate(schedule, lambda _: instructions))
    assert words in str(err.value)
    assert err.value.index == expected


def test_prefetch_without_host_copy_rejected(vgg):
    graph, schedule = vgg
    t = next(i.tensor for i in schedule.instructions if isinstance(i, Prefetch))
    stripped = [i for i in schedule.instructions
                if not (isinstance(i, (Offload,)) and i.tensor == t)
                and not (isinstance(i, Wait) and i.tensor == t and i.direction == "d2h")]
    with pytest.raises(ScheduleError, match="no completed host copy"):
        verify(graph, mutate(schedule, lambda _: stripped))


def test_use_after_free_is_rejected(vgg):
    graph, schedule = vgg
    instructions = list(schedule.instructions)
    # free a tensor right after it is made, before its readers run
    k = index_of(instructions, Compute, lambda c: c.op == 1)
    out = graph.ops[1].outputs[0]
    instructions.insert(k + 1, Free(out))
    with pytest.raises(ScheduleError, match="not resident"):
        verify(graph, mutate(schedule, lambda _: instructions))


def test_double_free_and_missing_output_rejected(vgg):
    graph, schedule = vgg
    k = index_of(schedule.instructions, Free)
    doubled = list(schedule.instructions)
    doubled.insert(k + 1, doubled[k])
    with pytest.raises(ScheduleError, match="not resident"):
        verify(graph, mutate(schedule, lambda _: doubled))
    loss = schedule.keep_at_end[0]
    with pytest.raises(ScheduleError, match="not resident at the end"):
        verify(graph, mutate(schedule, lambda ins: [*ins, Free(loss)]))


def test_recompute_without_inputs_rejected():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.recompute_cheap(graph))
    ins = list(schedule.instructions)
    k = next(i for i, s in enumerate(ins) if isinstance(s, Compute) and s.recompute)
    needed = graph.ops[ins[k].op].inputs
    victim = next(t for t in needed if graph.tensors[t].producer is not None)
    ins.insert(k, Free(victim))
    with pytest.raises(ScheduleError, match="recomputed but its input"):
        verify(graph, mutate(schedule, lambda _: ins))


def test_schedule_json_round_trip(vgg):
    _, schedule = vgg
    again = Schedule.from_json(schedule.to_json())
    assert again.instructions == schedule.instructions
    assert again.keep_at_end == schedule.keep_at_end
    with pytest.raises(ScheduleError):
        Schedule.from_json('{"instructions": [["Bogus", {}]]}')


def test_prefetch_waits_for_views_of_the_old_copy():
    """Regression: the LM head reads a view of the final LayerNorm output after the base's
    own Free; hoisting the base's prefetch above that view's Free would put two copies on
    the device while the memory rule counts one. Lowering must not, and the verifier
    refuses a schedule that does."""
    import torch

    from outcore import zoo
    from outcore.plan.memory import predicted_peak
    from outcore.runtime.executor import Executor

    torch.manual_seed(0)
    work = zoo.get("transformer", 8, small=True)
    graph = capture(work.model, work.loss_fn, work.batch)
    schedule = lower(graph, baseline.offload_all(graph))
    verify(graph, schedule)
    result = Executor(graph, schedule).run(work.batch)
    assert result.peak_bytes == predicted_peak(graph, schedule)
    # a prefetch moved up to just after its base's Free, above the Free of a view of it
    ins = list(schedule.instructions)
    for k, s in enumerate(ins):
        if not isinstance(s, Prefetch):
            continue
        base_free = max(i for i in range(k)
                        if isinstance(ins[i], Free) and ins[i].tensor == s.tensor)
        view_frees = [i for i in range(base_free, k) if isinstance(ins[i], Free)
                      and graph.tensors[ins[i].tensor].storage == s.tensor
                      and ins[i].tensor != s.tensor]
        if view_frees:
            moved = ins[:base_free + 1] + [s] + [x for x in ins[base_free + 1:] if x is not s]
            break
    else:
        raise AssertionError("the transformer has an offloaded base with a longer-lived view")
    with pytest.raises(ScheduleError, match="view of it still holds"):
        verify(graph, mutate(schedule, lambda _: moved))
