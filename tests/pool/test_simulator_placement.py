"""Pool placement plugged into the simulator, on a captured graph and a real schedule."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
import outcore
from outcore.api import cost_model_for
from outcore.plan.lower import lower
from outcore.policies import baseline
from outcore.pool import (
    POLICIES,
    PoolError,
    blocks_from_schedule,
    check_placement,
    for_simulator,
)
from outcore.sim import simulate

from models import make


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_simulator_places_every_block_without_overlap(policy):
    model, loss_fn, batch = make("densenet")
    graph = outcore.capture(model, loss_fn, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    result = simulate(graph, schedule, cost_model_for("v100-pcie"), placement=for_simulator(policy))
    placement = result.placement
    assert placement.lower_bound == result.peak_bytes
    assert placement.pool_size >= result.peak_bytes
    check_placement(blocks_from_schedule(graph, schedule), placement.offsets, placement.sizes,
                    placement.pool_size)


def test_unknown_policy_is_refused():
    with pytest.raises(PoolError, match="unknown placement policy"):
        for_simulator("worst-fit")
