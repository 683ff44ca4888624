"""Gradient accumulation over data-parallel steps equals eager DDP bit for bit.

DDP all-reduces the ``.grad`` autograd accumulated, ``sum_r (prior + g_r) / N``; outcore
averaged the new gradients and added them, ``prior + sum_r g_r / N``: the same value in
exact arithmetic, different float roundings (1.5e-8 on a conv weight after two
accumulated steps; found by the session-20 journey fuzz). The bucket now starts from the
prior ``.grad`` (``BucketReducer.prior``; the slot holds ``gradient + prior``). Also: the
model has BatchNorm buffers and an unused parameter, and a refused step (a layer frozen
after compiling) leaves the accumulated ``.grad`` in place.
"""

from __future__ import annotations

import accumulate_workers
import dp_workers


def test_accumulated_gradients_equal_ddp_bit_for_bit() -> None:
    results = dp_workers.launch(accumulate_workers.accumulate, 2, 4, deadline=240.0)
    for rank, result in enumerate(results):
        assert not (isinstance(result, tuple) and result[:1] == ("error",)), result
        assert result["mismatches"] == [], (rank, result["mismatches"])
        assert result["refused"] and result["kept"], (rank, result)
