"""outcore's plan run by Inductor: ``torch.compile(model, backend=outcore.inductor_backend(...))``.

* ``partition``: ``OutcorePartitioner``, the aot_autograd partitioner whose saved set is
  outcore's plan (recompute only), and ``Partition``, its record per graph;
* ``saved``: the plan's kept set at the forward/backward cut, mapped onto FX nodes;
* ``fused_first``: the backend's own planner (fused work recomputed first, a matrix
  product only when memory forces it), planned beside outcore-auto;
* ``heavy``: the matmul/convolution flops a compiled backward recomputes, for outcore's
  partitions and (``MinCutRecorder``) Inductor's min-cut;
* ``backend``: ``inductor_backend(budget=...)``, the torch.compile backend (Inductor with
  that partitioner).

Imports torch (load it through ``outcore.inductor_backend``, which is lazy).
"""

from outcore.compiled.backend import InductorBackend, InductorRoundingWarning, inductor_backend
from outcore.compiled.partition import OffloadNotCompiledError, OutcorePartitioner, Partition

__all__ = ["InductorBackend", "InductorRoundingWarning", "OffloadNotCompiledError",
           "OutcorePartitioner", "Partition", "inductor_backend"]
