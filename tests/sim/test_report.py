"""The Perfetto trace and the memory plot of a simulated step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outcore.report.timeline import plot_memory, stepwise
from outcore.report.trace import TRACKS, chrome_trace, write_trace
from outcore.sim import simulate
from outcore.sim.synthetic import offload_all_schedule, residual_chain

from sim_helpers import TableCost


@pytest.fixture(scope="module")
def run():
    graph = residual_chain(4, activation_bytes=4096, param_bytes=256)
    schedule = offload_all_schedule(graph)
    result = simulate(graph, schedule, TableCost({}, d2h=4096.0, h2d=8192.0))
    return graph, schedule, result


def test_trace_has_one_complete_event_per_instruction_on_its_track(run, tmp_path: Path) -> None:
    graph, schedule, result = run
    path = write_trace(tmp_path / "step.json", result, graph, schedule)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(schedule)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "d2h", "h2d"}
    for i, (e, stream) in enumerate(zip(slices, result.stream, strict=True)):
        assert e["tid"] == TRACKS[stream] and e["dur"] >= 0 and e["ts"] >= 0
        assert e["args"]["index"] == i
    offloads = [e for e in slices if e["cat"] == "offload"]
    assert offloads and all(e["tid"] == TRACKS["d2h"] for e in offloads)
    assert all(e["dur"] == pytest.approx(1e6) for e in offloads)  # 4096 B at 4096 B/s
    computes = [e for e in slices if e["cat"] == "compute"]
    assert [e["name"] for e in computes] == [op.name for op in graph.ops]
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "device memory"]
    assert max(c["args"]["bytes"] for c in counters) == result.peak_bytes
    assert doc["otherData"]["step_time"] == result.step_time


def test_trace_refuses_a_schedule_it_did_not_simulate(run) -> None:
    graph, schedule, result = run
    schedule.instructions.append(schedule.instructions[-1])
    try:
        with pytest.raises(ValueError, match="pass the schedule"):
            chrome_trace(result, graph, schedule)
    finally:
        schedule.instructions.pop()


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_memory_plot_is_written(run, tmp_path: Path, suffix: str, magic: bytes) -> None:
    graph, schedule, result = run
    path = plot_memory(result, tmp_path / f"memory{suffix}", graph=graph, schedule=schedule,
                       budget=result.peak_bytes * 2)
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(magic)


@pytest.mark.parametrize("by", ["instruction", "time"])
def test_other_axes(run, tmp_path: Path, by: str) -> None:
    _, _, result = run
    assert plot_memory(result, tmp_path / "m.png", by=by).stat().st_size > 1000
    with pytest.raises(ValueError, match="by must be"):
        plot_memory(result, tmp_path / "m.png", by="layer")


def test_stepwise_takes_each_steps_peak(run) -> None:
    _, _, result = run
    mem, live = stepwise(result)
    assert len(mem) == len(result.steps) == len(live)
    assert max(mem) == result.peak_bytes and max(live) == max(result.live_tensors)
