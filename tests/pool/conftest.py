"""Makes ``pool_graphs`` (hand-made training graphs) importable under --import-mode=importlib."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
