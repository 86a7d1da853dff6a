"""Read a fairseq Transformer checkpoint: its weights, its arguments as our ModelConfig,
its update count and languages.

The file is read with the restricted unpickler of `nmt_cli.interop.fairseq.unpickle`: no code
stored in it runs, and fairseq need not be installed. A checkpoint comes from outside,
so every argument is checked where it is read, and a malformed one is named (e.g.
`args.encoder_layers`, `cfg.model.encoder.layers`) instead of failing deep inside the
model.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt_cli.config import ACTIVATIONS, ModelConfig, check_language_code
from nmt_cli.errors import NmtError
from nmt_cli.interop.fairseq.unpickle import PICKLE_MODULE, plain

# fairseq's `base_architecture` (transformer_legacy.py): what an old checkpoint may omit.
BASE_DEFAULTS: dict[str, Any] = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False,
    "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "activation_fn": "relu", "dropout": 0.1,
    "share_decoder_input_output_embed": False, "share_all_embeddings": False, "no_scale_embedding": False,
    "max_source_positions": 1024, "max_target_positions": 1024,
}
_BIG = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16,
        "decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096, "decoder_attention_heads": 16, "dropout": 0.3}
# The fairseq Transformer architectures we import, with the values their presets set.
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": {},
    "transformer_wmt_en_de": {},
    "transformer_iwslt_de_en": {"encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4,
                                "decoder_ffn_embed_dim": 1024, "decoder_attention_heads": 4},
    "transformer_vaswani_wmt_en_de_big": _BIG,
    "transformer_vaswani_wmt_en_fr_big": {**_BIG, "dropout": 0.1},
    "transformer_wmt_en_de_big": {**_BIG, "attention_dropout": 0.1},
    "transformer_wmt_en_de_big_t2t": {**_BIG, "attention_dropout": 0.1, "activation_dropout": 0.1,
                                      "encoder_normalize_before": True, "decoder_normalize_before": True},
}
# Options that change the network in ways our model does not reproduce (flag -> is it on?).
UNSUPPORTED_FLAGS = (
    "layernorm_embedding", "adaptive_input", "tie_adaptive_weights", "adaptive_softmax_cutoff",
    "no_cross_attention", "cross_self_attention", "no_token_positional_embeddings", "char_inputs",
    "encoder_layers_to_keep", "decoder_layers_to_keep",
)
# Arguments read as numbers or switches. A checkpoint comes from outside, so each is checked
# where it is read: a malformed one is named instead of failing deep inside the model.
SIZE_ARGS = (
    "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
    "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
    "max_source_positions", "max_target_positions", "decoder_input_dim", "decoder_output_dim",
)
DROPOUT_ARGS = ("dropout", "attention_dropout", "activation_dropout")
SWITCH_ARGS = (
    "encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "decoder_learned_pos",
    "share_decoder_input_output_embed", "share_all_embeddings", "no_scale_embedding", "no_decoder_final_norm",
)


def read_args(args: Any, cfg: Any, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The flat model and task arguments of a checkpoint: `args` (old) or `cfg.model`/`cfg.task` (new),
    and where each is stored in the checkpoint (`args.encoder_layers`, `cfg.model.encoder.layers`).

    A hydra-style model config nests `encoder`/`decoder` groups; they are flattened to
    the `encoder_embed_dim`-style names of the argparse era.
    """
    if isinstance(args, dict) and args:
        return dict(args), {key: f"args.{key}" for key in args}
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise NmtError(f"{path} records neither 'args' nor 'cfg.model': not a fairseq training checkpoint")
    flat: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for key, value in cfg["model"].items():
        if key in ("encoder", "decoder") and isinstance(value, dict):
            for name, item in value.items():
                flat[f"{key}_{name}"], labels[f"{key}_{name}"] = item, f"cfg.model.{key}.{name}"
        else:
            flat[key], labels[key] = value, f"cfg.model.{key}"
    if "arch" not in flat:
        flat["arch"], labels["arch"] = flat.get("_name"), "cfg.model._name"
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    for key in ("source_lang", "target_lang"):
        if flat.get(key) is None:
            flat[key], labels[key] = task.get(key), f"cfg.task.{key}"
    return flat, labels


