"""Architecture invariant: the planning layers are plain Python and never import torch."""

import subprocess
import sys

PLAIN = ["outcore", "outcore.graph.ir", "outcore.graph.order", "outcore.graph.liveness",
         "outcore.graph.bounds", "outcore.plan.lower", "outcore.plan.verify",
         "outcore.plan.memory", "outcore.policies", "outcore.policies.auto", "outcore.sim",
         "outcore.cost.model", "outcore.cost.profiles", "outcore.pool",
         "outcore.variants.select", "outcore.variants.workspace"]


def test_plain_layers_do_not_import_torch():
    code = ("import sys\n"
            f"for m in {PLAIN!r}:\n"
            "    __import__(m)\n"
            "    assert 'torch' not in sys.modules, f'{m} imported torch'\n"
            "import outcore\n"
            "print(len(outcore.policies()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)  # the assert below shows stderr
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 5
