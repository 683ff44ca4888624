"""The pooch reproduction: a thin caller of ``outcore.reproduce.pooch``.

(Also `outcore reproduce pooch`, from an installed wheel.)

    python benchmarks/repro_pooch.py [--quick]
"""

import sys

from outcore.reproduce.pooch import main

if __name__ == "__main__":
    sys.exit(main())
