"""`nmt generate`: parse flags into a `GenerateConfig`, decode the split, print fairseq-generate's lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from nmt_cli.config import GenerateConfig
from nmt_cli.files import make_parent_directory, published_output
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(GenerateConfig)
def generate(**params: Any) -> None:
    """Decode a binarized split of DATA_BIN and print fairseq-generate's output.

    \b
    DATA_BIN is a data-bin of `nmt preprocess` or of `fairseq-preprocess`. Per sentence, in
    fairseq's batch order: S-{id} source, T-{id} target, H-{id} score and hypothesis,
    D-{id} score and detokenized hypothesis (the H- text: fairseq's without --tokenizer/--bpe),
    P-{id} per-token scores, with --print-alignment A-{id} source-target token pairs;
    scores are log-probabilities in base 2. Then
    `Generate SUBSET with beam=K: BLEU4 = ...`, and `Translated N sentences ...` on stderr.
    Unlike fairseq 0.12, a last batch smaller than --required-batch-size-multiple is
    decoded too: every sentence gets its lines.

    \b
    Examples (an nmt data-bin's pieces are sentencepiece's; a bare --remove-bpe is "@@ "):
      nmt generate data-bin --path run/checkpoint_best.pt --gen-subset test --beam 5 \\
          --remove-bpe sentencepiece
      nmt generate data-bin --path run/checkpoint_best.pt --batch-size 128 --beam 4 --lenpen 0.6 \\
          --remove-bpe sentencepiece --quiet
      nmt generate data-bin --path run/checkpoint_best.pt --results-path out    # out/generate-test.txt
      grep ^H out/generate-test.txt | cut -f3
    """
    from nmt_cli.decode.generate import run_generate

    cfg = config_from_params(GenerateConfig, params)
    target = "-"
    if cfg.results_path is not None:  # fairseq's file name in the directory
        path = Path(cfg.results_path) / f"generate-{cfg.gen_subset}.txt"
        make_parent_directory(path)
        target = str(path)
    with published_output(target, "w") as out:
        run_generate(cfg, out, target, sys.stderr)
