"""Load what `translate` needs: checkpoint(s), dictionaries and the text pipelines.

The dictionaries come from the checkpoint itself (it stores its symbol lists); the
data directory (`--data-bin`, or by default the checkpoint's run directory, which
holds copies of `meta.json`, `dict.*.txt` and the BPE models) supplies the text
pipeline and must agree with the checkpoint's dictionaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoints.ema_weights import with_ema_as_model
from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint
from nmt_cli.data.dictionary import SPECIALS, Dictionary, check_same_symbols
from nmt_cli.data.meta import read_meta
from nmt_cli.decode.ensemble import Ensemble, check_same_dictionaries
from nmt_cli.decode.search import IncrementalDecoder
from nmt_cli.errors import NmtError
from nmt_cli.host_memory import release_freed_memory
from nmt_cli.models.fast.int8 import quantize_linears
from nmt_cli.models.fast.packed import pack_linears
from nmt_cli.models.transformer import Transformer
from nmt_cli.text.pipeline import SUBWORD_NMT_MARKER, TextPipeline, bpe_model_path
from nmt_cli.text.subword_nmt import SubwordNmtBpe
from nmt_cli.text.tokenizer import TokenizerSettings


@dataclass
class LoadedModels:
    """An ensemble (one model or several) and what describes its inputs and outputs."""

    decoder: IncrementalDecoder
    transformers: list[Transformer]  # the models, in --path order (teacher forcing runs them one by one)
    src_dict: Dictionary
    tgt_dict: Dictionary
    source_lang: str
    target_lang: str
    max_source_positions: int
    max_target_positions: int


@dataclass
class TextSides:
    """Raw text <-> pieces for each side; None where the input/output format needs none."""

    source: TextPipeline | None
    target: TextPipeline | None


def dictionary_from_symbols(symbols: list[str], source: str) -> Dictionary:
    """A Dictionary from a checkpoint's symbol list (ids are list positions)."""
    if tuple(symbols[: len(SPECIALS)]) != SPECIALS:
        raise NmtError(f"{source}: the stored dictionary does not start with {', '.join(SPECIALS)}")
    return Dictionary(symbols[len(SPECIALS) :], [1] * (len(symbols) - len(SPECIALS)))


def load_models(paths: tuple[str, ...], device: torch.device, precision: str = "fp32",
                use_ema: bool = False) -> LoadedModels:
    """Load every checkpoint (an ensemble when several), in eval mode on `device`, with
    the linear layers `precision` asks for (see prepare_linears); `use_ema`: the
    checkpoints' EMA weights instead of their weights."""
    models, dicts, languages = [], [], None
    for path in paths:
        state = load_checkpoint(path)
        if use_ema:
            state = with_ema_as_model(state, path)
        model = model_from_checkpoint(state, path).to(device).eval()
        dicts.append((list(state["src_dict"]), list(state["tgt_dict"])))
        languages = languages or (str(state.get("source_lang", "")), str(state.get("target_lang", "")))
        # The checkpoint's weights are the model's now. Freed before packing or quantization
        # makes copies of its own, at most two copies of the weights are held at once.
        del state
        for param in model.parameters():
            param.requires_grad_(False)
        prepare_linears(model, precision, device)
        models.append(model)
    check_same_dictionaries(list(paths), dicts)
    # The checkpoints' tensors and the weights that packing or quantization replaced are
    # garbage now; without this the process would keep their memory (see the function).
    release_freed_memory()
    return LoadedModels(
        decoder=models[0] if len(models) == 1 else Ensemble(models),
        transformers=models,
        src_dict=dictionary_from_symbols(dicts[0][0], paths[0]),
        tgt_dict=dictionary_from_symbols(dicts[0][1], paths[0]),
        source_lang=languages[0],
        target_lang=languages[1],
        max_source_positions=min(m.cfg.max_source_positions for m in models),
        max_target_positions=min(m.cfg.max_target_positions for m in models),
    )


# The precisions whose linear layers run on packed weights on a CPU (nmt_cli/models/fast/packed.py).
PACKED_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def prepare_linears(model: torch.nn.Module, precision: str, device: torch.device) -> None:
    """Swap the linear layers of a loaded model for what decoding in `precision` runs
    fastest: 8-bit integer ones for int8 (a CPU only); for float32 and bf16 on a CPU,
    weights packed in oneDNN's layout where the CPU runs them (else: float32 on plain
    weights, bf16 under autocast, which casts the weights at every call)."""
    if precision == "int8":
        quantize_linears(model)
    elif precision in PACKED_PRECISIONS and device.type == "cpu":
        pack_linears(model, PACKED_PRECISIONS[precision])


def text_directory(checkpoint: str, data_bin: str | None) -> Path:
    """Where meta.json, dictionaries and BPE models live: --data-bin, else the run directory."""
    return Path(data_bin) if data_bin is not None else Path(checkpoint).resolve().parent


def check_directory_dictionaries(directory: Path, loaded: LoadedModels, checkpoint: str) -> None:
    """The directory's dict.{lang}.txt files must be the checkpoint's dictionaries."""
    for lang, stored in ((loaded.source_lang, loaded.src_dict), (loaded.target_lang, loaded.tgt_dict)):
        path = directory / f"dict.{lang}.txt"
        if not path.is_file():
            raise NmtError(f"{path} not found (the checkpoint's {lang} dictionary must be next to meta.json)")
        check_same_symbols(f"dictionary {path}", Dictionary.load(path).symbols, checkpoint, stored.symbols,
                           "; pass the --data-bin the model was trained on")


