"""The dymem reproduction: a thin caller of ``outcore.reproduce.dymem``.

(Also `outcore reproduce dymem`, from an installed wheel.)

    python benchmarks/repro_dymem.py [--quick]
"""

import sys

from outcore.reproduce.dymem import main

if __name__ == "__main__":
    sys.exit(main())
