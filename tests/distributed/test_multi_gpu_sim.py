"""N GPUs simulated on a shared host link, all-reduce overlapped with backward (plain data)."""

from __future__ import annotations

import pytest
from dp_graphs import keep_all, three_layers

from outcore.cost.interconnects import (
    HOSTS,
    HostProfile,
    allreduce_time,
    get_host,
    get_interconnect,
    shared_link_profile,
)
from outcore.cost.profiles import get_profile
from outcore.errors import ProfileError
from outcore.graph.ir import Op
from outcore.sim import simulate
from outcore.sim.multi_gpu import rank_cost_model, simulate_data_parallel


class OneSecondOps:
    """Every op takes 1 s; copies at 1 byte/s; no workspace."""

    copy_engines = 2

    def op_time(self, op: Op) -> float:
        return 1.0

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return float(nbytes)

    def workspace(self, op: Op) -> int:
        return 0

    def bind(self, graph: object) -> OneSecondOps:
        return self


@pytest.mark.parametrize(("host", "n", "gbs"), [
    ("k40m-x2", 1, 8.0), ("k40m-x2", 2, 5.0),  # moDNN: two K40m on one bus
    ("v100-pcie-x8", 2, 6.0), ("v100-pcie-x8", 4, 3.0), ("v100-pcie-x8", 8, 3.0),
    ("dgx1-v100", 2, 6.0), ("dgx1-v100", 8, 6.0),  # 2 GPUs per PCIe switch
])
def test_ranks_copying_at_once_share_the_host_link(host, n, gbs):
    h = get_host(host)
    profile = get_profile(h.gpu)
    shared = shared_link_profile(profile, h, n)
    assert shared.h2d_bandwidth == pytest.approx(gbs * 1e9)
    assert shared.d2h_bandwidth == pytest.approx(gbs * 1e9)
    assert shared.peak_flops == profile.peak_flops  # compute is not shared
    model = rank_cost_model(profile, h, n)
    assert model.transfer_time(10**9, "h2d") == pytest.approx(
        profile.launch_overhead + 1 / gbs)


def test_ring_allreduce_time_inside_and_across_hosts():
    h = get_host("dgx1-v100")
    nv, ib = get_interconnect("nvlink2"), get_interconnect("infiniband-edr-x4")
    b = 10**9
    assert allreduce_time(b, 1, h) == 0.0
    assert allreduce_time(b, 2, h) == pytest.approx(b / nv.bandwidth + 2 * nv.latency)
    assert allreduce_time(b, 8, h) == pytest.approx(2 * 7 / 8 * b / nv.bandwidth
                                                    + 14 * nv.latency)
    # 16 GPUs = 2 DGX-1: the ring inside each, plus half the buffer each way over the network
    assert allreduce_time(b, 16, h) == pytest.approx(
        allreduce_time(b, 8, h) + b / ib.bandwidth + 2 * ib.latency)
    slow = get_host("v100-pcie-x8")
    assert allreduce_time(b, 8, slow) > 5 * allreduce_time(b, 8, h)  # PCIe vs NVLink


def test_host_profiles_refuse_unknown_interconnects():
    assert {"k40m-x2", "v100-pcie-x8", "dgx1-v100"} <= set(HOSTS)
    with pytest.raises(ProfileError, match="unknown interconnect"):
        HostProfile("bad", "v100-pcie", 8, 4, 1e9, "smoke-signals", "infiniband-edr")
    with pytest.raises(ProfileError, match="gpus_per_link"):
        HostProfile("bad", "v100-pcie", 8, 0, 1e9, "pcie3", "infiniband-edr")


def test_one_gpu_is_the_plain_simulation():
    graph = three_layers()
    schedule = keep_all(graph)
    one = simulate_data_parallel(graph, schedule, OneSecondOps(), get_host("dgx1-v100"), 1)
    assert one.step_time == simulate(graph, schedule, OneSecondOps()).step_time == 6.0
    assert one.comm_time == 0.0 and one.exposed_comm_time == 0.0 and not one.buckets


@pytest.mark.parametrize(("grad_bytes", "hidden"), [
    # 1e9 bytes: 0.1 s per all-reduce on 2 GPUs over pcie3 (10 GB/s bus): gw2's and gw1's
    # run beside b1 and b0, only gw0's (issued at the end) is exposed
    (10**9, True),
    # 3e10 bytes: 3 s each; gw2's starts when b2 ends (t=4), gw1's and gw0's queue behind
    # it: the step ends at 4 + 3 * 3 = 13 instead of 6
    (3 * 10**10, False),
])
def test_allreduce_overlaps_the_rest_of_backward(grad_bytes, hidden):
    graph = three_layers(grad_bytes=grad_bytes)
    schedule = keep_all(graph)
    host = get_host("v100-pcie-x8")
    result = simulate_data_parallel(graph, schedule, OneSecondOps(), host, 2,
                                    bucket_cap=grad_bytes)
    assert len(result.buckets) == 3
    per = allreduce_time(grad_bytes, 2, host)
    assert result.comm_time == pytest.approx(3 * per)
    if hidden:
        assert result.exposed_comm_time == pytest.approx(per)
    else:
        assert result.exposed_comm_time == pytest.approx(
            4 + 3 * per - 6, rel=1e-6)
        assert result.step_time == pytest.approx(4 + 3 * per)
    assert result.step_time == pytest.approx(result.rank.step_time + result.exposed_comm_time)
    # keep-all only grows, so the peak is at the end: with all three bucket buffers
    assert result.peak_bytes == result.rank.peak_bytes + 3 * grad_bytes


def test_sub_batches_reduce_after_the_last_pass():
    graph = three_layers(grad_bytes=10**9)
    schedule = keep_all(graph)
    schedule.sub_batches = 2
    host = get_host("v100-pcie-x8")
    result = simulate_data_parallel(graph, schedule, OneSecondOps(), host, 2,
                                    bucket_cap=10**12)
    assert result.rank.step_time == 12.0
    assert result.step_time == pytest.approx(12.0 + allreduce_time(3 * 10**9, 2, host))
    assert result.peak_bytes == result.rank.peak_bytes  # .grad reduced in place


def test_the_planning_pieces_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys\n"
            "import outcore.plan.grad_buckets, outcore.sim.multi_gpu, outcore.cost.interconnects\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr


def test_the_data_parallel_benchmark_imports():
    """benchmarks/data_parallel.py imports what it needs (a moved helper broke it once)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "data_parallel.py"
    spec = importlib.util.spec_from_file_location("data_parallel_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.fig9) and callable(module.sync_bn)
