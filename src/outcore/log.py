"""outcore's logger and its announcements.

Every decision that changes what the user computes (splitting the batch) or costs a re-plan
(a new input shape, a recompilation) is logged on the ``outcore`` logger and, when it
changes semantics or costs time, also raised as a warning (a subclass of
``outcore.errors.OutcoreWarning``) so it shows even where logging is not configured.

    >>> import logging
    >>> logging.getLogger("outcore").setLevel(logging.INFO)   # see every decision
"""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger("outcore")
log.addHandler(logging.NullHandler())


def announce(message: str, category: type[Warning] | None = None, *,
             level: int = logging.WARNING, stacklevel: int = 3) -> None:
    """Log ``message`` at ``level``; with ``category``, also ``warnings.warn`` it."""
    log.log(level, message)
    if category is not None:
        warnings.warn(message, category, stacklevel=stacklevel)


def info(message: str) -> None:
    """A decision worth knowing that changes nothing the user computes."""
    log.info(message)
