"""The default hardware profile: the GPU that is there, and one that knows the graph's dtypes.

``default_gpu(graph, device)`` is what ``outcore.plan``/``compile`` use when no ``gpu=`` is
given: on ``device="cuda"`` the profile of ``torch.cuda.get_device_name()`` (an H100 plans as
"h100"), on ``device="cpu"`` the measured profile of this CPU (``"this-cpu"``: host and
device memory are one memory, so nothing is offloaded), else ``DEFAULT_GPU`` (which is also
the GPU ``"cpu-emulated"`` emulates by default: its copy engines keep that GPU's
compute-to-link ratio, ``outcore.runtime.devices.bandwidth``, and its capacity is a budget
offloading does relieve); when that profile gives no peak for a dtype the graph computes
in (bfloat16 on a V100), the first catalogue profile that knows every one of them. Each
choice other than the plain default is logged on the ``outcore`` logger.
"""

from __future__ import annotations

from outcore.log import info

DEFAULT_GPU = "v100-pcie"
#: Devices whose memory is this CPU's RAM: planned with its measured profile when no gpu=.
CPU_DEVICES = ("cpu",)

#: Substrings of ``torch.cuda.get_device_name()`` -> profile, most specific first.
_NAMES = (
    ("h200", "h200"), ("h100", "h100"), ("gh200", "h100"),
    ("a100", "a100-40gb"),
    ("v100-sxm", "v100-nvlink"), ("v100", "v100-pcie"),
    ("titan xp", "titan-xp"), ("titan x", "titan-x-maxwell"),
    ("k40", "k40c"),
)
_FLOATING = ("float", "bfloat", "half", "double")


def profile_for_device_name(name: str, memory: int | None = None) -> str | None:
    """The profile of a CUDA device called ``name`` (e.g. "NVIDIA H100 80GB HBM3"), or None.

    An A100 with more than 48 GiB is "a100-80gb".
    """
    low = name.lower()
    for key, profile in _NAMES:
        if key in low:
            if profile == "a100-40gb" and ("80gb" in low or (memory or 0) > 48 * 2**30):
                return "a100-80gb"
            return profile
    return None


def detect_cuda_profile() -> str | None:
    """The profile of CUDA device 0, or None (no CUDA, or a GPU the catalogue lacks)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    memory = torch.cuda.get_device_properties(0).total_memory
    profile = profile_for_device_name(name, memory)
    if profile is None:
        info(f"no hardware profile for {name!r}; planning with {DEFAULT_GPU} (pass gpu=)")
    else:
        info(f"planning for the GPU that is here: {name!r} -> profile {profile!r}")
    return profile


def graph_dtypes(graph: object) -> set[str]:
    """The floating dtypes the graph's tensors hold."""
    tensors = getattr(graph, "tensors", [])
    return {d for d in (t.dtype.removeprefix("torch.") for t in tensors) if d.startswith(_FLOATING)}


def default_gpu(graph: object = None, device: str | None = None) -> str:
    """The profile to plan with when the user names none (see the module docstring)."""
    from outcore.cost.profiles import get_profile, profiles

    if device in CPU_DEVICES:
        from outcore.cost.profiles import THIS_CPU

        info(f"planning for this CPU (device={device!r}): measured profile {THIS_CPU!r}; "
             "host and device memory are one memory, so nothing is offloaded (pass gpu= to "
             "plan for a GPU instead)")
        return THIS_CPU
    name = (detect_cuda_profile() if device == "cuda" else None) or DEFAULT_GPU
    needed = graph_dtypes(graph) if graph is not None else set()
    missing = needed - set(get_profile(name).peak_flops)
    if not missing:
        return name
    for candidate, profile in profiles().items():
        if needed <= set(profile.peak_flops):
            info(f"profile {name!r} gives no peak for {sorted(missing)}; planning with "
                 f"{candidate!r} (pass gpu= to choose)")
            return candidate
    return name
