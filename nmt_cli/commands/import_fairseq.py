"""`nmt import-fairseq`: turn a fairseq Transformer checkpoint into an nmt run directory."""

from __future__ import annotations

from pathlib import Path

import click

from nmt_cli.interop.fairseq.importer import ImportConfig, import_fairseq as run_import

_PATH = click.Path(path_type=Path)


@click.command("import-fairseq")
@click.argument("checkpoint", type=_PATH)
@click.option("--dict-dir", required=True, type=_PATH,
              help="Directory holding the model's dict.SRC.txt and dict.TGT.txt (its data-bin).")
@click.option("--out", "out_dir", required=True, type=_PATH,
              help="Run directory to write: checkpoint.pt, meta.json, dictionaries, BPE codes.")
@click.option("--bpe-codes", type=_PATH, default=None,
              help="subword-nmt BPE codes the model was trained with (copied into the run); "
                   "without them `nmt translate` needs pre-segmented input (--input-format bpe).")
@click.option("--source-lang", "-s", default=None, help="Source language (default: from the checkpoint).")
@click.option("--target-lang", "-t", default=None, help="Target language (default: from the checkpoint).")
@click.option("--force", is_flag=True,
              help="Replace an --out directory that holds anything but this same import (its files are deleted).")
def import_fairseq(checkpoint: Path, dict_dir: Path, out_dir: Path, bpe_codes: Path | None,
                   source_lang: str | None, target_lang: str | None, force: bool) -> None:
    """Convert a fairseq Transformer CHECKPOINT (transformer, transformer_wmt_en_de,
    transformer_vaswani_wmt_en_de_big, transformer_wmt_en_de_big_t2t, ...) into a run
    directory that `nmt translate --path OUT/checkpoint.pt` reads.

    \b
    The file is read with a restricted unpickler: no code stored in it runs, and
    fairseq need not be installed. Options nmt cannot reproduce exactly (e.g.
    --layernorm-embedding, adaptive softmax, GELU) are refused by name.

    \b
    OUT is written as a whole. It must be new or empty, or hold this same import
    (same input files and languages: then nothing is written); any other OUT,
    such as an nmt training run, is refused unless --force replaces it.
    """
    result = run_import(ImportConfig(checkpoint, dict_dir, out_dir, bpe_codes, source_lang, target_lang, force))
    if not result.written:
        click.echo(f"{out_dir} already holds this import (same input files); nothing written", err=True)
        return
    click.echo(f"wrote {result.checkpoint}", err=True)
    if bpe_codes is None:
        click.echo("note: no --bpe-codes, so the run applies no BPE: translate pre-segmented text "
                   "(--input-format bpe), and with a BPE model read the output with --output-format bpe", err=True)
