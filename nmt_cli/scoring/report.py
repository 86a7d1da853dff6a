"""`nmt score`: sacreBLEU's BLEU / chrF / TER, paper-style tokenized BLEU, and paired significance tests.

Two kinds of BLEU answer two questions:

- detokenized sacreBLEU (default): the number to share and compare across toolkits
  (Post, 2018); its signature says how it was computed;
- tokenized BLEU (`--tokenized-bleu`): Moses-tokenized, case-sensitive multi-bleu.perl,
  with `##AT##` compound splitting for En-De (`--compound-split`): the number in
  Vaswani et al. (2017) and the fairseq papers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from nmt_cli.config import ScoreConfig
from nmt_cli.scoring import sacre, tokenized
from nmt_cli.scoring.inputs import check_same_length, display_name, read_hypotheses, read_references

TOKENIZED_NAME = "tokenized-BLEU"


def tokenized_bleu_signature(cfg: ScoreConfig) -> str:
    tok = "pretokenized" if cfg.already_tokenized else f"moses-{cfg.target_lang}"
    compound = "yes" if cfg.compound_split else "no"
    return f"nrefs:{len(cfg.refs)}|case:mixed|tok:{tok}|compound-split:{compound}|smooth:none"


def tokenized_bleu(cfg: ScoreConfig, hyps: list[str], refs: list[list[str]]) -> tokenized.TokenizedBleu:
    """multi-bleu.perl on Moses-tokenized (and optionally compound-split) hypotheses and references."""
    lang = None if cfg.already_tokenized else cfg.target_lang
    return tokenized.multi_bleu(
        tokenized.prepare(hyps, lang, cfg.compound_split),
        [tokenized.prepare(stream, lang, cfg.compound_split) for stream in refs],
    )


def _tokenized_json(cfg: ScoreConfig, result: tokenized.TokenizedBleu) -> dict:
    return {
        "name": TOKENIZED_NAME,
        "score": float(f"{result.score:.2f}"),
        "signature": tokenized_bleu_signature(cfg),
        "verbose_score": result.format().split(", ", 1)[1],
        "counts": list(result.correct),
        "totals": list(result.total),
        "hyp_len": result.hyp_len,
        "ref_len": result.ref_len,
    }


def corpus_report(cfg: ScoreConfig, hyps: list[str], refs: list[list[str]]) -> list[str]:
    """Corpus-level results: aligned `NAME|signature = ...` lines, or one JSON list."""
    metrics = sacre.build_metrics(cfg.metrics, refs, cfg.tokenize, cfg.lowercase, sentence_level=False)
    results = sacre.corpus_scores(metrics, hyps, cfg.width, cfg.output_json)
    if cfg.tokenized_bleu:
        result = tokenized_bleu(cfg, hyps, refs)
        if cfg.output_json:
            results.append(_tokenized_json(cfg, result))
        else:
            results.append(f"{TOKENIZED_NAME}|{tokenized_bleu_signature(cfg)} = {result.format()}")
    if cfg.output_json:
        return [json.dumps(results, indent=1, ensure_ascii=False)]
    return sacre.align_on_equals(results)


def score(cfg: ScoreConfig) -> Iterator[str]:
    """Read the inputs named in `cfg` and yield the report's output lines."""
    hyps = read_hypotheses(cfg.hyp, cfg.hyp_format)
    refs = [read_references(path) for path in cfg.refs]
    streams = [(cfg.hyp, hyps), *zip(cfg.refs, refs)]
    if cfg.compare is not None:
        other = read_hypotheses(cfg.compare, cfg.hyp_format)
        streams.append((cfg.compare, other))
    check_same_length(streams)

    if cfg.compare is not None:
        metrics = sacre.build_metrics(cfg.metrics, refs, cfg.tokenize, cfg.lowercase, sentence_level=False)
        results = sacre.paired_bootstrap(
            metrics, (display_name(cfg.hyp), hyps), (display_name(cfg.compare), other), cfg.paired_bs_n, cfg.seed
        )
        yield from sacre.format_paired(results, cfg.width, cfg.output_json)
    elif cfg.sentence_level:
        metrics = sacre.build_metrics(cfg.metrics, refs, cfg.tokenize, cfg.lowercase, sentence_level=True)
        yield from sacre.sentence_scores(metrics, hyps, refs, cfg.width, cfg.output_json)
    else:
        yield from corpus_report(cfg, hyps, refs)
