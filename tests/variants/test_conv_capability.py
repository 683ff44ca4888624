"""Every convolution variant against the framework kernel on a table of configurations
(``conv_table.CONFIGS``): offered exactly where its declaration (``outcore.variants.capability``)
covers the op, and there within its stated tolerance, with the workspace the tracker measures.

The ATen calls are recorded from the torch.nn layer itself (forward and backward, as autograd
issues them), so padding modes, ``padding="same"`` and channels_last reach the variants in
the form real models give them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from conv_table import CONFIGS, Config
from torch.utils._python_dispatch import TorchDispatchMode

from outcore.variants import capability, registry
from outcore.variants.errors import VariantUnsupported
from outcore.variants.meta import CONV, CONV_BACKWARD
from outcore.variants.profile import measured_workspace
from outcore.variants.torchmeta import arg_meta_of

VARIANTS = sorted(capability.CONV_CAPABILITIES)


class _Recorder(TorchDispatchMode):
    """Records every aten.convolution / convolution_backward call with cloned arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in (CONV, CONV_BACKWARD):
            self.calls.append((name, tuple(a.clone(memory_format=torch.preserve_format)
                                           if isinstance(a, torch.Tensor) else a
                                           for a in args)))
        return func(*args, **(kwargs or {}))


def _calls(config: Config) -> list[tuple[str, tuple[Any, ...]]]:
    torch.manual_seed(0)
    layer = config.layer()
    x = config.input().requires_grad_(True)
    with _Recorder() as rec:
        y = layer(x)
        y.backward(torch.randn_like(y))
    targets = [t for t, _ in rec.calls]
    assert targets == [CONV, CONV_BACKWARD], targets
    return rec.calls


def _error(got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    """max |got - want| / max |want| (0 for two Nones)."""
    assert (got is None) == (want is None)
    if got is None or want is None:
        return 0.0
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = float(want.abs().max()) or 1.0
    return float((got - want).abs().max()) / scale


@pytest.mark.parametrize("name", list(CONFIGS))
def test_offered_exactly_where_declared(name):
    """The variants offered for each recorded op are the table's (the framework kernel
    always); a refused one names its reason."""
    config = CONFIGS[name]
    for target, args in _calls(config):
        offered = registry.supported_variants(target, arg_meta_of(args))
        assert set(offered) == {"framework", *config.supported}, (target, offered)
        for variant in VARIANTS:
            if variant not in config.supported:
                with pytest.raises(VariantUnsupported) as info:
                    registry.check_supported(target, variant, arg_meta_of(args))
                assert info.value.reason


@pytest.mark.parametrize(("name", "variant"), [(n, v) for n, c in CONFIGS.items()
                                                 for v in sorted(c.supported)])
def test_values_within_stated_tolerance_and_workspace_exact(name, variant):
    """Forward and backward (every output) within the declaration's tolerance of the
    framework kernel; the measured workspace equals the formula the planner charges."""
    config = CONFIGS[name]
    tolerance = capability.CONV_CAPABILITIES[variant].tolerance[str(config.dtype)[6:]]
    for target, args in _calls(config):
        want = registry.implementation(target, "framework")(*args)
        with torch.no_grad():
            measured, got = measured_workspace(registry.implementation(target, variant), args, {})
        pairs = list(zip(got, want, strict=True)) if target == CONV_BACKWARD else [(got, want)]
        for i, (g, w) in enumerate(pairs):
            err = _error(g, w)
            assert err <= tolerance, f"{target} output {i}: error {err:.3g} > {tolerance:g}"
        assert measured == registry.workspace_bytes(target, variant, arg_meta_of(args))


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True), (False, False, False)])
@pytest.mark.parametrize("name", ["1d grouped", "2d depthwise strided", "3d strided grouped"])
def test_im2col_backward_every_output_mask(name, mask):
    config = CONFIGS[name]
    _, args = _calls(config)[1]
    args = (*args[:-1], list(mask))
    want = registry.implementation(CONV_BACKWARD, "framework")(*args)
    with torch.no_grad():
        measured, got = measured_workspace(registry.implementation(CONV_BACKWARD, "im2col"),
                                           args, {})
    for wanted, g, w in zip(mask, got, want, strict=True):
        # the framework's grouped 1-d backward returns a stray tensor for a False entry
        assert (g is not None) == wanted
        if wanted:
            assert _error(g, w) <= capability.IM2COL.tolerance["float32"]
    assert measured == registry.workspace_bytes(CONV_BACKWARD, "im2col", arg_meta_of(args))


def test_declared_tolerances_are_not_loose():
    """A stated tolerance is a claim about rounding, not a blanket: within 1000 ulps."""
    for declared in capability.CONV_CAPABILITIES.values():
        for dtype, tol in declared.tolerance.items():
            eps = torch.finfo(getattr(torch, dtype)).eps
            assert tol <= 1000 * eps, (dtype, tol)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_layout_capture_did_not_foresee_is_refused_at_run_time(variant):
    """Capture checks fake strides; if the real tensor arrives channels_last anyway, the
    variant raises VariantUnsupported instead of writing a layout the plan did not assume."""
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3)
    with torch.no_grad(), pytest.raises(VariantUnsupported, match="strides"):
        registry.implementation(CONV, variant)(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], 1)


def test_groups_inconsistent_with_the_weight_are_refused():
    meta = (((2, 8, 9, 9), "float32"), ((12, 2, 3, 3), "float32"), None, [1, 1], [1, 1],
            [1, 1], False, [0, 0], 3)
    assert set(registry.supported_variants(CONV, meta)) == {"framework"}
    assert math.prod((2, 2)) == 4  # 8 channels / 3 groups: no integer split