def load_text_sides(directory: Path, loaded: LoadedModels, checkpoint: str, need_source: bool, need_target: bool) -> TextSides:
    """The text pipelines the formats need, after checking the directory matches the model."""
    if not (need_source or need_target):
        return TextSides(None, None)
    if not (directory / "meta.json").is_file():
        raise NmtError(
            f"no meta.json in {directory}: pass --data-bin (raw text in or out, --print-alignment and "
            "--replace-unk need the tokenizer and BPE model of the training data), or use --input-format bpe "
            "and --output-format bpe"
        )
    meta = _read_languages(directory)
    if meta != (loaded.source_lang, loaded.target_lang):
        raise NmtError(
            f"{directory / 'meta.json'} is for {meta[0]}-{meta[1]} but checkpoint {checkpoint} "
            f"translates {loaded.source_lang}-{loaded.target_lang}"
        )
    check_directory_dictionaries(directory, loaded, checkpoint)
    return TextSides(
        TextPipeline.from_data_bin(directory, loaded.source_lang) if need_source else None,
        TextPipeline.from_data_bin(directory, loaded.target_lang) if need_target else None,
    )


def _read_languages(directory: Path) -> tuple[str, str]:
    meta: dict[str, Any] = read_meta(directory)
    return str(meta.get("source_lang", "")), str(meta.get("target_lang", ""))


def fairseq_interactive_text(cfg: Any, directory: Path, loaded: LoadedModels) -> TextSides | None:
    """fairseq-interactive's --source-lang/--target-lang/--tokenizer/--bpe/--bpe-codes (a
    TranslateConfig's). Where meta.json fixes the pipeline they must agree with it (one error
    line otherwise; nmt never applies another one) and None is returned. Where the data was
    segmented before preprocessing (meta.json's `segmented_input` '@@ '), nmt does not know
    how, and `--bpe subword_nmt --bpe-codes FILE` (with `--tokenizer moses`, fairseq's) give
    the pipeline, returned as the text sides to use, as fairseq-interactive would apply it."""
    for flag, given, actual in (("--source-lang", cfg.source_lang, loaded.source_lang),
                                ("--target-lang", cfg.target_lang, loaded.target_lang)):
        if given is not None and given != actual:
            raise NmtError(f"{flag} {given}: the model translates {loaded.source_lang}-{loaded.target_lang}")
    if cfg.tokenizer is None and cfg.bpe is None and cfg.bpe_codes is None:
        return None
    meta_path = directory / "meta.json"
    meta: dict[str, Any] = read_meta(directory) if meta_path.is_file() else {}
    if meta.get("segmented_input") == SUBWORD_NMT_MARKER and not meta.get("bpe") and cfg.bpe == "subword_nmt":
        return _subword_nmt_text(cfg, loaded)
    tokenizer = str((meta.get("tokenizer") or {}).get("name", "none"))
    if cfg.tokenizer is not None and {"space": "none"}.get(cfg.tokenizer, cfg.tokenizer) != tokenizer:
        raise NmtError(f"--tokenizer {cfg.tokenizer}: {meta_path} tokenizes with {tokenizer}, which nmt applies itself")
    bpe_entry = meta.get("bpe") or {}
    bpe = str(bpe_entry.get("type", "sentencepiece")) if bpe_entry else "none"
    if cfg.bpe is not None and cfg.bpe != bpe:
        raise NmtError(f"--bpe {cfg.bpe}: {meta_path} segments with {bpe}, which nmt applies itself")
    if cfg.bpe_codes is not None:  # subword-nmt's codes, or the source side's sentencepiece model
        codes = None
        if bpe == "subword_nmt":
            codes = directory / str(bpe_entry.get("codes", "bpe.codes"))
        elif bpe == "sentencepiece":
            codes = bpe_model_path(directory, meta, "src")
        if codes is None or not codes.is_file() or codes.read_bytes() != Path(cfg.bpe_codes).read_bytes():
            raise NmtError(f"--bpe-codes {cfg.bpe_codes}: not the BPE codes of {directory} (nmt applies those itself)")
    return None


def _subword_nmt_text(cfg: Any, loaded: LoadedModels) -> TextSides:
    """fairseq-interactive's pipeline: its Moses tokenizer (escaping, -a, no normalization) or
    none, then subword-nmt with the given codes."""
    if cfg.bpe_codes is None:
        raise NmtError("--bpe subword_nmt needs --bpe-codes FILE (the codes the text was segmented with)")
    name = "none" if cfg.tokenizer in (None, "space", "none") else cfg.tokenizer
    moses = {"name": name, "normalize_punctuation": False, "aggressive_dash_splits": True, "escape": True}
    sides = []
    for lang in (loaded.source_lang, loaded.target_lang):
        settings = TokenizerSettings.from_meta(moses if name == "moses" else {"name": "none", "normalize_punctuation": False},
                                               lang)
        sides.append(TextPipeline(settings, bpe=SubwordNmtBpe.load(cfg.bpe_codes)))
    return TextSides(*sides)
