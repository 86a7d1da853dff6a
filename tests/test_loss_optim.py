"""Label-smoothed loss against a naive per-token loop; the optimizer and lr schedules
against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from nmt_cli.errors import NmtError
from nmt_cli.train import loss as loss_module
from nmt_cli.train.loss import LossKernels, label_smoothed_nll_loss
from nmt_cli.train.optim import LrSchedule, build_optimizer, inverse_sqrt_lr, noam_lr, set_lr

PAD = 1


def naive_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float]:
    """fairseq's formula written token by token in plain Python floats."""
    V = logits.shape[-1]
    eps_i = eps / (V - 1)
    total, total_nll = 0.0, 0.0
    for row, t in zip(logits.reshape(-1, V).tolist(), target.reshape(-1).tolist()):
        if t == PAD:
            continue
        log_z = math.log(sum(math.exp(z) for z in row))
        logp = [z - log_z for z in row]
        nll, smooth = -logp[t], -sum(logp)
        total += (1 - eps - eps_i) * nll + eps_i * smooth
        total_nll += nll
    return total, total_nll


def target_with_pads(B: int, T: int, V: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(2, V, (B, T), generator=gen)
    target[0, -2:] = PAD
    target[-1, -1] = PAD
    return target


def reference_gradient(logits: torch.Tensor, target: torch.Tensor, eps: float, scale: float) -> torch.Tensor:
    """Autograd of the direct formula in float64."""
    reference = logits.detach().double().requires_grad_(True)
    logp = torch.log_softmax(reference, dim=-1)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    eps_i = eps / (logits.size(-1) - 1)
    ref_loss = (((1 - eps - eps_i) * nll - eps_i * logp.sum(-1)) * (target != PAD).double()).sum()
    (ref_grad,) = torch.autograd.grad(ref_loss * scale, reference)
    return ref_grad


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_matches_naive_reference(eps: float) -> None:
    B, T, V = 3, 5, 11
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    target = target_with_pads(B, T, V, seed=1)
    loss, nll = label_smoothed_nll_loss(logits, target, eps, PAD)
    ref_loss, ref_nll = naive_loss(logits, target, eps)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll, rel=1e-6)


def test_formula_used_under_torch_compile_matches_reference(monkeypatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    B, T, V = 2, 4, 7
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    target = target_with_pads(B, T, V, seed=6)
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    ref_loss, ref_nll = naive_loss(logits, target, 0.1)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-6) and nll.item() == pytest.approx(ref_nll, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # float32: computed in place
def test_gradient_matches_autograd_of_direct_formula(dtype: torch.dtype) -> None:
    B, T, V, eps = 4, 6, 9, 0.1
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_(True)
    target = target_with_pads(B, T, V, seed=2)
    # Small chunks so the chunked loops run several times.
    loss, _ = label_smoothed_nll_loss(logits, target, eps, PAD, chunk_elements=23)
    (grad,) = torch.autograd.grad(loss * 0.7, logits)
    assert grad.dtype == dtype
    ref_grad = reference_gradient(logits, target, eps, 0.7)
    # The softmax is float32 whatever the logits: gradients are good to float32 rounding.
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-6)
    assert (grad[target == PAD] == 0).all()


