"""`nmt import-marian`: turn a Hugging Face MarianMTModel directory (OPUS-MT) into an nmt run directory."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.commands.outcome import say_outcome
from nmt_cli.config import MarianImportConfig
from nmt_cli.interop.marian.importer import import_marian as run_import
from nmt_cli.options import click_options, config_from_params


@click.command("import-marian")
@click_options(MarianImportConfig)
def import_marian(**params: Any) -> None:
    """Convert a Hugging Face MarianMTModel directory MODEL_DIR (an OPUS-MT model:
    config.json, model.safetensors or pytorch_model.bin, vocab.json, source.spm,
    target.spm) into a run directory whose `nmt translate --path OUT/checkpoint.pt`
    takes raw text.

    \b
    Nothing is downloaded: pass a directory (e.g. one that Hugging Face's
    `snapshot_download` or `save_pretrained` wrote). The weights are read without
    running code stored in them. Models nmt cannot compute exactly are refused by name.

    \b
    OUT is written as a whole. It must be new or empty, or hold this same import
    (then nothing is written); any other OUT is refused unless --force replaces it.
    """
    cfg = config_from_params(MarianImportConfig, params)
    result = run_import(cfg)
    say_outcome(result.written, cfg.out_dir, "this import (same input files)", f"wrote {result.checkpoint}")
