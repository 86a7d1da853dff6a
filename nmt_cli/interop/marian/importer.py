"""Convert a Hugging Face `MarianMTModel` directory (an OPUS-MT model) into an nmt run directory.

What OPUS-MT models are, in nmt's terms: a post-norm Transformer with Marian's
sinusoids (`ModelConfig.sinusoids = "marian"`), scaled embeddings, one embedding matrix
for everything or one per side, a bias on the output projection (`final_logits_bias`),
and a decoder that starts from the embedding of `<pad>` (`start_embedding`). Their text
goes through a sentencepiece model per side; a leading `>>xx<<` (a multilingual model's
target language) is one piece of its own.

nmt's dictionaries put `<s>`, `<pad>`, `</s>`, `<unk>` first (fairseq's ids), so the
vocabulary is renumbered and the embedding rows, the output projection and its bias are
permuted with it. Marian has no `<s>`: its row is zero and its bias `NEVER`, so that it
is never chosen. Anything the Hugging Face model would compute differently from these
settings is refused by name.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoints.format import check_state_dict_fits, model_checkpoint, save_checkpoint
from nmt_cli.config import MarianImportConfig, ModelConfig, check_language_code
from nmt_cli.data.dictionary import EOS, PAD, SPECIALS, UNK
from nmt_cli.errors import NmtError
from nmt_cli.interop.imported import ImportResult, holds_this_import, imported_run_meta, publish_import
from nmt_cli.interop.marian.weights import read_model_weights, weight_files
from nmt_cli.json_text import json_object
from nmt_cli.models.registry import build_model
from nmt_cli.run_lock import directory_lock
from nmt_cli.staging import check_unchanged, file_version, fingerprint
from nmt_cli.text.bpe import BpeModel

# The output bias of `<s>`, which Marian's vocabularies lack: far below any real logit.
NEVER = -1.0e4
# Hugging Face's names for the activations nmt has (ModelConfig.activation_fn).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}


@dataclass(frozen=True)
class Vocabulary:
    """One side's Marian vocabulary and the nmt ids it gets."""

    path: Path
    marian_ids: dict[str, int]  # vocab.json: piece -> Marian id
    symbols: list[str]  # nmt's dictionary by id: the specials first, then Marian's order

    def rows(self) -> list[int | None]:
        """For each nmt id, the Marian id whose row it takes (None: `<s>` that Marian lacks)."""
        return [self.marian_ids.get(symbol) for symbol in self.symbols]


