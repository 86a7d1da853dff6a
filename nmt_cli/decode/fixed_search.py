"""Beam search whose whole step, model and search together, is one CUDA graph.

With only the model's step graphed (nmt_cli/decode/graphs.py), the search's own
operators, about 80 small ones per step, are what is left for the host to launch.
Here they run on buffers of fixed shapes with the step number on the device, so the
whole step is captured and replayed: per step the host launches one graph and asks,
one step late, whether every sentence is done.

The semantics are `search.generate`'s (the same candidate, finishing and advancing
functions run inside the step), for beam search and greedy decoding without sampling
or --no-repeat-ngram-size (`supports`). How differs, not what:
* at step 0 the beams other than the first start at -inf instead of being skipped:
  the same candidates, as all beams are the same then;
* finished sentences stay in the batch, masked, until every sentence is done;
* the cache's spare buffer receives the reordered rows of its whole capacity.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, UNK_ID
from nmt_cli.decode.graphs import GraphedCall, GraphedTransformer, graph_key
from nmt_cli.decode.search import (
    BeamState,
    HostCopy,
    Hypothesis,
    advance_beams,
    best_hypotheses,
    finish_hypotheses,
    max_output_lengths,
)
from nmt_cli.errors import NmtError


def supports(cfg: DecodeConfig) -> bool:
    """Whether a search of `cfg` keeps its shapes fixed (sampling and n-gram bans do not)."""
    return not cfg.sampling and cfg.no_repeat_ngram_size == 0


@torch.inference_mode()
def generate_fixed(decoder: GraphedTransformer, src_tokens: Tensor, cfg: DecodeConfig,
                   max_target_positions: int) -> list[list[Hypothesis]]:
    """search.generate for one model, each step one GraphedCall (a CUDA graph where the
    decoder uses graphs). src_tokens (B, S) right-padded; see search.generate."""
    if not supports(cfg):
        raise ValueError("generate_fixed needs beam search without sampling or --no-repeat-ngram-size")
    B, K = src_tokens.size(0), cfg.beam
    device = src_tokens.device
    if B == 0:
        return []
    model = decoder.model
    V = model.decoder.output_projection.weight.size(0)
    if K > V:
        raise NmtError(f"--beam {K} is larger than the target vocabulary ({V} symbols)")
    src_lengths = src_tokens.ne(PAD_ID).sum(dim=1).tolist()
    max_len = max_output_lengths(src_lengths, cfg, max_target_positions)
    L = max(max_len) + 2
    state = BeamState.start(torch.tensor(max_len, device=device), K, L)
    state.cum_scores[:, 1:] = -math.inf  # step 0 expands the first beam only
    cache: dict[str, Any] = {}
    model.start_cache(model.encode(src_tokens), B * K, cache, zeroed=True)
    position = torch.zeros((), dtype=torch.long, device=device)  # the step, on the device
    calls: dict[tuple, GraphedCall] = {}
    pending: HostCopy | None = None  # the previous step's `done` flags, on their way to the host
    for step in range(L - 1):
        cache["length"] = step
        model.prepare_static_step(cache)  # may grow the cache, which drops the spare buffer
        if cache["self_kv_spare"] is None:
            cache["self_kv_spare"] = torch.zeros_like(cache["self_kv"])
        buffers = (cache["self_kv"], cache["self_kv_spare"], cache["cross_kv"], cache["cross_mask"])
        key = graph_key(calls, buffers)
        if key not in calls:
            calls[key] = GraphedCall(_whole_step(decoder, state, position, buffers, cfg), device, decoder.use_graphs)
        calls[key]()
        decoder.check(calls[key])
        cache["self_kv"], cache["self_kv_spare"] = cache["self_kv_spare"], cache["self_kv"]
        if pending is not None and bool(pending.get().all()):
            break
        pending = HostCopy(state.done)
    return best_hypotheses(state, cfg.nbest)


def _whole_step(decoder: GraphedTransformer, state: BeamState, position: Tensor, buffers: tuple[Tensor, ...],
                cfg: DecodeConfig):
    """The step at `position` as a function of fixed shapes, everything in place: the model's
    step, the search's, the cache rows gathered into the spare buffer, position + 1."""
    self_kv, spare, cross_kv, cross_mask = buffers
    B, K = state.cum_scores.shape

    def step() -> None:
        column = position.view(1) + 1  # where this step's tokens go
        last_tokens = state.tokens.index_select(1, position.view(1))  # (B*K, 1)
        lprobs = decoder.model.decode_step_static(last_tokens, position, self_kv, cross_kv, cross_mask)
        lprobs = _adjust(lprobs, position, state.max_len, K, cfg)
        V = lprobs.size(1)
        flat = (lprobs.view(B, K, V) + state.cum_scores.unsqueeze(2)).view(B, K * V)
        scores, index = flat.topk(2 * K, dim=1)
        cands = (scores, index % V, torch.div(index, V, rounding_mode="floor"))
        finish_hypotheses(state, cands, lprobs, column, cfg)
        state.done |= state.fin_count.ge(K) | state.max_len.le(position)
        rows = advance_beams(state, cands, lprobs, column, K)
        torch.index_select(self_kv, 0, rows, out=spare)
        position.add_(1)

    return step


def _adjust(lprobs: Tensor, position: Tensor, max_len: Tensor, K: int, cfg: DecodeConfig) -> Tensor:
    """search.adjust_lprobs without n-gram bans, with the step on the device."""
    if cfg.temperature != 1.0:
        lprobs = torch.log_softmax(lprobs / cfg.temperature, dim=-1)
    torch.nan_to_num(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf, out=lprobs)
    lprobs[:, PAD_ID] = -math.inf
    if cfg.unk_penalty:
        lprobs[:, UNK_ID] -= cfg.unk_penalty
    at_max = max_len.le(position).repeat_interleave(K)  # (B*K,): only </s> is allowed
    if cfg.min_len > 0:
        # Rows at their maximum length keep </s>: forcing it wins over min_len.
        lprobs[:, EOS_ID].masked_fill_(position.lt(cfg.min_len) & at_max.logical_not(), -math.inf)
    not_eos = torch.ones(lprobs.size(1), dtype=torch.bool, device=lprobs.device)
    not_eos[EOS_ID] = False
    return lprobs.masked_fill_(at_max.unsqueeze(1) & not_eos, -math.inf)
