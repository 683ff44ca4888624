"""Weights held in host memory on a GPU: a small GPT whose parameters, gradients and AdamW
state are four times the budget trains for 20 steps with a scheduler and clipping, against
eager CUDA PyTorch; the copies slowed on purpose change nothing.

What is compared, and how exactly:

* First step's gradients: ``torch.equal`` to eager CUDA's (the same CUDA kernels run; a
  held parameter is copied to the GPU bit for bit and its gradient copied back so).
* 20 training steps: the held parameters step with torch's CPU AdamW kernels, eager steps
  them with its CUDA kernels. Element-wise fp32 ops round the same on both, but the CUDA
  compiler fuses multiply-adds (one rounding where the CPU has two) and clipping sums the
  norm in another order, so a step can differ in the last bit. From the next step on the
  gradients differ by as much, relatively, and where a gradient is near zero (terms that
  cancel) Adam's scale-free update m / (sqrt(v) + eps) turns that into a visible part of
  lr. Tolerance: ``atol=1e-4, rtol=1e-4`` on parameters (lr 3e-3: 3% of one step's
  largest move; a missed or stale update moves a parameter by about lr), ``rtol=1e-4`` on
  losses. Seen on an H200 (torch 2.11): max |param diff| 9.9e-6 after 20 clipped steps,
  2.1e-5 after 4 unclipped ones; max |loss diff| 4.8e-7. Within one device (copies slowed
  or not) the results are ``torch.equal``, and so are the first step's gradients, and
  20 bf16 steps with fp32 host masters (the same CPU AdamW on both sides).
* Memory: the tracked peak equals the predicted one every step. What the caching allocator
  reports over a whole ``train_step`` (``max_memory_allocated`` less what is allocated
  outside the plan: cuBLAS workspaces) stays within the budget plus what docs/cuda.md says
  the allocator adds: 511 bytes of rounding per storage, the largest in-kernel temporary W
  of the eager step's ops, and the optimizer step's own temporaries (single-tensor AdamW:
  two tensors the size of the largest device-held parameter).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from outcore.weights import compile as compile_weights
from outcore.zoo.transformer import build_transformer

from cuda_helpers import OpTemporaries

VOCAB, SEQ, BATCH = 512, 16, 2
LR = 3e-3
#: GPU clock cycles each copy stream spins before each copy (~5 ms): far longer than this
#: model's kernels, so every Wait and every host step reaches its copy before it lands.
SLOW = 8_000_000
PARAM_TOL = {"rtol": 1e-4, "atol": 1e-4}
LOSS_RTOL = 1e-4


def token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def gpt() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = build_transformer(vocab=VOCAB, seq_len=SEQ, n_layer=2, n_head=2, d_model=128,
                              dropout=0.0, tie_weights=False, attention="math").cuda()
    return model, batches(1, seed=1)[0]


def batches(n: int, seed: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).cuda(),
             torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).cuda()) for _ in range(n)]


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def adamw(params) -> torch.optim.AdamW:
    # foreach=False: the device-held parameters then step with the same CUDA kernels as
    # eager's (torch picks the single-tensor path anyway once parameters are on two devices)
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1, foreach=False)


def cuda_bytes(tensors) -> int:
    """Bytes of the distinct CUDA storages among ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def resident(model, opt, batch) -> int:
    """CUDA bytes the budget counts between steps: parameters, buffers, optimizer state,
    the batch."""
    state = [v for s in opt.state.values() for v in s.values()]
    return cuda_bytes([*model.parameters(), *model.buffers(), *state, *batch])


def workspace(model, batch) -> int:
    ref = copy.deepcopy(model)
    probe = OpTemporaries()
    with probe:
        token_loss(ref(batch[0]), batch[1]).backward()
    return probe.worst


def eager_step(ref, opt, x, y, clip) -> torch.Tensor:
    loss = token_loss(ref(x), y)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(list(ref.parameters()), clip)
    opt.step()
    opt.zero_grad()
    return loss.detach()


def test_first_step_gradients_are_bit_equal_to_eager_cuda() -> None:
    model, example = gpt()
    ref = copy.deepcopy(model)
    opt = adamw(model.parameters())
    with compile_weights(model, token_loss, example, optimizer=opt,
                         budget=weight_bytes(model), device="cuda") as trainer:
        held = set(trainer.held())
        assert held, "at a quarter of the weights' bytes something must be held"
        named = dict(model.named_parameters())
        for name in held:
            assert named[name].device.type == "cpu" and named[name].is_pinned(), name
        assert trainer.pinned is not None and trainer.pinned.numel() <= 1.05 * sum(
            named[n].numel() * named[n].element_size() for n in held) + 64 * len(held)
        x, y = example
        loss = trainer.step(x, y)
        ref_loss = token_loss(ref(x), y)
        ref_loss.backward()
        assert trainer.measured_peak == trainer.predicted_peak
        assert torch.equal(loss, ref_loss.detach())
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and torch.equal(p.grad.cuda(), q.grad), name
            assert p.grad.device == p.device, name


