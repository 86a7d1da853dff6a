"""sacreBLEU's BLEU, chrF and TER, computed and printed exactly as the `sacrebleu` command line does.

The metric objects and their `format()` come from sacreBLEU itself, so every digit
and the signature match `sacrebleu REF -i HYP -m ... -f text` (or `-f json`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from nmt_cli.errors import NmtError

def bleu_tokenizers() -> list[str]:
    """The `--tokenize` choices of the installed sacreBLEU."""
    from sacrebleu.metrics.bleu import BLEU

    return list(BLEU.TOKENIZERS)


def build_metrics(
    names: Sequence[str],
    refs: Sequence[Sequence[str]],
    tokenize: str,
    lowercase: bool,
    sentence_level: bool,
) -> dict:
    """sacreBLEU metric objects with the CLI's defaults; references are cached inside them.

    Sentence-level BLEU uses effective order, as `sacrebleu --sentence-level` does.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    metrics = {}
    for name in names:
        if name == "bleu":
            try:
                metrics[name] = BLEU(
                    lowercase=lowercase, tokenize=tokenize, effective_order=sentence_level, references=refs
                )
            except (RuntimeError, ImportError, OSError) as error:
                # ja-mecab and ko-mecab need extra packages; flores101/200 download a model.
                reason = " ".join(str(error).split())
                raise NmtError(f"sacreBLEU's --tokenize {tokenize} is not available here: {reason}") from None
        elif name == "chrf":
            metrics[name] = CHRF(references=refs)
        elif name == "ter":
            metrics[name] = TER(references=refs)
        else:
            raise ValueError(f"unknown metric {name!r}")
    return metrics


def align_on_equals(lines: list[str]) -> list[str]:
    """Right-align the text before ` = ` across lines, like the sacrebleu CLI's text output."""
    if len(lines) < 2:
        return lines
    widths = [line.index("=") - 1 for line in lines]
    width = max(widths)
    return [f"{line[:w]:>{width}}{line[w:]}" for w, line in zip(widths, lines)]


def corpus_scores(metrics: dict, hyps: Sequence[str], width: int, as_json: bool) -> list:
    """One formatted result per metric: text lines (before alignment) or sacreBLEU's JSON dicts."""
    results = []
    for metric in metrics.values():
        score = metric.corpus_score(hyps, None)
        signature = metric.get_signature().format()
        formatted = score.format(width, False, signature, as_json)
        results.append(json.loads(formatted) if as_json else formatted)
    return results


def sentence_scores(
    metrics: dict, hyps: Sequence[str], refs: Sequence[Sequence[str]], width: int, as_json: bool
) -> Iterator[str]:
    """One output line per hypothesis: the metrics as `sacrebleu -sl` prints them (tab-separated), or JSON."""
    signatures = {name: metric.get_signature().format() for name, metric in metrics.items()}
    for lineno, (hyp, *sentence_refs) in enumerate(zip(hyps, *refs), start=1):
        scores = {name: metric.sentence_score(hyp, sentence_refs) for name, metric in metrics.items()}
        if as_json:
            record = {"line": lineno}
            record.update({score.name: float(f"{score.score:.{width}f}") for score in scores.values()})
            yield json.dumps(record, ensure_ascii=False)
        else:
            yield "\t".join(scores[name].format(width, False, signatures[name]) for name in metrics)


@dataclass(frozen=True)
class SystemResult:
    """One system's corpus score in a paired test, with its bootstrap mean and 95% interval."""

    name: str
    score: float
    mean: float
    ci: float
    p_value: float | None  # None for the baseline


@dataclass(frozen=True)
class PairedResult:
    metric: str  # sacreBLEU's name, e.g. "BLEU", "chrF2"
    signature: str
    baseline: SystemResult
    system: SystemResult


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    # sacreBLEU's paired test takes its seed only from this environment variable.
    previous = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = previous


def paired_bootstrap(
    metrics: dict,
    baseline: tuple[str, Sequence[str]],
    system: tuple[str, Sequence[str]],
    n_samples: int,
    seed: int,
) -> list[PairedResult]:
    """sacreBLEU's paired bootstrap resampling (Koehn, 2004), as `sacrebleu --paired-bs` runs it."""
    from sacrebleu.significance import PairedTest

    with _sacrebleu_seed(seed):
        test = PairedTest(
            [baseline, system], {m: metrics[m] for m in metrics}, references=None, test_type="bs", n_samples=n_samples
        )
        signatures, scores = test()
    # For identical outputs every resampled difference is exactly 0 and sacreBLEU, counting
    # only strictly larger differences, would report its smallest p-value, 1/(n+1): call them
    # what they are, indistinguishable (p = 1).
    identical = list(baseline[1]) == list(system[1])
    results = []
    for metric_name, signature in signatures.items():
        (base, other) = scores[metric_name]
        p_value = 1.0 if identical else float(other.p_value)
        results.append(
            PairedResult(
                metric=metric_name,
                signature=signature.format(),
                baseline=SystemResult(baseline[0], base.score, float(base.mean), float(base.ci), None),
                system=SystemResult(system[0], other.score, float(other.mean), float(other.ci), p_value),
            )
        )
    return results


def format_paired(results: list[PairedResult], width: int, as_json: bool) -> list[str]:
    """Text: per metric, its signature and one line per system; JSON: one list of objects."""
    if as_json:
        records = [
            {
                "metric": r.metric,
                "signature": r.signature,
                "baseline": r.baseline.__dict__,
                "system": r.system.__dict__,
            }
            for r in results
        ]
        return [json.dumps(records, indent=1, ensure_ascii=False)]
    lines = []
    for r in results:
        lines.append(f"{r.metric}|{r.signature}")
        for role, s in (("baseline", r.baseline), ("system", r.system)):
            line = f"  {role:<8} {s.name}: {s.score:.{width}f} (μ = {s.mean:.{width}f} ± {s.ci:.{width}f})"
            if s.p_value is not None:
                verdict = "significant" if s.p_value < 0.05 else "not significant"
                line += f" p-value = {s.p_value:.4f} ({verdict} at p < 0.05)"
            lines.append(line)
    return lines
