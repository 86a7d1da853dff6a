"""Typed configurations: the boundary between the CLI and the library.

click parses flags into these dataclasses; library code takes nothing else.
Each validates itself in `__post_init__` and raises `NmtError` on bad values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError
from nmt_cli.machine import check_cpu_count, check_device_string

# numpy's random generators take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1
# torch takes sizes as int64; a larger one can never be built, and counting parameters
# with it (nmt_cli/models/size.py) could exceed what a float, and so a message, can show.
MAX_MODEL_SIZE = 2**63 - 1
# fairseq's sinusoid frequencies divide by dim // 2 - 1, which must not be 0.
MIN_SINUSOID_DIM = 4


def check_finite_numbers(config: Any) -> None:
    """Raise on a float field that is nan or inf: it would reach the model as silent NaNs."""
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise NmtError(f"--{field.name.replace('_', '-')} must be a finite number (got {value})")


def check_seed(seed: int, flag: str = "--seed", smallest: int = 0) -> None:
    if not smallest <= seed <= MAX_SEED:
        raise NmtError(f"{flag} must be between {smallest} and {MAX_SEED} (got {seed})")


@dataclass(frozen=True)
class ModelConfig:
    """An encoder-decoder Transformer. Field names follow fairseq's flags."""

    encoder_embed_dim: int = 512
    encoder_ffn_embed_dim: int = 2048
    encoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_embed_dim: int = 512
    decoder_ffn_embed_dim: int = 2048
    decoder_layers: int = 6
    decoder_attention_heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # Post-norm (False) is the paper's layout; pre-norm trains more stably when deep.
    normalize_before: bool = False
    share_all_embeddings: bool = False
    share_decoder_input_output_embed: bool = False
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    # Learned position embeddings instead of sinusoids (for imported models).
    learned_pos: bool = False
    # Multiply embeddings by sqrt(d_model) (the paper); off only for imported models.
    scale_embedding: bool = True

    def __post_init__(self) -> None:
        check_finite_numbers(self)
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
            if not _has_type(value, expected):
                raise NmtError(f"model config field {name} is {value!r}, not of type {expected.__name__}")
        return cls(**values)


