"""Label-smoothed cross entropy, fairseq's `label_smoothed_cross_entropy` formula.

For one target token t with log-probabilities log p over a vocabulary of V symbols:

    nll    = -log p[t]
    smooth = -sum_v log p[v]
    loss   = (1 - eps - eps_i) * nll + eps_i * smooth,   eps_i = eps / (V - 1)

i.e. the target keeps probability mass 1 - eps and every other symbol gets eps / (V - 1)
(fairseq's current formula). Pad positions contribute nothing. Losses are *sums* over
tokens; the trainer divides by the number of target tokens of the whole update.

In eager mode the computation never materialises a float32 copy of the (B, T, V) logits,
so under bf16 autocast the only (B, T, V) tensors are the bf16 logits and their bf16
gradient, and the backward pass recomputes the softmax:

* on a CUDA device (with Triton), two small compiled functions do the work: the forward
  pass reads the logits and keeps each row's log-normaliser, the backward pass reads the
  logits once and writes the gradient once: at these sizes a GPU update is bound by
  memory traffic, so fewer passes make a faster update (benchmarks/HISTORY.md);
* elsewhere it works in float32 on row chunks.

When the whole model is compiled (`--compile`), the plain formula is used and the
compiler fuses it with the rest.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import warnings
from collections.abc import Callable

import torch

# Rows per chunk are chosen so that one float32 chunk is about this many elements. On a
# CPU, 1 MiB: each chunk's passes (the cast of bf16 logits, the softmax, the gradient)
# then run in a core's L2 cache, where chunks of 256 MiB went to memory at every pass
# (benchmarks/loss_speed.py measures it).
# On other devices, large chunks, for fewer kernel launches.
CPU_CHUNK_ELEMENTS = 1 << 18
CHUNK_ELEMENTS = 1 << 26


def _rows_per_chunk(logits: torch.Tensor, chunk_elements: int | None) -> int:
    if chunk_elements is None:
        chunk_elements = CPU_CHUNK_ELEMENTS if logits.device.type == "cpu" else CHUNK_ELEMENTS
    return max(1, chunk_elements // logits.size(-1))


def fused_terms(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row float32 (nll, smooth, log_z) of logits (N, V), log_z the log-normaliser.

    With log p_v = z_v - log_z: nll = log_z - z_t and smooth = V log_z - sum_v z_v.
    Written for the compiler, which reads the logits without a float32 copy.
    """
    z = logits.float()
    log_z = torch.logsumexp(z, dim=-1)  # (N,)
    nll = log_z - z.gather(1, target.unsqueeze(1)).squeeze(1)
    smooth = z.size(1) * log_z - z.sum(dim=-1)
    return nll, smooth, log_z


def fused_grad(logits: torch.Tensor, target: torch.Tensor, log_z: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """d/dz (a nll + b smooth) = (a + V b) p_v - b - a [v = t], in the logits' dtype.

    a, b (N,) are the incoming gradients of each row's nll and smooth terms. Written for
    the compiler, which makes it one pass: read the logits, write the gradient.
    """
    V = logits.size(1)
    probs = torch.exp(logits.float() - log_z.unsqueeze(1))  # (N, V)
    is_target = torch.arange(V, device=logits.device).unsqueeze(0) == target.unsqueeze(1)  # (N, V)
    grad = probs * (a + V * b).unsqueeze(1) - b.unsqueeze(1) - torch.where(is_target, a.unsqueeze(1), 0.0)
    return grad.to(logits.dtype)


FusedKernels = tuple[Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]], Callable[..., torch.Tensor]]
_compiled: FusedKernels | None = None
_compile_failed = False


class LossKernels(enum.Enum):
    """Which implementation computes the per-row loss terms (all give the same values)."""

    AUTO = "auto"  # compiled fused kernels on a CUDA device with Triton, row chunks elsewhere
    CHUNKED = "chunked"  # row chunks everywhere: what a CPU runs, measured on a GPU by the benchmarks
    EAGER_FUSED = "eager-fused"  # the fused formulas uncompiled, so that a CPU can check them


def fused_kernels(logits: torch.Tensor, choice: LossKernels = LossKernels.AUTO) -> FusedKernels | None:
    """`fused_terms` and `fused_grad` as `choice` asks: compiled for logits on a CUDA device
    where Triton is installed (None elsewhere or once compiling them has failed), eager,
    or None for the chunked path."""
    global _compiled
    if choice is LossKernels.EAGER_FUSED:
        return fused_terms, fused_grad
    if choice is LossKernels.CHUNKED or _compile_failed or not logits.is_cuda or not _have_triton():
        return None
    if _compiled is None:
        # torch.compile's default: the second number of rows it sees makes it compile once
        # more, for any number of rows, while the vocabulary size stays a constant of the
        # kernels (their index arithmetic divides by it).
        _compiled = (torch.compile(fused_terms), torch.compile(fused_grad))
    return _compiled


