"""Suite-wide: the on-disk plan cache is off (``OUTCORE_NO_CACHE=1``) so no test reads a plan
another run stored, nor writes into the user's cache. Tests of the cache turn it on with a
temporary ``OUTCORE_CACHE_DIR``."""

import os

os.environ.setdefault("OUTCORE_NO_CACHE", "1")
