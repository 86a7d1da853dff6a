"""Batched beam search (and greedy decoding and sampling) over a model-agnostic protocol.

The semantics are those of fairseq's SequenceGenerator, so that the same weights give
the same hypotheses and scores:

* Every hypothesis starts with `</s>` (the decoder's BOS). At step 0 all K beams are
  identical, so only beam 0 is expanded.
* Each step takes the best 2K candidates over K beams x V tokens by summed log-prob.
  `</s>` candidates among the first K positions are finished (while the sentence has
  fewer than K finished hypotheses); the beam continues with the best K candidates
  that do not end in `</s>`.
* A sentence is done when it has K finished hypotheses or reaches its maximum output
  length, where `</s>` is forced. Finished sentences leave the batch (masked until
  then; see `generate` for when).
* A finished hypothesis scores sum(log-probs, `</s>` included) / length_penalty(len),
  len counting `</s>`.

Differences from fairseq, both invisible with real vocabularies: the maximum output
length uses each sentence's own source length (fairseq uses the padded batch width,
so its output can depend on the batch), and a beam slot left without a live
candidate is marked dead (score -inf) instead of fairseq's position-based
`cands_to_ignore` bookkeeping. Greedy decoding is beam search with K = 1.

Shapes: B sentences still decoding (shrinks as they finish), K beams, V vocabulary,
L = longest allowed output + 2 (leading `</s>`, tokens, final `</s>`), C candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, UNK_ID
from nmt_cli.decode.constraints import ConstraintSet, ConstraintTracker, rank_complete_first
from nmt_cli.decode.lenpen import length_penalty
from nmt_cli.decode.row_topk import row_topk
from nmt_cli.decode.sampling import sample_candidates
from nmt_cli.errors import NmtError


class IncrementalDecoder(Protocol):
    """What search needs from a model (or an ensemble of models).

    The encoder output is per sentence; `decode_step` gets K target rows per sentence
    (the beams, K = 1 for greedy), a sentence's rows next to each other. The cache is
    the decoder's own (a Transformer's: nmt_cli/models/decoding_state.py): the search
    makes it with `new_cache` and hands it back at every step.
    """

    # Done sentences leave the batch once this fraction of it is done (0: at once); until
    # then they stay, masked. Decoders whose steps have fixed shapes, or whose cache a
    # departure copies whole (a CPU's), ask for more. Results do not depend on it.
    sentence_drop_fraction: float

    def encode(self, src_tokens: Tensor) -> Any: ...

    def new_cache(self) -> Any:
        """An empty cache for one batch; the first `decode_step` fills it."""

    def decode_step(self, prev_tokens: Tensor, encoder_out: Any, cache: Any) -> Tensor: ...

    def reorder_cache(self, cache: Any, index: Tensor, sentence_index: Tensor | None = None) -> None:
        """Keep target rows `index` (new row i continues a row of the sentence that
        becomes sentence i // K) and, when sentences leave, sentences `sentence_index`."""

    def reorder_encoder_out(self, encoder_out: Any, index: Tensor) -> Any:
        """Keep sentences `index`, in that order."""


@dataclass
class Hypothesis:
    """One finished output."""

    tokens: list[int]  # target ids, ending with </s>
    score: float  # summed log-prob / length penalty
    positional_scores: list[float]  # log-prob of each token (same length as tokens)
    # With --print-alignment/--replace-unk: per token but the final </s>, the source
    # position it attends most (decode/forced.py); None otherwise.
    source_positions: list[int] | None = None


def check_beam_fits(beam: int, vocab_size: int) -> None:
    """NmtError when a beam is wider than the target vocabulary (there are not K distinct
    continuations to keep)."""
    if beam > vocab_size:
        raise NmtError(f"--beam {beam} is larger than the target vocabulary ({vocab_size} symbols)")


def check_min_len_fits(min_len: int, max_target_positions: int) -> None:
    """--min-len must leave room for `</s>` in the model's target positions."""
    if min_len > max_target_positions - 1:
        raise NmtError(f"--min-len {min_len} exceeds the model's longest output, {max_target_positions - 1} tokens "
                       f"(its {max_target_positions} target positions, one of them for </s>)")


def max_output_lengths(src_lengths: list[int], cfg: DecodeConfig, max_target_positions: int) -> list[int]:
    """Per sentence, the most tokens allowed before the forced `</s>`.

    a * src_len + b (src_len counts the source's `</s>`, as fairseq), capped so that
    the decoder never sees more than `max_target_positions` tokens.
    """
    cap = max_target_positions - 1
    return [max(0, min(int(cfg.max_len_a * n + cfg.max_len_b), cap)) for n in src_lengths]


def adjust_lprobs(lprobs: Tensor, generated: Tensor, step: int, at_max: Tensor | None, cfg: DecodeConfig) -> Tensor:
    """Apply temperature, bans and penalties to next-token log-probs (N, V), in place.

    generated (N, step) holds the tokens after the leading `</s>`; at_max (N,) marks
    rows whose sentence reached its maximum length (only `</s>` is allowed there),
    None when no row has.
    """
    lprobs = penalize(lprobs, cfg)
    if step < cfg.min_len:
        eos_column = lprobs[:, EOS_ID]
        # Rows at their maximum length keep </s>: forcing it wins over min_len.
        lprobs[:, EOS_ID] = eos_column.fill_(-math.inf) if at_max is None else eos_column.masked_fill(~at_max, -math.inf)
    if cfg.no_repeat_ngram_size > 0:
        block_repeated_ngrams(lprobs, generated, cfg.no_repeat_ngram_size)
    return lprobs if at_max is None else force_eos(lprobs, at_max)


def penalize(lprobs: Tensor, cfg: DecodeConfig) -> Tensor:
    """The adjustments that do not depend on the step (in place where possible):
    temperature, NaN guard, no `<pad>`, the `<unk>` penalty."""
    if cfg.temperature != 1.0:
        # From each row's best score first: the best token keeps 0 however small the
        # temperature (the others may overflow to -inf, which is harmless).
        lprobs = torch.log_softmax((lprobs - lprobs.amax(dim=-1, keepdim=True)) / cfg.temperature, dim=-1)
    torch.nan_to_num(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf, out=lprobs)
    lprobs[:, PAD_ID] = -math.inf
    if cfg.unk_penalty:
        lprobs[:, UNK_ID] -= cfg.unk_penalty
    return lprobs


def force_prefix(lprobs: Tensor, wanted: Tensor, K: int) -> None:
    """Rows of sentences whose `wanted` (B,) token is not `<pad>` may only take it (in
    place); it keeps its log-prob. The other rows are left as they are."""
    token = wanted.repeat_interleave(K).unsqueeze(1)  # (B*K, 1)
    forced = token.ne(PAD_ID)
    kept = lprobs.gather(1, token)
    lprobs.masked_fill_(forced, -math.inf)
    lprobs.scatter_(1, token, torch.where(forced, kept, lprobs.gather(1, token)))


def force_eos(lprobs: Tensor, at_max: Tensor) -> Tensor:
    """Only `</s>` stays allowed in the rows marked by at_max (N,) (in place)."""
    # The marked rows are filled whole and their `</s>` put back: a mask of the rows alone,
    # broadcast, where a mask of every (row, token) would be written and read again at
    # each step of a fixed-shape search. (Device ops only: a CUDA graph captures them.)
    eos = lprobs[:, EOS_ID].clone()
    lprobs.masked_fill_(at_max.unsqueeze(1), -math.inf)
    lprobs[:, EOS_ID] = eos
    return lprobs


def block_repeated_ngrams(lprobs: Tensor, generated: Tensor, n: int) -> None:
    """Ban (in place) every token that would repeat an n-gram of `generated` (N, t)."""
    N, t = generated.shape
    V = lprobs.size(1)
    if t < n:
        return
    windows = generated.unfold(1, n, 1)  # (N, t - n + 1, n): every n-gram so far
    suffix = generated[:, t - n + 1 :]  # (N, n - 1): what the next token would extend
    matches = (windows[:, :, :-1] == suffix.unsqueeze(1)).all(dim=-1)  # (N, W)
    # Non-matching windows write into a spare column V that is dropped afterwards.
    banned = torch.where(matches, windows[:, :, -1], torch.full_like(windows[:, :, -1], V))
    mask = torch.zeros(N, V + 1, dtype=torch.bool, device=lprobs.device).scatter_(1, banned, True)
    lprobs.masked_fill_(mask[:, :V], -math.inf)


def beam_candidates(lprobs: Tensor, cum_scores: Tensor, first_step: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K (summed score, token, beam) candidates per sentence, best first.

    lprobs (B, K, V), cum_scores (B, K). Returns three (B, C) tensors.
    A sentence's best 2K candidates are among its beams' own best 2K tokens, so each
    beam is cut to those before its score is added: no (B, K, V) sum is written.
    """
    B, K, V = lprobs.shape
    per_beam = min(2 * K, V)
    if first_step:  # all beams are the same at step 0
        scores, tokens = row_topk(lprobs[:, 0, :], per_beam)
        return scores, tokens, torch.zeros_like(tokens)
    beam_best, beam_tokens = row_topk(lprobs.reshape(B * K, V), per_beam)  # (B*K, per_beam)
    summed = (beam_best.view(B, K, per_beam) + cum_scores.unsqueeze(2)).view(B, K * per_beam)
    scores, index = summed.topk(min(2 * K, K * per_beam), dim=1)
    return scores, beam_tokens.view(B, -1).gather(1, index), torch.div(index, per_beam, rounding_mode="floor")


@dataclass
class BeamState:
    """Everything search tracks for the B sentences still decoding."""

    sentence: Tensor  # (B,) position of each sentence in the input batch
    max_len: Tensor  # (B,) most tokens before the forced </s>
    tokens: Tensor  # (B*K, L) leading </s>, then the beam's tokens, pad after
    token_lprobs: Tensor  # (B*K, L) log-prob of each token in `tokens`
    cum_scores: Tensor  # (B, K) summed log-probs; -inf marks a dead beam
    fin_tokens: Tensor  # (B, K+1, L) finished hypotheses; slot K is scratch
    fin_lprobs: Tensor  # (B, K+1, L)
    fin_scores: Tensor  # (B, K+1) normalized scores
    fin_len: Tensor  # (B, K+1) output length including </s>
    fin_count: Tensor  # (B,) finished hypotheses so far
    done: Tensor  # (B,) bool: the sentence is complete; it waits to leave the batch

    @classmethod
    def start(cls, max_len: Tensor, K: int, L: int) -> "BeamState":
        B, device = max_len.size(0), max_len.device
        tokens = torch.full((B * K, L), PAD_ID, dtype=torch.long, device=device)
        tokens[:, 0] = EOS_ID
        return cls(
            sentence=torch.arange(B, device=device),
            max_len=max_len,
            tokens=tokens,
            token_lprobs=torch.zeros(B * K, L, device=device),
            cum_scores=torch.zeros(B, K, device=device),
            fin_tokens=torch.full((B, K + 1, L), PAD_ID, dtype=torch.long, device=device),
            fin_lprobs=torch.zeros(B, K + 1, L, device=device),
            fin_scores=torch.full((B, K + 1), -math.inf, device=device),
            fin_len=torch.zeros(B, K + 1, dtype=torch.long, device=device),
            fin_count=torch.zeros(B, dtype=torch.long, device=device),
            done=torch.zeros(B, dtype=torch.bool, device=device),
        )

    def select(self, keep: Tensor, K: int) -> "BeamState":
        """The state of sentences `keep` (indices into the current B) only."""
        rows = (keep.unsqueeze(1) * K + torch.arange(K, device=keep.device)).view(-1)
        return BeamState(
            self.sentence[keep], self.max_len[keep], self.tokens[rows], self.token_lprobs[rows],
            self.cum_scores[keep], self.fin_tokens[keep], self.fin_lprobs[keep], self.fin_scores[keep],
            self.fin_len[keep], self.fin_count[keep], self.done[keep],
        )

    def prefix(self, width: int) -> "BeamState":
        """This state with its per-position tensors cut to their first `width` positions:
        views, so that writes reach this state. The positions after them hold only
        padding until a step reaches them, so a step need not copy them."""
        return replace(self, tokens=self.tokens[:, :width], token_lprobs=self.token_lprobs[:, :width],
                       fin_tokens=self.fin_tokens[:, :, :width], fin_lprobs=self.fin_lprobs[:, :, :width])


def finish_hypotheses(state: BeamState, cands: tuple[Tensor, Tensor, Tensor], lprobs: Tensor, column: Tensor,
                      divisor: float | Tensor, cfg: DecodeConfig) -> None:
    """Store the `</s>` candidates among the first K as finished hypotheses (in place).

    `column` (1,) long, on the device: step + 1, where this step's tokens go (a tensor,
    so that nothing here depends on the step on the host). `divisor`: the length
    penalty of step + 1 tokens, a number or a (1,) float32 tensor (the same quotient).
    Sentences already done are left alone, and so are their finished hypotheses.
    """
    scores, tokens, beams = (c[:, : cfg.beam] for c in cands)  # (B, K) each
    B, K = scores.shape
    L = state.tokens.size(1)
    is_eos = tokens.eq(EOS_ID) & scores.isfinite() & state.done.logical_not().unsqueeze(1)
    rank = state.fin_count.unsqueeze(1) + is_eos.long().cumsum(dim=1) - 1
    slot = torch.where(is_eos & (rank < K), rank, torch.full_like(rank, K))  # K: discard
    rows = (torch.arange(B, device=scores.device).unsqueeze(1) * K + beams).view(-1)  # (B*K,)
    hyp_tokens = state.tokens.index_select(0, rows).view(B, K, L).index_fill_(2, column, EOS_ID)
    hyp_lprobs = state.token_lprobs.index_select(0, rows).view(B, K, L)
    hyp_lprobs.index_copy_(2, column, lprobs[rows, EOS_ID].view(B, K, 1))
    slot_rows = slot.unsqueeze(2).expand(B, K, L)
    state.fin_tokens.scatter_(1, slot_rows, hyp_tokens)
    state.fin_lprobs.scatter_(1, slot_rows, hyp_lprobs)
    state.fin_scores.scatter_(1, slot, scores / divisor)
    state.fin_len.scatter_(1, slot, column.expand(B, K))
    state.fin_count += slot.lt(K).sum(dim=1)


def advance_beams(state: BeamState, cands: tuple[Tensor, Tensor, Tensor], lprobs: Tensor, column: Tensor,
                  K: int) -> Tensor:
    """Continue each sentence with its best K candidates not ending in `</s>`, in place
    (the state's tensors keep their memory). `column` as in finish_hypotheses.

    Returns the (B*K,) rows of the previous step that the new beams extend.
    """
    scores, tokens, beams = cands  # (B, C) each
    B, C = scores.shape
    is_eos = tokens.eq(EOS_ID) & scores.isfinite()
    # Sort key: live candidates first, in score order; then </s> candidates.
    order_key = is_eos.long() * C + torch.arange(C, device=scores.device)
    key, chosen = order_key.topk(K, dim=1, largest=False)  # (B, K)
    new_scores = scores.gather(1, chosen).masked_fill(key >= C, -math.inf)  # no live candidate: dead
    new_tokens = tokens.gather(1, chosen).view(-1, 1)
    rows = (torch.arange(B, device=scores.device).unsqueeze(1) * K + beams.gather(1, chosen)).view(-1)
    state.tokens.copy_(state.tokens.index_select(0, rows)).index_copy_(1, column, new_tokens)
    new_lprobs = lprobs[rows, new_tokens.view(-1)].view(-1, 1)
    state.token_lprobs.copy_(state.token_lprobs.index_select(0, rows)).index_copy_(1, column, new_lprobs)
    state.cum_scores.copy_(new_scores)
    return rows


@torch.inference_mode()
def generate(
    model: IncrementalDecoder,
    src_tokens: Tensor,
    cfg: DecodeConfig,
    max_target_positions: int,
    generator: torch.Generator | None = None,
    lagged_sync: bool | None = None,
    prefix_tokens: Tensor | None = None,
    constraints: ConstraintSet | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch: src_tokens (B, S) right-padded with `<pad>`, each ending in `</s>`.

    `prefix_tokens` (B, P), right-padded with `<pad>`: each output starts with its row's
    tokens (forced; their log-probs are the model's). `constraints`: phrases each output
    must contain (decode/constraints.py; beam search only).

    Returns, per sentence in input order, its best `cfg.nbest` hypotheses, best first.
    `generator` seeds sampling (fairseq's --sampling); beam search is deterministic.
    The one host sync per step asks which sentences are done. With `lagged_sync`
    (default: on for CUDA) the host reads the previous step's answer, so it never
    waits for the step the device is computing; done sentences are masked until
    they leave the batch one step later. Results are the same either way, and
    whenever done sentences leave the batch (see `sentence_drop_fraction` below).
    """
    B0, K = src_tokens.size(0), cfg.beam
    device = src_tokens.device
    if B0 == 0:
        return []
    src_lengths = src_tokens.ne(PAD_ID).sum(dim=1).tolist()
    max_len = max_output_lengths(src_lengths, cfg, max_target_positions)
    if prefix_tokens is not None:  # the whole prefix fits, whatever --max-len-a/b say
        max_len = [max(m, p) for m, p in zip(max_len, prefix_tokens.ne(PAD_ID).sum(dim=1).tolist())]
    if constraints is not None:  # room for the phrases on top of a free translation
        cap = max_target_positions - 1
        max_len = [min(m + extra, cap) for m, extra in zip(max_len, constraints.lengths.sum(dim=1).tolist())]
    L = max(max_len) + 2
    shortest_max_len = min(max_len)  # before this step no sentence needs a forced </s>
    state = BeamState.start(torch.tensor(max_len, device=device), K, L)
    results = BeamState.start(state.max_len, K, L)  # finished sentences are copied here
    encoder_out = model.encode(src_tokens)  # per sentence: the K beams of a sentence share it
    cache = model.new_cache()
    lagged_sync = device.type == "cuda" if lagged_sync is None else lagged_sync
    pending: HostCopy | None = None  # last step's `done` flags, on their way to the host
    drop_fraction = model.sentence_drop_fraction
    column = torch.ones(1, dtype=torch.long, device=device)  # step + 1, kept on the device
    tracker = ConstraintTracker.for_beams(constraints, K) if constraints is not None else None
    for step in range(L - 1):
        B = state.cum_scores.size(0)
        lprobs = model.decode_step(state.tokens[:, : step + 1], encoder_out, cache).float()  # (B*K, V)
        V = lprobs.size(1)
        if step == 0:
            check_beam_fits(K, V)
        at_max = state.max_len.le(step).repeat_interleave(K) if step >= shortest_max_len else None  # (B*K,)
        lprobs = adjust_lprobs(lprobs, state.tokens[:, 1 : step + 1], step, at_max, cfg)
        if prefix_tokens is not None and step < prefix_tokens.size(1):
            force_prefix(lprobs, prefix_tokens[state.sentence, step], K)
        lprobs3 = lprobs.view(B, K, V)
        if tracker is not None:
            cands = tracker.candidates(lprobs3, state.cum_scores, state.tokens[:, 1 : step + 1], state.sentence,
                                       at_max, step)
        elif cfg.sampling:
            cands = sample_candidates(lprobs3, state.cum_scores, step, cfg.sampling_topk, cfg.sampling_topp, generator)
        else:
            cands = beam_candidates(lprobs3, state.cum_scores, first_step=step == 0)
        # L fits the longest output allowed (200 tokens by default) and this step's tokens
        # go to position step + 1: the beams' reorders and the finished hypotheses copy
        # only the positions up to there, not the whole length allowed.
        filled = state.prefix(step + 2)
        finish_hypotheses(filled, cands, lprobs, column, length_penalty(step + 1, cfg.lenpen, cfg.lenpen_style), cfg)
        state.done |= state.fin_count.ge(K) | state.max_len.le(step)  # (B,)
        rows = advance_beams(filled, cands, lprobs, column, K)
        if tracker is not None:
            tracker.advance(rows, state.tokens[:, 1 : step + 2], state.sentence)
        column += 1
        done = pending if lagged_sync else HostCopy(state.done)
        kept_sentences = None  # all sentences stay, unless some leave below
        if done is not None:
            done_flags = done.get()
            done_count = int(done_flags.sum())
            if done_count == B:
                break
            if done_count >= max(1.0, drop_fraction * B):
                # Copied to the device only now: a blocking copy waits for the device's queue.
                keep = done_flags.logical_not().nonzero().squeeze(1).to(device)
                _store_finished(results, state)
                if tracker is not None:
                    tracker.keep_sentences(keep)
                state, rows, encoder_out = _drop_done(model, state, rows, encoder_out, keep, K)
                kept_sentences = keep
        pending = HostCopy(state.done) if lagged_sync else None
        model.reorder_cache(cache, rows, sentence_index=kept_sentences)
    _store_finished(results, state)
    if constraints is not None:
        return [hyps[: cfg.nbest] for hyps in rank_complete_first(best_hypotheses(results, K), constraints)]
    return best_hypotheses(results, cfg.nbest)


class HostCopy:
    """A device tensor copied to the host without blocking; `get` waits for the copy only."""

    def __init__(self, tensor: Tensor) -> None:
        self.event = None
        if tensor.is_cuda:
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = tensor.clone()

    def get(self) -> Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def _drop_done(
    model: IncrementalDecoder, state: BeamState, rows: Tensor, encoder_out: Any, keep: Tensor, K: int
) -> tuple[BeamState, Tensor, Any]:
    """Keep only sentences `keep`: their state, their cache rows and their encoder output."""
    B = state.cum_scores.size(0)
    encoder_out = model.reorder_encoder_out(encoder_out, keep)
    return state.select(keep, K), rows.view(B, K)[keep].view(-1), encoder_out


def _store_finished(results: BeamState, state: BeamState) -> None:
    """Copy the finished-hypothesis tables of all current sentences into `results`."""
    for name in ("fin_tokens", "fin_lprobs", "fin_scores", "fin_len", "fin_count"):
        getattr(results, name)[state.sentence] = getattr(state, name)


def best_hypotheses(results: BeamState, nbest: int) -> list[list[Hypothesis]]:
    """Per sentence, the `nbest` finished hypotheses by descending score (on the host)."""
    scores, lengths = results.fin_scores.cpu(), results.fin_len.cpu()
    tokens, lprobs, counts = results.fin_tokens.cpu(), results.fin_lprobs.cpu(), results.fin_count.cpu()
    out = []
    for b in range(scores.size(0)):
        count = int(counts[b])
        order = torch.sort(scores[b, :count], descending=True, stable=True).indices[:nbest].tolist()
        hyps = []
        for j in order:
            n = int(lengths[b, j])
            hyps.append(Hypothesis(tokens[b, j, 1 : n + 1].tolist(), float(scores[b, j]), lprobs[b, j, 1 : n + 1].tolist()))
        out.append(hyps)
    return out