def model_config_from_args(args: dict[str, Any], weights: dict[str, torch.Tensor], path: Path,
                           labels: dict[str, str] | None = None) -> ModelConfig:
    """Our ModelConfig for a fairseq Transformer; NmtError naming any option we cannot reproduce,
    or any argument of the wrong type (`labels` says where each is stored; default `args.NAME`)."""
    labels = labels or {}
    arch = args.get("arch")
    if arch is not None and not isinstance(arch, str):
        raise NmtError(f"{path}: {_label(labels, 'arch')} must be a string naming the architecture, not {_show(arch)}")
    if arch not in ARCH_DEFAULTS:
        raise NmtError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCH_DEFAULTS)})")
    v = {**BASE_DEFAULTS, **ARCH_DEFAULTS[arch], **{k: x for k, x in args.items() if x is not None}}
    for side_key, encoder_key in (("decoder_embed_dim", "encoder_embed_dim"), ("decoder_ffn_embed_dim", "encoder_ffn_embed_dim")):
        v.setdefault(side_key, v[encoder_key])
    _check_arg_types(v, labels, path)
    problems = [f"--{flag.replace('_', '-')}" for flag in UNSUPPORTED_FLAGS if v.get(flag)]
    if v["activation_fn"] not in ACTIVATIONS:
        problems.append(f"--activation-fn {v['activation_fn']}")
    for name in ("normalize_before", "learned_pos"):
        if bool(v[f"encoder_{name}"]) != bool(v[f"decoder_{name}"]):
            problems.append(f"--encoder-{name.replace('_', '-')} differing from --decoder-{name.replace('_', '-')}")
    if v["encoder_embed_dim"] != v["decoder_embed_dim"]:
        problems.append("--encoder-embed-dim differing from --decoder-embed-dim")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        if v.get(name) not in (None, v["decoder_embed_dim"]):
            problems.append(f"--{name.replace('_', '-')} differing from --decoder-embed-dim")
    pre_norm = bool(v["encoder_normalize_before"])
    if pre_norm and v.get("no_decoder_final_norm"):
        problems.append("--no-decoder-final-norm")
    if pre_norm and (_version(weights, "encoder", path) < 2 or _version(weights, "decoder", path) <= 2):
        problems.append("a pre-norm model from before fairseq added the final LayerNorm (state version < 3)")
    if problems:
        raise NmtError(f"{path}: nmt cannot reproduce this fairseq model: {'; '.join(problems)}")
    try:
        return _model_config(v, pre_norm)
    except NmtError as error:  # a combination ModelConfig refuses, e.g. heads not dividing the width
        raise NmtError(f"{path}: {error}") from None


def _model_config(v: dict[str, Any], pre_norm: bool) -> ModelConfig:
    return ModelConfig(
        encoder_embed_dim=v["encoder_embed_dim"], encoder_ffn_embed_dim=v["encoder_ffn_embed_dim"],
        encoder_layers=v["encoder_layers"], encoder_attention_heads=v["encoder_attention_heads"],
        decoder_embed_dim=v["decoder_embed_dim"], decoder_ffn_embed_dim=v["decoder_ffn_embed_dim"],
        decoder_layers=v["decoder_layers"], decoder_attention_heads=v["decoder_attention_heads"],
        dropout=v["dropout"], attention_dropout=v["attention_dropout"], activation_dropout=v["activation_dropout"],
        normalize_before=pre_norm,
        share_all_embeddings=bool(v["share_all_embeddings"]),
        share_decoder_input_output_embed=bool(v["share_decoder_input_output_embed"]),
        max_source_positions=v["max_source_positions"], max_target_positions=v["max_target_positions"],
        learned_pos=bool(v["encoder_learned_pos"]),
        scale_embedding=not v["no_scale_embedding"], activation_fn=v["activation_fn"],
    )


