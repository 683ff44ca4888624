"""Architecture invariant: the planning layers are plain Python and never import torch.

Every module of the torch-free layers (graph, plan, policies with each paper's subpackage,
cost, sim, pool, the variant selection) is imported in a fresh interpreter in which torch
cannot be imported at all, so a module that imports torch, even indirectly, fails here.
"""

import pkgutil
import subprocess
import sys

import outcore

PLAIN_PACKAGES = ["graph", "plan", "policies", "cost", "sim", "pool", "variants"]
#: The modules of those packages that run torch (they measure or trace on this machine).
TORCH_SIDE = {"outcore.cost.measure_ops", "outcore.cost.measure_host", "outcore.cost.measure_step",
              "outcore.cost.measure_temporaries",
              "outcore.variants.conv_im2col", "outcore.variants.conv_fft",
              "outcore.variants.torchmeta", "outcore.variants.attention",
              "outcore.variants.profile"}
POLICY_PACKAGES = {"outcore.policies.vdnn", "outcore.policies.superneurons",
                   "outcore.policies.modnn", "outcore.policies.pooch", "outcore.policies.dymem",
                   "outcore.policies.auto", "outcore.policies.baseline",
                   "outcore.policies.common"}


def plain_modules() -> list[str]:
    found = ["outcore", "outcore.units", "outcore.errors", "outcore.planned"]
    for package in PLAIN_PACKAGES:
        path = [f"{outcore.__path__[0]}/{package}"]
        found.append(f"outcore.{package}")
        found += [m.name for m in pkgutil.walk_packages(path, prefix=f"outcore.{package}.")
                  if m.name not in TORCH_SIDE]
    return found


def test_the_module_list_covers_every_policy_subpackage():
    modules = set(plain_modules())
    assert modules >= POLICY_PACKAGES
    assert "outcore.policies.vdnn.cudnn" in modules and "outcore.plan.verify" in modules
    assert not modules & TORCH_SIDE


def test_plain_layers_do_not_import_torch():
    modules = plain_modules()
    code = ("import sys\n"
            "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
            f"for m in {modules!r}:\n"
            "    __import__(m)\n"
            "import outcore\n"
            "print(len(outcore.policies()), len(sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)  # the assert below shows stderr
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) >= 5


def test_torch_side_modules_do_import_torch():
    """The exclusion list is not a hiding place: each excluded module really needs torch."""
    for module in sorted(TORCH_SIDE):
        code = f"import sys\nsys.modules['torch'] = None\nimport {module}\n"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=False)
        assert done.returncode != 0, f"{module} imports without torch: move it off TORCH_SIDE"