def _has_type(value: Any, expected: type) -> bool:
    """Whether a stored value fits a field of type `expected` (an int fits a float; a bool is not a number)."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


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

    beam: int = 5
    nbest: int = 1
    lenpen: float = 1.0
    # "fairseq": score / len**lenpen; "gnmt": score / ((5 + len) / 6)**lenpen. len counts </s>.
    lenpen_style: str = "fairseq"
    max_len_a: float = 0.0
    max_len_b: int = 200
    # Minimum number of tokens before </s> (fairseq's --min-len, default 1).
    min_len: int = 1
    no_repeat_ngram_size: int = 0
    unk_penalty: float = 0.0
    temperature: float = 1.0
    sampling: bool = False
    sampling_topk: int = -1
    sampling_topp: float = -1.0
    seed: int = 1

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if self.beam < 1:
            raise NmtError(f"--beam must be >= 1 (got {self.beam})")
        if not 1 <= self.nbest <= self.beam:
            raise NmtError(f"--nbest must be between 1 and --beam {self.beam} (got {self.nbest})")
        if self.lenpen_style not in LENPEN_STYLES:
            raise NmtError(f"--lenpen-style must be one of {', '.join(LENPEN_STYLES)} (got {self.lenpen_style!r})")
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
        check_seed(self.seed)


INPUT_FORMATS = ("raw", "bpe", "ids")
OUTPUT_FORMATS = ("text", "bpe", "jsonl")
PRECISIONS = ("fp32", "bf16", "fp16")
# Training only: the model itself in bf16, float32 master weights (nmt_cli/train/master_weights.py).
TRAIN_PRECISIONS = PRECISIONS + ("pure-bf16",)
# Translation only, on a CPU: 8-bit integer linear layers (nmt_cli/models/fast/int8.py).
TRANSLATE_PRECISIONS = PRECISIONS + ("int8",)
ERROR_POLICIES = ("strict", "replace")


@dataclass(frozen=True)
class TranslateConfig:
    """What `nmt translate` reads and writes, and how it batches; search is in `decode`."""

    checkpoints: tuple[str, ...]
    decode: DecodeConfig = DecodeConfig()
    data_bin: str | None = None
    input_format: str = "raw"
    output_format: str = "text"
    buffer_size: int = 2000
    max_tokens: int | None = None
    batch_size: int | None = None
    device: str = "cpu"
    threads: int | None = None
    # Processes translating at once on a CPU, each with its own model (decode/workers.py).
    workers: int = 1
    precision: str = "fp32"
    # Replay each decoding step as a CUDA graph (nmt_cli/decode/graphs.py); cuda only.
    # None: on with a CUDA device, where it decodes several times faster.
    cuda_graphs: bool | None = None
    errors: str = "strict"
    quiet: bool = False

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if not self.checkpoints or any(not p for p in self.checkpoints):
            raise NmtError("--path needs at least one checkpoint (several: a.pt:b.pt)")
        for name, value, allowed in (
            ("--input-format", self.input_format, INPUT_FORMATS),
            ("--output-format", self.output_format, OUTPUT_FORMATS),
            ("--precision", self.precision, TRANSLATE_PRECISIONS),
            ("--errors", self.errors, ERROR_POLICIES),
        ):
            if value not in allowed:
                raise NmtError(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
        if self.buffer_size < 1:
            raise NmtError(f"--buffer-size must be >= 1 (got {self.buffer_size})")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise NmtError(f"--max-tokens must be >= 1 (got {self.max_tokens})")
        if self.batch_size is not None and self.batch_size < 1:
            raise NmtError(f"--batch-size must be >= 1 (got {self.batch_size})")
        if self.threads is not None:
            check_cpu_count("--threads", self.threads)
        check_device_string(self.device)
        check_cpu_count("--workers", self.workers)
        if self.workers > 1 and self.device != "cpu":
            raise NmtError("--workers needs --device cpu (on a GPU one process batches faster)")


# --- preprocessing (nmt preprocess) ----------------------------------------------------

PREPROCESS_TOKENIZERS = ("moses", "none")
PREPROCESS_BPE = ("sentencepiece", "none")


@dataclass(frozen=True)
class PreprocessConfig:
    """`nmt preprocess`: raw parallel text -> data-bin/. Field names follow fairseq's flags."""

    source_lang: str
    target_lang: str
    trainpref: Path
    destdir: Path = Path("data-bin")
    validpref: tuple[Path, ...] = ()
    testpref: tuple[Path, ...] = ()
    joined_dictionary: bool = False
    workers: int = 1
    thresholdsrc: int = 0
    thresholdtgt: int = 0
    nwordssrc: int = -1
    nwordstgt: int = -1
    srcdict: Path | None = None
    tgtdict: Path | None = None
    tokenizer: str = "moses"
    normalize_punctuation: bool = True
    aggressive_dash_splits: bool = False
    bpe: str = "sentencepiece"
    bpe_size: int = 32000
    # Sentences sampled to learn BPE: bounds memory on huge corpora (sentencepiece holds the sample).
    bpe_sample: int = 2_000_000
    bpe_seed: int = 1
    separate_bpe: bool = False
    bpe_model: Path | None = None  # reuse a joint model instead of learning one
    min_len: int = 1
    max_len: int = 250
    # Moses' clean-corpus-n default; fairseq's WMT14 recipe uses 1.5.
    max_ratio: float = 9.0
    force: bool = False

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        for flag, lang in (("--source-lang", self.source_lang), ("--target-lang", self.target_lang)):
            if not lang or any(c in lang for c in "/\\. "):
                raise NmtError(f"{flag} must be a plain language code like 'en' (got {lang!r})")
        if self.source_lang == self.target_lang:
            raise NmtError(f"--source-lang and --target-lang are both {self.source_lang!r}")
        check_cpu_count("--workers", self.workers)
        if self.tokenizer not in PREPROCESS_TOKENIZERS:
            raise NmtError(f"--tokenizer must be one of {', '.join(PREPROCESS_TOKENIZERS)} (got {self.tokenizer!r})")
        if self.bpe not in PREPROCESS_BPE:
            raise NmtError(f"--bpe must be one of {', '.join(PREPROCESS_BPE)} (got {self.bpe!r})")
        if self.bpe_size < 2:
            raise NmtError(f"--bpe-size must be >= 2 (got {self.bpe_size})")
        if self.bpe_sample < 0:
            raise NmtError(f"--bpe-sample must be >= 0 (0: all sentences; got {self.bpe_sample})")
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


# --- scoring (nmt score) ---------------------------------------------------------------

SCORE_METRICS = ("bleu", "chrf", "ter")
HYP_FORMATS = ("auto", "text", "jsonl")


