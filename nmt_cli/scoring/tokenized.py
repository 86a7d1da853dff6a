"""Tokenized BLEU as the papers computed it: Moses tokenization, `##AT##` compound splitting, multi-bleu.perl.

Vaswani et al. (2017) report BLEU from tensor2tensor's `get_ende_bleu.sh`: hypotheses
and references are tokenized with Moses' `tokenizer.perl -l de`, hyphenated compounds
are split (`perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`), and `multi-bleu.perl`
scores the result. fairseq's `compound_split_bleu.sh` does the same. These numbers are
not comparable with sacreBLEU's detokenized BLEU; both are reported.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ORDER = 4

# multi-bleu.perl reads bytes, so Perl's `split` and `\S` see only ASCII whitespace;
# matching that (rather than Python's Unicode whitespace) keeps the counts identical.
_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_COMPOUND = re.compile(r"([^ \t\n\r\f\v])-([^ \t\n\r\f\v])")


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Tokenize like Moses' `tokenizer.perl -l LANG` with its defaults (escaping on, no aggressive dash splits)."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def compound_split(line: str) -> str:
    """`a-b` -> `a ##AT##-##AT## b`, non-overlapping left to right, exactly as the Perl one-liner."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def split_tokens(line: str) -> list[str]:
    """Perl's `split(' ', $line)`: runs of whitespace separate tokens; leading whitespace is ignored."""
    return [token for token in _ASCII_SPACE.split(line) if token]


def ngram_counts(tokens: list[str], order: int) -> Counter:
    return Counter(tuple(tokens[i : i + order]) for i in range(len(tokens) - order + 1))


@dataclass(frozen=True)
class TokenizedBleu:
    """Corpus statistics and score of multi-bleu.perl (case-sensitive, no smoothing)."""

    correct: tuple[int, ...]  # clipped n-gram matches, n = 1..4
    total: tuple[int, ...]  # hypothesis n-grams, n = 1..4
    hyp_len: int
    ref_len: int  # sum over sentences of the closest reference length (shorter one on ties)

    @property
    def precisions(self) -> tuple[float, ...]:
        return tuple(c / t if t else 0.0 for c, t in zip(self.correct, self.total))

    @property
    def brevity_penalty(self) -> float:
        if self.hyp_len >= self.ref_len:
            return 1.0
        return math.exp(1 - self.ref_len / self.hyp_len) if self.hyp_len else 0.0

    @property
    def score(self) -> float:
        """BLEU in [0, 100]; 0 when any n-gram order has no match (multi-bleu's log(0))."""
        if min(self.precisions) == 0.0:
            return 0.0
        return 100 * self.brevity_penalty * math.exp(sum(math.log(p) for p in self.precisions) / MAX_ORDER)

    def format(self) -> str:
        """The numbers as multi-bleu.perl prints them, after `BLEU = `."""
        p1, p2, p3, p4 = (100 * p for p in self.precisions)
        ratio = self.hyp_len / self.ref_len if self.ref_len else 0.0
        return (
            f"{self.score:.2f}, {p1:.1f}/{p2:.1f}/{p3:.1f}/{p4:.1f} "
            f"(BP={self.brevity_penalty:.3f}, ratio={ratio:.3f}, hyp_len={self.hyp_len}, ref_len={self.ref_len})"
        )


def multi_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> TokenizedBleu:
    """multi-bleu.perl on already tokenized text; `refs` holds one stream per reference set."""
    correct, total = [0] * MAX_ORDER, [0] * MAX_ORDER
    hyp_len = ref_len = 0
    for i, hyp in enumerate(hyps):
        hyp_tokens = split_tokens(hyp)
        ref_tokens = [split_tokens(stream[i]) for stream in refs]
        hyp_len += len(hyp_tokens)
        # Closest reference length; on a tie the shorter one.
        ref_len += min((abs(len(r) - len(hyp_tokens)), len(r)) for r in ref_tokens)[1]
        for n in range(1, MAX_ORDER + 1):
            max_ref_counts: Counter = Counter()
            for r in ref_tokens:
                max_ref_counts |= ngram_counts(r, n)
            hyp_counts = ngram_counts(hyp_tokens, n)
            total[n - 1] += sum(hyp_counts.values())
            correct[n - 1] += sum(min(count, max_ref_counts[g]) for g, count in hyp_counts.items())
    return TokenizedBleu(tuple(correct), tuple(total), hyp_len, ref_len)


def prepare(lines: Sequence[str], lang: str | None, split_compounds: bool) -> list[str]:
    """Moses-tokenize (unless `lang` is None: already tokenized) and optionally split compounds."""
    tokenized = list(lines) if lang is None else moses_tokenize(lines, lang)
    return [compound_split(line) for line in tokenized] if split_compounds else tokenized
