"""Lexically constrained beam search: dynamic beam allocation (Post & Vilar, 2018),
batched and on the device in the manner of Hu et al. (2019).

Each sentence has up to M phrases (target id sequences) that its output must contain;
`ordered` asks for them in the given order, without overlap. At every step each
sentence's candidates are

* the best 2K (summed score, token, beam) of plain beam search,
* for every beam, the next token of each phrase it can advance (ordered: of the one
  phrase it works on), and
* every beam's own best token,

with duplicates removed. A candidate's *bank* is the number of phrase tokens its
hypothesis has met (whole phrases met, plus the progress into unmet ones). So that
hypotheses that met fewer phrase tokens are not crowded out by ones that met many (or
the other way round), the K slots are dealt out across banks in turn: the best of each
bank (most tokens met first), then the second best of each, and so on (fairseq's
"stripes"). `</s>` is allowed only once every phrase is met, except at the maximum
length, where search forces it (so every input still gets an output).

Progress into a phrase is recomputed from the hypothesis' tokens at each step: the
longest end of the output that is a start of the phrase (ordered: of the output after
the previous phrase), so a phrase whose tokens repeat (`a a b` after `a a a`) is still
tracked exactly. Phrases are short, so this is W small tensor comparisons per step.

Shapes: B sentences (rows of the input batch: indexed by the search's `state.sentence`),
K beams, N = B*K rows, M phrases, W longest phrase, V vocabulary, t tokens so far,
C candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.decode.row_topk import row_topk

if TYPE_CHECKING:
    from nmt_cli.decode.search import Hypothesis


@dataclass
class ConstraintSet:
    """The phrases of every sentence of a batch."""

    tokens: Tensor  # (B, M, W) long; <pad> after each phrase and in absent phrases
    lengths: Tensor  # (B, M) long; 0: no phrase in this slot (phrases come first)
    ordered: bool

    @classmethod
    def from_lists(cls, phrases: list[list[list[int]]], ordered: bool, device: torch.device) -> "ConstraintSet":
        """`phrases[b]`: sentence b's phrases, each a non-empty list of target ids."""
        M = max(1, max(len(p) for p in phrases))
        W = max(1, max((len(ids) for p in phrases for ids in p), default=1))
        tokens = torch.full((len(phrases), M, W), PAD_ID, dtype=torch.long)
        lengths = torch.zeros(len(phrases), M, dtype=torch.long)
        for b, sentence in enumerate(phrases):
            for m, ids in enumerate(sentence):
                tokens[b, m, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                lengths[b, m] = len(ids)
        return cls(tokens.to(device), lengths.to(device), ordered)


@dataclass
class PhraseProgress:
    """Where N hypotheses stand with their phrases."""

    met: Tensor  # (N, M) bool; absent phrases count as met
    start: Tensor  # (N,) long: ordered, where the output after the last met phrase begins
    progress: Tensor  # (N, M) long: tokens of each unmet phrase (ordered: the current one) matched


def track(tokens: Tensor, lengths: Tensor, ordered: bool, history: Tensor, met: Tensor,
          start: Tensor) -> PhraseProgress:
    """The standing after `history` (N, t), the output so far (newest token last), of
    hypotheses whose standing before the newest token was `met`, `start`; `tokens`
    (N, M, W) and `lengths` (N, M) are each row's phrases."""
    N, t = history.shape
    M, W = tokens.shape[1:]
    if ordered:  # only the first unmet phrase can progress
        unmet = met.logical_not()
        active = unmet & (unmet.long().cumsum(dim=1) == 1)  # (N, M)
    else:
        active = met.logical_not()
    progress = torch.zeros(N, M, dtype=torch.long, device=history.device)
    for k in range(1, min(W, t) + 1):
        ends = (tokens[:, :, :k] == history[:, t - k :].unsqueeze(1)).all(dim=2)  # (N, M)
        fits = ends & lengths.ge(k) & active
        if ordered:
            fits &= (t - start).ge(k).unsqueeze(1)
        progress = torch.where(fits, k, progress)
    completed = active & lengths.gt(0) & progress.eq(lengths)
    if ordered:
        start = torch.where(completed.any(dim=1), t, start)
    return PhraseProgress(met | completed, start, progress.masked_fill(completed, 0))


def bank(lengths: Tensor, standing: PhraseProgress) -> Tensor:
    """Phrase tokens met (N,): whole phrases plus the progress into unmet ones."""
    return (lengths * standing.met).sum(dim=1) + standing.progress.sum(dim=1)


@dataclass
class ConstraintTracker:
    """The phrases' standing of the search's N rows, kept in step with its beams."""

    phrases: ConstraintSet
    K: int
    met: Tensor  # (N, M) bool
    start: Tensor  # (N,) long
    progress: Tensor  # (N, M) long

    @classmethod
    def for_beams(cls, phrases: ConstraintSet, K: int) -> "ConstraintTracker":
        met = phrases.lengths.eq(0).repeat_interleave(K, dim=0)
        zeros = torch.zeros(met.shape, dtype=torch.long, device=met.device)
        return cls(phrases, K, met, zeros[:, 0].clone(), zeros)

    def _row_phrases(self, sentence: Tensor, per_row: int) -> tuple[Tensor, Tensor]:
        """Each row's phrases and lengths, `per_row` rows per sentence of `sentence` (B,)."""
        return (self.phrases.tokens[sentence].repeat_interleave(per_row, dim=0),
                self.phrases.lengths[sentence].repeat_interleave(per_row, dim=0))

    def candidates(self, lprobs: Tensor, cum_scores: Tensor, history: Tensor, sentence: Tensor,
                   at_max: Tensor | None, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """The (B, 2K) (summed score, token, beam) candidates in allocation order, for the
        search's finish_hypotheses and advance_beams. lprobs (B, K, V) (its `</s>` column
        is changed in place), cum_scores (B, K), history (N, t) the beams' tokens so far."""
        B, K, V = lprobs.shape
        device = lprobs.device
        tokens, lengths = self._row_phrases(sentence, K)  # (N, M, W), (N, M)
        now = PhraseProgress(self.met, self.start, self.progress)
        unfinished = now.met.all(dim=1).logical_not()  # (N,)
        if at_max is not None:  # at the maximum length </s> stays: an output for every input
            unfinished &= at_max.logical_not()
        lprobs.view(B * K, V)[:, EOS_ID].masked_fill_(unfinished, -math.inf)
        if step == 0:  # the beams are alike: only beam 0 may extend
            cum_scores = cum_scores.clone()
            cum_scores[:, 1:] = -math.inf
        summed = lprobs + cum_scores.unsqueeze(2)  # (B, K, V)
        # Plain beam search's best 2K.
        per_beam = min(2 * K, V)
        best, best_tokens = row_topk(summed.view(B * K, V), per_beam)
        top_scores, index = best.view(B, K * per_beam).topk(min(2 * K, K * per_beam), dim=1)
        top = (top_scores, best_tokens.view(B, -1).gather(1, index), torch.div(index, per_beam, rounding_mode="floor"))
        # Each beam's next token of every phrase it can advance.
        M = lengths.size(1)
        advancing = now.met.logical_not() & (now.progress < lengths)
        if self.phrases.ordered:
            advancing &= now.met.logical_not().long().cumsum(dim=1).eq(1)
        next_tokens = tokens.gather(2, now.progress.clamp(max=tokens.size(2) - 1).unsqueeze(2)).squeeze(2)  # (N, M)
        next_tokens = torch.where(advancing, next_tokens, EOS_ID)
        next_scores = summed.view(B * K, V).gather(1, next_tokens).masked_fill(advancing.logical_not(), -math.inf)
        beam_ids = torch.arange(K, device=device).repeat(B).unsqueeze(1)  # (N, 1)
        forced = (next_scores.view(B, K * M), next_tokens.view(B, K * M), beam_ids.expand(B * K, M).reshape(B, K * M))
        # Each beam's own best token.
        own_scores, own_tokens = summed.max(dim=2)  # (B, K)
        own = (own_scores, own_tokens, torch.arange(K, device=device).expand(B, K))
        scores, cand_tokens, beams = (torch.cat(parts, dim=1) for parts in zip(top, forced, own))  # (B, C)
        scores = _without_duplicates(scores, beams * V + cand_tokens)
        banks = self._candidate_banks(cand_tokens, beams, history, tokens, lengths)
        return _allocate(scores, cand_tokens, beams, banks, self.phrases.lengths[sentence].sum(dim=1),
                         M * tokens.size(2), 2 * K)

    def _candidate_banks(self, cand_tokens: Tensor, beams: Tensor, history: Tensor, tokens: Tensor,
                         lengths: Tensor) -> Tensor:
        """The bank (B, C) of every candidate's hypothesis: its beam's output plus its token."""
        B, C = cand_tokens.shape
        rows = (torch.arange(B, device=beams.device).unsqueeze(1) * self.K + beams).view(-1)  # (B*C,)
        extended = torch.cat([history.index_select(0, rows), cand_tokens.view(-1, 1)], dim=1)
        standing = track(tokens[rows], lengths[rows], self.phrases.ordered, extended, self.met[rows], self.start[rows])
        return bank(lengths[rows], standing).view(B, C)

    def advance(self, rows: Tensor, history: Tensor, sentence: Tensor) -> None:
        """The beams now continue rows `rows` (N,) of the last step with the last token of
        `history` (N, t)."""
        tokens, lengths = self._row_phrases(sentence, self.K)
        standing = track(tokens, lengths, self.phrases.ordered, history, self.met[rows], self.start[rows])
        self.met, self.start, self.progress = standing.met, standing.start, standing.progress

    def keep_sentences(self, keep: Tensor) -> None:
        """Keep the rows of sentences `keep` (indices into the current B), in that order."""
        rows = (keep.unsqueeze(1) * self.K + torch.arange(self.K, device=keep.device)).view(-1)
        self.met, self.start, self.progress = self.met[rows], self.start[rows], self.progress[rows]


def contains_phrases(tokens: list[int], phrases: list[list[int]], ordered: bool) -> bool:
    """Whether `tokens` contain every phrase (ordered: one after another, without overlap):
    the plain definition, on the host."""
    start = 0
    for phrase in phrases:
        n = len(phrase)
        at = next((i for i in range(start if ordered else 0, len(tokens) - n + 1) if tokens[i : i + n] == phrase), None)
        if at is None:
            return False
        start = at + n
    return True


def rank_complete_first(hypotheses: list[list[Hypothesis]], phrases: ConstraintSet) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses with those that contain all its phrases first (stable).
    Only a hypothesis forced to end at the maximum length can miss a phrase; it still
    beats having no output, but never a complete one."""
    lengths, tokens = phrases.lengths.tolist(), phrases.tokens.tolist()
    ranked = []
    for b, hyps in enumerate(hypotheses):
        wanted = [tokens[b][m][:n] for m, n in enumerate(lengths[b]) if n > 0]
        ranked.append(sorted(hyps, key=lambda h: not contains_phrases(h.tokens, wanted, phrases.ordered)))
    return ranked


def _without_duplicates(scores: Tensor, keys: Tensor) -> Tensor:
    """`scores` (B, C) with -inf at every repeat of a (beam, token) key of its row."""
    sorted_keys, order = keys.sort(dim=1, stable=True)
    repeat = torch.zeros_like(keys, dtype=torch.bool)
    repeat.scatter_(1, order[:, 1:], sorted_keys[:, 1:] == sorted_keys[:, :-1])
    return scores.masked_fill(repeat, -math.inf)


def _allocate(scores: Tensor, tokens: Tensor, beams: Tensor, banks: Tensor, total: Tensor, most: int,
              count: int) -> tuple[Tensor, Tensor, Tensor]:
    """The `count` first candidates (B, count) in dynamic beam allocation order: the best
    of each bank (most phrase tokens met first), then the second best of each, ...;
    candidates without a finite score last. `total` (B,): each sentence's phrase tokens,
    `most` a bound on them known on the host (no sync)."""
    B, C = scores.shape
    # By bank (descending), then score (descending): a stable sort by score, then by bank.
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    by_bank = banks.gather(1, by_score).argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # (B, C)
    sorted_banks = banks.gather(1, order)
    position = torch.arange(C, device=scores.device).expand(B, C)
    new_bank = torch.ones_like(sorted_banks, dtype=torch.bool)
    new_bank[:, 1:] = sorted_banks[:, 1:] != sorted_banks[:, :-1]
    rank = position - torch.where(new_bank, position, 0).cummax(dim=1).values  # place within its bank
    stripe = rank * (total.unsqueeze(1) + 1) + (total.unsqueeze(1) - sorted_banks)
    dead = scores.gather(1, order).isfinite().logical_not()
    stripe = stripe + dead.long() * (C * (most + 2))
    final = order.gather(1, stripe.argsort(dim=1, stable=True)[:, :count])
    return scores.gather(1, final), tokens.gather(1, final), beams.gather(1, final)