@dataclass(frozen=True)
class ScoreConfig:
    """What `nmt score` compares and reports. Paths may be `-` (stdin) for one hypothesis stream."""

    refs: tuple[str, ...]
    hyp: str = "-"
    hyp_format: str = "auto"
    metrics: tuple[str, ...] = ("bleu",)
    # sacreBLEU's BLEU options (`--tokenize` choices are checked against sacreBLEU by the CLI).
    tokenize: str = "13a"
    lowercase: bool = False
    width: int = 1
    # Paper-comparable tokenized BLEU (multi-bleu.perl).
    tokenized_bleu: bool = False
    target_lang: str | None = None
    already_tokenized: bool = False
    compound_split: bool = False
    sentence_level: bool = False
    output_json: bool = False
    # Paired bootstrap resampling against a second system.
    compare: str | None = None
    paired_bs_n: int = 1000
    seed: int = 12345

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
        if self.hyp_format not in HYP_FORMATS:
            raise NmtError(f"--hyp-format must be one of {', '.join(HYP_FORMATS)} (got {self.hyp_format!r})")
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


@dataclass(frozen=True)
class AverageConfig:
    """Which checkpoints `nmt average` reads (explicit files, or the last N of a run directory) and where it writes."""

    inputs: tuple[str, ...]
    output: str
    num_update_checkpoints: int | None = None
    num_epoch_checkpoints: int | None = None
    checkpoint_upper_bound: int | None = None

    @property
    def num_last(self) -> int | None:
        return self.num_update_checkpoints or self.num_epoch_checkpoints

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if not self.inputs:
            raise NmtError("--inputs needs checkpoint files or one run directory")
        if not self.output:
            raise NmtError("--output is required")
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


# --- training (nmt train) ----------------------------------------------------------------

LR_SCHEDULERS = ("inverse_sqrt", "noam", "fixed")
BEST_CHECKPOINT_METRICS = ("loss", "nll")


@dataclass(frozen=True)
class TrainConfig:
    """Everything `nmt train` needs besides the model's own ModelConfig.

    Defaults are the paper's recipe where it has one (Adam betas (0.9, 0.98), eps 1e-9,
    inverse square-root schedule with 4000 warm-up updates, label smoothing 0.1).
    Interval and limit fields use 0 for "off"; `keep_*` use -1 for "keep all".
    """

    data: str
    save_dir: str
    arch: str = "transformer_base"
    source_lang: str | None = None
    target_lang: str | None = None
    train_subset: str = "train"
    valid_subset: str = "valid"
    # Batching: padded tokens per batch, sentences per batch, accumulation.
    max_tokens: int | None = 4096
    batch_size: int | None = None
    required_batch_size_multiple: int = 8
    update_freq: int = 1
    # Optimisation.
    lr: float = 5e-4
    lr_scheduler: str = "inverse_sqrt"
    warmup_updates: int = 4000
    warmup_init_lr: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    # Stopping.
    max_update: int = 0
    max_epoch: int = 0
    max_time: float = 0.0  # seconds of this invocation
    patience: int = 0  # validations without improvement before stopping
    # Validation and checkpoints.
    validate_interval: int = 1
    validate_interval_updates: int = 0
    disable_validation: bool = False
    best_checkpoint_metric: str = "loss"
    save_interval: int = 1
    save_interval_updates: int = 0
    keep_last_epochs: int = -1
    keep_interval_updates: int = -1
    reset_optimizer: bool = False
    reset_run: bool = False
    finetune_from: str | None = None
    # Hardware and logging.
    seed: int = 1
    device: str = "auto"
    precision: str = "fp32"
    compile: bool = False
    log_interval: int = 100

    def __post_init__(self) -> None:
        check_finite_numbers(self)
        if self.max_tokens is None and self.batch_size is None:
            raise NmtError("set --max-tokens or --batch-size (or both)")
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
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise NmtError(f"unknown --lr-scheduler {self.lr_scheduler!r}; choose from {', '.join(LR_SCHEDULERS)}")
        if self.lr_scheduler != "fixed" and self.warmup_updates == 0:
            raise NmtError(f"--lr-scheduler {self.lr_scheduler} needs --warmup-updates > 0")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise NmtError(f"--adam-betas must be two numbers in [0, 1) (got {self.adam_betas})")
        if self.adam_eps <= 0:
            raise NmtError("--adam-eps must be positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise NmtError(f"--label-smoothing must be in [0, 1) (got {self.label_smoothing})")
        if self.precision not in TRAIN_PRECISIONS:
            raise NmtError(f"unknown --precision {self.precision!r}; choose from {', '.join(TRAIN_PRECISIONS)}")
        if self.best_checkpoint_metric not in BEST_CHECKPOINT_METRICS:
            raise NmtError(f"--best-checkpoint-metric must be one of {', '.join(BEST_CHECKPOINT_METRICS)}")
        check_device_string(self.device, also=("auto",))
        check_seed(self.seed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