def import_marian(cfg: MarianImportConfig) -> ImportResult:
    """Write `cfg.out_dir` (checkpoint.pt, meta.json, dictionaries, sentencepiece models) as a whole."""
    directory = cfg.model_dir
    if not directory.is_dir():
        raise NmtError(f"{directory} is not a directory (pass the directory of a Hugging Face MarianMTModel)")
    config = read_json(directory / "config.json")
    tokenizer_config = read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    check_marian(config, directory / "config.json")
    src_lang = cfg.source_lang or _language(tokenizer_config, "source_lang", directory / "tokenizer_config.json")
    tgt_lang = cfg.target_lang or _language(tokenizer_config, "target_lang", directory / "tokenizer_config.json")
    if not src_lang or not tgt_lang:
        raise NmtError(f"{directory / 'tokenizer_config.json'} does not tell the languages; "
                       "give --source-lang and --target-lang")
    shared = bool(config.get("share_encoder_decoder_embeddings", True))
    if src_lang == tgt_lang and not shared:
        raise NmtError(f"--source-lang and --target-lang are both {src_lang!r}, but the model has a vocabulary per side")
    special = {name: str(tokenizer_config.get(f"{name}_token", default)) for name, default in
               (("eos", EOS), ("unk", UNK), ("pad", PAD))}
    src_vocab = read_vocabulary(directory / "vocab.json", special)
    tgt_vocab = src_vocab if shared else read_vocabulary(directory / "target_vocab.json", special)
    check_special_ids(config, tgt_vocab, special, directory / "config.json")
    spm_files = {"source.spm": directory / "source.spm", "target.spm": directory / "target.spm"}
    for path in spm_files.values():
        BpeModel(path)  # a missing or broken model is refused now, not at translation

    weight_paths = weight_files(directory)
    inputs = [directory / "config.json", src_vocab.path, tgt_vocab.path, *spm_files.values(), *weight_paths]
    if tokenizer_config:
        inputs.append(directory / "tokenizer_config.json")
    weight_versions = {path: file_version(path) for path in weight_paths}
    print_id = fingerprint({"languages": [src_lang, tgt_lang]}, inputs)
    dict_names = {f"dict.{src_lang}.txt", f"dict.{tgt_lang}.txt"}
    checkpoint_path = cfg.out_dir / "checkpoint.pt"
    with directory_lock(cfg.out_dir, "--out"):  # one writer, from the check of --out to its publication
        if holds_this_import(cfg.out_dir, print_id, cfg.force, {"checkpoint.pt", "meta.json", *spm_files, *dict_names},
                             inputs):
            return ImportResult(checkpoint_path, written=False)

        read = read_model_weights(weight_paths)
        check_unchanged(weight_versions)  # the fingerprint is of the weights that were read
        weights, sharing = convert_weights(strip_model_prefix(read), config, src_vocab, tgt_vocab, directory)
        model_cfg = model_config(config, sharing)
        # Every weight is loaded next (check_state_dict_fits makes sure): no random init.
        model = build_model(model_cfg, len(src_vocab.symbols), len(tgt_vocab.symbols), initialise=False)
        check_state_dict_fits(model, weights, directory)
        model.load_state_dict(weights)
        state = model_checkpoint(model_cfg, model.state_dict(), src_lang, tgt_lang, src_vocab.symbols,
                                 tgt_vocab.symbols, num_updates=0, epoch=0)
        meta = run_meta(src_lang, tgt_lang, shared, directory, print_id)
        dictionaries = {f"dict.{src_lang}.txt": src_vocab.symbols, f"dict.{tgt_lang}.txt": tgt_vocab.symbols}

        def write(run_dir: Path) -> None:
            for name, source in spm_files.items():
                shutil.copyfile(source, run_dir / name)
            for name, symbols in dictionaries.items():
                (run_dir / name).write_text("".join(f"{s} 1\n" for s in symbols[len(SPECIALS):]), encoding="utf-8")
            (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            save_checkpoint(state, run_dir / "checkpoint.pt")

        publish_import(cfg.out_dir, write)
    return ImportResult(checkpoint_path, written=True)


# ---------------------------------------------------------------------------
# config.json


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise NmtError(f"{path} not found (a Hugging Face MarianMTModel directory holds it)")
    return json_object(path.read_bytes(), str(path))


def check_marian(config: dict[str, Any], path: Path) -> None:
    """Refuse, by name, a model that is not a MarianMTModel nmt computes exactly."""
    if config.get("model_type") != "marian":
        raise NmtError(f"{path}: model_type is {config.get('model_type')!r}; nmt imports Marian models "
                       "(model_type 'marian') only")
    architectures = config.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        raise NmtError(f"{path}: architectures {architectures} holds no MarianMTModel (an encoder-decoder); "
                       "nmt imports translation models only")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise NmtError(f"{path}: activation_function {activation!r} is not one nmt has "
                       f"({', '.join(sorted(ACTIVATIONS))})")
    for name in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                 "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings"):
        if not (isinstance(config.get(name), int) and not isinstance(config.get(name), bool) and config[name] > 0):
            raise NmtError(f"{path}: {name} must be a positive integer (got {config.get(name)!r})")
    for name in ("dropout", "attention_dropout", "activation_dropout"):  # kept for fine-tuning the import
        value = config.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise NmtError(f"{path}: {name} must be a number from 0 up to 1 (got {value!r})")
    if not isinstance(config.get("scale_embedding", False), bool):
        raise NmtError(f"{path}: scale_embedding must be true or false (got {config['scale_embedding']!r})")


def model_config(config: dict[str, Any], sharing: Sharing) -> ModelConfig:
    """The nmt model that computes what Hugging Face's MarianMTModel of `config` computes."""
    dim = config["d_model"]
    return ModelConfig(
        encoder_embed_dim=dim, decoder_embed_dim=dim,
        encoder_ffn_embed_dim=config["encoder_ffn_dim"], decoder_ffn_embed_dim=config["decoder_ffn_dim"],
        encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
        encoder_attention_heads=config["encoder_attention_heads"],
        decoder_attention_heads=config["decoder_attention_heads"],
        dropout=float(config.get("dropout", 0.1)), attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        normalize_before=False,  # Hugging Face's Marian layers are post-norm, whatever else config.json says
        share_all_embeddings=sharing.all, share_decoder_input_output_embed=sharing.decoder_output,
        max_source_positions=config["max_position_embeddings"], max_target_positions=config["max_position_embeddings"],
        learned_pos=False, scale_embedding=bool(config.get("scale_embedding", False)),
        activation_fn=ACTIVATIONS[config.get("activation_function", "gelu")],
        sinusoids="marian", output_bias=True, start_embedding=True,
    )


