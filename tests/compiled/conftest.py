"""Fixtures of the compiled-backend tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """One thread, as ``benchmarks/vs_pytorch.py --threads 1`` measures (allocator peaks of a
    compiled step depend on the thread count); dynamo's caches reset around the test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)
