"""``python -m outcore ...``: the ``outcore`` command (``outcore.cli.main``, the console
script's entry point), its exit code passed on to the shell."""

from __future__ import annotations

import sys

from outcore.cli import main

if __name__ == "__main__":
    sys.exit(main())
