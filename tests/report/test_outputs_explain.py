"""Issue 18 point 7: explain and the HTML report name the user's modules, group by decision,
use human units and the decision colours; plots mark phases, moves and the budget; the trace
is named after the model; a snapshot PyTorch's memory visualiser reads back."""

import io
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import outcore
from outcore.report.explain import COLOURS, ORDER
from outcore.report.html import render_html
from outcore.report.snapshot import memory_snapshot, write_snapshot
from outcore.report.timeline import plot_memory
from outcore.report.trace import write_trace

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from models import make


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.conv2(self.act1(self.conv1(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layer3 = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        return self.head(self.layer3(torch.relu(self.stem(x))).flatten(1))


@pytest.fixture(scope="module")
def planned():
    torch.manual_seed(0)
    model = Net()
    batch = (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))
    graph = outcore.capture(model, nn.functional.cross_entropy, batch)
    from outcore.graph.bounds import reference_peaks

    peaks = reference_peaks(graph)
    budget = (peaks.liveness + peaks.layer_lower_bound) // 2
    return outcore.plan(graph, budget, policy="auto")


def test_capture_records_module_paths_for_forward_and_backward(planned):
    graph = planned.graph
    paths = graph.meta["module_paths"]
    assert len(paths) == len(graph.ops)
    convs = [(op.phase.value, paths[op.id]) for op in graph.ops if op.target.endswith(
        "convolution.default")]
    assert ("forward", "layer3.1.conv2") in convs and ("forward", "stem") in convs
    backward = {paths[op.id] for op in graph.ops if "convolution_backward" in op.target}
    assert {"stem", "layer3.0.conv1", "layer3.1.conv2"} <= backward
    assert graph.from_json(graph.to_json()).meta["module_paths"] == paths


def test_explain_names_modules_groups_by_decision_in_human_units(planned):
    rows = planned.explain()
    modules = {r["module"] for r in rows}
    assert {"layer3.0.act1", "layer3.1.act1", "layer3.1", "(top level)", "(loss)"} <= modules
    assert all(r["op"] and r["producer"].startswith("aten.") for r in rows)
    ranks = [ORDER.index(r["decision"]) for r in rows]
    assert ranks == sorted(ranks) and len(set(ranks)) >= 2  # grouped: moved first, then kept
    for group in rows.groups().values():
        sizes = [r["bytes"] for r in group]
        assert sizes == sorted(sizes, reverse=True)
    assert all(r["size"] == outcore.format_bytes(r["bytes"]) for r in rows)
    assert not any("sub-batch" in n for n in rows.notes) and rows.sub_batches == 1


def test_html_report_units_colours_modules_and_no_repeated_note(planned):
    text = render_html(planned, "net")
    for colour in COLOURS.values():
        assert colour in text  # the colours are defined ...
    used = {d for d in COLOURS if f'<td class="{d}">{d}</td>' in text}
    assert used == {r["decision"] for r in planned.explain()}  # ... and applied
    assert "layer3.1.act1" in text and " KiB" in text
    rows = planned.explain()
    biggest = max(r["bytes"] for r in rows)
    assert f">{biggest}<" not in text  # raw byte counts only in a title attribute
    longest_why = max((r["why"] for r in rows), key=len)
    if len(longest_why) > 100:
        assert text.count(longest_why) <= 1


def test_plot_marks_phases_moves_and_always_the_budget(planned, tmp_path):
    from matplotlib.figure import Figure

    drawn = {}
    real = Figure.savefig

    def spy(fig, *args, **kwargs):
        ax = fig.axes[0]
        drawn["labels"] = ax.get_legend_handles_labels()[1]
        drawn["texts"] = [t.get_text().strip() for t in ax.texts]
        return real(fig, *args, **kwargs)

    Figure.savefig = spy
    try:
        plot_memory(planned.simulation, tmp_path / "m.png", graph=planned.graph,
                    schedule=planned.schedule, budget=planned.budget)
        labels, texts = drawn["labels"], drawn["texts"]
        plot_memory(planned.simulation, tmp_path / "n.png")
        unbounded = drawn["labels"]
    finally:
        Figure.savefig = real
    assert any(label.startswith("budget") for label in labels)
    assert any("no budget" in label for label in unbounded)
    assert {"forward", "backward"} <= set(texts)
    kinds = set(planned.simulation.kind)
    for kind in ("offload", "prefetch", "recompute"):
        assert any(label.startswith(kind) for label in labels) == (kind in kinds)
    assert kinds & {"offload", "recompute"}
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_trace_process_is_named_after_the_model(planned, tmp_path):
    path = write_trace(tmp_path / "t.json", planned.simulation, planned.graph, planned.schedule,
                       model="resnet50 (batch 8)")
    events = json.loads(path.read_text())["traceEvents"]
    (name,) = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert "resnet50 (batch 8)" in name and "Net" not in name


def test_memory_snapshot_loads_back_in_torch_memory_viz(planned, tmp_path):
    from torch.cuda import _memory_viz

    path = write_snapshot(tmp_path / "snap.pickle", planned.simulation, planned.graph,
                          planned.schedule)
    with path.open("rb") as handle:
        snap = pickle.load(handle)
    assert set(snap) >= {"segments", "device_traces"}
    trace = snap["device_traces"][0]
    assert {e["action"] for e in trace} == {"alloc", "free_requested", "free_completed"}
    # torch's own readers parse it: the text trace, the segment summary, the HTML viewer
    assert "entries" in _memory_viz.trace(snap)
    assert "segments" in _memory_viz.segsum(snap).lower()
    assert "snapshot.pickle" in _memory_viz.trace_plot(snap)
    # replaying the trace gives the simulated device memory after every instruction
    live, peak = 0, 0
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"] \
            if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    assert planned.simulation.peak_bytes <= peak <= planned.simulation.peak_bytes + 512 * len(
        planned.simulation.lifetimes)
    names = {f["filename"] for e in trace for f in e["frames"]}
    assert "layer3.1.conv2" in names


def test_snapshot_of_a_spine_model_has_consistent_addresses():
    model, loss_fn, batch = make("resnet")
    graph = outcore.capture(model, loss_fn, batch)
    planned = outcore.plan(graph, None, policy="keep-all")
    snap = memory_snapshot(planned.simulation, graph, planned.schedule)
    live: dict[int, int] = {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            assert all(e["addr"] + e["size"] <= a or a + s <= e["addr"] for a, s in live.items())
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            del live[e["addr"]]
    active = [b for b in snap["segments"][0]["blocks"] if b["state"] == "active_allocated"]
    assert {b["address"] for b in active} == set(live)
    assert sum(b["size"] for b in snap["segments"][0]["blocks"]) == \
        snap["segments"][0]["total_size"]
    assert io.BytesIO(pickle.dumps(snap)).getbuffer().nbytes > 0
