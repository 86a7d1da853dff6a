"""`nmt preprocess`: parse flags into a `PreprocessConfig` and run the pipeline."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import PreprocessConfig
from nmt_cli.options import click_options, config_from_params, given_params


@click.command(name="preprocess")
@click_options(PreprocessConfig)
def preprocess(**params: Any) -> None:
    """Raw parallel text -> tokenized, BPE-segmented, binarized data-bin/.

    \b
    Reads PREFIX.SRC / PREFIX.TGT for every split (UTF-8, one sentence per line;
    CRLF endings and a leading byte order mark are accepted and removed). Steps:
      1. punctuation normalization + Moses tokenization of every split;
      2. cleaning of the training pairs only (empty, too long, bad length ratio),
         as Moses clean-corpus-n does; valid/test lines are never dropped;
      3. sentencepiece BPE learned on the tokenized training text and applied
         to every split;
      4. dictionaries from the training pieces (fairseq format);
      5. binarized splits SPLIT.SRC-TGT.LANG.bin/.idx.

    \b
    DESTDIR also gets meta.json (settings and counts), dict.LANG.txt and the
    BPE model, so `nmt translate` can process raw text the same way. The output
    is built in a hidden sibling directory and moved into place when complete.
    Re-running with the same inputs and settings finds the dataset up to date
    and does nothing; a DESTDIR holding anything else needs --force.
    The output is identical for any --workers. Counts go to stdout.
    """
    from nmt_cli.preprocess.progress import StageReporter
    from nmt_cli.preprocess.run import preprocess as run_preprocess, summary_lines

    cfg = config_from_params(PreprocessConfig, params)
    for line in cfg.ignored_bpe_options(given_params()):
        click.echo(line, err=True)
    result = run_preprocess(cfg, StageReporter())
    for line in summary_lines(result):
        click.echo(line)
