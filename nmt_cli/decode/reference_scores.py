"""`nmt generate --score-reference`: the model's scores of the reference translations.

Teacher forcing through the search's `IncrementalDecoder` protocol, so that ensembles
score as they search (probabilities averaged over the models). Each reference is scored
as fairseq's `SequenceScorer` scores it: per-token log-probabilities (`</s>` included)
and their sum divided by the length, with no length penalty.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.decode.search import Hypothesis, IncrementalDecoder


@torch.no_grad()
def score_references(decoder: IncrementalDecoder, src_tokens: Tensor, targets: list[list[int]]) -> list[Hypothesis]:
    """One Hypothesis per sentence of src_tokens (B, S): its target (ids ending in `</s>`), scored."""
    B, T = len(targets), max(len(t) for t in targets)
    target = torch.full((B, T), PAD_ID, dtype=torch.long)  # (B, T)
    for i, ids in enumerate(targets):
        target[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    target = target.to(src_tokens.device)
    # `</s> y1 ... y_{T-1}`: the step t input; rows past their end read pads, whose outputs are not used.
    prev = torch.cat([torch.full((B, 1), EOS_ID, dtype=torch.long, device=target.device), target[:, :-1]], dim=1)
    encoder_out = decoder.encode(src_tokens)
    cache = decoder.new_cache()
    picked = []
    for t in range(T):
        lprobs = decoder.decode_step(prev[:, : t + 1], encoder_out, cache).float()  # (B, V)
        picked.append(lprobs.gather(1, target[:, t : t + 1]).squeeze(1))
    scores = torch.stack(picked, dim=1).cpu()  # (B, T)
    return [Hypothesis(ids, float(scores[i, : len(ids)].sum() / len(ids)), scores[i, : len(ids)].tolist())
            for i, ids in enumerate(targets)]