def test_twenty_steps_with_scheduler_and_clipping_match_eager_within_the_budget() -> None:
    model, example = gpt()
    ref = copy.deepcopy(model)
    opt, ref_opt = adamw(model.parameters()), adamw(ref.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 5, 0.5)
    budget = weight_bytes(model)  # weights + grads + two AdamW moments = 4x this
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    allowance = 512 * len(compile_graph_tensors(model, example)) + workspace(model, example) \
        + 2 * largest
    worst = 0.0
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         device="cuda", clip_grad_norm=0.5) as trainer:
        assert trainer.held()
        assert trainer.predicted_peak + trainer.choice.device_state <= budget
        for i, (x, y) in enumerate(batches(20)):
            torch.cuda.synchronize()
            outside = torch.cuda.memory_allocated() - resident(model, opt, (x, y))
            torch.cuda.reset_peak_memory_stats()
            loss = trainer.train_step(x, y)
            torch.cuda.synchronize()
            used = torch.cuda.max_memory_allocated() - outside
            sched.step()
            ref_loss = eager_step(ref, ref_opt, x, y, 0.5)
            ref_sched.step()
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
            assert used <= budget + allowance, f"step {i}: {used} > {budget} + {allowance}"
            torch.testing.assert_close(loss, ref_loss, rtol=LOSS_RTOL, atol=0.0)
            worst = max(worst, float((loss - ref_loss).abs()))
    diffs = {}
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cuda(), q.detach(), **PARAM_TOL, msg=name)
        diffs[name] = float((p.detach().cuda() - q.detach()).abs().max())
    print(f"\nweights-cuda: held {len(trainer.held())}/{len(diffs)}, budget {budget} B, "
          f"allowance {allowance} B, max |loss diff| {worst:.3g}, "
          f"max |param diff| {max(diffs.values()):.3g}")


def compile_graph_tensors(model, example) -> list:
    from outcore.capture import capture

    return list(capture(model, token_loss, example).tensors)


def overlapped_run(delay: int, steps: int = 4, broken: bool = False):
    """``steps`` overlapped train_steps (no clipping: each held parameter steps on the host
    thread as soon as its gradient landed) from the same start; losses and parameters."""
    model, example = gpt()
    opt = adamw(model.parameters())
    options = {"copy_delay_cycles": delay, "poison": True}
    with compile_weights(model, token_loss, example, optimizer=opt,
                         budget=weight_bytes(model), device="cuda",
                         device_options=options) as trainer:
        assert trainer.stepper.grad_of, "some parameter must be stepped on the host"
        if broken:  # the host steps no longer wait for the copies' events
            trainer.stepper.device = _NoEvents(trainer.device)
        losses = [trainer.train_step(x, y) for x, y in batches(steps, seed=3)]
        peaks = (trainer.measured_peak, trainer.predicted_peak)
    return losses, [p.detach().cuda() for p in model.parameters()], peaks


class _NoEvents:
    """The CUDA device without ``copy_event``: a host step that reads and writes on issue."""

    def __init__(self, device) -> None:
        self._device = device

    def host_tensor(self, tid: int) -> torch.Tensor:
        return self._device.host_tensor(tid)


@pytest.mark.parametrize("steps", [4])
def test_slowed_copies_change_nothing_in_overlapped_host_steps(steps: int) -> None:
    fast, fast_params, fast_peaks = overlapped_run(0, steps)
    slow, slow_params, slow_peaks = overlapped_run(SLOW, steps)
    assert fast_peaks[0] == fast_peaks[1] and slow_peaks[0] == slow_peaks[1]
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert torch.equal(a, b), f"step {i}"
    for p, q in zip(fast_params, slow_params, strict=True):
        assert torch.equal(p, q)
    # and against eager CUDA
    model, _ = gpt()
    opt = adamw(model.parameters())
    for i, (x, y) in enumerate(batches(steps, seed=3)):
        torch.testing.assert_close(fast[i], eager_step(model, opt, x, y, None),
                                   rtol=LOSS_RTOL, atol=0.0)
    worst = 0.0
    for p, q in zip(fast_params, model.parameters(), strict=True):
        torch.testing.assert_close(p, q.detach(), **PARAM_TOL)
        worst = max(worst, float((p - q.detach()).abs().max()))
    print(f"\nweights-cuda overlapped: {steps} steps, max |param diff| vs eager {worst:.3g}")


def test_a_host_step_that_does_not_wait_for_its_copies_is_caught() -> None:
    """Test of the test: without the event waits, the slowed copies are read unfinished."""
    _, fast_params, _ = overlapped_run(0, 2)
    _, broken_params, _ = overlapped_run(SLOW, 2, broken=True)
    assert not all(torch.equal(p, q) for p, q in zip(fast_params, broken_params, strict=True))


def test_bf16_with_fp32_host_masters_twenty_steps_are_bit_equal_to_eager() -> None:
    """bf16 weights on the GPU, fp32 masters and AdamW state on the host (``MasterWeights``):
    both sides run the same CUDA kernels for the step and the same CPU kernels for AdamW,
    so 20 steps with StepLR and clipping are ``torch.equal`` to the eager scheme
    (``outcore.weights.mixed.eager_step`` on CUDA)."""
    from outcore.weights.mixed import MasterWeights
    from outcore.weights.mixed import eager_step as mixed_step

    model, example = gpt()
    model = model.to(torch.bfloat16)
    ref = copy.deepcopy(model)
    master, ref_master = MasterWeights(model), MasterWeights(ref)
    opt, ref_opt = adamw(master.parameters()), adamw(ref_master.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 5, 0.5)
    budget = 2 * weight_bytes(model)  # bf16 weight + grad + fp32 master + moments = 4x this
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         device="cuda", master=master, clip_grad_norm=0.5) as trainer:
        assert trainer.held()
        for i, (x, y) in enumerate(batches(20)):
            loss = trainer.train_step(x, y)
            sched.step()
            ref_loss = token_loss(ref(x), y)
            mixed_step(ref, ref_master, ref_opt, ref_loss, clip=0.5)
            ref_sched.step()
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
            assert torch.equal(loss, ref_loss.detach()), f"step {i}"
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.detach().cuda(), q.detach()), name
        assert torch.equal(master.masters[name], ref_master.masters[name]), name