def _check_arg_types(v: dict[str, Any], labels: dict[str, str], path: Path) -> None:
    """NmtError naming the first size, dropout or switch of the wrong type or out of range."""
    for key in SIZE_ARGS:
        value = v.get(key)
        if value is not None and not (_is_int(value) and value >= 1):
            raise NmtError(f"{path}: {_label(labels, key)} must be a positive integer, not {_show(value)}")
    for key in DROPOUT_ARGS:
        value = v.get(key)
        if not (_is_number(value) and 0 <= value < 1):
            raise NmtError(f"{path}: {_label(labels, key)} must be a number in [0, 1), not {_show(value)}")
    for key in SWITCH_ARGS:
        value = v.get(key)
        # A string such as 'False' would read as on: only booleans (and 0/1) are switches.
        if value is not None and not (isinstance(value, bool) or (_is_int(value) and value in (0, 1))):
            raise NmtError(f"{path}: {_label(labels, key)} must be true or false, not {_show(value)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _label(labels: dict[str, str], key: str) -> str:
    """Where argument `key` is stored in the checkpoint, for error messages."""
    return labels.get(key, f"args.{key}")


def _show(value: Any) -> str:
    """A value for a one-line error message: its repr on one line, shortened."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _version(weights: dict[str, torch.Tensor], side: str, path: Path) -> float:
    """fairseq's per-module state version (a missing key reads as 1, as fairseq does)."""
    version = weights.get(f"{side}.version")
    if version is None:
        return 1.0
    if version.numel() == 0:
        raise NmtError(f"{path}: model weight {side}.version is empty (fairseq stores its state version there)")
    return float(version.flatten()[0])


@dataclass
class FairseqCheckpoint:
    args: dict[str, Any]  # model and task arguments, flattened
    weights: dict[str, torch.Tensor]  # fairseq parameter names
    num_updates: int = 0
    labels: dict[str, str] = field(default_factory=dict)  # argument -> where it is stored (`args.arch`)


def load_fairseq_checkpoint(path: str | Path) -> FairseqCheckpoint:
    """Read a fairseq checkpoint safely (see the module docstring for the trust model)."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", pickle_module=PICKLE_MODULE, weights_only=False)
    except pickle.UnpicklingError as error:
        raise NmtError(f"cannot read fairseq checkpoint {path}: {error}") from None
    except Exception as error:  # noqa: BLE001 - torch raises many types for a damaged file
        raise NmtError(f"not a readable fairseq checkpoint: {path} ({str(error).splitlines()[0]})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise NmtError(f"not a fairseq checkpoint (no 'model' weights): {path}")
    weights = {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    for key in weights:
        # Every parameter of a fairseq TransformerModel lies in its encoder or its decoder.
        if not isinstance(key, str) or not key.startswith(("encoder.", "decoder.")):
            raise NmtError(f"{path}: model weight {_show(key)} is not named encoder.* or decoder.*")
    num_updates = read_num_updates(plain(state.get("optimizer_history")), path)
    args, labels = read_args(plain(state.get("args")), plain(state.get("cfg")), path)
    return FairseqCheckpoint(args, weights, num_updates, labels)


def read_num_updates(history: Any, path: Path) -> int:
    """The update count of fairseq's last optimizer_history entry (0 when none is recorded)."""
    if history is None:
        return 0
    if not isinstance(history, list):
        raise NmtError(f"{path}: optimizer_history must be a list, not {_show(history)}")
    if not history:
        return 0
    if not isinstance(history[-1], dict):
        raise NmtError(f"{path}: optimizer_history[-1] must be a dict, not {_show(history[-1])}")
    count = history[-1].get("num_updates")
    if count is None:
        return 0
    if not (_is_int(count) and count >= 0):
        raise NmtError(f"{path}: optimizer_history[-1].num_updates must be a non-negative integer, not {_show(count)}")
    return count


@contextmanager
def malformed_checkpoint_as_error(path: Path) -> Iterator[None]:
    """The last line of defence behind the explicit checks: a malformation they did not foresee
    (a field of a type nobody expected) still gives one line naming the checkpoint."""
    try:
        yield
    except (TypeError, ValueError, IndexError, KeyError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise NmtError(f"{path}: malformed fairseq checkpoint ({type(error).__name__}: {reason[:200]})") from None


def recorded_language(loaded: FairseqCheckpoint, key: str, path: Path) -> str | None:
    """The checkpoint's source_lang or target_lang (it names the dictionary file to read)."""
    value = loaded.args.get(key)
    if value is not None and not isinstance(value, str):
        raise NmtError(f"{path}: {_label(loaded.labels, key)} must be a language code (a string), not {_show(value)}")
    if value:  # empty: the dictionaries' file names tell the language
        check_language_code(value, f"{path}: {_label(loaded.labels, key)}")
    return value
