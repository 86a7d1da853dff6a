"""fairseq's own BLEU (`--scoring bleu`, its C `libbleu`), the line `fairseq-generate` ends with.

It scores token sequences as they are (no tokenization): the target dictionary's pieces,
or with `--remove-bpe` the whitespace-separated words. Its conventions, kept here so
that the numbers are fairseq's: each sentence ends with `</s>`, which is trimmed off
again except when it is all there is (an empty hypothesis counts one token); an
`<unk>` of the reference never matches; the brevity penalty is min(1, exp(1 - r / c)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from nmt_cli.data.dictionary import EOS
from nmt_cli.scoring.tokenized import MAX_ORDER, ngram_counts

# Stands in for a reference `<unk>`: equal to no hypothesis token.
_NEVER_MATCHES = object()


def trimmed(tokens: Sequence[object]) -> list[object]:
    """`tokens` + `</s>` with trailing `</s>` removed, the first token always kept (libbleu's trim)."""
    out = list(tokens) + [EOS]
    while len(out) > 1 and out[-1] == EOS:
        out.pop()
    return out


@dataclass
class FairseqBleu:
    """Corpus statistics accumulated sentence by sentence, as fairseq's `Scorer.add`."""

    ref_len: int = 0
    hyp_len: int = 0
    matches: list[int] = field(default_factory=lambda: [0] * MAX_ORDER)
    totals: list[int] = field(default_factory=lambda: [0] * MAX_ORDER)

    def add(self, ref: Sequence[str], hyp: Sequence[str], unk: str | None = None) -> None:
        """One sentence pair; `unk`: the reference token that stands for an unknown word."""
        ref_tokens = [_NEVER_MATCHES if unk is not None and t == unk else t for t in trimmed(ref)]
        hyp_tokens = trimmed(hyp)
        self.ref_len += len(ref_tokens)
        self.hyp_len += len(hyp_tokens)
        for n in range(1, MAX_ORDER + 1):
            hyp_counts = ngram_counts(hyp_tokens, n)
            ref_counts = ngram_counts(ref_tokens, n)
            self.totals[n - 1] += sum(hyp_counts.values())
            self.matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())

    @property
    def precisions(self) -> list[float]:
        return [m / t if t > 0 else 0.0 for m, t in zip(self.matches, self.totals)]

    @property
    def brevity(self) -> float:
        if self.hyp_len == 0:
            return 0.0
        return min(1.0, math.exp(1 - self.ref_len / self.hyp_len))

    @property
    def score(self) -> float:
        if min(self.precisions) == 0.0:
            return 0.0
        return self.brevity * math.exp(sum(math.log(p) for p in self.precisions) / MAX_ORDER) * 100

    def result_string(self) -> str:
        """`BLEU4 = 27.35, 60.1/37.4/25.1/17.3 (BP=0.9, ratio=..., syslen=..., reflen=...)` as fairseq prints it."""
        p = [100 * x for x in self.precisions]
        ratio = self.hyp_len / self.ref_len if self.ref_len else 0.0
        return (f"BLEU{MAX_ORDER} = {self.score:2.2f}, {p[0]:2.1f}/{p[1]:2.1f}/{p[2]:2.1f}/{p[3]:2.1f} "
                f"(BP={self.brevity:.3f}, ratio={ratio:.3f}, syslen={self.hyp_len}, reflen={self.ref_len})")
