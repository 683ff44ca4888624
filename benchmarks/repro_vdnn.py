"""The vdnn reproduction: a thin caller of ``outcore.reproduce.vdnn``.

(Also `outcore reproduce vdnn`, from an installed wheel.)

    python benchmarks/repro_vdnn.py [--quick]
"""

import sys

from outcore.reproduce.vdnn import main

if __name__ == "__main__":
    sys.exit(main())
