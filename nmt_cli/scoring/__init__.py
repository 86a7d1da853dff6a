"""Scoring: reading hypotheses and references, sacreBLEU metrics, tokenized BLEU.

`nmt_cli/score.py` puts these together for `nmt score`.
"""
