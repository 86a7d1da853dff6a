"""Label-smoothed cross entropy, fairseq's `label_smoothed_cross_entropy` formula.

For one target token t with log-probabilities log p over a vocabulary of V symbols:

    nll    = -log p[t]
    smooth = -sum_v log p[v]
    loss   = (1 - eps - eps_i) * nll + eps_i * smooth,   eps_i = eps / (V - 1)

i.e. the target keeps probability mass 1 - eps and every other symbol gets eps / (V - 1)
(fairseq's current formula). Pad positions contribute nothing. Losses are *sums* over
tokens; the trainer divides by the number of target tokens of the whole update.

In eager mode the computation never materialises a float32 copy of the (B, T, V) logits:
it works in float32 on row chunks and recomputes the softmax in the backward pass, so
under bf16 autocast the only (B, T, V) tensors are the bf16 logits and their bf16
gradient. Under torch.compile the plain formula is used and the compiler fuses it.
"""

from __future__ import annotations

import torch

# Rows per chunk are chosen so that one float32 chunk is about this many elements.
CHUNK_ELEMENTS = 1 << 26


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab_size)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-row (nll, smooth) terms from logits, with a chunked memory-light backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor):
        # logits (N, V) any float dtype; target (N,) int64
        N, V = logits.shape
        nll = torch.empty(N, dtype=torch.float32, device=logits.device)  # (N,) -log p[t]
        smooth = torch.empty(N, dtype=torch.float32, device=logits.device)  # (N,) -sum_v log p[v]
        step = _rows_per_chunk(V)
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
        logits, target = ctx.saved_tensors
        N, V = logits.shape
        grad = torch.empty_like(logits)
        step = _rows_per_chunk(V)
        for start in range(0, N, step):
            rows = slice(start, start + step)
            targets = target[rows].unsqueeze(1)  # (n, 1)
            a, b = grad_nll[rows].unsqueeze(1), grad_smooth[rows].unsqueeze(1)  # (n, 1)
            scale = a + V * b
            if logits.dtype == torch.float32:
                # Straight into the gradient and finished there: no (n, V) temporaries,
                # each of which would cost a pass over memory (and fresh pages on a CPU).
                probs = torch.softmax(logits[rows], dim=-1, out=grad[rows])
            else:
                probs = torch.softmax(logits[rows], dim=-1, dtype=torch.float32)  # (n, V)
            # The targets' entries (p a + p V b - b - a), from probs before they are overwritten.
            at_targets = probs.gather(1, targets).mul_(scale).sub_(b).sub_(a)  # (n, 1)
            # Every entry as p (a + V b) - b in one pass over memory, written in the
            # gradient's dtype: a bf16 gradient needs no float32 copy of its own.
            torch.addcmul(-b, probs, scale, out=grad[rows])
            grad[rows].scatter_(1, targets, at_targets.to(grad.dtype))
        return grad, None


def label_smoothed_nll_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed nll (detached) over non-pad targets.

    `logits` (B, T, V) or (N, V), any float dtype; `target` (B, T) or (N,). Both
    results are float32 scalars, in nats.
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
        nll, smooth = _SmoothedCrossEntropy.apply(logits, target)
    mask = (target != ignore_index).float()  # (N,)
    nll, smooth = nll * mask, smooth * mask
    loss = weight_nll * nll.sum() + weight_smooth * smooth.sum()
    return loss, nll.sum().detach()
