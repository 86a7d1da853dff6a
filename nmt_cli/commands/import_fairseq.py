"""`nmt import-fairseq`: turn a fairseq Transformer checkpoint into an nmt run directory."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.commands.outcome import say_outcome
from nmt_cli.config import FairseqImportConfig
from nmt_cli.interop.fairseq.importer import import_fairseq as run_import
from nmt_cli.options import click_options, config_from_params


@click.command("import-fairseq")
@click_options(FairseqImportConfig)
def import_fairseq(**params: Any) -> None:
    """Convert a fairseq Transformer CHECKPOINT (transformer, transformer_wmt_en_de,
    transformer_vaswani_wmt_en_de_big, transformer_wmt_en_de_big_t2t, ...) into a run
    directory that `nmt translate --path OUT/checkpoint.pt` reads.

    \b
    The file is read with a restricted unpickler: no code stored in it runs, and
    fairseq need not be installed. Options nmt cannot reproduce exactly (e.g.
    --layernorm-embedding, adaptive softmax, --activation-fn tanh) are refused by name.

    \b
    OUT is written as a whole. It must be new or empty, or hold this same import
    (same input files and languages: then nothing is written); any other OUT,
    such as an nmt training run, is refused unless --force replaces it.
    """
    cfg = config_from_params(FairseqImportConfig, params)
    result = run_import(cfg)
    written = say_outcome(result.written, cfg.out_dir, "this import (same input files)", f"wrote {result.checkpoint}")
    if written and cfg.bpe_codes is None:
        click.echo("note: no --bpe-codes, so the run applies no BPE: translate pre-segmented text "
                   "(--input-format bpe), and with a BPE model read the output with --output-format bpe", err=True)
