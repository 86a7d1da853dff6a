"""Scoring: reading hypotheses and references, sacreBLEU metrics, tokenized BLEU.

`nmt_cli/scoring/report.py` puts these together for `nmt score`.
"""
