"""Suite-wide: the on-disk plan cache is off (``OUTCORE_NO_CACHE=1``) so no test reads a plan
another run stored, nor writes into the user's cache. Tests of the cache turn it on with a
temporary ``OUTCORE_CACHE_DIR``.

Under pytest-xdist (``make test`` runs ``pytest -n 2``) each worker gets its share of the
cores as intra-op threads (at least one), so that the workers together use no more threads
than the machine has cores: oversubscribed OpenMP threads spin against each other and slow
every test down. A test that needs a given thread count sets it itself (``one_thread``)."""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # shared helpers: ``from exact import ...``

os.environ.setdefault("OUTCORE_NO_CACHE", "1")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
