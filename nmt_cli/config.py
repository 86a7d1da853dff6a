"""Typed configurations: the boundary between the CLI and the library.

click parses flags into these dataclasses; library code takes nothing else.
Each validates itself in `__post_init__` and raises `NmtError` on bad values.
"""

from __future__ import annotations

import functools
import json
import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from nmt_cli.errors import NmtError
from nmt_cli.field_types import has_type
from nmt_cli.machine import check_cpu_count, check_cuda_device, check_device_string, default_device
from nmt_cli.options import (Alias, Refused, auto_switch, choice_alias, flag_of, flag_option, no_effect_alias, option,
                             refused_alias, switch_alias, value_alias)

# numpy's random generators take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1
# torch takes sizes as int64; a larger one can never be built, and counting parameters
# with it (nmt_cli/models/size.py) could exceed what a float, and so a message, can show.
MAX_MODEL_SIZE = 2**63 - 1
# fairseq's sinusoid frequencies divide by dim // 2 - 1, which must not be 0.
MIN_SINUSOID_DIM = 4
ACTIVATIONS = ("relu", "gelu", "swish")
SINUSOID_STYLES = ("fairseq", "marian")


# What a field of each plain type holds, for check_field_types' message.
_PLAIN_TYPES = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}


@functools.cache
def _plain_field_types(config_class: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (its plain type, whether None is allowed), for fields annotated int,
    float, bool or str, alone or `| None`."""
    plain = {}
    for name, hint in typing.get_type_hints(config_class).items():
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = [kind for kind in members if kind is not type(None)]
        if len(kinds) == 1 and kinds[0] in _PLAIN_TYPES:
            plain[name] = (kinds[0], len(kinds) < len(members))
    return plain


def check_field_types(config: Any) -> None:
    """Raise on a field whose value is not of its declared type. A config built in Python
    (the API's options) skips click's conversion: a beam of 2.5 would fail deep in torch,
    and a switch given "no" would be taken as on."""
    plain = _plain_field_types(type(config))
    for field in fields(config):
        kind, optional = plain.get(field.name, (None, False))
        value = getattr(config, field.name)
        if kind is None or (value is None and optional):
            continue
        if kind is bool:
            fits = isinstance(value, bool)
        else:  # bool is an int in Python, but no count, size or rate; an int is a fine float
            fits = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if not fits:
            flag = flag_of(field)
            name = flag.decls[0].split("/")[0] if flag is not None else field.name
            allowed = _PLAIN_TYPES[kind] + (" or None" if optional else "")
            raise NmtError(f"{name} must be {allowed} (got {type(value).__name__} {value!r:.50})")


def check_fields_of_python_callers(config: Any) -> None:
    """The field checks of a config that the Python API and the server build from values
    of their callers': types, then finite numbers, then choices."""
    check_field_types(config)
    check_finite_numbers(config)
    check_choices(config)


def check_finite_numbers(config: Any) -> None:
    """Raise on a float field that is nan or inf: it would reach the model as silent NaNs."""
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise NmtError(f"--{field.name.replace('_', '-')} must be a finite number (got {value})")


def first_changed(config: Any, names: Iterable[str]) -> str | None:
    """The flag (--name) of the first field of `names` whose value is not its default."""
    defaults = {field.name: field.default for field in fields(config)}
    return next((f"--{name.replace('_', '-')}" for name in names if getattr(config, name) != defaults[name]), None)


def check_choices(config: Any) -> None:
    """Raise on a field outside its flag's fixed `choices` (a config built in Python or read
    from a checkpoint skips click's own check)."""
    for field in fields(config):
        flag, value = flag_of(field), getattr(config, field.name)
        choices = flag.choices if flag is not None else None
        if isinstance(choices, tuple) and value is not None and value not in choices:
            name = flag.decls[0].split("/")[0]
            raise NmtError(f"{name} must be one of {', '.join(choices)} (got {value!r})")


def check_seed(seed: int, flag: str = "--seed", smallest: int = 0) -> None:
    if not smallest <= seed <= MAX_SEED:
        raise NmtError(f"{flag} must be between {smallest} and {MAX_SEED} (got {seed})")


# fairseq's model families that nmt does not build (`--arch NAME` starting with the key).
OTHER_MODEL_FAMILIES = {
    "fconv": "fairseq's convolutional model",
    "lstm": "an LSTM",
    "lightconv": "fairseq's lightweight convolutions",
    "light_conv": "fairseq's lightweight convolutions",
    "transformer_lm": "a language model",
    "bart": "BART",
    "mbart": "mBART",
    "hf_": "a Hugging Face model",
}


def refuse_other_model_family(arch: str) -> Refused | None:
    """--arch of a model family nmt does not build, named as such (other names: the registry's list)."""
    for prefix, family in OTHER_MODEL_FAMILIES.items():
        if arch.startswith(prefix):
            return Refused(f"{family}; nmt builds encoder-decoder Transformers only "
                           "(e.g. --arch transformer_wmt_en_de; `nmt info --arch NAME` shows one)")
    return None


@dataclass(frozen=True)
class ModelConfig:
    """An encoder-decoder Transformer. Field names follow fairseq's flags."""

    # fairseq sets pre-norm per stack; nmt has one setting for both, so it takes the pair.
    ALIASES: ClassVar[tuple[Alias, ...]] = (
        Alias("--encoder-normalize-before", "fairseq's: with --decoder-normalize-before, --normalize-before.",
              lambda _: {"normalize_before": True}, together_with="--decoder-normalize-before"),
        Alias("--decoder-normalize-before", "fairseq's: with --encoder-normalize-before, --normalize-before.",
              lambda _: {"normalize_before": True}, together_with="--encoder-normalize-before"),
    )

    encoder_embed_dim: int = option("--encoder-embed-dim", default=512, help="Encoder model dimension (d_model).")
    encoder_ffn_embed_dim: int = option("--encoder-ffn-embed-dim", default=2048,
                                        help="Encoder feed-forward inner dimension (d_ff).")
    encoder_layers: int = option("--encoder-layers", default=6, help="Number of encoder layers.")
    encoder_attention_heads: int = option("--encoder-attention-heads", default=8, help="Encoder attention heads.")
    decoder_embed_dim: int = option("--decoder-embed-dim", default=512, help="Decoder model dimension (d_model).")
    decoder_ffn_embed_dim: int = option("--decoder-ffn-embed-dim", default=2048,
                                        help="Decoder feed-forward inner dimension (d_ff).")
    decoder_layers: int = option("--decoder-layers", default=6, help="Number of decoder layers.")
    decoder_attention_heads: int = option("--decoder-attention-heads", default=8, help="Decoder attention heads.")
    dropout: float = option("--dropout", default=0.1, help="Dropout on embeddings and sub-layer outputs.")
    attention_dropout: float = option("--attention-dropout", default=0.0, help="Dropout on attention weights.")
    activation_dropout: float = option("--activation-dropout", default=0.0,
                                       help="Dropout after the feed-forward activation.")
    # Post-norm (False) is the paper's layout; pre-norm trains more stably when deep.
    normalize_before: bool = option(
        "--normalize-before/--no-normalize-before", default=False,
        help="LayerNorm before each sub-layer (pre-norm) instead of after it (post-norm, the paper's).")
    share_all_embeddings: bool = option(
        "--share-all-embeddings/--no-share-all-embeddings", default=False,
        help="One embedding matrix for encoder input, decoder input and output (needs a joined dictionary).")
    share_decoder_input_output_embed: bool = option(
        "--share-decoder-input-output-embed/--no-share-decoder-input-output-embed", default=False,
        help="Tie the decoder input embedding to the output projection.")
    max_source_positions: int = option("--max-source-positions", default=1024,
                                       help="Longest source sentence (tokens) the model accepts.")
    max_target_positions: int = option("--max-target-positions", default=1024,
                                       help="Longest target sentence (tokens) the model accepts.")
    # Learned position embeddings instead of sinusoids (for imported models).
    learned_pos: bool = option("--learned-pos/--no-learned-pos", default=False,
                               help="Learned position embeddings instead of sinusoids.")
    # Multiply embeddings by sqrt(d_model) (the paper); off only for imported models.
    scale_embedding: bool = option("--scale-embedding/--no-scale-embedding", default=True,
                                   help="Multiply token embeddings by sqrt(d_model) (the paper's).")
    # What imported Marian (OPUS-MT) models need; the defaults are fairseq's Transformer.
    activation_fn: str = option("--activation-fn", default="relu", choices=ACTIVATIONS,
                                help="Activation of the feed-forward sub-layers (swish: x * sigmoid(x)).")
    sinusoids: str = option(
        "--sinusoids", default="fairseq", choices=SINUSOID_STYLES,
        help="fairseq: fairseq's sinusoid frequencies, positions numbered after <pad>'s id; marian: the "
             "paper's frequencies 10000^(-2i/d), positions numbered from 0 (Marian's and OPUS-MT's).")
    output_bias: bool = option("--output-bias/--no-output-bias", default=False,
                               help="A bias on the output projection (Marian's final_logits_bias).")
    start_embedding: bool = option(
        "--start-embedding/--no-start-embedding", default=False,
        help="The decoder's first input is a vector of its own, not the embedding of </s> "
             "(Marian's decoders start from <pad>'s embedding).")

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        check_choices(self)
        for field in fields(self):
            value = getattr(self, field.name)
            if type(value) is int and value > MAX_MODEL_SIZE:
                raise NmtError(f"--{field.name.replace('_', '-')} must be below 2^63 (got {len(str(value))} digits)")
        for side in ("encoder", "decoder"):
            dim = getattr(self, f"{side}_embed_dim")
            heads = getattr(self, f"{side}_attention_heads")
            if min(dim, heads, getattr(self, f"{side}_ffn_embed_dim"), getattr(self, f"{side}_layers")) <= 0:
                raise NmtError(f"{side} sizes must be positive")
            if dim % heads != 0:
                raise NmtError(f"--{side}-embed-dim {dim} is not divisible by --{side}-attention-heads {heads}")
            if dim < MIN_SINUSOID_DIM and not self.learned_pos:
                raise NmtError(f"--{side}-embed-dim {dim} is too small for sinusoidal positions "
                               f"(at least {MIN_SINUSOID_DIM}, or --learned-pos)")
        for name in ("max_source_positions", "max_target_positions"):
            if getattr(self, name) < 1:
                raise NmtError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise NmtError(f"--{name.replace('_', '-')} must be in [0, 1)")
        if self.share_all_embeddings and self.encoder_embed_dim != self.decoder_embed_dim:
            raise NmtError("--share-all-embeddings needs --encoder-embed-dim == --decoder-embed-dim")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        if not isinstance(values, dict):
            raise NmtError(f"the model config is not a dict of fields (it is a {type(values).__name__})")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise NmtError(f"unknown model config fields: {', '.join(map(str, unknown))}")
        for name, value in values.items():
            expected = type(known[name].default)  # every field has a default of its own type
            if not has_type(value, (int, float) if expected is float else (expected,)):  # an int fits a float
                raise NmtError(f"model config field {name} is {value!r}, not of type {expected.__name__}")
        return cls(**values)


# fairseq's flags of its train, generate and interactive commands that nmt has no setting for.
FAIRSEQ_COMMON_ALIASES: tuple[Alias, ...] = (
    refused_alias("--user-dir", "nmt has no plugins: its models, losses and search are built in", type=str),
    choice_alias("--task", {"translation": {}}, "nmt does translation only (fairseq's translation task)",
                 help="fairseq's; only translation, nmt's one task."),
)


# --- decoding (search and translate) -------------------------------------------------

LENPEN_STYLES = ("fairseq", "gnmt")
# Bounds that keep search scores finite in float32 (whose largest value is ~3.4e38):
# temperatures divide scores, and a length penalty of 1,024 tokens ** 10 is ~1e30.
MIN_TEMPERATURE = 1e-30
MAX_LENPEN = 10.0
MAX_UNK_REWARD = 1e30  # a negative --unk-penalty is a reward; any positive one is fine (-inf bans <unk>)


@dataclass(frozen=True)
class DecodeConfig:
    """How to search for hypotheses. Defaults are fairseq-generate's.

    The paper's setting is beam 4, lenpen 0.6 (GNMT-style penalty) and a maximum
    output length of input length + 50 (max_len_a 1, max_len_b 50).
    """

    beam: int = option("--beam", default=5, show_default=True, help="Beam size (1: greedy decoding).")
    nbest: int = option("--nbest", default=1, show_default=True,
                        help="Hypotheses kept per sentence, best first. translate: N lines per input line in text "
                             "and bpe output (N empty ones for an empty line), a \"nbest\" list in jsonl; generate: "
                             "N H-/D-/P- triples per sentence; serve: a \"nbest\" list per sentence.")
    lenpen: float = option("--lenpen", default=1.0, show_default=True,
                           help="Length penalty exponent alpha (the paper: 0.6 with --lenpen-style gnmt).")
    # "fairseq": score / len**lenpen; "gnmt": score / ((5 + len) / 6)**lenpen. len counts </s>.
    lenpen_style: str = option(
        "--lenpen-style", default="fairseq", choices=LENPEN_STYLES, show_default=True,
        help="fairseq: score / len^alpha; gnmt: score / ((5 + len) / 6)^alpha (len counts </s>).")
    max_len_a: float = option("--max-len-a", default=0.0, show_default=True,
                              help="Maximum output length is a * source length + b (the paper: a 1, b 50).")
    max_len_b: int = option("--max-len-b", default=200, show_default=True, help="See --max-len-a.")
    # Minimum number of tokens before </s> (fairseq's --min-len, default 1).
    min_len: int = option("--min-len", default=1, show_default=True, help="Minimum number of tokens before </s>.")
    no_repeat_ngram_size: int = option("--no-repeat-ngram-size", default=0, show_default=True,
                                       help="Never repeat an n-gram of this size within a hypothesis (0: off).")
    unk_penalty: float = option("--unk-penalty", "--unkpen", default=0.0, show_default=True,
                                help="Subtracted from the log-probability of <unk> (positive: fewer <unk>).")
    temperature: float = option("--temperature", default=1.0, show_default=True,
                                help="Divide the logits by this before the softmax (< 1 sharper, > 1 flatter).")
    sampling: bool = flag_option(
        "--sampling",
        help="Sample instead of searching (back-translation): each of --beam hypotheses is one sample.")
    sampling_topk: int = option("--sampling-topk", default=-1, show_default=True,
                                help="With --sampling: draw only from the k most probable tokens (-1: all; not with "
                                     "--sampling-topp).")
    sampling_topp: float = option("--sampling-topp", default=-1.0, show_default=True,
                                  help="With --sampling: draw only from the smallest set of tokens with this much "
                                       "probability (-1: all).")
    seed: int = option("--seed", default=1, show_default=True, help="Random seed (for --sampling).")

    def __post_init__(self) -> None:
        check_fields_of_python_callers(self)
        if self.beam < 1:
            raise NmtError(f"--beam must be >= 1 (got {self.beam})")
        if not 1 <= self.nbest <= self.beam:
            raise NmtError(f"--nbest must be between 1 and --beam {self.beam} (got {self.nbest})")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise NmtError("--max-len-a and --max-len-b must be >= 0")
        if self.min_len < 0:
            raise NmtError(f"--min-len must be >= 0 (got {self.min_len})")
        if self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise NmtError(f"--min-len {self.min_len} exceeds the maximum output length --max-len-b {self.max_len_b}")
        if self.no_repeat_ngram_size < 0:
            raise NmtError("--no-repeat-ngram-size must be >= 0")
        if self.temperature < MIN_TEMPERATURE:
            raise NmtError(f"--temperature must be >= {MIN_TEMPERATURE:g} (got {self.temperature:g}; below it the "
                           "scaled scores leave float32's range)")
        if abs(self.lenpen) > MAX_LENPEN:
            raise NmtError(f"--lenpen must be between -{MAX_LENPEN:g} and {MAX_LENPEN:g} (got {self.lenpen:g}; beyond "
                           "that a long output's length penalty leaves float32's range)")
        if self.unk_penalty < -MAX_UNK_REWARD:
            raise NmtError(f"--unk-penalty must be >= -{MAX_UNK_REWARD:g} (got {self.unk_penalty:g}; a larger reward "
                           "makes `<unk>` scores infinite)")
        if self.sampling_topk == 0 or self.sampling_topk < -1:
            raise NmtError("--sampling-topk must be a positive number of tokens (or -1: off)")
        if self.sampling_topp != -1.0 and not 0.0 < self.sampling_topp <= 1.0:
            raise NmtError("--sampling-topp must be in (0, 1] (or -1: off)")
        if (self.sampling_topk > 0 or self.sampling_topp > 0) and not self.sampling:
            raise NmtError("--sampling-topk/--sampling-topp need --sampling")
        if self.sampling_topk > 0 and self.sampling_topp > 0:  # a contradiction: fairseq would drop top-k
            raise NmtError("give one of --sampling-topk and --sampling-topp, not both")
        check_seed(self.seed)

    def check_fits_score_reference(self) -> None:
        """--score-reference scores with the model's plain probabilities (teacher forcing):
        settings that change them or the search are refused."""
        for flag, given in (("--temperature", self.temperature != 1.0), ("--unk-penalty", self.unk_penalty != 0),
                            ("--sampling", self.sampling)):
            if given:
                raise NmtError(f"--score-reference scores with the model's own probabilities: drop {flag}")


# --- guided decoding (nmt translate: prefixes, constraints, alignments, scoring) -------

CONSTRAINT_ORDERS = ("ordered", "unordered")


@dataclass(frozen=True)
class GuidedConfig:
    """What guides or replaces translate's free search (decode/guided.py); all off by default.

    Per-line inputs: a prefix from --prefix-file, constraints (tab-separated after the
    source with --constraints), a reference (tab-separated after the source, or from
    --reference-file, with --score-reference); with --json-input every line is a JSON
    object holding them instead.
    """

    prefix_file: str | None = option(
        "--prefix-file", default=None, path="file", metavar="FILE",
        help="One target prefix per input line (raw text, processed like the target side): each output "
             "starts with its prefix, then search continues. An empty line: no prefix. On a GPU, batches "
             "with prefixes or constraints take the eager search (only the model's step is a CUDA graph).")
    constraints: str | None = option(
        "--constraints", default=None, choices=CONSTRAINT_ORDERS, metavar="ordered|unordered",
        help="Lexically constrained decoding: every input line is source<TAB>phrase<TAB>phrase...; each "
             "phrase (raw target text) appears in the output (ordered: in the given order).")
    json_input: bool = flag_option(
        "--json-input",
        help="Every input line is a JSON object: {\"text\": source, \"prefix\": ..., \"constraints\": [...], "
             "\"reference\": ...} (all but text optional).")
    print_alignment: bool = flag_option(
        "--print-alignment",
        help="Word alignment srcword-tgtword (0-based, fairseq's A- pairs) of each output: after a tab in "
             "text output, an \"alignment\" list in jsonl.")
    alignment_layer: int = option(
        "--alignment-layer", default=-1, show_default=True,
        help="Decoder layer whose cross-attention (averaged over heads) aligns (-1: the last, as fairseq).")
    replace_unk: bool = flag_option(
        "--replace-unk", help="Replace each <unk> of the output with the whole source word aligned to it (as a "
                              "word of its own; in bpe output one piece starting a word).")
    score_reference: bool = flag_option(
        "--score-reference",
        help="Score given translations instead of translating: lines are source<TAB>reference (or see "
             "--reference-file); prints the log-probability of the sentence, a tab, and of each token.")
    reference_file: str | None = option(
        "--reference-file", default=None, path="file", metavar="FILE",
        help="With --score-reference: the references, one per input line (the input then holds sources only).")

    @property
    def needs_alignment(self) -> bool:
        return self.print_alignment or self.replace_unk

    @property
    def reads_target_text(self) -> bool:
        """Whether input lines may hold target text (prefixes, phrases, references)."""
        return bool(self.prefix_file or self.constraints or self.json_input or self.score_reference)

    def __post_init__(self) -> None:
        check_fields_of_python_callers(self)
        if self.reference_file is not None and not self.score_reference:
            raise NmtError("--reference-file needs --score-reference")
        if self.score_reference and (self.constraints or self.prefix_file or self.needs_alignment):
            raise NmtError("--score-reference scores given translations: it takes no --prefix-file, --constraints, "
                           "--print-alignment or --replace-unk")
        if self.json_input and (self.prefix_file or self.reference_file):
            raise NmtError("--json-input lines carry their own prefix and reference: drop --prefix-file/--reference-file")


INPUT_FORMATS = ("raw", "bpe", "ids")
OUTPUT_FORMATS = ("text", "bpe", "jsonl")
PRECISIONS = ("fp32", "bf16", "fp16")
# Training only: the model itself in bf16, float32 master weights (nmt_cli/train/master_weights.py).
TRAIN_PRECISIONS = PRECISIONS + ("pure-bf16",)
# Translation only, on a CPU: 8-bit integer linear layers (nmt_cli/models/fast/int8.py).
TRANSLATE_PRECISIONS = PRECISIONS + ("int8",)
ERROR_POLICIES = ("strict", "replace")
DEFAULT_BUFFER_SIZE = 2000
ENGINES = ("nmt", "ctranslate2")


# The text pipeline fairseq-interactive is told with --tokenizer/--bpe; nmt reads it from meta.json.
INTERACTIVE_TOKENIZERS = ("moses", "space", "none")
INTERACTIVE_BPE = ("subword_nmt", "sentencepiece", "none")


def ensemble_paths_option(help: str) -> Any:
    """translate's and generate's --path: one checkpoint, or several separated by ':' (an ensemble)."""
    return option("--path", required=True, metavar="CKPT[:CKPT...]", to_value=lambda text: tuple(text.split(":")),
                  help=help)


def decoding_device_option() -> Any:
    """translate's and serve's --device; absent, the command picks it (machine.decoding_device)."""
    return option(
        "--device", default="cpu", cli_default=None,
        help="cpu, cuda or cuda:N [default: cuda when available (and not --precision int8), else cpu].")


def decoding_precision_option() -> Any:
    """translate's and serve's --precision."""
    return option(
        "--precision", default="fp32", choices=TRANSLATE_PRECISIONS, show_default=True,
        help="bf16/fp16 run the model under autocast (fp16 on cuda only); int8: 8-bit integer linear "
             "layers, on the CPU only; search stays in fp32.")


def decoding_threads_option(help: str = "CPU threads for the model [default: torch's].") -> Any:
    """translate's and serve's --threads (checked by `check_decoding_threads`)."""
    return option("--threads", default=None, type=int, help=help)


def check_decoding_threads(threads: int | None) -> None:
    if threads is not None:
        check_cpu_count("--threads", threads)


def engine_option() -> Any:
    """translate's and serve's --engine: who runs the batch -> hypotheses step
    (nmt_cli/decode/ctranslate2_engine.py)."""
    return option(
        "--engine", default="nmt", choices=ENGINES, show_default=True,
        help="nmt: nmt's own model and search (the reference); ctranslate2: CTranslate2 runs them, from a "
             "directory of `nmt export --format ctranslate2` or from --path CKPT exported once and cached "
             "beside it (needs pip install 'nmt-cli[ctranslate2]').")


@dataclass(frozen=True)
class TranslateStreams:
    """Where `nmt translate` reads and writes: apart from `TranslateConfig`, which the Python
    API and the server share and which takes no files."""

    input_path: str = option("--input", "-i", default="-", show_default=True, metavar="FILE",
                             help="Text to translate, one sentence per line (UTF-8); - reads stdin.")
    output_path: str = option(
        "--output", "-o", default="-", show_default=True, metavar="FILE",
        help="Where translations go, one line per input line; - writes stdout. A file appears "
             "only when complete (written under a hidden temporary name, then renamed).")


@dataclass(frozen=True)
class TranslateConfig:
    """What `nmt translate` reads and writes, and how it batches; search is in `decode`."""

    # fairseq-interactive's ways of writing these settings.
    ALIASES: ClassVar[tuple[Alias, ...]] = (
        Alias("data", "", lambda path: {"data_bin": path}, type=str, metavar="[DATA_DIR]", argument=True),
        switch_alias("--cpu", {"device": "cpu"}, help="fairseq's: --device cpu."),
        switch_alias("--fp16", {"precision": "fp16"}, help="fairseq's: --precision fp16."),
        value_alias("--sentencepiece-model", str, lambda path: {"bpe_codes": path}, metavar="FILE",
                    help="fairseq's: --bpe-codes (a sentencepiece model, checked against the model's)."),
        *FAIRSEQ_COMMON_ALIASES,
    )

    checkpoints: tuple[str, ...] = ensemble_paths_option(
        "Checkpoint to translate with; several separated by ':' form an ensemble (probabilities averaged; the "
        "models must share dictionaries).")
    data_bin: str | None = option(
        "--data-bin", default=None, path="dir", metavar="DIR",
        help="Directory with meta.json, dict.*.txt and the BPE model(s) [default: the checkpoint's "
             "directory, where training copies them]. Its dictionaries must match the checkpoint's.")
    decode: DecodeConfig = DecodeConfig()
    # fairseq-interactive's flags naming what meta.json already says: checked against it, never ignored.
    source_lang: str | None = option("--source-lang", "-s", default=None, metavar="LANG",
                                     help="fairseq's; must be the model's source language [default: the model's].")
    target_lang: str | None = option("--target-lang", "-t", default=None, metavar="LANG",
                                     help="fairseq's; must be the model's target language [default: the model's].")
    tokenizer: str | None = option(
        "--tokenizer", default=None, choices=INTERACTIVE_TOKENIZERS,
        help="fairseq's; must be the tokenizer of the data directory's meta.json [default: meta.json's] "
             "(space: none).")
    bpe: str | None = option("--bpe", default=None, choices=INTERACTIVE_BPE,
                             help="fairseq's; must be the BPE of the data directory's meta.json [default: meta.json's].")
    bpe_codes: str | None = option(
        "--bpe-codes", default=None, path="file", metavar="FILE",
        help="fairseq's; must hold the same codes as the data directory's (its subword-nmt codes, or its "
             "sentencepiece model) [default: the data directory's].")
    remove_bpe: str | None = option(
        "--remove-bpe", default=None, flag_value="@@ ", metavar="[MARKER]",
        help="fairseq's; text and jsonl output always join pieces into words, so it changes nothing there "
             "[default: off]; refused with --output-format bpe, whose output is the pieces.")
    guided: GuidedConfig = GuidedConfig()
    input_format: str = option(
        "--input-format", default="raw", choices=INPUT_FORMATS, show_default=True,
        help="raw: plain text (tokenized and BPE-segmented as in preprocessing); bpe: space-separated "
             "pieces of the source dictionary; ids: space-separated source dictionary ids.")
    output_format: str = option(
        "--output-format", default="text", choices=OUTPUT_FORMATS, show_default=True,
        help="text: detokenized; bpe: space-separated target pieces; jsonl: one JSON object per line "
             "with line, hyp, score, tokens, ids, positional_scores (and nbest when --nbest > 1).")
    # Input lines per chunk: each chunk is sorted by length, translated, then written in order.
    buffer_size: int = option(
        "--buffer-size", default=DEFAULT_BUFFER_SIZE, type=int, cli_default=None,
        help="Lines read before translating them together (sorted by length for speed), at most: a chunk "
             "also ends where no further line has arrived yet; output appears chunk by chunk "
             f"[default: {DEFAULT_BUFFER_SIZE}; 1 when stdin is a terminal].")
    max_tokens: int | None = option(
        "--max-tokens", default=None, type=int,
        help="Source tokens per batch, padding included [default: 4096 unless --batch-size is given].")
    batch_size: int | None = option("--batch-size", "--max-sentences", default=None, type=int,
                                    help="Sentences per batch (at most).")
    device: str = decoding_device_option()
    threads: int | None = decoding_threads_option(
        "CPU threads for the model, in each process of --workers [default: torch's; 1 with --workers].")
    # Processes translating at once on a CPU, each with its own model (decode/workers.py).
    workers: int = option(
        "--workers", default=1, type=int, show_default=True,
        help="CPU only: processes translating at once, each with its own copy of the model. For "
             "throughput on several cores (e.g. --workers 4 on 4 cores); threads speed up each batch.")
    precision: str = decoding_precision_option()
    # Replay each decoding step as a CUDA graph (nmt_cli/decode/graphs.py); cuda only, on by
    # default there because it decodes several times faster.
    cuda_graphs: bool | None = auto_switch(
        "--cuda-graphs", auto="on with a cuda device",
        help="Replay each decoding step (model and search) as one CUDA graph: one launch instead of "
             "hundreds of small kernels; same translations")
    errors: str = option(
        "--errors", default="strict", choices=ERROR_POLICIES, show_default=True,
        help="Invalid UTF-8 input: strict stops with an error naming the line (lines before it are "
             "translated and written to stdout; -o FILE is left as it was); replace substitutes U+FFFD.")
    quiet: bool = flag_option("--quiet", "-q",
                              help="No progress bar or information on stderr (warnings and errors still appear).")
    # The checkpoints' moving average of the weights (nmt train --ema-decay) instead of their weights.
    use_ema: bool = flag_option("--use-ema", help="Decode with the EMA weights the checkpoint(s) hold "
                                                  "(trained with --ema-decay).")
    engine: str = engine_option()

    def __post_init__(self) -> None:
        check_fields_of_python_callers(self)
        if not self.checkpoints or any(not p for p in self.checkpoints):
            raise NmtError("--path needs at least one checkpoint (several: a.pt:b.pt)")
        if self.buffer_size < 1:
            raise NmtError(f"--buffer-size must be >= 1 (got {self.buffer_size})")
        if self.remove_bpe is not None and self.output_format == "bpe":
            raise NmtError("--remove-bpe removes the pieces that --output-format bpe writes: use --output-format "
                           "text (words, pieces joined) or drop --remove-bpe")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise NmtError(f"--max-tokens must be >= 1 (got {self.max_tokens})")
        if self.batch_size is not None and self.batch_size < 1:
            raise NmtError(f"--batch-size must be >= 1 (got {self.batch_size})")
        check_decoding_threads(self.threads)
        check_device_string(self.device)
        check_cpu_count("--workers", self.workers)
        if self.decode.sampling and self.guided.constraints:
            raise NmtError("--constraints needs beam search, not --sampling")
        if self.guided.score_reference:
            self.decode.check_fits_score_reference()
        if self.workers > 1 and self.device != "cpu":
            raise NmtError("--workers needs --device cpu (on a GPU one process batches faster)")
        self._check_device_fits()

    def _check_device_fits(self) -> None:
        """The device exists, and fits the precision and CUDA graphs (torch is imported only for a cuda one)."""
        device_type = self.device.split(":")[0]
        if self.precision == "int8" and device_type != "cpu" and self.engine != "ctranslate2":
            raise NmtError("--precision int8 needs --device cpu (use bf16 or fp16 on a GPU)")
        if device_type == "cuda":
            check_cuda_device(self.device)
        if self.precision == "fp16" and device_type == "cpu":
            raise NmtError("--precision fp16 needs --device cuda (use bf16 or fp32 on the CPU)")
        if self.cuda_graphs and device_type != "cuda":
            raise NmtError("--cuda-graphs needs --device cuda")


# --- decoding a binarized split (nmt generate) -----------------------------------------

# fairseq's --post-process values nmt applies (fairseq/data/data_utils.py `post_process`).
REMOVE_BPE_SYMBOLS = ("@@ ", "@@", "subword_nmt", "sentencepiece", "none")
GENERATE_SCORINGS = ("bleu", "sacrebleu")
# fairseq's --print-alignment values: hard (the value without one) and soft.
PRINT_ALIGNMENTS = ("hard", "soft")
# Tokens per batch when neither --max-tokens nor --batch-size is given (fairseq-generate's).
GENERATE_MAX_TOKENS = 12000


@dataclass(frozen=True)
class GenerateConfig:
    """What `nmt generate` decodes (a data-bin's split) and how it prints it: fairseq-generate's
    flags and output; search is in `decode`."""

    ALIASES: ClassVar[tuple[Alias, ...]] = (
        refused_alias("--sacrebleu", "nmt's (and fairseq-generate's) way to score with sacreBLEU is --scoring sacrebleu"),
        *FAIRSEQ_COMMON_ALIASES,
    )

    data: str = option(argument=True, path="dir", metavar="DATA_BIN")
    checkpoints: tuple[str, ...] = ensemble_paths_option(
        "Checkpoint to decode with; several separated by ':' form an ensemble.")
    gen_subset: str = option("--gen-subset", default="test", show_default=True,
                             help="The split of DATA_BIN to decode (train, valid, test, test1, ...).")
    source_lang: str | None = option("--source-lang", "-s", default=None,
                                     help="Source language [default: meta.json's, or the split files' names].")
    target_lang: str | None = option("--target-lang", "-t", default=None, help="Target language [default: as -s].")
    decode: DecodeConfig = DecodeConfig()
    max_tokens: int | None = option(
        "--max-tokens", default=None, type=int,
        help=f"Tokens per batch, padding included [default: {GENERATE_MAX_TOKENS} unless --batch-size is given].")
    batch_size: int | None = option("--batch-size", "--max-sentences", default=None, type=int,
                                    help="Sentences per batch (at most).")
    required_batch_size_multiple: int = option(
        "--required-batch-size-multiple", default=8, show_default=True,
        help="Batches under --max-tokens hold a multiple of this many sentences (fairseq's batching).")
    remove_bpe: str | None = option(
        "--remove-bpe", "--post-process", default=None, flag_value="@@ ", metavar="[SYMBOL]",
        help="Undo BPE in the S-, T-, H- and D- text and for BLEU, as fairseq: '@@ ' (the value "
             "without one), sentencepiece, ...")
    scoring: str = option("--scoring", default="bleu", choices=GENERATE_SCORINGS, show_default=True,
                          help="bleu: fairseq's BLEU over the tokens (bpe-removed with --remove-bpe); "
                               "sacrebleu: sacreBLEU with its 13a tokenization.")
    results_path: str | None = option(
        "--results-path", default=None, path="dir", metavar="DIR",
        help="Write the output to DIR/generate-{gen-subset}.txt instead of stdout.")
    quiet: bool = flag_option("--quiet", help="Print only the summary lines (no S-/T-/H-/D-/P- lines).")
    score_reference: bool = flag_option(
        "--score-reference", help="Score the references instead of searching: H- is the target, its score the "
                                  "mean log-probability of its tokens (fairseq's SequenceScorer).")
    print_alignment: str | None = option(
        "--print-alignment", default=None, flag_value="hard", choices=PRINT_ALIGNMENTS, metavar="[hard|soft]",
        help="After each P- line an A- line, from the last decoder layer's cross-attention averaged over heads "
             "(and over an ensemble's models), as fairseq: hard (the value without one): src-tgt pairs of token "
             "positions, each target token but </s> with the source token it attends most; soft: each target "
             "token's attention over the source tokens, comma-separated.")
    cpu: bool = flag_option("--cpu", help="Decode on the CPU even where a GPU is available.")
    fp16: bool = flag_option("--fp16", help="Run the model in half precision (autocast; a GPU only).")

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        check_choices(self)
        if self.score_reference:
            self.decode.check_fits_score_reference()
        if self.print_alignment == "soft" and self.score_reference:
            raise NmtError("--print-alignment soft with --score-reference: fairseq scores references with hard "
                           "alignments only; give --print-alignment (hard)")
        if not self.checkpoints or any(not p for p in self.checkpoints):
            raise NmtError("--path needs at least one checkpoint (several: a.pt:b.pt)")
        if not self.gen_subset or "/" in self.gen_subset:
            raise NmtError(f"--gen-subset must name a split such as test (got {self.gen_subset!r})")
        if self.remove_bpe is not None and self.remove_bpe not in REMOVE_BPE_SYMBOLS:
            raise NmtError(f"--remove-bpe must be one of {', '.join(repr(s) for s in REMOVE_BPE_SYMBOLS)} "
                           f"(got {self.remove_bpe!r})")
        for flag, value in (("--max-tokens", self.max_tokens), ("--batch-size", self.batch_size),
                            ("--required-batch-size-multiple", self.required_batch_size_multiple)):
            if value is not None and value < 1:
                raise NmtError(f"{flag} must be >= 1 (got {value})")

    @property
    def device(self) -> str:
        """cuda where one is available, unless --cpu."""
        return "cpu" if self.cpu else default_device()
# --- export (nmt export) ------------------------------------------------------------------

EXPORT_FORMATS = ("ctranslate2", "fairseq")
# CTranslate2's weight types an export may store (float32 without --quantization).
CT2_QUANTIZATIONS = ("int8", "int8_float16", "int8_float32", "int8_bfloat16", "float16", "bfloat16")


@dataclass(frozen=True)
class ExportConfig:
    """`nmt export`: an nmt checkpoint -> a CTranslate2 model directory or a fairseq checkpoint."""

    source: Path = option(argument=True, path="any", to_value=Path, metavar="RUN_OR_CKPT")
    out_dir: Path = option(argument=True, path="any", to_value=Path, metavar="OUT")
    format: str = option("--format", required=True, choices=EXPORT_FORMATS,
                         help="ctranslate2: a CTranslate2 model directory; fairseq: checkpoint.pt and "
                              "dict.*.txt for fairseq-generate / fairseq-interactive.")
    quantization: str | None = option(
        "--quantization", default=None, choices=CT2_QUANTIZATIONS,
        help="--format ctranslate2: the weights' type in the model files [default: float32].")
    force: bool = flag_option("--force", help="Replace an OUT directory that holds anything else (its files are deleted).")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.quantization is not None and self.format != "ctranslate2":
            raise NmtError("--quantization needs --format ctranslate2")


# --- preprocessing (nmt preprocess) ----------------------------------------------------

# auto: none for text already segmented into subword pieces (nmt_cli/preprocess/segmented.py), else moses / sentencepiece.
PREPROCESS_TOKENIZERS = ("auto", "moses", "none")
PREPROCESS_BPE = ("auto", "sentencepiece", "none")
# Sentences sampled to learn BPE (`nmt preprocess --bpe-sample`, `nmt learn-bpe --sample`).
DEFAULT_BPE_SAMPLE = 2_000_000


def comma_separated_prefixes(flag: str, value: str | None) -> tuple[Path, ...]:
    """A comma-separated list of prefixes; an empty item (`a,,b`, `a,`) is a mistake, never skipped."""
    if value is None:
        return ()
    prefixes = value.split(",")
    if "" in prefixes:
        raise NmtError(
            f"{flag} {value!r} has an empty prefix (item {prefixes.index('') + 1}); "
            "give comma-separated file prefixes such as a,b"
        )
    return tuple(Path(p) for p in prefixes)


def optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def check_language_code(lang: str, what: str) -> None:
    """A language code becomes part of file names (`dict.{lang}.txt`), so it is a plain one:
    never empty, never a path; `what` names where it came from (a flag, a file's field)."""
    if not lang or any(c in lang for c in "/\\. "):
        raise NmtError(f"{what} must be a plain language code like 'en' (got {lang!r})")


@dataclass(frozen=True)
class PreprocessConfig:
    """`nmt preprocess`: raw parallel text -> data-bin/. Field names follow fairseq's flags."""

    source_lang: str = option("-s", "--source-lang", required=True, help="Source language code; files are PREFIX.SRC.")
    target_lang: str = option("-t", "--target-lang", required=True, help="Target language code; files are PREFIX.TGT.")
    trainpref: Path = option("--trainpref", required=True, to_value=Path,
                             help="Training files prefix (reads PREFIX.SRC and PREFIX.TGT).")
    validpref: tuple[Path, ...] = option(
        "--validpref", default=(), cli_default=None, to_value=partial(comma_separated_prefixes, "--validpref"),
        help="Validation prefix(es), comma-separated: splits valid, valid1, ...")
    testpref: tuple[Path, ...] = option(
        "--testpref", default=(), cli_default=None, to_value=partial(comma_separated_prefixes, "--testpref"),
        help="Test prefix(es), comma-separated: splits test, test1, ...")
    destdir: Path = option("--destdir", default=Path("data-bin"), type=str, to_value=Path, show_default=True,
                           help="Output directory (data-bin/).")
    joined_dictionary: bool = flag_option("--joined-dictionary",
                                          help="One dictionary for both languages (needed to share embeddings).")
    workers: int = option("--workers", default=1, show_default=True,
                          help="Processes for tokenization, BPE and binarization; more than the usable CPUs run as "
                               "that many (the output is the same for any number).")
    thresholdsrc: int = option("--thresholdsrc", default=0, show_default=True,
                               help="Drop source symbols seen fewer times (they map to <unk>).")
    thresholdtgt: int = option("--thresholdtgt", default=0, show_default=True,
                               help="Drop target symbols seen fewer times.")
    nwordssrc: int = option(
        "--nwordssrc", default=-1, show_default=True,
        help="Keep at most this many source symbols, the 4 specials included, as in fairseq (0 or -1: all).")
    nwordstgt: int = option("--nwordstgt", default=-1, show_default=True,
                            help="Keep at most this many target symbols, the 4 specials included (0 or -1: all).")
    srcdict: Path | None = option(
        "--srcdict", default=None, type=str, to_value=optional_path,
        help="Reuse this source dictionary instead of building one (needs --bpe-model or --bpe none).")
    tgtdict: Path | None = option("--tgtdict", default=None, type=str, to_value=optional_path,
                                  help="Reuse this target dictionary instead of building one.")
    tokenizer: str = option(
        "--tokenizer", default="auto", choices=PREPROCESS_TOKENIZERS, show_default=True,
        help="moses: sacremoses tokenization (no escaping); none: split on whitespace only; auto: none when the "
             "training text is already segmented into subword pieces ('@@ ' or '▁'), else moses.")
    # Off for segmented text: it is taken as it is, as fairseq-preprocess does.
    normalize_punctuation: bool | None = auto_switch(
        "--normalize-punctuation", auto="on, off for text already segmented into subword pieces",
        help="Moses punctuation normalization (and removal of non-printing characters) before tokenizing")
    aggressive_dash_splits: bool = flag_option("--aggressive-dash-splits",
                                               help="Moses -a: split hyphenated words (A-B -> A @-@ B).")
    bpe: str = option("--bpe", default="auto", choices=PREPROCESS_BPE, show_default=True,
                      help="Subword segmentation; none: the text is already segmented; auto: none when the "
                           "training text holds subword pieces ('@@ ' or '▁'), else sentencepiece.")
    bpe_size: int = option("--bpe-size", default=32000, show_default=True,
                           help="BPE vocabulary size (sentencepiece pieces); at least the training text's "
                                "distinct characters + 4.")
    # Sentences sampled to learn BPE: bounds memory on huge corpora (sentencepiece holds the sample).
    bpe_sample: int = option(
        "--bpe-sample", default=DEFAULT_BPE_SAMPLE, show_default=True,
        help="Learn BPE on at most this many sentences (a seeded random sample; both languages count "
             "for joint BPE); bounds memory on large corpora. 0: all; else more than 100.")
    bpe_seed: int = option("--bpe-seed", default=1, show_default=True, help="Seed of the BPE sentence sample.")
    separate_bpe: bool = flag_option("--separate-bpe",
                                     help="Learn one BPE model per language instead of a joint one.")
    bpe_model: Path | None = option(  # reuse a joint model instead of learning one
        "--bpe-model", default=None, type=str, to_value=optional_path,
        help="Reuse this (joint) sentencepiece model instead of learning one.")
    min_len: int = option("--min-len", default=1, show_default=True,
                          help="Drop training pairs with a side shorter than this (tokens, before BPE).")
    max_len: int = option("--max-len", default=250, show_default=True,
                          help="Drop training pairs with a side longer than this (tokens, before BPE).")
    # Moses' clean-corpus-n default; fairseq's WMT14 recipe uses 1.5.
    max_ratio: float = option(
        "--max-ratio", default=9.0, show_default=True,
        help="Drop training pairs whose length ratio exceeds this (Moses clean-corpus-n; fairseq's WMT recipe "
             "uses 1.5).")
    force: bool = flag_option("--force",
                              help="Replace a --destdir that holds a different dataset.")

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        for flag, lang in (("--source-lang", self.source_lang), ("--target-lang", self.target_lang)):
            check_language_code(lang, flag)
        if self.source_lang == self.target_lang:
            raise NmtError(f"--source-lang and --target-lang are both {self.source_lang!r}")
        if self.workers < 1:  # above the CPUs is fine: fairseq's recipes say --workers 20 (preprocess/run.py)
            raise NmtError(f"--workers must be >= 1 (got {self.workers})")
        check_choices(self)
        from nmt_cli.text.bpe import check_sentencepiece_sizes

        check_sentencepiece_sizes(self.bpe_size, self.bpe_sample, "--bpe-size", "--bpe-sample")
        check_seed(self.bpe_seed, "--bpe-seed")
        if self.min_len < 1 or self.max_len < self.min_len:
            raise NmtError(f"need 1 <= --min-len <= --max-len (got {self.min_len}, {self.max_len})")
        if self.max_ratio < 1.0:
            raise NmtError(f"--max-ratio must be >= 1 (got {self.max_ratio})")
        if self.joined_dictionary and self.tgtdict is not None:
            raise NmtError("--joined-dictionary uses --srcdict for both sides; drop --tgtdict")
        # As in fairseq (and Dictionary.build), N counts the specials: a value that keeps
        # nothing else would silently turn all text into <unk>. N <= 0 keeps every word.
        from nmt_cli.data.dictionary import SPECIALS

        for flag, nwords in (("--nwordssrc", self.nwordssrc), ("--nwordstgt", self.nwordstgt)):
            if 0 < nwords <= len(SPECIALS):
                raise NmtError(f"{flag} {nwords} keeps no word: it counts the {len(SPECIALS)} special symbols "
                               f"({' '.join(SPECIALS)}), so it must be > {len(SPECIALS)} (or 0 or -1: all words)")
        # fairseq's commands often repeat equal values for both sides; a different one would be ignored.
        for target, source, unset in (("nwordstgt", "nwordssrc", -1), ("thresholdtgt", "thresholdsrc", 0)):
            if self.joined_dictionary and getattr(self, target) not in (unset, getattr(self, source)):
                raise NmtError(f"--joined-dictionary builds one dictionary with --{source} {getattr(self, source)}; "
                               f"--{target} {getattr(self, target)} would be ignored (drop it or make them equal)")
        if self.bpe_model is not None and (self.bpe == "none" or self.separate_bpe):
            raise NmtError("--bpe-model is a joint sentencepiece model: it needs --bpe sentencepiece without --separate-bpe")
        reused_dict = self.srcdict is not None or self.tgtdict is not None
        if reused_dict and self.bpe == "sentencepiece" and self.bpe_model is None:
            raise NmtError(
                "--srcdict/--tgtdict only fit the BPE model they were built with: "
                "pass that model with --bpe-model (or use --bpe none for pre-segmented text)"
            )

    def ignored_bpe_options(self, given_flags: frozenset[str]) -> list[str]:
        """Warnings for the options of BPE learning in `given_flags` (field names given on the
        command line) when no BPE is learned: --bpe none, or --bpe-model gives the model."""
        if self.bpe in ("sentencepiece", "auto") and self.bpe_model is None:
            return []
        reason = "--bpe none learns no BPE" if self.bpe == "none" else "--bpe-model gives the BPE model"
        given = [name for name in ("bpe_size", "bpe_sample", "bpe_seed") if name in given_flags]
        return [f"warning: --{name.replace('_', '-')} is ignored: {reason}" for name in given]


@dataclass(frozen=True)
class LearnBpeConfig:
    """`nmt learn-bpe`: the BPE stage of `nmt preprocess` on its own."""

    inputs: tuple[str, ...] = option(
        "--input", multiple=True, required=True,
        help="Tokenized text to learn from (UTF-8, one sentence per line); repeat for several files; - for stdin.")
    vocab_size: int = option("--vocab-size", required=True, type=int,
                             help="Number of BPE pieces (e.g. 32000); at least the text's distinct characters + 4.")
    model_prefix: str = option("--model-prefix", required=True, help="Write the model to PREFIX.model.")
    sample: int = option("--sample", default=DEFAULT_BPE_SAMPLE, show_default=True,
                         help="Learn on at most this many sentences (a seeded random sample; 0: all; "
                              "else more than 100).")
    seed: int = option("--seed", default=1, show_default=True, help="Seed of the sentence sample.")

    def __post_init__(self) -> None:
        from nmt_cli.files import file_prefix
        from nmt_cli.text.bpe import check_sentencepiece_sizes

        file_prefix(self.model_prefix, "--model-prefix", (".model",))  # '' would write a hidden `.model`
        if self.inputs.count("-") > 1:
            raise NmtError("--input - (standard input) can be given only once")
        check_sentencepiece_sizes(self.vocab_size, self.sample, "--vocab-size", "--sample")
        check_seed(self.seed)


@dataclass(frozen=True)
class ApplyBpeConfig:
    """`nmt apply-bpe`: segment text with a BPE model, or undo it."""

    model: str = option("--model", required=True, help="sentencepiece model (e.g. data-bin/bpe.model).")
    input_path: str = option("--input", default="-", show_default=True, help="Input text file; - for stdin.")
    output_path: str = option("--output", default="-", show_default=True, help="Output text file; - for stdout.")
    decode: bool = flag_option("--decode", help="Undo BPE: space-separated pieces in, tokenized text out.")


@dataclass(frozen=True)
class BinarizeConfig:
    """`nmt binarize`: already-segmented text and an existing dictionary -> PREFIX.bin/.idx."""

    dict_path: str = option("--dict", required=True, help="Dictionary (dict.LANG.txt of a data-bin/).")
    input_path: str = option("--input", required=True, help="Segmented text (BPE pieces separated by spaces).")
    output_prefix: str = option(
        "--output-prefix", required=True,
        help="Write PREFIX.bin and PREFIX.idx (e.g. data-bin/test1.en-de.en to add a test set).")
    workers: int = option("--workers", default=1, show_default=True, help="Processes to binarize with.")

    def __post_init__(self) -> None:
        check_cpu_count("--workers", self.workers)


# --- imports (nmt import-fairseq, nmt import-marian) ------------------------------------

def _out_dir_option(files: str) -> Any:
    return option("--out", required=True, path="any", to_value=Path, help=f"Run directory to write: {files}.")


def _language_option(side: str, default_from: str) -> Any:
    """--source-lang / -s or --target-lang / -t; None: `default_from`."""
    return option(f"--{side}-lang", f"-{side[0]}", default=None,
                  help=f"{side.capitalize()} language (default: {default_from}).")


def _force_option() -> Any:
    return flag_option(
        "--force", help="Replace an --out directory that holds anything but this same import (its files are deleted).")


def _check_import_languages(cfg: FairseqImportConfig | MarianImportConfig) -> None:
    """The languages given name the run's dictionaries, dict.LANG.txt inside --out."""
    for flag, lang in (("--source-lang", cfg.source_lang), ("--target-lang", cfg.target_lang)):
        if lang is not None:
            check_language_code(lang, flag)


@dataclass(frozen=True)
class FairseqImportConfig:
    """`nmt import-fairseq`: a fairseq Transformer checkpoint -> an nmt run directory."""

    checkpoint: Path = option(argument=True, path="any", to_value=Path)
    dict_dir: Path = option("--dict-dir", required=True, path="any", to_value=Path,
                            help="Directory holding the model's dict.SRC.txt and dict.TGT.txt (its data-bin).")
    out_dir: Path = _out_dir_option("checkpoint.pt, meta.json, dictionaries, BPE codes")
    bpe_codes: Path | None = option(
        "--bpe-codes", default=None, path="any", to_value=optional_path,
        help="subword-nmt BPE codes the model was trained with (copied into the run); "
             "without them `nmt translate` needs pre-segmented input (--input-format bpe).")
    source_lang: str | None = _language_option("source", "from the checkpoint")
    target_lang: str | None = _language_option("target", "from the checkpoint")
    force: bool = _force_option()

    def __post_init__(self) -> None:
        _check_import_languages(self)


@dataclass(frozen=True)
class MarianImportConfig:
    """`nmt import-marian`: a Hugging Face MarianMTModel directory -> an nmt run directory."""

    model_dir: Path = option(argument=True, path="any", to_value=Path)
    out_dir: Path = _out_dir_option("checkpoint.pt, meta.json, dictionaries, sentencepiece models")
    source_lang: str | None = _language_option("source", "tokenizer_config.json's source_lang")
    target_lang: str | None = _language_option("target", "tokenizer_config.json's target_lang")
    force: bool = _force_option()

    def __post_init__(self) -> None:
        _check_import_languages(self)


# --- scoring (nmt score) ---------------------------------------------------------------

SCORE_METRICS = ("bleu", "chrf", "ter")
HYP_FORMATS = ("auto", "text", "jsonl")


def split_metrics(value: str) -> tuple[str, ...]:
    """`--metrics bleu,chrF` -> ("bleu", "chrf")."""
    return tuple(name.strip().lower() for name in value.split(",") if name.strip())


def _bleu_tokenizers() -> list[str]:
    from nmt_cli.scoring.sacre import bleu_tokenizers

    return bleu_tokenizers()


@dataclass(frozen=True)
class ScoreConfig:
    """What `nmt score` compares and reports. Paths may be `-` (stdin) for one hypothesis stream."""

    refs: tuple[str, ...] = option(
        "--ref", "-r", required=True, multiple=True, metavar="FILE",
        help="Reference translations, one per line (detokenized). Repeat for several references.")
    hyp: str = option(
        "--hyp", "-i", default="-", show_default=True, metavar="FILE",
        help="Hypotheses (detokenized): plain text or `nmt translate --output-format jsonl`; - reads stdin.")
    hyp_format: str = option(
        "--hyp-format", default="auto", choices=HYP_FORMATS, show_default=True,
        help="auto: JSON lines when the first line is a JSON object with a \"hyp\" or \"text\" field.")
    metrics: tuple[str, ...] = option("--metrics", "-m", default=("bleu",), cli_default="bleu", show_default=True,
                                      to_value=split_metrics,
                                      help=f"Comma-separated sacreBLEU metrics: {','.join(SCORE_METRICS)}.")
    # sacreBLEU's BLEU options (`--tokenize` choices are sacreBLEU's own).
    tokenize: str = option("--tokenize", default="13a", choices=_bleu_tokenizers, show_default=True,
                           help="sacreBLEU's BLEU tokenizer (as `sacrebleu --tokenize`).")
    lowercase: bool = flag_option(
        "--lowercase", "-lc",
        help="Case-insensitive sacreBLEU BLEU (as `sacrebleu -lc`); chrF, TER and tokenized BLEU "
             "keep their defaults (tokenized BLEU is case-sensitive, as in the papers).")
    width: int = option("--width", "-w", default=1, type=int, show_default=True,
                        help="Decimals printed for sacreBLEU scores (as `sacrebleu --width`).")
    # Paper-comparable tokenized BLEU (multi-bleu.perl).
    tokenized_bleu: bool = flag_option(
        "--tokenized-bleu",
        help="Also report paper-style BLEU: Moses-tokenize hypotheses and references, then "
             "multi-bleu.perl (case-sensitive, no smoothing).")
    target_lang: str | None = option(
        "--target-lang", "-t", default=None, metavar="LANG",
        help="Language of the hypotheses, for the Moses tokenizer of --tokenized-bleu (e.g. de, fr).")
    already_tokenized: bool = flag_option(
        "--already-tokenized",
        help="With --tokenized-bleu: the inputs are already Moses-tokenized; only split on spaces.")
    compound_split: bool = flag_option(
        "--compound-split",
        help="With --tokenized-bleu: split hyphenated compounds (a-b -> a ##AT##-##AT## b) in both "
             "hypotheses and references, as tensor2tensor's get_ende_bleu.sh (En-De only).")
    sentence_level: bool = flag_option(
        "--sentence-level", "-sl",
        help="One score per hypothesis line (BLEU with effective order, as `sacrebleu -sl`).")
    output_json: bool = flag_option(
        "--json",
        help="JSON output: a list of sacreBLEU-style results; with --sentence-level one object per line.")
    # Paired bootstrap resampling against a second system.
    compare: str | None = option(
        "--compare", default=None, metavar="FILE",
        help="A second system's hypotheses: paired bootstrap resampling (sacreBLEU's --paired-bs), "
             "--hyp being the baseline. Prints both scores, their bootstrap mean and 95% interval, "
             "and the p-value (identical outputs: p = 1).")
    paired_bs_n: int = option("--paired-bs-n", default=1000, type=int, show_default=True,
                              help="Number of bootstrap resamples for --compare.")
    seed: int = option("--seed", default=12345, type=int, show_default=True,
                       help="Random seed of the bootstrap resampling (sacreBLEU's default; >= 1).")

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if not self.refs:
            raise NmtError("--ref is required (repeat it for several references)")
        if "-" in self.refs:
            raise NmtError("references must be files (stdin is for the hypotheses)")
        if not self.metrics and not self.tokenized_bleu:
            raise NmtError("nothing to compute: give --metrics or --tokenized-bleu")
        unknown = [m for m in self.metrics if m not in SCORE_METRICS]
        if unknown or len(set(self.metrics)) != len(self.metrics):
            raise NmtError(f"--metrics takes distinct names from {', '.join(SCORE_METRICS)} (got {','.join(self.metrics)})")
        check_choices(self)
        if not 0 <= self.width <= 10:
            raise NmtError(f"--width must be between 0 and 10 (got {self.width})")
        if (self.compound_split or self.already_tokenized) and not self.tokenized_bleu:
            raise NmtError("--compound-split and --already-tokenized apply to --tokenized-bleu; add it")
        if self.tokenized_bleu and not self.already_tokenized and not self.target_lang:
            raise NmtError("--tokenized-bleu needs --target-lang (the Moses tokenizer's language), or --already-tokenized")
        if self.sentence_level and (self.compare is not None or self.tokenized_bleu):
            raise NmtError("--sentence-level works with the sacreBLEU metrics of one system (no --compare, --tokenized-bleu)")
        if self.compare is not None:
            if self.tokenized_bleu:
                raise NmtError("--compare tests the sacreBLEU metrics; drop --tokenized-bleu")
            if self.compare == self.hyp:
                raise NmtError(f"--compare {self.compare} is the same input as --hyp")
        if self.paired_bs_n < 1:
            raise NmtError(f"--paired-bs-n must be >= 1 (got {self.paired_bs_n})")
        # sacreBLEU treats seed 0 as "no seed" (a different result every run).
        check_seed(self.seed, smallest=1)


# --- checkpoint averaging (nmt average) -------------------------------------------------


@dataclass(frozen=True, kw_only=True)  # keywords only: fields in the order of `nmt average --help`
class AverageConfig:
    """Which checkpoints `nmt average` reads (explicit files, or the last N of a run directory) and where it writes."""

    inputs: tuple[str, ...] = option(
        "--inputs", required=True, multiple=True, metavar="PATH",
        help="Checkpoint files to average (repeat the flag, or list several after it), or with "
             "--num-update-checkpoints / --num-epoch-checkpoints one run directory.")
    num_update_checkpoints: int | None = option(
        "--num-update-checkpoints", default=None, type=int, metavar="N",
        help="Average the last N checkpoint_{EPOCH}_{UPDATES}.pt files of the run directory, by update count.")
    num_epoch_checkpoints: int | None = option(
        "--num-epoch-checkpoints", default=None, type=int, metavar="N",
        help="Average the last N checkpoint{EPOCH}.pt files of the run directory, by epoch.")
    checkpoint_upper_bound: int | None = option(
        "--checkpoint-upper-bound", default=None, type=int, metavar="NUM",
        help="Ignore checkpoints numbered above NUM (an update count or an epoch, as selected).")
    output: str = option("--output", "-o", required=True, metavar="FILE",
                         help="Where to write the averaged checkpoint (written atomically).")
    # The checkpoints' moving average of the weights (nmt train --ema-decay) instead of their weights.
    use_ema: bool = flag_option("--use-ema", help="Average the EMA weights the checkpoints hold (trained with "
                                                  "--ema-decay); with one checkpoint, write its EMA as the model.")

    @property
    def num_last(self) -> int | None:
        return self.num_update_checkpoints or self.num_epoch_checkpoints

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if not self.inputs:
            raise NmtError("--inputs needs checkpoint files or one run directory")
        if not self.output:
            raise NmtError("--output is required")
        if "\x00" in self.output:  # no file name can hold it (os.path would raise ValueError)
            raise NmtError("--output holds a NUL character; no file can be named so")
        if self.num_update_checkpoints is not None and self.num_epoch_checkpoints is not None:
            raise NmtError("give --num-update-checkpoints or --num-epoch-checkpoints, not both")
        for name in ("num_update_checkpoints", "num_epoch_checkpoints", "checkpoint_upper_bound"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise NmtError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        if self.num_last is not None and len(self.inputs) != 1:
            raise NmtError("--num-update-checkpoints/--num-epoch-checkpoints take exactly one run directory in --inputs")
        if self.checkpoint_upper_bound is not None and self.num_last is None:
            raise NmtError("--checkpoint-upper-bound needs --num-update-checkpoints or --num-epoch-checkpoints")


# --- describing a model (nmt info) ----------------------------------------------------------


def _architecture_names() -> list[str]:
    from nmt_cli.models.registry import ARCHITECTURES

    return list(ARCHITECTURES)


@dataclass(frozen=True)
class InfoConfig:
    """What `nmt info` describes: a named preset, with vocabulary sizes (and model options,
    which the command passes beside it), or the model stored in a checkpoint."""

    arch: str | None = option("--arch", default=None, choices=_architecture_names, help="A named architecture preset.")
    checkpoint: str | None = option("--path", default=None, metavar="FILE",
                                     help="A checkpoint file: describe the model stored in it.")
    vocab_size: int | None = option("--vocab-size", default=None, type=int,
                                    help="One (joined) vocabulary size for source and target.")
    src_vocab_size: int | None = option("--src-vocab-size", default=None, type=int, help="Source vocabulary size.")
    tgt_vocab_size: int | None = option("--tgt-vocab-size", default=None, type=int, help="Target vocabulary size.")
    as_json: bool = flag_option("--json", help="Print one JSON object instead of a table.")

    def __post_init__(self) -> None:
        if (self.arch is None) == (self.checkpoint is None):
            raise NmtError("give exactly one of --arch and --path")
        sizes = {"--vocab-size": self.vocab_size, "--src-vocab-size": self.src_vocab_size,
                 "--tgt-vocab-size": self.tgt_vocab_size}
        for flag, size in sizes.items():
            if size is not None and size < 2:
                raise NmtError(f"{flag} must be >= 2 (got {size})")
        given = [flag for flag, size in sizes.items() if size is not None]
        if self.checkpoint is not None and given:
            raise NmtError(f"--path takes no vocabulary sizes (the checkpoint has them; got {given[0]})")
        if self.vocab_size is not None and len(given) > 1:
            raise NmtError("give either --vocab-size or --src-vocab-size/--tgt-vocab-size, not both")
        if (self.src_vocab_size is None) != (self.tgt_vocab_size is None):
            raise NmtError("--src-vocab-size and --tgt-vocab-size go together")

    @property
    def src_vocab(self) -> int | None:
        return self.vocab_size if self.vocab_size is not None else self.src_vocab_size

    @property
    def tgt_vocab(self) -> int | None:
        return self.vocab_size if self.vocab_size is not None else self.tgt_vocab_size


# --- training (nmt train) ----------------------------------------------------------------

LR_SCHEDULERS = ("inverse_sqrt", "noam", "fixed")
BEST_CHECKPOINT_METRICS = ("loss", "nll", "bleu", "chrf")
# Metrics where higher is better (selected by --eval-bleu's scores); the others are minimized.
MAXIMIZED_METRICS = ("bleu", "chrf")
# The settings of --eval-bleu, which act only with it.
EVAL_BLEU_SETTINGS = ("eval_bleu_beam", "eval_bleu_lenpen", "eval_bleu_max_len_a", "eval_bleu_max_len_b",
                      "eval_bleu_subset_lines", "eval_bleu_chrf", "eval_bleu_args", "eval_bleu_detok",
                      "eval_bleu_detok_args", "eval_tokenized_bleu", "eval_bleu_remove_bpe", "eval_bleu_print_samples")
# The settings of validation, which act only without --disable-validation.
VALIDATION_SETTINGS = ("valid_subset", "validate_interval", "validate_interval_updates", "best_checkpoint_metric")
# --eval-bleu-args keys (fairseq's generation arguments) and the TrainConfig fields they set.
EVAL_BLEU_ARGS = {"beam": "eval_bleu_beam", "lenpen": "eval_bleu_lenpen", "max_len_a": "eval_bleu_max_len_a",
                  "max_len_b": "eval_bleu_max_len_b"}
# --eval-bleu-detok values and the data-bin tokenizer each names: nmt detokenizes as the data-bin says.
EVAL_BLEU_DETOK = {"moses": "moses", "space": "none"}
# --eval-bleu-detok-args keys nmt takes: the languages of fairseq's Moses detokenizer. (Its other
# keys shape tokenizing, which nmt takes from the data-bin's meta.json.)
EVAL_BLEU_DETOK_ARGS = ("source_lang", "target_lang")
# --eval-bleu-remove-bpe values (fairseq's --post-process names) and the segmentation each removes.
EVAL_BLEU_REMOVE_BPE = {"@@ ": "subword_nmt", "subword_nmt": "subword_nmt", "sentencepiece": "sentencepiece",
                        "none": "none"}
FAIRSEQ_EMA_DECAY = 0.9999  # --store-ema without --ema-decay, as fairseq
# Padded tokens per training batch when neither --max-tokens nor --batch-size is given.
TRAIN_MAX_TOKENS = 4096


def parse_betas(text: str) -> tuple[float, float]:
    """`"(0.9, 0.98)"`, `"0.9,0.98"` or `"0.9 0.98"` -> (0.9, 0.98)."""
    numbers = [n for n in re.split(r"[\s,()\[\]]+", text) if n]
    try:
        values = tuple(float(n) for n in numbers)
    except ValueError:
        values = ()
    if len(values) != 2:
        raise NmtError(f"--adam-betas {text!r}: expected two numbers such as '(0.9, 0.98)'")
    return values  # type: ignore[return-value]


def _parse_duration(text: str) -> float:
    from nmt_cli.train.log import parse_duration  # imported when used: it loads rich

    return parse_duration(text)


# fairseq's pipelines of PyTorch's DDP (nmt's) and of its own all-reduce: the same gradients.
DDP_BACKENDS_LIKE_NMT = ("c10d", "pytorch_ddp", "no_c10d", "legacy_ddp")


def _restore_file(name: str) -> dict[str, Any] | Refused:
    if name == "checkpoint_last.pt":  # fairseq's default, in --save-dir: nmt resumes from it too
        return {}
    return Refused("nmt resumes only from SAVE_DIR/checkpoint_last.pt; to start from another checkpoint's "
                   "weights use --finetune-from-model (fresh optimizer), or copy it to SAVE_DIR/checkpoint_last.pt")


# What nmt offers instead of fairseq-train's --reset-* flags.
FRESH_START = ("--reset-optimizer resets only Adam's state; to train from a checkpoint's weights with all else fresh, "
               "use --finetune-from-model FILE and a new --save-dir")

# fairseq-train's flags for nmt's settings, or refused with what nmt does instead
# (the README's "Coming from fairseq" table lists them all).
TRAIN_FAIRSEQ_ALIASES: tuple[Alias, ...] = (
    choice_alias("--optimizer", {"adam": {}}, "nmt trains with Adam only (decoupled weight decay, as fairseq's adam)",
                 help="fairseq's; only adam, nmt's one optimizer."),
    choice_alias("--criterion", {"label_smoothed_cross_entropy": {}, "cross_entropy": {"label_smoothing": 0.0}},
                 "nmt's loss is (label-smoothed) cross-entropy: label_smoothed_cross_entropy or cross_entropy",
                 help="fairseq's: label_smoothed_cross_entropy (smoothing from --label-smoothing, whose default "
                      "here is 0.1, fairseq's 0) or cross_entropy (--label-smoothing 0)."),
    switch_alias("--fp16", {"precision": "fp16"}, help="fairseq's: --precision fp16."),
    switch_alias("--memory-efficient-fp16", {"precision": "fp16"},
                 help="fairseq's: --precision fp16 (nmt keeps float32 weights either way)."),
    switch_alias("--bf16", {"precision": "pure-bf16"},
                 help="fairseq's: --precision pure-bf16 (a bf16 model, float32 master weights)."),
    switch_alias("--cpu", {"device": "cpu"}, help="fairseq's: --device cpu."),
    value_alias("--stop-time-hours", float, lambda hours: {"max_time": hours * 3600.0}, metavar="HOURS",
                help="fairseq's: --max-time in hours (nmt counts this invocation's time; fairseq's, the run's "
                     "across restarts)."),
    value_alias("--finetune-from-model", str, lambda path: {"finetune_from": path}, metavar="FILE",
                help="fairseq's: --finetune-from."),
    value_alias("--restore-file", str, _restore_file, metavar="FILE",
                help="fairseq's; only checkpoint_last.pt (its default): nmt resumes from SAVE_DIR/checkpoint_last.pt."),
    choice_alias("--ddp-backend", {name: {} for name in DDP_BACKENDS_LIKE_NMT},
                 "nmt's multi-GPU training is PyTorch DDP (torchrun); no sharded or SlowMo training",
                 help="fairseq's: nmt always uses PyTorch DDP (the same gradients as each of these)."),
    choice_alias("--log-format", {name: {} for name in ("json", "simple", "tqdm", "none")},
                 "nmt logs plain lines on stderr and JSON lines in SAVE_DIR/train_log.jsonl",
                 help="fairseq's; no effect: nmt logs plain lines on stderr and JSON lines in SAVE_DIR/train_log.jsonl."),
    no_effect_alias("--num-workers", type=int,
                    help="fairseq's; no effect: nmt reads memory-mapped data in the training process."),
    no_effect_alias("--no-progress-bar", help="fairseq's; no effect: nmt shows progress only on a terminal."),
    refused_alias("--force-anneal", "nmt's schedulers (inverse_sqrt, noam, fixed) have no forced annealing", type=str),
    refused_alias("--reset-lr-scheduler", "nmt's schedule keeps no state: the rate follows the update count that "
                                          f"resuming from checkpoint_last.pt restores; {FRESH_START}"),
    refused_alias("--reset-dataloader", f"resuming from checkpoint_last.pt continues at the batch it saved; {FRESH_START}"),
    refused_alias("--reset-meters", "resuming from checkpoint_last.pt continues its log window, best metric and "
                                    f"patience; {FRESH_START}"),
    refused_alias("--no-save", "nmt always writes checkpoint_last.pt to --save-dir (resuming needs it); "
                               "--no-epoch-checkpoints writes only it and checkpoint_best.pt at epoch ends"),
    *FAIRSEQ_COMMON_ALIASES,
)


@dataclass(frozen=True, kw_only=True)  # keywords only: fields in the order of `nmt train --help`
class TrainConfig:
    """Everything `nmt train` needs besides the model's own ModelConfig.

    Defaults are the paper's recipe where it has one (Adam betas (0.9, 0.98), eps 1e-9,
    inverse square-root schedule with 4000 warm-up updates, label smoothing 0.1).
    Interval and limit fields use 0 for "off"; `keep_*` use -1 for "keep all".
    """

    ALIASES: ClassVar[tuple[Alias, ...]] = TRAIN_FAIRSEQ_ALIASES

    data: str = option(argument=True, path="dir", metavar="DATA_BIN")
    arch: str = option("--arch", "-a", default="transformer_base", refuse=refuse_other_model_family,
                       help="Architecture preset (see `nmt info --arch NAME`); fairseq's Transformer names "
                            "too (transformer, transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big, ...).")
    save_dir: str = option(  # fairseq's default name, so that its commands run unchanged
        "--save-dir", default="checkpoints",
        help="Run directory for checkpoints, train_log.jsonl and config.json (fairseq's default). If it holds checkpoint_last.pt, "
             "training resumes from it (on the same data-bin only). One training run at a time may use it (a "
             "lock, .NAME.lock beside it, says which process has it). Under torchrun only global rank 0 writes; a "
             "rank whose --save-dir lacks checkpoint_last.pt is sent rank 0's, and a rank holding another one than "
             "rank 0's (or one while rank 0 has none) stops training with an error.")
    source_lang: str | None = option("--source-lang", "-s", default=None,
                                     help="Source language [default: the data-bin's meta.json].")
    target_lang: str | None = option("--target-lang", "-t", default=None,
                                     help="Target language [default: the data-bin's meta.json].")
    train_subset: str = option("--train-subset", default="train", help="Split to train on.")
    valid_subset: str = option("--valid-subset", default="valid", help="Split to validate on.")
    # Batching: padded tokens per batch, sentences per batch, accumulation.
    max_tokens: int | None = option(
        "--max-tokens", default=None, type=int,
        help="Padded tokens per batch: batch size * max(source length, target length) "
             f"[default: {TRAIN_MAX_TOKENS} unless --batch-size is given; then no limit, as in fairseq].")
    batch_size: int | None = option("--batch-size", "--max-sentences", default=None, type=int,
                                    help="Most sentences per batch.")
    required_batch_size_multiple: int = option(
        "--required-batch-size-multiple", default=8, type=int,
        help="Round batch sizes down to a multiple of this (fast matrix shapes).")
    update_freq: int = option("--update-freq", default=1, type=int, one_item_list=True,
                              help="Accumulate gradients over N batches per update (N times the batch, same memory); "
                                   "fairseq's list form of one, '[N]', too.")
    # Optimisation.
    lr: float = option("--lr", default=5e-4, type=float, one_item_list=True,
                       help="Peak learning rate (inverse_sqrt, fixed), or multiplier of the paper's formula (noam); "
                            "fairseq's list form of one, '[0.0005]', too; fairseq's default is 0.25.")
    lr_scheduler: str = option(
        "--lr-scheduler", default="inverse_sqrt", choices=LR_SCHEDULERS,
        help="inverse_sqrt: linear warm-up to --lr, then lr*sqrt(warmup/step) (fairseq). "
             "noam: lr * d_model^-0.5 * min(step^-0.5, step*warmup^-1.5) (the paper). fixed: constant --lr "
             "(fairseq's default scheduler), after a linear warm-up (update k: lr*k/warmup) only where "
             "--warmup-updates is given, as fairseq's.")
    warmup_updates: int = option("--warmup-updates", default=4000, type=int,
                                 help="Warm-up updates of the schedule; fixed: 0 unless given (fairseq's defaults: "
                                      "4000 for inverse_sqrt, 0 for fixed).")
    warmup_init_lr: float = option(  # fairseq's negative default: 0 where there is warm-up, as always here
        "--warmup-init-lr", default=0.0, type=float, to_value=lambda lr: max(lr, 0.0),
        help="Learning rate at the start of inverse_sqrt warm-up (a negative one, fairseq's default -1: 0).")
    adam_betas: tuple[float, float] = option(
        "--adam-betas", default=(0.9, 0.98), cli_default="(0.9, 0.98)", to_value=parse_betas,
        help="Adam beta1 and beta2, e.g. '(0.9, 0.98)' or '0.9 0.98' (the paper's; fairseq's default is (0.9, 0.999)).")
    adam_eps: float = option("--adam-eps", default=1e-9, type=float,
                             help="Adam epsilon (the paper's; fairseq's default is 1e-8).")
    weight_decay: float = option("--weight-decay", "--wd", default=0.0, type=float,
                                 help="Decoupled weight decay (AdamW).")
    clip_norm: float = option("--clip-norm", default=0.0, type=float,
                              help="Clip the gradient norm to this value (0: no clipping).")
    label_smoothing: float = option(
        "--label-smoothing", default=0.1, type=float,
        help="Label smoothing epsilon (fairseq's formula: eps/(V-1) on every non-target symbol; the paper's 0.1, "
             "fairseq's default 0).")
    # Stopping.
    max_update: int = option("--max-update", default=0, type=int, help="Stop after this many updates (0: no limit).")
    max_epoch: int = option("--max-epoch", default=0, type=int, help="Stop after this many epochs (0: no limit).")
    max_time: float = option(  # seconds of this invocation
        "--max-time", default=0.0, cli_default="0", to_value=_parse_duration,
        help="Wall-clock budget of this invocation: seconds or e.g. 90s, 15m, 2h, 1h30m; saves a "
             "checkpoint and stops cleanly (0: no limit).")
    patience: int = option(  # validations without improvement before stopping; fairseq's off is N <= 0
        "--patience", default=0, type=int, to_value=lambda n: max(n, 0),
        help="Stop when the validation metric has not improved for N validations (0 or negative, fairseq's "
             "default -1: never).")
    # Validation and checkpoints.
    validate_interval: int = option("--validate-interval", default=1, type=int,
                                    help="Validate every N epochs (0: not at epoch ends).")
    validate_interval_updates: int = option("--validate-interval-updates", default=0, type=int,
                                            help="Also validate every N updates (0: off).")
    disable_validation: bool = flag_option("--disable-validation",
                                           help="Never validate (no valid split needed).")
    best_checkpoint_metric: str = option(
        "--best-checkpoint-metric", default="loss", choices=BEST_CHECKPOINT_METRICS,
        help="Validation metric that selects checkpoint_best.pt and that --patience and --keep-best-checkpoints "
             "follow: loss and nll are minimized, bleu and chrf (they need --eval-bleu) maximized.")
    save_interval: int = option("--save-interval", default=1, type=int,
                                help="Write checkpoint{EPOCH}.pt every N epochs (0: never).")
    no_epoch_checkpoints: bool = flag_option(
        "--no-epoch-checkpoints",
        help="At epoch ends write only checkpoint_last.pt (and checkpoint_best.pt), no checkpoint{EPOCH}.pt.")
    save_interval_updates: int = option(
        "--save-interval-updates", default=0, type=int,
        help="Write checkpoint_{EPOCH}_{UPDATES}.pt and checkpoint_last.pt every N updates, and validate them "
             "(as fairseq; 0: off).")
    keep_last_epochs: int = option("--keep-last-epochs", default=-1, type=int,
                                   help="Keep only the newest N epoch checkpoints (-1: all).")
    keep_interval_updates: int = option("--keep-interval-updates", default=-1, type=int,
                                        help="Keep only the newest N update checkpoints (-1: all).")
    # Validation BLEU and best-checkpoint selection (fairseq's flag names and formats).
    eval_bleu: bool = flag_option(
        "--eval-bleu",
        help="At each validation also translate the valid split with beam search, detokenize it as `nmt translate` "
             "does and score it with sacreBLEU against the data-bin's raw references (logged as bleu).")
    eval_bleu_beam: int = option("--eval-bleu-beam", default=5, type=int, help="Beam size of --eval-bleu.")
    eval_bleu_lenpen: float = option("--eval-bleu-lenpen", default=1.0, type=float,
                                     help="Length penalty of --eval-bleu (fairseq's: score / len^lenpen).")
    eval_bleu_max_len_a: float = option("--eval-bleu-max-len-a", default=0.0, type=float,
                                        help="--eval-bleu's maximum output length is a * source length + b.")
    eval_bleu_max_len_b: int = option("--eval-bleu-max-len-b", default=200, type=int,
                                      help="See --eval-bleu-max-len-a.")
    eval_bleu_subset_lines: int = option(
        "--eval-bleu-subset-lines", default=0, type=int,
        help="Translate only the first N lines of the valid split for --eval-bleu (0: all of it).")
    eval_bleu_chrf: bool = flag_option("--eval-bleu-chrf",
                                       help="With --eval-bleu also report sacreBLEU's chrF (logged as chrf).")
    eval_bleu_args: str | None = option(
        "--eval-bleu-args", default=None, metavar="JSON",
        help="fairseq's form of the search settings, e.g. '{\"beam\": 5, \"max_len_a\": 1.2, \"max_len_b\": 10, "
             "\"lenpen\": 1.0}' (keys: beam, lenpen, max_len_a, max_len_b).")
    eval_bleu_detok: str | None = option(
        "--eval-bleu-detok", default=None,
        help="fairseq's detokenizer choice. nmt detokenizes as the data-bin's meta.json says: moses (a Moses "
             "data-bin) and space (a data-bin without a tokenizer, or with --eval-tokenized-bleu) are accepted, "
             "other values refused.")
    eval_bleu_detok_args: str | None = option(
        "--eval-bleu-detok-args", default=None, metavar="JSON",
        help="fairseq's arguments of the detokenizer, e.g. '{\"target_lang\": \"de\"}': the Moses languages "
             "(source_lang, target_lang), which must be the data-bin's; other keys are refused.")
    eval_tokenized_bleu: bool = flag_option(
        "--eval-tokenized-bleu",
        help="Score the tokenized text (BPE removed, not detokenized) with sacreBLEU's tokenize 'none', as "
             "fairseq: the references are tokenized as preprocessing tokenized the target side.")
    eval_bleu_remove_bpe: str | None = option(
        "--eval-bleu-remove-bpe", default=None, flag_value="@@ ", metavar="[SYMBOL]",
        help="fairseq's BPE removal before scoring: '@@ ' (the value without one), subword_nmt, sentencepiece or "
             "none. nmt removes the data-bin's own segmentation anyway; a value naming another is refused.")
    eval_bleu_print_samples: bool = flag_option(
        "--eval-bleu-print-samples", help="Print a few hypothesis/reference pairs at each --eval-bleu.")
    maximize_best_checkpoint_metric: bool = flag_option(
        "--maximize-best-checkpoint-metric",
        help="Accepted as fairseq writes it: bleu and chrf are maximized anyway; refused with loss or nll.")
    keep_best_checkpoints: int = option(
        "--keep-best-checkpoints", default=-1, type=int,
        help="Also keep the N best checkpoints by --best-checkpoint-metric, named with their score as fairseq "
             "0.10 names them (checkpoint.best_bleu_27.31.pt); the rest are removed (-1: none written).")
    reset_optimizer: bool = flag_option("--reset-optimizer",
                                        help="When resuming: keep weights and progress, start a fresh optimizer state.")
    reset_run: bool = flag_option(
        "--reset-run",
        help="Delete the earlier run in --save-dir (its checkpoints and train_log.jsonl) and train from "
             "scratch. Without it, a --save-dir holding checkpoints or a log but no checkpoint_last.pt is refused.")
    finetune_from: str | None = option(
        "--finetune-from", default=None, path="file",
        help="Start from this checkpoint's weights with a fresh optimizer and schedule "
             "(ignored when --save-dir already holds checkpoint_last.pt).")
    # Hardware and logging.
    seed: int = option("--seed", default=1, type=int, help="Random seed (initial weights, batch order, dropout).")
    device: str = option("--device", default="auto", help="auto (GPU when available), cpu, cuda or cuda:N.")
    precision: str = option(
        "--precision", default="fp32", choices=TRAIN_PRECISIONS,
        help="fp32 (TF32 matmuls on GPU), bf16 autocast, fp16 autocast with dynamic loss scaling (a GPU only), or "
             "pure-bf16: the model runs in bf16 and the optimizer updates float32 master weights (fairseq's --bf16).")
    compile: bool = flag_option("--compile", help="Compile the model with torch.compile.")
    log_interval: int = option("--log-interval", default=100, type=int,
                               help="Log training statistics every N updates.")
    # Watching a run (train/tensorboard.py, train/live.py).
    tensorboard_logdir: str | None = option(
        "--tensorboard-logdir", default=None, metavar="DIR",
        help="Also write the train and valid records of train_log.jsonl as TensorBoard scalars to DIR "
             "(global rank 0 only; a resumed run replaces what was written after its checkpoint). "
             "Needs the extra: pip install 'nmt-cli[tensorboard]'.")
    # Exponential moving average of the weights (train/ema.py); fairseq's flags.
    ema_decay: float | None = option(
        "--ema-decay", default=None, type=float,
        help="Keep an exponential moving average of the weights in float32, saved in every checkpoint: "
             "after each update EMA = D * EMA + (1 - D) * weights (e.g. 0.9999) [default: off; 0.9999 with --store-ema].")
    ema_start_update: int = option("--ema-start-update", default=0, type=int,
                                   help="Through update N the EMA is a copy of the weights; it averages from update N+1 on.")
    ema_update_freq: int = option("--ema-update-freq", default=1, type=int,
                                  help="Fold the weights into the EMA every N updates.")
    store_ema: bool = flag_option("--store-ema", help="Keep the EMA (fairseq's flag; implied by --ema-decay).")
    ema_validate: bool = flag_option("--ema-validate",
                                     help="Validate (and select checkpoint_best.pt) with the EMA weights.")

    @property
    def max_tokens_in_use(self) -> int | None:
        """A batch's token cap: --max-tokens, else TRAIN_MAX_TOKENS unless --batch-size is
        given (None: no cap, as fairseq has none without --max-tokens)."""
        if self.max_tokens is None and self.batch_size is None:
            return TRAIN_MAX_TOKENS
        return self.max_tokens

    @property
    def ema_decay_in_use(self) -> float | None:
        """The EMA's decay, or None when no EMA is kept (fairseq's default with --store-ema alone)."""
        if self.ema_decay is not None:
            return self.ema_decay
        return FAIRSEQ_EMA_DECAY if self.store_ema else None

    def _check_ema(self) -> None:
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise NmtError(f"--ema-decay must be in (0, 1) (got {self.ema_decay})")
        if self.ema_start_update < 0:
            raise NmtError(f"--ema-start-update must be >= 0 (got {self.ema_start_update})")
        if self.ema_update_freq < 1:
            raise NmtError(f"--ema-update-freq must be >= 1 (got {self.ema_update_freq})")
        if self.ema_decay_in_use is None:
            used = [flag for flag, on in (("--ema-validate", self.ema_validate),
                                          ("--ema-start-update", self.ema_start_update != 0),
                                          ("--ema-update-freq", self.ema_update_freq != 1)) if on]
            if used:
                raise NmtError(f"{used[0]} needs --ema-decay D (or --store-ema)")

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        self._check_ema()
        positive = ("max_tokens", "batch_size", "required_batch_size_multiple", "update_freq", "log_interval")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise NmtError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        non_negative = ("warmup_updates", "max_update", "max_epoch", "max_time", "patience", "validate_interval",
                        "validate_interval_updates", "save_interval", "save_interval_updates", "weight_decay",
                        "clip_norm", "warmup_init_lr")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise NmtError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(self, name)})")
        for name in ("keep_last_epochs", "keep_interval_updates"):
            if getattr(self, name) < -1 or getattr(self, name) == 0:
                raise NmtError(f"--{name.replace('_', '-')} must be a positive count or -1 for all")
        if self.lr <= 0:
            raise NmtError(f"--lr must be positive (got {self.lr})")
        check_choices(self)
        if self.lr_scheduler != "fixed" and self.warmup_updates == 0:
            raise NmtError(f"--lr-scheduler {self.lr_scheduler} needs --warmup-updates > 0")
        if self.lr_scheduler != "inverse_sqrt" and self.warmup_init_lr != 0:  # fairseq has it for inverse_sqrt alone
            raise NmtError(f"--warmup-init-lr is inverse_sqrt's; --lr-scheduler {self.lr_scheduler} warms up from 0: "
                           "drop one")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise NmtError(f"--adam-betas must be two numbers in [0, 1) (got {self.adam_betas})")
        if self.adam_eps <= 0:
            raise NmtError("--adam-eps must be positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise NmtError(f"--label-smoothing must be in [0, 1) (got {self.label_smoothing})")
        self._check_eval_bleu()
        check_device_string(self.device, also=("auto",))
        check_seed(self.seed)

    def _check_eval_bleu(self) -> None:
        metric = self.best_checkpoint_metric
        if self.maximize_best_checkpoint_metric and metric not in MAXIMIZED_METRICS:
            raise NmtError(f"--maximize-best-checkpoint-metric contradicts --best-checkpoint-metric {metric}: "
                           f"lower {metric} is better (only {', '.join(MAXIMIZED_METRICS)} are maximized)")
        if metric in MAXIMIZED_METRICS and not self.eval_bleu:
            raise NmtError(f"--best-checkpoint-metric {metric} needs --eval-bleu (it scores the validation translations)")
        if self.eval_bleu and self.disable_validation:
            raise NmtError("--eval-bleu scores validations, and --disable-validation turns them off; drop one")
        if not self.eval_bleu and (flag := first_changed(self, EVAL_BLEU_SETTINGS)):
            raise NmtError(f"{flag} is a setting of --eval-bleu: add --eval-bleu, or drop it")
        if self.disable_validation and (flag := first_changed(self, VALIDATION_SETTINGS)):
            raise NmtError(f"{flag} sets the validations, and --disable-validation turns them off; drop one")
        for flag, following_validations in (("--patience", self.patience > 0),
                                            ("--keep-best-checkpoints", self.keep_best_checkpoints > 0)):
            if following_validations and self.disable_validation:
                raise NmtError(f"{flag} follows the validations, and --disable-validation turns them off; drop one")
        if self.tensorboard_logdir == "":
            raise NmtError("--tensorboard-logdir is empty: give the directory to write to, or leave the option out")
        if self.keep_best_checkpoints < -1 or self.keep_best_checkpoints == 0:
            raise NmtError("--keep-best-checkpoints must be a positive count or -1 for none")
        if self.eval_bleu_subset_lines < 0:
            raise NmtError(f"--eval-bleu-subset-lines must be >= 0 (got {self.eval_bleu_subset_lines})")
        if self.eval_bleu_detok is not None and self.eval_bleu_detok not in EVAL_BLEU_DETOK:
            raise NmtError(f"--eval-bleu-detok {self.eval_bleu_detok} is not supported: nmt detokenizes as the "
                           f"data-bin's meta.json says (accepted: {', '.join(EVAL_BLEU_DETOK)})")
        if self.eval_bleu_remove_bpe is not None and self.eval_bleu_remove_bpe not in EVAL_BLEU_REMOVE_BPE:
            raise NmtError(f"--eval-bleu-remove-bpe must be one of "
                           f"{', '.join(repr(s) for s in EVAL_BLEU_REMOVE_BPE)} (got {self.eval_bleu_remove_bpe!r})")
        self.eval_bleu_detok_languages()
        self.eval_bleu_search()  # the search settings are checked as translate's are

    def eval_bleu_detok_languages(self) -> dict[str, str]:
        """fairseq's --eval-bleu-detok-args JSON: {"source_lang" or "target_lang": language}."""
        if self.eval_bleu_detok_args is None:
            return {}
        try:
            given = json.loads(self.eval_bleu_detok_args)
        except ValueError as error:
            raise NmtError(f"--eval-bleu-detok-args {self.eval_bleu_detok_args!r} is not JSON ({error})") from None
        if not isinstance(given, dict):
            raise NmtError("--eval-bleu-detok-args must be a JSON object such as '{\"target_lang\": \"de\"}' "
                           f"(got {self.eval_bleu_detok_args!r})")
        unknown = sorted(set(given) - set(EVAL_BLEU_DETOK_ARGS))
        if unknown:
            raise NmtError(f"--eval-bleu-detok-args: {', '.join(unknown)} not supported by nmt (it takes "
                           f"{', '.join(EVAL_BLEU_DETOK_ARGS)}; tokenizing is as the data-bin's meta.json says)")
        for key, value in given.items():
            if not isinstance(value, str):
                raise NmtError(f"--eval-bleu-detok-args: {key} must be a language code such as \"de\" "
                               f"(got {json.dumps(value)})")
        return given

    def eval_bleu_search(self, given_flags: frozenset[str] = frozenset()) -> DecodeConfig:
        """The beam search of --eval-bleu: its flags, or fairseq's --eval-bleu-args JSON.
        A flag in `given_flags` (field names: given on the command line) contradicts the JSON
        even at its default value."""
        values = {key: getattr(self, name) for key, name in EVAL_BLEU_ARGS.items()}
        if self.eval_bleu_args is not None:
            try:
                given = json.loads(self.eval_bleu_args)
            except ValueError as error:
                raise NmtError(f"--eval-bleu-args {self.eval_bleu_args!r} is not JSON ({error})") from None
            if not isinstance(given, dict):
                raise NmtError(f"--eval-bleu-args must be a JSON object such as '{{\"beam\": 5}}' (got {self.eval_bleu_args!r})")
            unknown = sorted(set(given) - set(EVAL_BLEU_ARGS))
            if unknown:
                raise NmtError(f"--eval-bleu-args: {', '.join(unknown)} not supported by nmt (it takes "
                               f"{', '.join(EVAL_BLEU_ARGS)})")
            defaults = {f.name: f.default for f in fields(self)}
            for key, value in given.items():
                name = EVAL_BLEU_ARGS[key]
                expected = int if key in ("beam", "max_len_b") else (int, float)
                if isinstance(value, bool) or not isinstance(value, expected):
                    raise NmtError(f"--eval-bleu-args: {key} must be a number (got {json.dumps(value)})")
                flag_value = getattr(self, name)
                if (flag_value != defaults[name] or name in given_flags) and flag_value != value:
                    raise NmtError(f"--eval-bleu-args gives {key} {value} but --{name.replace('_', '-')} is "
                                   f"{flag_value}; give one of them")
                values[key] = value
        try:
            return DecodeConfig(beam=values["beam"], lenpen=float(values["lenpen"]),
                                max_len_a=float(values["max_len_a"]), max_len_b=values["max_len_b"])
        except NmtError as error:  # DecodeConfig names translate's flags
            raise NmtError(f"--eval-bleu search settings: {error}") from None

    def to_dict(self) -> dict[str, Any]:
        """The settings that checkpoints and config.json record: max_tokens is the cap in use."""
        return asdict(self) | {"max_tokens": self.max_tokens_in_use}


PLOT_FORMATS = (".png", ".svg", ".html")


@dataclass(frozen=True, kw_only=True)
class PlotConfig:
    """Which runs `nmt plot` draws and where (nmt_cli/train/plot.py)."""

    runs: tuple[str, ...] = option(argument=True, multiple=True, metavar="RUN...")
    output: str = option("--output", "-o", required=True, metavar="FILE",
                         help="The figure: .png or .svg (an image), or .html (a page holding the SVG).")
    dpi: int = option("--dpi", default=100, type=int, help="Resolution of a .png in dots per inch.")

    def __post_init__(self) -> None:
        if not 10 <= self.dpi <= 1000:
            raise NmtError(f"--dpi must be between 10 and 1000 (got {self.dpi})")
        if not self.runs:
            raise NmtError("nmt plot needs at least one RUN (a run directory or its train_log.jsonl)")
        if Path(self.output).suffix.lower() not in PLOT_FORMATS:
            raise NmtError(f"--output {self.output!r} must end in {', '.join(PLOT_FORMATS)} (the figure's format)")


# --- serving (nmt serve) ----------------------------------------------------------------

@dataclass(frozen=True)
class ServeConfig:
    """What `nmt serve` loads, where it listens, how it batches and what a request may ask."""

    paths: tuple[str, ...] = option(
        "--path", required=True, multiple=True, metavar="[NAME=]CKPT_OR_RUN", to_value=tuple,
        help="A checkpoint or run directory to serve (its checkpoint_best.pt, else checkpoint_last.pt), or with --engine ctranslate2 an "
             "export directory; repeat for several models. "
             "Requests pick one by NAME [default name: SRC-TGT, e.g. en-de].")
    host: str = option("--host", default="127.0.0.1", show_default=True,
                       help="Address to listen on; anything but loopback needs --api-key or --api-key-file.")
    port: int = option("--port", default=8000, show_default=True, help="TCP port.")
    api_key: str | None = option("--api-key", default=None,
                                 help="Key every translation request must carry (Authorization: Bearer KEY, "
                                      "X-API-Key, or LibreTranslate's api_key).")
    api_key_file: str | None = option("--api-key-file", default=None, path="file",
                                      help="A file whose first line is the key (keeps it out of the process list).")
    decode: DecodeConfig = DecodeConfig()
    max_batch_tokens: int = option("--max-batch-tokens", default=4096, show_default=True,
                                   help="Source tokens translated together in one batch (requests are merged up to it).")
    max_wait_ms: float = option("--max-wait-ms", default=50.0, show_default=True,
                                help="How long the first request of a batch waits for others to join it.")
    queue_size: int = option("--queue-size", default=1024, show_default=True,
                             help="Sentences waiting per model; beyond it requests get 503 with Retry-After.")
    max_beam: int = option("--max-beam", default=8, show_default=True, help="Largest beam (and n-best) a request may ask.")
    max_sentences: int = option("--max-sentences", default=128, show_default=True,
                                help="Sentences per request (more: 413).")
    max_chars: int = option("--max-chars", default=2000, show_default=True,
                            help="Characters per sentence (more: 413).")
    max_total_chars: int = option("--max-total-chars", default=50000, show_default=True,
                                  help="Characters per request (more: 413).")
    header_timeout: float = option(
        "--header-timeout", default=10.0, show_default=True,
        help="Seconds a connection has to send a request's line and headers, from connecting or from its "
             "previous response; then it gets 408 and is closed.")
    max_connections: int | None = option(
        "--max-connections", default=None, type=int,
        help="Open connections served at most; beyond it a request gets 503. "
             "[default: what the open-file limit allows, less a tenth kept free]")
    device: str = decoding_device_option()
    precision: str = decoding_precision_option()
    threads: int | None = decoding_threads_option()
    engine: str = engine_option()

    def __post_init__(self) -> None:
        check_fields_of_python_callers(self)
        if not self.paths or any(not p for p in self.paths):
            raise NmtError("--path needs a checkpoint or run directory")
        if not 0 <= self.port <= 65535:
            raise NmtError(f"--port must be between 0 and 65535 (got {self.port})")
        for flag, value in (("--max-batch-tokens", self.max_batch_tokens), ("--queue-size", self.queue_size),
                            ("--max-beam", self.max_beam), ("--max-sentences", self.max_sentences),
                            ("--max-chars", self.max_chars), ("--max-total-chars", self.max_total_chars)):
            if value < 1:
                raise NmtError(f"{flag} must be >= 1 (got {value})")
        if self.max_wait_ms < 0:
            raise NmtError(f"--max-wait-ms must be >= 0 (got {self.max_wait_ms:g})")
        if not self.header_timeout > 0:
            raise NmtError(f"--header-timeout must be > 0 (got {self.header_timeout:g})")
        if self.max_connections is not None and self.max_connections < 1:
            raise NmtError(f"--max-connections must be >= 1 (got {self.max_connections})")
        if self.max_sentences > self.queue_size:
            raise NmtError(f"--max-sentences {self.max_sentences} exceeds --queue-size {self.queue_size}: "
                           "such a request could never be queued")
        if self.decode.beam > self.max_beam:
            raise NmtError(f"--beam {self.decode.beam} exceeds --max-beam {self.max_beam}")
        if self.api_key is not None and self.api_key_file is not None:
            raise NmtError("give --api-key or --api-key-file, not both")
        if self.api_key == "":
            raise NmtError("--api-key is empty")
        if not _is_loopback(self.host) and self.api_key is None and self.api_key_file is None:
            raise NmtError(f"--host {self.host} is not a loopback address: anyone who can reach it could use "
                           "the server, so give --api-key or --api-key-file")
        check_decoding_threads(self.threads)
        check_device_string(self.device)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
