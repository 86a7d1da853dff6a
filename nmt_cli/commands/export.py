"""`nmt export`: write an nmt checkpoint as a CTranslate2 model directory or a fairseq checkpoint."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.commands.outcome import say_outcome
from nmt_cli.config import ExportConfig
from nmt_cli.options import click_options, config_from_params


@click.command("export")
@click_options(ExportConfig)
def export(**params: Any) -> None:
    """Export RUN_OR_CKPT (a checkpoint, or a run directory: its checkpoint_best.pt, else
    checkpoint_last.pt) into the directory OUT.

    \b
    --format ctranslate2: a CTranslate2 model directory (needs pip install
      'nmt-cli[ctranslate2]'), with the dictionaries, meta.json and BPE model beside it:
      `nmt translate --engine ctranslate2 --path OUT` takes raw text, and
      ctranslate2.Translator(OUT) takes the BPE pieces.
    --format fairseq: checkpoint.pt and dict.SRC.txt / dict.TGT.txt, which
      `fairseq-generate OUT --path OUT/checkpoint.pt` and fairseq-interactive load, and
      `nmt import-fairseq` reads back.

    \b
    Examples:
      nmt export --format ctranslate2 run ct2-model --quantization int8
      nmt export --format fairseq run/checkpoint_best.pt fairseq-model
    """
    from nmt_cli.interop.export import export as run_export

    cfg = config_from_params(ExportConfig, params)
    result = run_export(cfg)
    say_outcome(result.written, cfg.out_dir, f"this export of {result.checkpoint}",
                f"wrote {cfg.out_dir} ({cfg.format}) from {result.checkpoint}")