@functools.cache
def _have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def _run_fused(kernel: Callable, *args: torch.Tensor):
    """`kernel(*args)`, or None after a warning if it could not be compiled (no C compiler
    for Triton, say): the loss then takes its chunked path, slower but the same."""
    global _compile_failed
    try:
        return kernel(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # what the compiler raises varies with its version
        if not _compile_failed:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]  # compiler errors run long
            warnings.warn(f"the fused loss could not be compiled, using the chunked one: {reason}", stacklevel=2)
        _compile_failed = True
        return None


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-row (nll, smooth) terms from logits, with a memory-light backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, choice: LossKernels, chunk_elements: int | None):
        # logits (N, V) any float dtype; target (N,) int64
        ctx.choice, ctx.chunk_elements = choice, chunk_elements
        kernels = fused_kernels(logits, choice)
        terms = _run_fused(kernels[0], logits, target) if kernels is not None else None
        if terms is not None:
            nll, smooth, log_z = terms
            ctx.save_for_backward(logits, target, log_z)
            return nll, smooth
        N, V = logits.shape
        nll = torch.empty(N, dtype=torch.float32, device=logits.device)  # (N,) -log p[t]
        smooth = torch.empty(N, dtype=torch.float32, device=logits.device)  # (N,) -sum_v log p[v]
        step = _rows_per_chunk(logits, chunk_elements)
        for start in range(0, N, step):
            rows = slice(start, start + step)
            log_probs = torch.log_softmax(logits[rows], dim=-1, dtype=torch.float32)  # (n, V)
            nll[rows] = -log_probs.gather(1, target[rows].unsqueeze(1)).squeeze(1)
            smooth[rows] = -log_probs.sum(dim=-1)
        ctx.save_for_backward(logits, target)
        return nll, smooth

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor, grad_smooth: torch.Tensor):
        # With a, b the incoming gradients of a row's nll and smooth terms:
        # d/dz_v (a * nll + b * smooth) = (a + V b) p_v - a [v = t] - b.
        logits, target, *log_z = ctx.saved_tensors
        kernels = fused_kernels(logits, ctx.choice) if log_z else None  # log_z: the forward pass was fused
        if kernels is not None:
            grad = _run_fused(kernels[1], logits, target, log_z[0], grad_nll, grad_smooth)
            if grad is not None:
                return grad, None, None, None
        N, V = logits.shape
        grad = torch.empty_like(logits)
        in_gradient = logits.dtype == torch.float32  # the probabilities are computed in the gradient itself
        step = _rows_per_chunk(logits, ctx.chunk_elements)
        for start in range(0, N, step):
            rows = slice(start, start + step)
            targets = target[rows].unsqueeze(1)  # (n, 1)
            a, b = grad_nll[rows].unsqueeze(1), grad_smooth[rows].unsqueeze(1)  # (n, 1)
            scale = a + V * b
            if in_gradient:
                # Straight into the gradient and finished there: no (n, V) temporaries,
                # each of which would cost a pass over memory (and fresh pages on a CPU).
                probs = torch.softmax(logits[rows], dim=-1, out=grad[rows])
            else:
                probs = torch.softmax(logits[rows], dim=-1, dtype=torch.float32)  # (n, V)
            # The targets' entries (p a + p V b - b - a), from probs before they are overwritten.
            at_targets = probs.gather(1, targets).mul_(scale).sub_(b).sub_(a)  # (n, 1)
            # Every entry as p (a + V b) - b, in place while the chunk is in cache. Two
            # passes, as addcmul broadcasts the per-row b and scale without vector
            # instructions on a CPU, which makes its one pass the slower.
            probs.mul_(scale).sub_(b)
            if not in_gradient:
                grad[rows] = probs  # one cast to the gradient's dtype
            grad[rows].scatter_(1, targets, at_targets.to(grad.dtype))
        return grad, None, None, None


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int,
    kernels: LossKernels = LossKernels.AUTO,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed nll (detached) over non-pad targets.

    `logits` (B, T, V) or (N, V), any float dtype; `target` (B, T) or (N,). Both
    results are float32 scalars, in nats. The chunked path takes rows of about
    `chunk_elements` logits at a time (default: the device's, CPU_CHUNK_ELEMENTS or
    CHUNK_ELEMENTS); tests and benchmarks/loss_speed.py choose others.
    """
    V = logits.size(-1)
    logits = logits.reshape(-1, V)  # (N, V)
    target = target.reshape(-1)  # (N,)
    eps_i = epsilon / (V - 1) if V > 1 else 0.0
    weight_nll, weight_smooth = 1.0 - epsilon - eps_i, eps_i
    if torch.compiler.is_compiling():
        # The compiler fuses the plain formula into a few kernels without float32 copies,
        # and a chunk loop would make it recompile for every batch size.
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        nll = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)
        smooth = -log_probs.sum(dim=-1)
    else:
        nll, smooth = _SmoothedCrossEntropy.apply(logits, target, kernels, chunk_elements)
    mask = (target != ignore_index).float()  # (N,)
    nll, smooth = nll * mask, smooth * mask
    loss = weight_nll * nll.sum() + weight_smooth * smooth.sum()
    return loss, nll.sum().detach()
