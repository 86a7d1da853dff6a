"""Candidate selection for sampling (back-translation), with fairseq's semantics.

Each of the K beams is an independent sample. At step 0 all beams are identical,
so the K samples are drawn from beam 0 with replacement; afterwards each beam draws
one token from its own distribution. Top-k or top-p (nucleus; never both) restrict the choice;
the score of a drawn token is its unrestricted log-probability.
"""

from __future__ import annotations

import torch
from torch import Tensor


def restrict_topk(probs: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    """Keep the `topk` most probable tokens: (probs (..., k), token ids (..., k))."""
    return probs.topk(min(topk, probs.size(-1)), dim=-1)


def restrict_topp(probs: Tensor, topp: float) -> tuple[Tensor, Tensor]:
    """Keep the smallest most-probable set whose mass reaches `topp` (fairseq's rule).

    Returns probs (..., V) sorted descending with the excluded tail zeroed, and the
    matching token ids (..., V).
    """
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    below = sorted_probs.cumsum(dim=-1) < topp  # tokens strictly inside the nucleus
    # Also keep the token that crosses the threshold (the first one not below it).
    last_kept = below.sum(dim=-1, keepdim=True).clamp(max=probs.size(-1) - 1)
    keep = below.scatter(-1, last_kept, True)
    return sorted_probs.masked_fill(~keep, 0.0), sorted_ids


def sampling_weights(lprobs: Tensor) -> Tensor:
    """exp(lprobs) (..., V), fairseq's weights, except where a row's weights all
    underflow to 0: a sharp temperature whose likeliest token is banned (`</s>` before
    --min-len) leaves its allowed tokens below exp(-104). Those rows are renormalised
    first (a softmax); a row with nothing allowed at all (a model whose outputs were not
    finite) gets equal weights, and whatever it draws scores -inf."""
    probs = lprobs.exp()
    empty = probs.sum(dim=-1, keepdim=True).eq(0)
    # Computed for every row, chosen per row: no host sync (on a GPU) to ask which rows need it.
    renormalised = torch.softmax(lprobs, dim=-1).nan_to_num_(nan=1.0)
    return torch.where(empty, renormalised, probs)


def sample_candidates(
    lprobs: Tensor,
    cum_scores: Tensor,
    step: int,
    topk: int,
    topp: float,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One token per beam.

    lprobs (B, K, V) log-probabilities for the next token; cum_scores (B, K) the
    beams' summed log-probs so far. Returns (scores, tokens, beams), each (B, K):
    new summed scores, drawn tokens and the beam each extends.
    """
    B, K, V = lprobs.shape
    if step == 0:
        lprobs = lprobs[:, :1, :]  # (B, 1, V): all beams are the same at step 0
    probs = sampling_weights(lprobs)
    if topk > 0:
        probs, ids = restrict_topk(probs, topk)
    elif topp > 0:
        probs, ids = restrict_topp(probs, topp)
    else:
        ids = None
    rows = probs.reshape(-1, probs.size(-1))  # (B or B*K, V')
    if step == 0:
        drawn = torch.multinomial(rows, K, replacement=True, generator=generator).view(B, 1, K)
        beams = torch.zeros(B, K, dtype=torch.long, device=lprobs.device)
    else:
        drawn = torch.multinomial(rows, 1, replacement=True, generator=generator).view(B, K, 1)
        beams = torch.arange(K, device=lprobs.device).expand(B, K)
    tokens = drawn if ids is None else ids.gather(-1, drawn)
    token_lprobs = lprobs.gather(-1, tokens)  # (B, 1, K) or (B, K, 1)
    tokens, token_lprobs = tokens.reshape(B, K), token_lprobs.reshape(B, K)
    if step > 0:
        token_lprobs = token_lprobs + cum_scores
    return token_lprobs, tokens, beams.contiguous()
