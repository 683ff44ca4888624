"""Let a subpackage also be the public function of the same name.

``outcore.plan`` is both the planning subpackage (``outcore.plan.lower``, ...) and the
function ``outcore.plan(graph, budget, ...)``; ``outcore.policies`` is both the policy
subpackage and ``outcore.policies()``. A package cannot be shadowed by a function without
breaking ``import outcore.plan.lower``, so the package's module object is given a
``__call__`` instead (assigning a module's ``__class__`` to a ModuleType subclass is
supported Python since 3.5).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(module_name: str, target: Callable[[], Callable[..., Any]]) -> None:
    """Make ``sys.modules[module_name](...)`` call ``target()(...)`` (resolved lazily)."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return target()(*args, **kwargs)

    sys.modules[module_name].__class__ = CallableModule
