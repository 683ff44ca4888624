"""outcore's offload inside an FSDP2-wrapped model's step (gloo, 2 CPU ranks).

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards the parameters over the ranks and
gathers them around the step; the model's first block is compiled with
``outcore.backend(policy="offload-all")``, so its activations are offloaded and prefetched
inside FSDP's forward and backward. The gradients FSDP reduce-scatters (averaged over the
ranks) must equal the mean over the ranks' halves of eager PyTorch's (tolerance: one ulp
relative, for the reduction's sum order), and the block's measured peak its predicted one.
See docs/guide.md, "Composing with FSDP2 and pipeline stages".
"""

from __future__ import annotations

import dp_workers


def test_outcore_offload_runs_inside_an_fsdp2_step() -> None:
    results = dp_workers.launch(dp_workers.fsdp2_with_outcore_block, 2, deadline=300)
    for rank, r in enumerate(results):
        assert not isinstance(r, tuple), f"rank {rank} failed: {r}"
        assert r["sharded"], "fully_shard must have made every parameter a DTensor"
        assert r["names"] == r["expected"]
        assert r["err"] <= 2.5e-7, f"rank {rank}: {r['err']:.2g} off the eager average"
        assert r["offloads"] > 0, "offload-all must offload the block's activations"
        assert r["measured"] == r["predicted"]
