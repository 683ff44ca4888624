"""The superneurons reproduction: a thin caller of ``outcore.reproduce.superneurons``.

(Also `outcore reproduce superneurons`, from an installed wheel.)

    python benchmarks/repro_superneurons.py [--quick]
"""

import sys

from outcore.reproduce.superneurons import main

if __name__ == "__main__":
    sys.exit(main())
