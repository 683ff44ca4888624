"""The modnn reproduction: a thin caller of ``outcore.reproduce.modnn``.

(Also `outcore reproduce modnn`, from an installed wheel.)

    python benchmarks/repro_modnn.py [--quick]
"""

import sys

from outcore.reproduce.modnn import main

if __name__ == "__main__":
    sys.exit(main())
