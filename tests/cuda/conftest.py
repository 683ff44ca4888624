"""The CUDA suite (``make test-cuda``): skipped, with the reason, where no GPU is visible.

Where ``OUTCORE_REQUIRE_CUDA=1`` (set by scripts/test_cuda.sh), a missing GPU fails the run
instead: on the GPU machine a skipped CUDA test would hide a broken setup.

Bit-equality with eager on a GPU needs deterministic kernels: cuDNN's deterministic
algorithms, no autotuning, and cuBLAS with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``,
which must be set before cuBLAS starts, hence here at import).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))

HAS_CUDA = torch.cuda.is_available()
REASON = (f"needs a CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none; "
          "run `make test-cuda` on a GPU machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    mine = [item for item in items if here in item.path.parents]
    for item in mine:
        item.add_marker(pytest.mark.cuda)
    if HAS_CUDA or not mine:
        return
    if os.environ.get("OUTCORE_REQUIRE_CUDA") == "1":
        raise pytest.UsageError(f"OUTCORE_REQUIRE_CUDA=1 but {REASON}")
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(autouse=True)
def _deterministic():
    """Deterministic kernels for the test, the previous settings restored after it."""
    if not HAS_CUDA:
        yield
        return
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled())
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[:2]
        torch.use_deterministic_algorithms(saved[2])
        torch.cuda.synchronize()