def test_bf16_logits_keep_float32_loss() -> None:
    B, T, V = 2, 4, 64
    logits = torch.randn(B, T, V) * 4
    target = target_with_pads(B, T, V, seed=3)
    loss32, _ = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    low = logits.bfloat16().requires_grad_(True)
    loss16, _ = label_smoothed_nll_loss(low, target, 0.1, PAD)
    loss16.backward()
    assert loss16.dtype == torch.float32 and low.grad.dtype == torch.bfloat16
    # Only the rounding of the logits to bf16 separates the two.
    ref16, _ = naive_loss(low.detach().double(), target, 0.1)
    assert loss16.item() == pytest.approx(ref16, rel=1e-5)
    assert loss16.item() == pytest.approx(loss32.item(), rel=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradient_is_the_float32_one_rounded_once(dtype: torch.dtype) -> None:
    B, T, V = 3, 7, 40
    logits = (torch.randn(B, T, V, generator=torch.Generator().manual_seed(4)) * 4).to(dtype)
    target = target_with_pads(B, T, V, seed=5)
    grads = []
    for x in (logits.clone().requires_grad_(True), logits.float().requires_grad_(True)):
        loss, _ = label_smoothed_nll_loss(x, target, 0.1, PAD, chunk_elements=50)  # several chunks
        (loss * 0.3).backward()
        grads.append(x.grad)
    assert grads[0].dtype == dtype
    assert torch.equal(grads[0], grads[1].to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_formulas_match_the_reference(dtype: torch.dtype) -> None:
    """The fused path's own formulas, run eagerly: what a CUDA device runs compiled."""
    B, T, V, eps = 3, 5, 13, 0.1
    logits = (torch.randn(B, T, V, generator=torch.Generator().manual_seed(7)) * 4).to(dtype).requires_grad_(True)
    target = target_with_pads(B, T, V, seed=8)
    loss, nll = label_smoothed_nll_loss(logits, target, eps, PAD, LossKernels.EAGER_FUSED)
    (loss * 0.7).backward()
    ref_loss, ref_nll = naive_loss(logits.detach().double(), target, eps)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-6) and nll.item() == pytest.approx(ref_nll, rel=1e-6)
    assert logits.grad.dtype == dtype
    ref_grad = reference_gradient(logits, target, eps, 0.7)
    # bf16: the float32 gradient rounded once (8 bits of mantissa).
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
    torch.testing.assert_close(logits.grad.double(), ref_grad, **tolerance)
    assert (logits.grad[target == PAD] == 0).all()


def test_a_fused_loss_that_cannot_compile_falls_back_to_the_chunked_one(monkeypatch) -> None:
    def cannot_compile(*args):
        raise RuntimeError("no C compiler\n(a long compiler log)")

    monkeypatch.setattr(loss_module, "fused_kernels", lambda logits, choice: (cannot_compile, cannot_compile))
    monkeypatch.setattr(loss_module, "_compile_failed", False)
    B, T, V = 2, 4, 9
    logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(9), requires_grad=True)
    target = target_with_pads(B, T, V, seed=10)
    with pytest.warns(UserWarning, match="fused loss could not be compiled.*no C compiler") as caught:
        loss, _ = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    assert "compiler log" not in str(caught[0].message)  # its first line only
    loss.backward()
    assert loss_module._compile_failed
    assert loss.item() == pytest.approx(naive_loss(logits.detach().double(), target, 0.1)[0], rel=1e-6)
    torch.testing.assert_close(logits.grad.double(), reference_gradient(logits, target, 0.1, 1.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_optimizer_steps_follow_the_adamw_formula(weight_decay: float) -> None:
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4, 3, generator=gen))
    optimizer = build_optimizer([param], (0.9, 0.98), 1e-8, weight_decay, torch.device("cpu"))
    ref = param.detach().double().clone()
    m, v = torch.zeros_like(ref), torch.zeros_like(ref)
    for t, lr in enumerate([1e-3, 5e-4, 2e-3], start=1):
        grad = torch.randn(4, 3, generator=gen)
        param.grad = grad.clone()
        set_lr(optimizer, lr)
        optimizer.step()
        # Loshchilov & Hutter: decay the weights, then Adam's bias-corrected step.
        g = grad.double()
        ref *= 1 - lr * weight_decay
        m = 0.9 * m + 0.1 * g
        v = 0.98 * v + 0.02 * g * g
        ref -= lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.98**t)).sqrt() + 1e-8)
        torch.testing.assert_close(param.detach().double(), ref, rtol=1e-6, atol=1e-7)


def test_inverse_sqrt_schedule() -> None:
    peak, warmup, init = 5e-4, 4000, 1e-7
    assert inverse_sqrt_lr(1, peak, warmup, init) == pytest.approx(init + (peak - init) / 4000)
    assert inverse_sqrt_lr(2000, peak, warmup, init) == pytest.approx((init + peak) / 2)
    assert inverse_sqrt_lr(4000, peak, warmup, init) == pytest.approx(peak)
    assert inverse_sqrt_lr(16000, peak, warmup, init) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(100_000, peak, warmup, init) == pytest.approx(peak * math.sqrt(4000 / 100_000))


def test_noam_schedule() -> None:
    # Hand-computed from the paper's formula with d_model 512, warm-up 4000.
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(16000, 512, 4000) == pytest.approx(512**-0.5 / 16000**0.5)
    assert noam_lr(16000, 512, 4000, factor=2.0) == pytest.approx(2 * 512**-0.5 / 126.491106, rel=1e-6)
    schedule = LrSchedule("noam", lr=1.0, warmup_updates=4000, d_model=512)
    values = [schedule.lr_at(s) for s in (1, 1000, 3999, 4000, 4001, 10_000)]
    assert values.index(max(values)) == 3


def fairseqs_fixed_lr(num_updates: int, lr: float, warmup_updates: int) -> float:
    """fairseq's FixedLRSchedule.step_update(num_updates): the rate it sets after that many
    updates, for the next one."""
    if warmup_updates > 0 and num_updates < warmup_updates:
        return (num_updates + 1) / float(warmup_updates) * lr
    return lr


@pytest.mark.parametrize("warmup", [0, 1, 4, 7])
def test_fixed_schedule_warms_up_as_fairseqs(warmup: int) -> None:
    schedule = LrSchedule("fixed", lr=3e-4, warmup_updates=warmup)
    for done in range(12):  # update done + 1 is made with the rate set after `done` updates
        assert schedule.lr_at(done + 1) == pytest.approx(fairseqs_fixed_lr(done, 3e-4, warmup), rel=1e-12), done


def test_schedule_validation() -> None:
    with pytest.raises(NmtError, match="--warmup-updates"):
        LrSchedule("inverse_sqrt", lr=1e-3, warmup_updates=0)
    with pytest.raises(NmtError, match="unknown --lr-scheduler"):
        LrSchedule("cosine", lr=1e-3, warmup_updates=10)
    assert LrSchedule("fixed", lr=3e-4, warmup_updates=0).lr_at(123) == 3e-4
