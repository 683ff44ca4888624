"""Import torchvision beside the CPU build of torch 2.13 (one place, for tests and benchmarks).

PyPI's torchvision 0.28.0 (the release for torch 2.13) is built against the CUDA torch: beside
the CPU torch its compiled extension ``torchvision/_C.so`` cannot load (it links
``libtorch_cuda.so``), and then ``import torchvision`` fails in ``_meta_registrations``, which
registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` without checking that
the extension loaded (every other kernel there is guarded by ``extension._has_ops()``). No
CPU wheel of torchvision is on PyPI and there is no sdist to build.

``import_torchvision`` declares those two operator schemas (no kernel) when, and only when,
the extension did not load, then imports torchvision. Its Python parts (every model builder)
work; the compiled ops (nms, roi_align, deform_conv2d, image decoding) raise torch's "no kernel"
error, and no classification model in the corpus uses them. timm imports torchvision, so it
must be imported after this.
"""

from __future__ import annotations

import importlib.util
import types

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
_library: object | None = None


def import_torchvision() -> types.ModuleType:
    """``import torchvision``, declaring the two schemas its import needs if ``_C`` cannot
    load. Raises ImportError when torchvision is not installed."""
    global _library  # noqa: PLW0603 - the Library must outlive the call (it owns the schemas)
    import torch

    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("torchvision is not installed: pip install -e '.[test]'")
    if _library is None and not _extension_loads():
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            lib.define(schema)
        _library = lib
    import torchvision

    return torchvision


def _extension_loads() -> bool:
    """Whether torchvision's compiled extension loads beside this torch."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    from pathlib import Path

    for folder in spec.submodule_search_locations:
        for lib in Path(folder).glob("_C.*"):
            try:
                torch.ops.load_library(str(lib))
            except (OSError, RuntimeError):
                return False
            return True
    return False
