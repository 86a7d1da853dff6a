"""An nmt checkpoint -> a fairseq checkpoint and dictionaries that fairseq 0.12 loads.

`checkpoint.pt` holds what `fairseq.checkpoint_utils.load_model_ensemble_and_task`
reads: `args`, an `argparse.Namespace` of the `transformer` architecture and the
`translation` task (fairseq turns it into its configuration itself, filling every
other option with its default), `model` with fairseq's key names (the inverse of
`import-fairseq`'s renaming: nmt_cli/interop/source.py) and an `optimizer_history`
that records the update count. Beside it, `dict.{src}.txt` and `dict.{tgt}.txt`, so
that `fairseq-generate DIR --path DIR/checkpoint.pt` and `fairseq-interactive` find
them. Only a Namespace and tensors are pickled, which `import-fairseq`'s restricted
unpickler reads back: export then import is the identity on the weights.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from nmt_cli.checkpoints.format import save_file
from nmt_cli.errors import NmtError
from nmt_cli.interop.source import ExportSource

FAIRSEQ_ARCH = "transformer"


def fairseq_args(source: ExportSource) -> argparse.Namespace:
    """The model and task arguments fairseq needs to rebuild the network exactly."""
    cfg = source.cfg
    beyond_fairseq = [flag for flag, used in (("--sinusoids marian", cfg.sinusoids != "fairseq"),
                                              ("--output-bias", cfg.output_bias),
                                              ("--start-embedding", cfg.start_embedding)) if used]
    if beyond_fairseq:
        raise NmtError(f"{source.checkpoint}: fairseq's Transformer has no {', '.join(beyond_fairseq)} "
                       "(a model imported from Marian); export it to CTranslate2 instead")
    return argparse.Namespace(
        arch=FAIRSEQ_ARCH, task="translation", criterion="cross_entropy", optimizer=None, lr_scheduler=None,
        data=".", source_lang=source.source_lang, target_lang=source.target_lang,
        encoder_embed_dim=cfg.encoder_embed_dim, encoder_ffn_embed_dim=cfg.encoder_ffn_embed_dim,
        encoder_layers=cfg.encoder_layers, encoder_attention_heads=cfg.encoder_attention_heads,
        decoder_embed_dim=cfg.decoder_embed_dim, decoder_ffn_embed_dim=cfg.decoder_ffn_embed_dim,
        decoder_layers=cfg.decoder_layers, decoder_attention_heads=cfg.decoder_attention_heads,
        decoder_input_dim=cfg.decoder_embed_dim, decoder_output_dim=cfg.decoder_embed_dim,
        encoder_normalize_before=cfg.normalize_before, decoder_normalize_before=cfg.normalize_before,
        encoder_learned_pos=cfg.learned_pos, decoder_learned_pos=cfg.learned_pos,
        share_all_embeddings=cfg.share_all_embeddings,
        share_decoder_input_output_embed=cfg.share_decoder_input_output_embed,
        no_scale_embedding=not cfg.scale_embedding, activation_fn=cfg.activation_fn,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        max_source_positions=cfg.max_source_positions, max_target_positions=cfg.max_target_positions,
        left_pad_source=True, left_pad_target=False, no_token_positional_embeddings=False,
        layernorm_embedding=False, no_decoder_final_norm=False, adaptive_softmax_cutoff=None,
    )


def fairseq_checkpoint(source: ExportSource) -> dict[str, Any]:
    """The checkpoint's contents (as fairseq-train would leave them, minus optimizer state)."""
    return {
        "args": fairseq_args(source),
        "model": dict(source.weights),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "NmtExport",
                               "lr_scheduler_state": {}, "num_updates": source.num_updates}],
        "extra_state": {},
        "last_optimizer_state": None,
    }


def write_fairseq_model(source: ExportSource, directory: Path) -> None:
    """checkpoint.pt, the dictionaries, and the run's meta.json and BPE files, into `directory`."""
    save_file(fairseq_checkpoint(source), directory / "checkpoint.pt")  # a full disk is OSError, as for the others
    source.src_dict.save(directory / f"dict.{source.source_lang}.txt")
    source.tgt_dict.save(directory / f"dict.{source.target_lang}.txt")
    for path in source.text_files:
        shutil.copyfile(path, directory / path.name)
