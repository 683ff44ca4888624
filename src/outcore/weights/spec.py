"""What an optimizer keeps per parameter and what its step costs, without building it.

Plain Python (no torch). ``outcore.plan(graph, budget, optimizer="adamw")`` plans a graph
captured with fake tensors, where no optimizer exists: an ``OptimizerSpec`` sizes the
optimizer's state from the parameters' shapes and dtypes.

``STATE`` is the one account of what each torch optimizer keeps per parameter (read off
torch 2.13's ``_init_group``, checked against the real state after a step by
tests/weights/test_optimizer_state.py). Every sizing goes through it: the named specs,
``torch_spec`` (a torch optimizer by class name and options), a built optimizer given to
``outcore.plan`` (``spec_of``, ``graph_state_bytes``; ``outcore plan --optimizer`` sizes
the very optimizer ``outcore run --optimizer`` builds this way) and
``outcore.weights.optimizer.state_bytes``, which sizes it for ``outcore.compile``. So the
plan of an optimizer and the run with it count the same bytes.

Two recipes, one per way of building the optimizer (tests/weights/test_state_recipes.py
checks both against torch's state after a step, in fp32 and bf16):

* built on the model's own parameters (``outcore run --optimizer``, or
  ``outcore.compile(model, ..., optimizer=opt)`` without ``master=``): torch keeps the state
  in each parameter's dtype and there are no masters; a built optimizer, or
  ``torch_spec(kind, own_dtype=True, master=False)``, sizes it;
* the named specs: the mixed-precision recipe fine-tuning runs (and ZeRO-Offload keeps on
  the host), the optimizer built on ``outcore.weights.mixed.MasterWeights``: the state in
  fp32, and an fp32 master copy of every parameter whose dtype is narrower than fp32
  (bf16/fp16 weights on the device). So AdamW holds 8 bytes per element of an fp32
  parameter and 12 of a bf16 one, plus a 4-byte step count; "sgd" (SGD with momentum) 4
  (8 with a master). For an fp32 model both recipes are the same bytes. A master and its
  state live in host memory whatever the placement, as ``MasterWeights`` keeps them
  (``graph_masters`` names those parameters for the chooser), and their step runs there.

``OptimizerSpec(name, bytes_per_element=...)`` states any other size.

The step is priced by the bytes it moves (``OptimizerSpec.update_bytes``, from ``STATE``):
the rates are AdamW's and another optimizer's scale with ``ADAM_UPDATE_BYTES`` over its
bytes (``update_rate``), so SGD without momentum (param and gradient read, param written)
steps 28/12 as many parameters per second as AdamW.

``optimizer_seconds`` is the one place the optimizer step's time enters the plan: the
chooser adds it to the simulated step (``outcore.weights.choose``) and the lower bound
takes it at the fewest host-held elements any fitting placement has
(``outcore.weights.bound``). Its contract: non-decreasing in ``host_numel`` for a fixed
total (moving a parameter's step to the host never makes the step faster), which is what
makes the bound's use of it sound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outcore.errors import InvalidArgumentError

#: Parameters per second of AdamW, when not measured: a GPU and one CPU socket (fused
#: kernels, fp32). ``outcore.weights.optimizer.measure_host_adam`` measures this CPU.
DEVICE_ADAM_RATE = 2.0e10
HOST_ADAM_RATE = 5.0e8
#: Bytes one fp32 AdamW update moves per parameter: the parameter, its gradient and the two
#: moments read, the parameter and the moments written (7 streams of 4 bytes). The rates
#: above are AdamW's; another optimizer's are scaled by ``ADAM_UPDATE_BYTES /
#: OptimizerSpec.update_bytes()`` (the step is memory-bound, ``update_rate``).
ADAM_UPDATE_BYTES = 28


def _on(options: Mapping[str, Any], key: str) -> int:
    return 1 if options.get(key) else 0


@dataclass(frozen=True)
class Kept:
    """What a torch optimizer's ``step()`` keeps per parameter: ``full(options)`` tensors
    of the parameter's shape and dtype (``options``: its param group), ``scalars`` 0-dim
    tensors of torch's scalar dtype, and with ``factored`` Adafactor's variance
    (``factored_numel`` elements of the parameter's dtype)."""

    full: Callable[[Mapping[str, Any]], int]
    scalars: int
    factored: bool = False


#: Per torch optimizer (its class name): what it keeps per parameter, read off torch 2.13's
#: ``_init_group``. Checked against the real state after one step for every entry
#: (tests/weights/test_optimizer_state.py).
STATE: dict[str, Kept] = {
    # exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad); step
    "Adam": Kept(lambda g: 2 + _on(g, "amsgrad"), 1),
    "AdamW": Kept(lambda g: 2 + _on(g, "amsgrad"), 1),
    "NAdam": Kept(lambda g: 2, 2),  # exp_avg, exp_avg_sq; step, mu_product
    "RAdam": Kept(lambda g: 2, 1),  # exp_avg, exp_avg_sq; step
    "Adamax": Kept(lambda g: 2, 1),  # exp_avg, exp_inf; step
    "Adadelta": Kept(lambda g: 2, 1),  # square_avg, acc_delta; step
    "Adagrad": Kept(lambda g: 1, 1),  # sum (made when the optimizer is built); step
    # square_avg (+ momentum_buffer with momentum > 0, + grad_avg when centered); step
    "RMSprop": Kept(lambda g: 1 + (1 if g.get("momentum", 0) > 0 else 0)
                    + _on(g, "centered"), 1),
    "SGD": Kept(lambda g: _on(g, "momentum"), 0),  # momentum_buffer when momentum != 0
    "ASGD": Kept(lambda g: 1, 3),  # ax (the average); step, eta, mu
    "Rprop": Kept(lambda g: 2, 1),  # prev (the last gradient), step_size; step
    # step; and row_var and col_var (the variance factored over the last two dimensions)
    # of a parameter of 2 or more dimensions, else variance (full size)
    "Adafactor": Kept(lambda g: 0, 1, factored=True),
}

#: Why an optimizer cannot be planned per parameter, and what to use instead.
REFUSED = {
    "LBFGS": "LBFGS keeps one state for all the parameters together (its curvature history: "
             "history_size pairs of vectors as long as every parameter flattened into one, "
             "and the last direction and gradient) and its step(closure) runs forward and "
             "backward again, several times per step; outcore holds a parameter's state "
             "where the parameter lives and steps each host-held parameter on its own, so it "
             "cannot split LBFGS. Use a per-parameter optimizer (AdamW, Adam, SGD, "
             "Adafactor, ...) with the weights planned, or plan only the activations: "
             "outcore.compile(model, loss_fn, batch, budget=...) without optimizer=, and a "
             "closure that calls trainer.step(x, y)",
}


def factored_numel(shape: Sequence[int]) -> int:
    """Elements of Adafactor's variance of a parameter of ``shape``: for 2 or more
    dimensions a row factor (the shape with the last dimension 1) and a column factor (the
    next-to-last dimension 1), else one tensor of the parameter's shape."""
    dims = list(shape)
    if len(dims) < 2:
        return math.prod(dims)
    return math.prod(dims[:-1]) + math.prod(dims[:-2]) * dims[-1]


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer's state per parameter: ``moments`` tensors of the parameter's shape
    (plus, with ``factored``, Adafactor's factored variance), an fp32 master copy of
    narrower parameters when ``master``, ``step_bytes`` of 0-dim tensors; or exactly
    ``bytes_per_element`` per element when given (the rest but ``step_bytes`` ignored).
    The tensors are fp32, or with ``own_dtype`` the parameter's own dtype (a torch
    optimizer built on the parameters themselves); a mastered parameter's are fp32 (the
    optimizer is built on the masters). ``torch_spec`` makes one from ``STATE``."""

    name: str
    moments: int = 2
    master: bool = True
    step_bytes: int = 4
    bytes_per_element: float | None = None
    factored: bool = False
    own_dtype: bool = False

    def state_bytes(self, numel: int, itemsize: int,
                    shape: Sequence[int] | None = None) -> int:
        """Bytes of one parameter's state (``numel`` elements of ``itemsize`` bytes;
        ``shape``, default one dimension, matters with ``factored``)."""
        if self.bytes_per_element is not None:
            return round(self.bytes_per_element * numel) + self.step_bytes
        mastered = self.mastered(itemsize)
        size = itemsize if self.own_dtype and not mastered else 4
        tensors = self.moments * numel
        if self.factored:
            tensors += factored_numel((numel,) if shape is None else shape)
        return tensors * size + (4 * numel if mastered else 0) + self.step_bytes

    def mastered(self, itemsize: int) -> bool:
        """Whether a parameter of ``itemsize`` bytes per element gets an fp32 master (and
        its state with it: on the host, ``MasterWeights``); never for a
        ``bytes_per_element`` spec, which has no account of its tensors."""
        return self.master and self.bytes_per_element is None and itemsize < 4

    def update_bytes(self) -> int:
        """Bytes one step of this optimizer reads and writes per parameter element, in fp32
        streams of 4 bytes: the parameter and its gradient read, the parameter written, and
        each full-size state tensor read and written (``moments``; Adafactor's factored
        variance as one, for the full-size estimate its step builds from the factors). So
        SGD without momentum 12, with momentum 20, Adam/AdamW 28 (``ADAM_UPDATE_BYTES``),
        with amsgrad 36. A spec given as ``bytes_per_element`` has no account of its
        tensors and is priced as AdamW. Independent of the parameters' dtype (the rates
        are fp32 AdamW's; a master's cast is priced apart, ``master_cast_bytes``)."""
        if self.bytes_per_element is not None:
            return ADAM_UPDATE_BYTES
        return 4 * (3 + 2 * (self.moments + (1 if self.factored else 0)))


def update_rate(adam_rate: float, update_bytes: int = ADAM_UPDATE_BYTES) -> float:
    """Parameters per second of an optimizer moving ``update_bytes`` per parameter, where
    AdamW (``ADAM_UPDATE_BYTES``) steps ``adam_rate``: the step is memory-bound, so its rate
    scales with the bytes it moves. Raises InvalidArgumentError for ``update_bytes <= 0``."""
    if update_bytes <= 0:
        raise InvalidArgumentError(update_bytes, "bytes moved per parameter above 0")
    return adam_rate * ADAM_UPDATE_BYTES / update_bytes


def update_bytes_of(optimizer: Any) -> int:
    """``OptimizerSpec.update_bytes`` of what ``spec_of`` accepts (a name, a spec or a built
    optimizer). A built one is read per param group, the most bytes of any group (groups
    may keep different state: SGD with momentum for some parameters only); one ``STATE``
    does not know is priced as AdamW (``ADAM_UPDATE_BYTES``)."""
    if isinstance(optimizer, (str, OptimizerSpec)):
        return spec_of(optimizer).update_bytes()
    from outcore.weights.optimizer import built_update_bytes

    return built_update_bytes(optimizer)


def torch_spec(kind: str, options: Mapping[str, Any] | None = None, *,
               name: str | None = None, master: bool = True, own_dtype: bool = False,
               scalar_bytes: int = 4) -> OptimizerSpec:
    """The spec of ``torch.optim.<kind>`` with ``options`` (its param group's; torch's
    defaults for the rest), from ``STATE``; ``scalar_bytes``: the bytes of one 0-dim
    state tensor (8 when torch's default dtype is float64 and it is not fused).
    ``master``/``own_dtype``: as ``OptimizerSpec``'s. Raises InvalidArgumentError for
    LBFGS (``REFUSED``: why, and what instead) and an optimizer ``STATE`` does not know."""
    if kind in REFUSED:
        raise InvalidArgumentError(kind, "a per-parameter optimizer", REFUSED[kind] + ".")
    kept = STATE.get(kind)
    if kept is None:
        raise InvalidArgumentError(kind, f"a torch optimizer among {sorted(STATE)} to plan "
                                   "with", "For another optimizer pass OptimizerSpec(name, "
                                   "bytes_per_element=...), or build it on "
                                   "model.named_parameters() and step it once: its state is "
                                   "then sized as it is.")
    return OptimizerSpec(name or kind.lower(), moments=kept.full(options or {}), master=master,
                         step_bytes=kept.scalars * scalar_bytes, factored=kept.factored,
                         own_dtype=own_dtype)


#: The named specs: torch's optimizers with their default options ("sgd": with momentum)
#: in the mixed-precision recipe (module doc).
SPECS: dict[str, OptimizerSpec] = {
    "adamw": torch_spec("AdamW"),
    "adam": torch_spec("Adam"),
    "sgd": torch_spec("SGD", {"momentum": 0.9}),
}


def spec_of(optimizer: Any) -> OptimizerSpec:
    """An ``OptimizerSpec`` from a name ("adamw", "adam", "sgd"), a spec, or a built
    ``torch.optim`` optimizer (sized from ``STATE`` as
    ``outcore.weights.optimizer.state_bytes`` sizes it: its state in the parameters' own
    dtype, no master copy; every param group must keep the same). Raises
    InvalidArgumentError for anything else."""
    if isinstance(optimizer, OptimizerSpec):
        return optimizer
    if isinstance(optimizer, str):
        spec = SPECS.get(optimizer.lower())
        if spec is None:
            raise InvalidArgumentError(optimizer, f"an optimizer name among {sorted(SPECS)}",
                                       "Or pass OptimizerSpec(name, bytes_per_element=...) "
                                       "or the torch optimizer itself.")
        return spec
    if not getattr(optimizer, "param_groups", None):
        raise InvalidArgumentError(optimizer, "an optimizer name, an OptimizerSpec or a "
                                   "torch.optim optimizer")
    from outcore.weights.optimizer import built_spec

    return built_spec(optimizer)


def optimizer_name(optimizer: Any) -> str:
    """What reports call ``optimizer``: a spec's name, else the lower-case name or class."""
    if isinstance(optimizer, OptimizerSpec):
        return optimizer.name
    return (optimizer if isinstance(optimizer, str) else type(optimizer).__name__).lower()


def graph_state_bytes(graph: Any, optimizer: Any) -> dict[str, int]:
    """Parameter name -> bytes of its optimizer state, for every parameter of ``graph``
    (``spec_of``'s sizing of each parameter's shape and dtype). A built optimizer whose
    param groups name their parameters (built on ``model.named_parameters()``) is sized
    per parameter as ``outcore.weights.optimizer.state_bytes`` sizes it (its groups may
    then keep different state; a graph parameter it does not hold keeps none)."""
    from outcore.plan.weights import parameters

    if not isinstance(optimizer, (str, OptimizerSpec)) and getattr(
            optimizer, "param_groups", None):
        from outcore.weights.optimizer import named_state_bytes

        named = named_state_bytes(optimizer, set(parameters(graph)))
        if named is not None:
            return named
    spec = spec_of(optimizer)
    return {name: spec.state_bytes(numel, itemsize, shape)
            for name, shape, numel, itemsize in _parameter_sizes(graph)}


def graph_masters(graph: Any, optimizer: Any) -> frozenset[str]:
    """Names of ``graph``'s parameters that the mixed-precision recipe of ``optimizer``
    gives an fp32 master (``OptimizerSpec.mastered``: a named spec or a spec with
    ``master``, on bf16/fp16 parameters). Their ``graph_state_bytes`` (the master and its
    state) live in host memory whatever the placement and their step runs there, as
    ``MasterWeights`` keeps them. A built optimizer has none (it is built on the
    parameters themselves)."""
    if not isinstance(optimizer, (str, OptimizerSpec)):
        return frozenset()
    spec = spec_of(optimizer)
    return frozenset(name for name, _, _, itemsize in _parameter_sizes(graph)
                     if spec.mastered(itemsize))


def _parameter_sizes(graph: Any) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Per parameter of ``graph``: (name, shape, elements, bytes per element: 4 for an
    empty one)."""
    from outcore.plan.weights import parameters

    out = []
    for name, tid in parameters(graph).items():
        t = graph.tensors[tid]
        numel = math.prod(t.shape)
        out.append((name, tuple(t.shape), numel, t.nbytes // numel if numel else 4))
    return out


def optimizer_seconds(host_numel: int, device_numel: int, *,
                      host_rate: float = HOST_ADAM_RATE,
                      device_rate: float = DEVICE_ADAM_RATE) -> float:
    """Seconds of the optimizer step with ``host_numel`` elements stepped on the host and
    ``device_numel`` on the device, one after the other (not overlapped with backward).
    Non-decreasing in ``host_numel`` at a fixed total while ``host_rate <= device_rate``
    (module doc)."""
    return host_numel / host_rate + device_numel / device_rate