def _language(tokenizer_config: dict[str, Any], key: str, path: Path) -> str | None:
    """tokenizer_config.json's language code, checked as a given one is: it names a dictionary file."""
    value = tokenizer_config.get(key)
    if not (isinstance(value, str) and value):
        return None
    check_language_code(value, f"{path}: {key}")
    return value


# ---------------------------------------------------------------------------
# Vocabularies


def read_vocabulary(path: Path, special: dict[str, str]) -> Vocabulary:
    """vocab.json (piece -> id, ids 0..N-1 once each) and the nmt dictionary it becomes."""
    entries = read_json(path)
    ids = list(entries.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or sorted(ids) != list(range(len(ids))):
        raise NmtError(f"{path}: the ids must be the integers 0 to {len(entries) - 1}, each once")
    for name, token in special.items():
        if token not in entries:
            raise NmtError(f"{path} has no {name} token {token!r}")
    for piece in entries:
        if not piece or any(c.isspace() for c in piece):
            raise NmtError(f"{path}: piece {piece!r} is empty or holds whitespace, which a dictionary line cannot hold")
    # Marian's own specials take nmt's special ids; `<s>` is there only if Marian has it.
    renamed = {special["eos"]: EOS, special["unk"]: UNK, special["pad"]: PAD}
    marian_ids = {renamed.get(piece, piece): i for piece, i in entries.items()}
    rest = [piece for piece, _ in sorted(marian_ids.items(), key=lambda item: item[1]) if piece not in SPECIALS]
    return Vocabulary(path, marian_ids, [*SPECIALS, *rest])


def check_special_ids(config: dict[str, Any], vocab: Vocabulary, special: dict[str, str], path: Path) -> None:
    """config.json's eos and pad ids must be the vocabulary's `</s>` and `<pad>`."""
    for name, nmt_symbol in (("eos", EOS), ("pad", PAD)):
        configured = config.get(f"{name}_token_id")
        if configured is not None and configured != vocab.marian_ids[nmt_symbol]:
            raise NmtError(f"{path}: {name}_token_id {configured} is not the id of {special[name]!r} in {vocab.path} "
                           f"({vocab.marian_ids[nmt_symbol]})")


# ---------------------------------------------------------------------------
# Weights


def strip_model_prefix(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MarianMTModel's names (`model.encoder...`, `lm_head`, `final_logits_bias`) without `model.`."""
    return {key.removeprefix("model."): value for key, value in weights.items()}


@dataclass(frozen=True)
class Sharing:
    """Which of the three embedding matrices are one (as the stored weights show)."""

    all: bool  # encoder input, decoder input and output
    decoder_output: bool  # decoder input and output


def convert_weights(source: dict[str, torch.Tensor], config: dict[str, Any], src_vocab: Vocabulary,
                    tgt_vocab: Vocabulary, origin: Path) -> tuple[dict[str, torch.Tensor], Sharing]:
    """Hugging Face MarianMTModel tensors -> nmt's Transformer state dict (float32), and
    which embeddings it shares."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in source:
            raise NmtError(f"{origin}: weight {name} is missing")
        used.add(name)
        value = source[name]
        if not value.is_floating_point():
            raise NmtError(f"{origin}: weight {name} is a tensor of {value.dtype}, not of floating-point numbers")
        return value.float()

    def first_of(*names: str) -> torch.Tensor:
        """A matrix stored under its own name, or under the name of the one it is tied to
        (save_pretrained stores tied matrices once)."""
        for name in names:
            if name in source:
                return take(name)
        raise NmtError(f"{origin}: none of the weights {', '.join(names)} is there")

    joined = src_vocab is tgt_vocab
    src_embed = first_of("encoder.embed_tokens.weight", "shared.weight")
    tgt_embed = first_of("decoder.embed_tokens.weight", *(["shared.weight"] if joined else []), "lm_head.weight")
    output = first_of("lm_head.weight", "decoder.embed_tokens.weight", *(["shared.weight"] if joined else []))
    used.add("shared.weight")  # what the embeddings were tied to; nmt's sharing follows the values
    decoder_output = torch.equal(tgt_embed, output)
    sharing = Sharing(all=joined and decoder_output and torch.equal(src_embed, tgt_embed), decoder_output=decoder_output)
    bias = take("final_logits_bias").reshape(-1) if "final_logits_bias" in source else torch.zeros(output.size(0))
    _check_rows(src_embed, src_vocab, "the source embedding", origin)
    _check_rows(tgt_embed, tgt_vocab, "the target embedding", origin)
    _check_rows(output, tgt_vocab, "the output projection", origin)
    if bias.numel() != output.size(0):
        raise NmtError(f"{origin}: final_logits_bias has {bias.numel()} values for {output.size(0)} target symbols")

    out: dict[str, torch.Tensor] = {}
    rows = tgt_vocab.rows()
    # A matrix that is one in the model is permuted once (nmt ties them again as it loads).
    out["decoder.embed_tokens.weight"] = permute_rows(tgt_embed, rows)
    out["encoder.embed_tokens.weight"] = (out["decoder.embed_tokens.weight"] if sharing.all
                                          else permute_rows(src_embed, src_vocab.rows()))
    out["decoder.output_projection.weight"] = (out["decoder.embed_tokens.weight"] if decoder_output
                                               else permute_rows(output, rows))
    out["decoder.output_projection.bias"] = permute_rows(bias.unsqueeze(1), rows, fill=NEVER).squeeze(1)
    start_id = config.get("decoder_start_token_id", config.get("pad_token_id", tgt_vocab.marian_ids[PAD]))
    if not (isinstance(start_id, int) and 0 <= start_id < tgt_embed.size(0)):
        raise NmtError(f"{origin}: decoder_start_token_id {start_id!r} is not an id of the target vocabulary")
    out["decoder.start_embedding"] = tgt_embed[start_id].clone()

    for side in ("encoder", "decoder"):
        for layer in range(config[f"{side}_layers"]):
            # The same names as nmt's, except the attention projections nmt fuses: [q; k; v] and [k; v].
            prefix = f"{side}.layers.{layer}"
            names = ["self_attn.out_proj", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm"]
            if side == "decoder":
                names += ["encoder_attn.q_proj", "encoder_attn.out_proj", "encoder_attn_layer_norm"]
            for leaf in ("weight", "bias"):
                out[f"{prefix}.self_attn.in_proj.{leaf}"] = torch.cat(
                    [take(f"{prefix}.self_attn.{p}_proj.{leaf}") for p in "qkv"])
                if side == "decoder":
                    out[f"{prefix}.encoder_attn.kv_proj.{leaf}"] = torch.cat(
                        [take(f"{prefix}.encoder_attn.{p}_proj.{leaf}") for p in "kv"])
                for name in names:
                    out[f"{prefix}.{name}.{leaf}"] = take(f"{prefix}.{name}.{leaf}")
    # Position tables are a function of the config (nmt computes them as Hugging Face does).
    ignored = {"encoder.embed_positions.weight", "decoder.embed_positions.weight"}
    unused = sorted(set(source) - used - ignored)
    if unused:
        raise NmtError(f"{origin}: weight {unused[0]} belongs to a part of the model nmt does not have")
    return out, sharing


def _check_rows(matrix: torch.Tensor, vocab: Vocabulary, what: str, origin: Path) -> None:
    if matrix.dim() != 2 or matrix.size(0) != len(vocab.marian_ids):
        raise NmtError(f"{origin}: {what} has shape {tuple(matrix.shape)}, but {vocab.path} "
                       f"has {len(vocab.marian_ids)} pieces")


def permute_rows(matrix: torch.Tensor, rows: list[int | None], fill: float = 0.0) -> torch.Tensor:
    """Row i of the result is `matrix[rows[i]]`, or `fill` where rows[i] is None."""
    out = torch.full((len(rows), matrix.size(1)), fill, dtype=matrix.dtype)
    present = [i for i, row in enumerate(rows) if row is not None]
    out[present] = matrix[[rows[i] for i in present]]
    return out


# ---------------------------------------------------------------------------
# The run directory


def run_meta(src_lang: str, tgt_lang: str, shared: bool, origin: Path, print_id: str) -> dict[str, Any]:
    """meta.json of an imported OPUS-MT run: Hugging Face's MarianTokenizer's text processing.

    No tokenizer and no punctuation normalization (MarianTokenizer applies none; OPUS-MT's
    own scripts run Moses' normalize-punctuation.perl first): each side's sentencepiece
    model, whose own normalization is in the model file, segments the raw line.
    """
    return imported_run_meta(
        src_lang, tgt_lang, shared,
        tokenizer={"name": "none", "normalize_punctuation": False, "aggressive_dash_splits": False, "escape": False},
        bpe={"type": "sentencepiece", "model_src": "source.spm", "model_tgt": "target.spm", "marian": True},
        imported_from={"toolkit": "marian", "directory": origin.name, "fingerprint": print_id})
