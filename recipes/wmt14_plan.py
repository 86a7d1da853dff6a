#!/usr/bin/env python3
"""The WMT14 recipe's settings and plan: the paper's table, the batch for any world size,
the expected time and disk, and every stage's command.

    python3 recipes/wmt14_plan.py shell   # plan on stderr; bash assignments for wmt14.sh on stdout
    python3 recipes/wmt14_plan.py show    # plan on stderr only

It reads the recipe's environment (PAIR, ARCH, GPUS, NNODES, and any override named in
the printed plan), so that wmt14.sh runs exactly the commands the plan prints. Standard
library only: it runs before anything is installed and never imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import math
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class PlanError(Exception):
    """A setting the recipe cannot run with; printed as one `error:` line."""


# ---- the paper's settings ---------------------------------------------------------------

@dataclass(frozen=True)
class PaperSettings:
    """One (pair, arch) row of the paper's recipe. Each field is overridable from the
    environment by its upper-cased name (LR=5e-4, AVERAGE=10, ...)."""

    lr: float
    dropout: float
    warmup_updates: int
    label_smoothing: float
    # Padded tokens per update (--max-tokens x --update-freq x processes, counted as nmt
    # and fairseq cut batches: sentences x the longer side). fairseq's 8 GPUs x 3584 is its
    # reading of the paper's ~25k source + 25k target tokens (Ott et al., 2018); without
    # padding it holds nearer 20k a side on newstest's lengths (TARGET_FILL).
    tokens_per_update: int
    max_update: int
    # The paper saved every 10 minutes: 1,500 updates of base (0.4 s each on 8 P100s),
    # 600 of big (1.0 s each).
    save_interval_updates: int
    average: int  # the last N update checkpoints averaged for decoding
    beam: int
    lenpen: float  # GNMT length penalty alpha
    max_len_a: float  # maximum output length = a x input length + b
    max_len_b: int


PAPER_BATCH = 8 * 3584
PAPER = {
    ("en-de", "transformer_base"): PaperSettings(7e-4, 0.1, 4000, 0.1, PAPER_BATCH, 100_000, 1500, 5, 4, 0.6, 1, 50),
    ("en-de", "transformer_big"): PaperSettings(5e-4, 0.3, 4000, 0.1, PAPER_BATCH, 300_000, 600, 20, 4, 0.6, 1, 50),
    ("en-fr", "transformer_base"): PaperSettings(7e-4, 0.1, 4000, 0.1, PAPER_BATCH, 100_000, 1500, 5, 4, 0.6, 1, 50),
    ("en-fr", "transformer_big"): PaperSettings(5e-4, 0.1, 4000, 0.1, PAPER_BATCH, 300_000, 600, 20, 4, 0.6, 1, 50),
}
# newstest2014, tokenized BLEU (compound-split for En-De), Vaswani et al. (2017), Table 2.
PAPER_BLEU = {("en-de", "transformer_base"): 27.3, ("en-de", "transformer_big"): 28.4,
              ("en-fr", "transformer_base"): 38.1, ("en-fr", "transformer_big"): 41.8}
# Joint BPE: fairseq's prepare-wmt14en2de.sh (32k) and prepare-wmt14en2fr.sh (40k).
BPE_SIZE = {"en-de": 32000, "en-fr": 40000}
# Non-pad target tokens per padded token of a batch: a batch is cut by its longer side and
# its longest pair, so a 3584-token batch of newstest2013+2014 (BPE 8k, nmt's batching) holds
# ~2,500 target and ~2,300 source tokens.
TARGET_FILL = 0.70
# Per process: the most padded tokens a batch may hold unless MAX_TOKENS says otherwise
# (fairseq's value, which fits a 16 GB GPU for big; larger GPUs may take more).
DEFAULT_MAX_TOKENS = 3584
# A batch must hold the longest pair: 250 words (preprocess --max-len) after BPE.
MIN_MAX_TOKENS = 1024
BATCH_TOLERANCE = 0.10

# The settings of SMOKE=1: the same stages on a generated corpus, a tiny model, a CPU.
SMOKE = PaperSettings(2e-3, 0.1, 30, 0.1, 2048, 60, 20, 2, 4, 0.6, 1, 50)
SMOKE_BPE_SIZE = 600
# nmt's own limits, checked before the hours of download and preprocessing that precede
# the stage that would refuse them (the plan imports nothing of nmt; tests keep them equal):
# `nmt train --precision` choices, and the fewest BPE pieces `nmt preprocess` learns.
TRAIN_PRECISIONS = ("fp32", "bf16", "fp16", "pure-bf16")
MIN_BPE_SIZE = 5


# ---- measured figures that the estimates rest on ----------------------------------------

@dataclass(frozen=True)
class ArchSize:
    dim: int
    ffn_dim: int
    layers: int  # encoder and decoder each


ARCH_SIZES = {"transformer_base": ArchSize(512, 2048, 6), "transformer_big": ArchSize(1024, 4096, 6),
              "transformer_tiny": ArchSize(32, 64, 2)}
# Target tokens/s of nmt train on one H200 (bf16, 512 x 32-token batches, eager):
# benchmarks/README.md, "Latest figures" (the GPU training row, 2026-11-30).
H200_TARGET_TOKENS_PER_S = {"transformer_base": 498_468, "transformer_big": 248_347}
# Real batches (lengths, padding, a new shape almost every update) against fixed shapes:
# 0.58 to 1.0 of the fixed-shape rate in benchmarks/README.md's "Latest figures" (the CPU
# rows on Multi30k's batches: bf16 5,435 against 1.94 x float32's fixed rate; float32
# 4,851 against 4,866).
REAL_BATCH_FACTOR = (0.58, 1.0)
# The paper's own times on 8 P100s (section 5.2): 0.4 s per base update, 1.0 s per big one.
P100X8_SECONDS_PER_UPDATE = {"transformer_base": 0.4, "transformer_big": 1.0}

# Checkpoints: float32 weights plus Adam's two float32 moments (the averaged one: weights only).
CHECKPOINT_BYTES_PER_PARAMETER = 12
AVERAGED_BYTES_PER_PARAMETER = 4
SPECIAL_SYMBOLS = 4  # <s> <pad> </s> <unk> in the joined dictionary


@dataclass(frozen=True)
class CorpusSize:
    pairs: int  # training pairs before cleaning
    raw_bytes_per_pair: int  # both sides, as newstest2014 (253 bytes En-De, 273 En-Fr)
    pieces_per_side: int  # BPE pieces per sentence and side, about


CORPUS_SIZES = {"en-de": CorpusSize(4_500_000, 253, 30), "en-fr": CorpusSize(40_800_000, 273, 32)}
# Text in a .tgz expands about threefold; giga-fren.tar holds .gz files, gunzipped beside them.
TGZ_EXPANSION = 3
GZ_MEMBERS_EXPANSION = 1 + 3
BINARY_BYTES_PER_PIECE = 2  # uint16 ids below 65,536 symbols
INDEX_BYTES_PER_SENTENCE = 8


# ---- environment -----------------------------------------------------------------------

def _env_number(env: Mapping[str, str], name: str, kind: type, default):
    text = env.get(name, "")
    if text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise PlanError(f"{name}={text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise PlanError(f"{name}={text!r} is not a finite number")
    return value


def _train_flags(env: Mapping[str, str]) -> tuple[str, ...]:
    """TRAIN_FLAGS split as the shell splits words."""
    text = env.get("TRAIN_FLAGS", "")
    try:
        return tuple(shlex.split(text))
    except ValueError as error:  # an unclosed quote
        raise PlanError(f"TRAIN_FLAGS={text!r} cannot be split into flags: {error}") from None


@dataclass(frozen=True)
class World:
    gpus: int  # per node; 0: the CPU
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @property
    def processes(self) -> int:
        return max(self.gpus, 1) * self.nnodes

    @property
    def distributed(self) -> bool:
        return self.processes > 1


@dataclass(frozen=True)
class Batch:
    max_tokens: int
    update_freq: int
    processes: int
    target: int

    @property
    def tokens_per_update(self) -> int:
        return self.max_tokens * self.update_freq * self.processes

    @property
    def deviation(self) -> float:
        return self.tokens_per_update / self.target - 1

    @property
    def within_tolerance(self) -> bool:
        return abs(self.deviation) <= BATCH_TOLERANCE


def plan_batch(target: int, processes: int, max_tokens: int | None, update_freq: int | None) -> Batch:
    """--max-tokens and --update-freq whose product with the processes is `target` tokens.

    `max_tokens` (MAX_TOKENS) caps one process's batch; the fewest accumulation steps that
    respect it are taken, then the batch is cut to the target. Both given: used as they are.
    """
    if max_tokens is not None and max_tokens < 1 or update_freq is not None and update_freq < 1:
        raise PlanError("MAX_TOKENS and UPDATE_FREQ must be >= 1")
    if max_tokens is not None and update_freq is not None:
        return Batch(max_tokens, update_freq, processes, target)
    if update_freq is None:
        cap = max_tokens or DEFAULT_MAX_TOKENS
        update_freq = max(1, math.ceil(target / (processes * cap)))
    chosen = max(target // (processes * update_freq), min(MIN_MAX_TOKENS, max_tokens or MIN_MAX_TOKENS))
    return Batch(chosen, update_freq, processes, target)


@dataclass(frozen=True)
class Paths:
    work: Path
    orig: Path  # downloaded archives and their extracted files
    raw: Path  # train/valid/test.{src,tgt}: plain text
    data_bin: Path
    run: Path
    averaged: Path
    hypotheses: Path


@dataclass(frozen=True)
class Recipe:
    """Everything a run of the recipe uses, resolved from the paper's table and the environment."""

    pair: str
    arch: str
    smoke: bool
    settings: PaperSettings
    overridden: frozenset[str]  # PaperSettings fields set from the environment
    bpe_size: int
    world: World
    batch: Batch
    precision: str
    keep_last_epochs: int
    workers: int
    train_flags: tuple[str, ...]
    wmt14_dir: str
    manifest: str
    paths: Paths

    @property
    def src(self) -> str:
        return self.pair.split("-")[0]

    @property
    def tgt(self) -> str:
        return self.pair.split("-")[1]


def resolve(env: Mapping[str, str]) -> Recipe:
    pair = env.get("PAIR", "")
    if pair not in BPE_SIZE:
        raise PlanError(f"PAIR={pair!r}: choose en-de or en-fr")
    smoke = env.get("SMOKE", "0") == "1"
    arch = "transformer_tiny" if smoke else env.get("ARCH", "") or "transformer_base"
    if not smoke and (pair, arch) not in PAPER:
        raise PlanError(f"ARCH={arch!r}: the recipe has the paper's settings for transformer_base and transformer_big")
    paper = SMOKE if smoke else PAPER[(pair, arch)]
    values, overridden = {}, set()
    for field in dataclasses.fields(PaperSettings):
        kind = int if field.type in ("int", int) else float
        value = _env_number(env, field.name.upper(), kind, None)
        if value is None:
            value = getattr(paper, field.name)
        else:
            overridden.add(field.name)
        values[field.name] = value
    settings = PaperSettings(**values)
    for name in ("warmup_updates", "tokens_per_update", "max_update", "save_interval_updates", "average", "beam"):
        if getattr(settings, name) < 1:
            raise PlanError(f"{name.upper()} must be >= 1 (got {getattr(settings, name)})")

    gpus = 0 if smoke else _env_number(env, "GPUS", int, 0)
    world = World(gpus, _env_number(env, "NNODES", int, 1), _env_number(env, "NODE_RANK", int, 0),
                  env.get("MASTER_ADDR", ""), _env_number(env, "MASTER_PORT", int, 29500))
    if gpus < 0 or world.nnodes < 1 or not 0 <= world.node_rank < world.nnodes:
        raise PlanError(f"need GPUS >= 0, NNODES >= 1 and 0 <= NODE_RANK < NNODES "
                        f"(got GPUS={gpus}, NNODES={world.nnodes}, NODE_RANK={world.node_rank})")
    if world.nnodes > 1 and not world.master_addr:
        raise PlanError("NNODES > 1 needs MASTER_ADDR: the address of node rank 0, the same on every node")
    if not 1 <= world.master_port <= 65535:
        raise PlanError(f"MASTER_PORT={world.master_port} is not a TCP port (1-65535)")
    batch = plan_batch(settings.tokens_per_update, world.processes,
                       _env_number(env, "MAX_TOKENS", int, None), _env_number(env, "UPDATE_FREQ", int, None))
    precision = env.get("PRECISION", "") or ("bf16" if gpus > 0 else "fp32")
    if precision not in TRAIN_PRECISIONS:
        raise PlanError(f"PRECISION={precision!r}: choose one of {', '.join(TRAIN_PRECISIONS)}")
    bpe_size = SMOKE_BPE_SIZE if smoke else _env_number(env, "BPE_SIZE", int, BPE_SIZE[pair])
    if bpe_size < MIN_BPE_SIZE:
        raise PlanError(f"BPE_SIZE must be >= {MIN_BPE_SIZE} (got {bpe_size})")
    keep_last_epochs = _env_number(env, "KEEP_LAST_EPOCHS", int, 1)
    if keep_last_epochs < -1 or keep_last_epochs == 0:
        raise PlanError(f"KEEP_LAST_EPOCHS must be a positive count or -1 for all (got {keep_last_epochs})")
    workers = _env_number(env, "WORKERS", int, 1)
    if workers < 1:
        raise PlanError(f"WORKERS must be >= 1 (got {workers})")

    root = Path(env.get("ROOT", "") or ROOT)
    default_work = root / "work" / f"wmt14_{pair.replace('-', '_')}{'_smoke' if smoke else ''}"
    work = Path(env.get("WORK", "") or default_work)
    run = work / f"run_{arch}"
    tgt = pair.split("-")[1]
    paths = Paths(work, work / "orig", work / "raw", work / "data-bin", run,
                  run / f"checkpoint_avg{settings.average}.pt", run / f"newstest2014.{pair}.{tgt}")
    wmt14_dir, manifest = env.get("WMT14_DIR", ""), env.get("WMT14_MANIFEST", "")
    if smoke:  # generated archives and their manifest (recipes/wmt14_smoke_data.py)
        wmt14_dir, manifest = str(work / "smoke-archives"), str(work / "smoke-archives" / "corpora.tsv")
    return Recipe(
        pair=pair, arch=arch, smoke=smoke, settings=settings, overridden=frozenset(overridden),
        bpe_size=bpe_size, world=world, batch=batch, precision=precision,
        keep_last_epochs=keep_last_epochs, workers=workers,
        train_flags=_train_flags(env),
        wmt14_dir=wmt14_dir, manifest=manifest, paths=paths,
    )


# ---- the stages' commands -----------------------------------------------------------------

def archives(pair: str) -> list[str]:
    """The corpora (names in data/corpora.tsv) of a pair's training, valid and test data."""
    names = ["wmt14/europarl-v7.tgz", "wmt14/commoncrawl.tgz", "wmt14/nc-v9.tgz", "wmt/dev.tgz"]
    if pair == "en-fr":
        names += ["wmt14/un.tgz", "wmt14/giga-fren.tar"]
    return names


def fetch_command(r: Recipe) -> list[str]:
    command = ["python3", str(ROOT / "data" / "fetch.py"), *archives(r.pair), "--dest", str(r.paths.orig)]
    if r.wmt14_dir:
        command += ["--local", r.wmt14_dir]
    if r.manifest:
        command += ["--manifest", r.manifest]
    return command


def preprocess_command(r: Recipe) -> list[str]:
    raw = r.paths.raw
    # --no-normalize-punctuation: Moses normalization turns the references' „ “ – (and
    # French non-breaking spaces) into ASCII, which sacreBLEU, scoring against the
    # untouched reference, counts as errors: a ceiling of 96-97 before training starts.
    return ["nmt", "preprocess", "-s", r.src, "-t", r.tgt,
            "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
            "--destdir", str(r.paths.data_bin), "--joined-dictionary", "--no-normalize-punctuation",
            "--bpe-size", str(r.bpe_size), "--bpe-sample", "2000000",
            "--max-len", "250", "--max-ratio", "1.5", "--workers", str(r.workers), "--force"]


def launcher(r: Recipe) -> list[str]:
    w = r.world
    if not w.distributed:
        return ["nmt"]
    command = ["torchrun", "--nproc-per-node", str(max(w.gpus, 1))]
    if w.nnodes > 1:
        command += ["--nnodes", str(w.nnodes), "--node-rank", str(w.node_rank),
                    "--master-addr", w.master_addr, "--master-port", str(w.master_port)]
    return command + ["-m", "nmt_cli"]


def train_command(r: Recipe) -> list[str]:
    s = r.settings
    return [*launcher(r), "train", str(r.paths.data_bin), "--arch", r.arch, "--save-dir", str(r.paths.run),
            "--share-all-embeddings", "--dropout", f"{s.dropout:g}",
            "--adam-betas", "0.9 0.98", "--adam-eps", "1e-9", "--clip-norm", "0.0",
            "--lr", f"{s.lr:g}", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(s.warmup_updates),
            "--warmup-init-lr", "1e-7", "--label-smoothing", f"{s.label_smoothing:g}",
            "--max-tokens", str(r.batch.max_tokens), "--update-freq", str(r.batch.update_freq),
            "--precision", r.precision, "--max-update", str(s.max_update),
            "--save-interval-updates", str(s.save_interval_updates), "--keep-interval-updates", str(s.average),
            "--keep-last-epochs", str(r.keep_last_epochs), "--log-interval", "100", *r.train_flags]


def average_command(r: Recipe) -> list[str]:
    return ["nmt", "average", "--inputs", str(r.paths.run), "--num-update-checkpoints", str(r.settings.average),
            "--output", str(r.paths.averaged)]


def translate_command(r: Recipe) -> list[str]:
    s = r.settings
    return ["nmt", "translate", "--path", str(r.paths.averaged), "--input", str(r.paths.raw / f"test.{r.src}"),
            "--output", f"{r.paths.hypotheses}.tmp", "--beam", str(s.beam), "--lenpen", f"{s.lenpen:g}",
            "--lenpen-style", "gnmt", "--max-len-a", f"{s.max_len_a:g}", "--max-len-b", str(s.max_len_b),
            "--max-tokens", "8000"]


def score_commands(r: Recipe) -> list[list[str]]:
    """sacreBLEU against the reference as extracted from WMT's SGM file, and the paper's
    tokenized BLEU; `nmt score` reads the reference as it is."""
    base = ["nmt", "score", "--ref", str(r.paths.raw / f"test.{r.tgt}"), "--hyp", str(r.paths.hypotheses)]
    tokenized = [*base, "--tokenized-bleu", "--target-lang", r.tgt]
    if r.pair == "en-de":
        tokenized.append("--compound-split")
    return [base, tokenized]


@dataclass(frozen=True)
class Stage:
    name: str
    commands: list[list[str]]
    note: str = ""


def stages(r: Recipe) -> list[Stage]:
    sgm = (f"newstest2014-{r.tgt}en-src.{r.src}.sgm / -ref.{r.tgt}.sgm -> {r.paths.raw}/test.{{{r.src},{r.tgt}}}, "
           "segments as they are")
    data_note = (f"after recipes/wmt14_smoke_data.py writes WMT-shaped archives into {r.wmt14_dir}; " if r.smoke else "") + (
        f"tar -xf each archive in {r.paths.orig}; {sgm}")
    return [
        Stage("data", [fetch_command(r)], data_note),
        Stage("prepare", [preprocess_command(r)]),
        Stage("train", [train_command(r)]),
        Stage("average", [average_command(r)]),
        Stage("translate", [translate_command(r)], f"renamed to {r.paths.hypotheses.name} when complete"),
        Stage("score", score_commands(r)),
    ]


def _without_option(command: list[str], option: str) -> list[str]:
    if option not in command:
        return command
    i = command.index(option)
    return command[:i] + command[i + 2:]


def stage_fingerprints(r: Recipe) -> dict[str, str]:
    """Per stage, the settings that produced it: its commands and those of every stage
    before it, so that a changed BPE_SIZE also redoes (or refuses) training."""
    fingerprints, chain = {}, f"pair {r.pair} smoke {int(r.smoke)}\n"
    for stage in stages(r):
        commands = stage.commands
        if stage.name == "data":  # where the archives come from does not change them (checksums)
            commands = [archives(r.pair), ["manifest", r.manifest]]
        if stage.name == "train":  # every node runs the same training whatever its rank
            commands = [_without_option(c, "--node-rank") for c in commands]
        chain += f"[{stage.name}]\n" + "\n".join(shlex.join(c) for c in commands) + "\n"
        fingerprints[stage.name] = chain.rstrip("\n")
    return fingerprints


# ---- estimates --------------------------------------------------------------------------

def _linear(in_dim: int, out_dim: int) -> int:
    return in_dim * out_dim + out_dim  # weight and bias


def parameters(arch: str, vocab: int) -> int:
    """Transformer parameters with one embedding matrix shared by both sides and the output
    (post-norm; tests check this against nmt's own count)."""
    a = ARCH_SIZES[arch]
    attention = 4 * _linear(a.dim, a.dim)
    ffn = _linear(a.dim, a.ffn_dim) + _linear(a.ffn_dim, a.dim)
    encoder_layer = attention + ffn + 2 * 2 * a.dim
    decoder_layer = 2 * attention + ffn + 3 * 2 * a.dim
    return vocab * a.dim + a.layers * (encoder_layer + decoder_layer)


@dataclass(frozen=True)
class TimeEstimate:
    hours_low: float  # at the fixed-shape rate
    hours_high: float  # at the lowest real-batch factor
    paper_p100_hours: float


def time_estimate(r: Recipe) -> TimeEstimate | None:
    rate = H200_TARGET_TOKENS_PER_S.get(r.arch)
    if rate is None or r.world.gpus == 0:
        return None
    # The GPU computes over every padded token of an update: at most tokens_per_update.
    seconds = r.settings.max_update * r.batch.tokens_per_update / (rate * r.world.processes)
    paper = r.settings.max_update * P100X8_SECONDS_PER_UPDATE[r.arch]
    return TimeEstimate(seconds / REAL_BATCH_FACTOR[1] / 3600, seconds / REAL_BATCH_FACTOR[0] / 3600, paper / 3600)


@dataclass(frozen=True)
class DiskEstimate:
    archives: int
    extracted: int
    raw_text: int
    data_bin: int
    checkpoint: int  # one, with Adam's state
    checkpoints_kept: int
    epoch_checkpoints: int  # of those kept
    averaged: int

    @property
    def checkpoints(self) -> int:
        return self.checkpoint * self.checkpoints_kept + self.averaged

    @property
    def total(self) -> int:
        return self.archives + self.extracted + self.raw_text + self.data_bin + self.checkpoints


def read_manifest_sizes(path: Path) -> dict[str, int]:
    spec = importlib.util.spec_from_file_location("nmt_recipe_fetch", ROOT / "data" / "fetch.py")
    fetch = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fetch  # dataclasses look their module up there
    spec.loader.exec_module(fetch)
    return {name: corpus.size for name, corpus in fetch.read_manifest(path).items()}


def epochs(r: Recipe) -> int:
    corpus = CORPUS_SIZES[r.pair]
    target_tokens = r.batch.tokens_per_update * TARGET_FILL
    return math.ceil(r.settings.max_update * target_tokens / (corpus.pairs * corpus.pieces_per_side))


def disk_estimate(r: Recipe) -> DiskEstimate:
    sizes = read_manifest_sizes(ROOT / "data" / "corpora.tsv")
    names = archives(r.pair)
    archive_bytes = sum(sizes[n] for n in names)
    extracted = sum(sizes[n] * (GZ_MEMBERS_EXPANSION if n.endswith(".tar") else TGZ_EXPANSION) for n in names)
    corpus = CORPUS_SIZES[r.pair]
    pieces = 2 * corpus.pieces_per_side * BINARY_BYTES_PER_PIECE + 2 * INDEX_BYTES_PER_SENTENCE
    params = parameters(r.arch, r.bpe_size + SPECIAL_SYMBOLS)
    epoch_checkpoints = epochs(r) if r.keep_last_epochs < 0 else min(r.keep_last_epochs, epochs(r))
    kept = r.settings.average + epoch_checkpoints + 2  # interval ones, epoch ones, last and best
    return DiskEstimate(archive_bytes, extracted, corpus.pairs * corpus.raw_bytes_per_pair, corpus.pairs * pieces,
                        params * CHECKPOINT_BYTES_PER_PARAMETER, kept, epoch_checkpoints,
                        params * AVERAGED_BYTES_PER_PARAMETER)


# ---- the printed plan ---------------------------------------------------------------------

def _gb(size: int) -> str:
    return f"{size / 1e9:,.1f} GB"


def _hours_range(low: float, high: float) -> str:
    if high < 48:
        return f"{low:.1f}-{high:.1f} h"
    return f"{low / 24:.1f}-{high / 24:.1f} days"


def plan_text(r: Recipe, dry_run: bool) -> str:
    s, w, b = r.settings, r.world, r.batch
    title = f"WMT14 {r.pair} {r.arch}" + (" (SMOKE=1: generated data, tiny model, CPU)" if r.smoke else "")
    lines = [f"== plan: {title}" + (" -- DRY_RUN=1: nothing runs" if dry_run else "")]
    paper = SMOKE if r.smoke else PAPER[(r.pair, r.arch)]
    lines.append("settings (the paper's unless marked; override with the variable in brackets):")
    for field in dataclasses.fields(PaperSettings):
        value = getattr(s, field.name)
        mark = f"   (override; paper {getattr(paper, field.name):g})" if field.name in r.overridden else ""
        lines.append(f"  {field.name:<22} {value:<10g} [{field.name.upper()}]{mark}")
    lines.append(f"  {'bpe_size':<22} {r.bpe_size:<10} [BPE_SIZE]")
    lines.append(f"  {'precision':<22} {r.precision:<10} [PRECISION]")
    lines.append(f"  {'keep_last_epochs':<22} {r.keep_last_epochs:<10} [KEEP_LAST_EPOCHS]")
    if r.train_flags:
        lines.append(f"  extra train flags      {shlex.join(r.train_flags)} [TRAIN_FLAGS]")
    where = f"{max(w.gpus, 1)} {'GPU' if w.gpus else 'CPU process'}(s) x {w.nnodes} node(s)"
    lines.append(f"world: {where} = {w.processes} process(es); this is node rank {w.node_rank}"
                 + (f", rendezvous {w.master_addr}:{w.master_port}" if w.nnodes > 1 else ""))
    verdict = "within" if b.within_tolerance else "NOT within"
    lines.append(f"tokens per update: {w.processes} x {b.max_tokens} (--max-tokens) x {b.update_freq} (--update-freq)"
                 f" = {b.tokens_per_update:,} padded tokens; target {b.target:,}"
                 + (" (fairseq's 8 x 3584, its reading of the paper's ~25k source + 25k target)"
                    if b.target == PAPER_BATCH else "")
                 + f": {b.deviation:+.2%}, {verdict} 10%")
    if not b.within_tolerance:
        lines.append(f"  WARNING: this batch is not the paper's; set MAX_TOKENS/UPDATE_FREQ "
                     f"(a process's batch must hold the longest pair: at least {MIN_MAX_TOKENS} tokens)")
    estimate = time_estimate(r)
    if r.smoke:
        lines.append("expected time: a few minutes on a CPU")
    elif estimate is None:
        lines.append(f"expected time: no measured throughput for {r.arch} without GPUs (CPU training is not practical)")
    else:
        lines.append(f"expected time (training): {_hours_range(estimate.hours_low, estimate.hours_high)} on "
                     f"{w.processes} H200-class GPU(s), from nmt's measured one-H200 rate "
                     f"({H200_TARGET_TOKENS_PER_S[r.arch]:,} target tok/s, benchmarks/README.md; real batches "
                     f"{REAL_BATCH_FACTOR[0]}-{REAL_BATCH_FACTOR[1]:g} of it; linear scaling over GPUs assumed); "
                     f"the paper: {estimate.paper_p100_hours:.1f} h on 8 P100s")
    if not r.smoke:
        d = disk_estimate(r)
        lines.append(f"expected disk: {_gb(d.total)} = archives {_gb(d.archives)} + extracted ~{_gb(d.extracted)}"
                     f" + plain text ~{_gb(d.raw_text)} + data-bin ~{_gb(d.data_bin)} + checkpoints {_gb(d.checkpoints)}"
                     f" ({d.checkpoints_kept} x {_gb(d.checkpoint)} with Adam's state, averaged {_gb(d.averaged)}; "
                     f"~{epochs(r)} epochs; KEEP_LAST_EPOCHS=-1, a checkpoint per epoch: "
                     f"{_gb(dataclasses.replace(d, checkpoints_kept=d.checkpoints_kept - d.epoch_checkpoints + epochs(r)).checkpoints)})")
    if w.nnodes > 1:
        lines.append("multi-node: WORK must be on a shared filesystem (every node reads and writes it); node rank 0 "
                     "runs the stages other than training, the other nodes wait for its done markers, join training "
                     "and stop after it")
    lines.append("stages:")
    for number, stage in enumerate(stages(r), 1):
        for i, command in enumerate(stage.commands):
            lines.append(f"  {number} {stage.name if i == 0 else '':<9} {shlex.join(command)}")
        if stage.note:
            lines.append(f"    {'':<9} ({stage.note})")
    return "\n".join(lines) + "\n"


def shell_assignments(r: Recipe) -> str:
    """bash that sets wmt14.sh's variables: paths, settings and each stage's command as an array."""
    q = shlex.quote
    out = {"SRC": r.src, "TGT": r.tgt, "ARCH": r.arch, "WORK": r.paths.work, "ORIG": r.paths.orig, "RAW": r.paths.raw,
           "DATA_BIN": r.paths.data_bin, "RUN": r.paths.run, "AVG": r.paths.averaged, "HYP": r.paths.hypotheses,
           "NNODES": r.world.nnodes, "NODE_RANK": r.world.node_rank, "WMT14_DIR": r.wmt14_dir,
           "AVERAGE": r.settings.average, "PAPER_BLEU": "" if r.smoke else PAPER_BLEU[(r.pair, r.arch)]}
    lines = [f"{name}={q(str(value))}" for name, value in out.items()]
    lines.append(f"ARCHIVES=({' '.join(q(n.rsplit('/', 1)[-1]) for n in archives(r.pair))})")
    for stage in stages(r):
        for i, command in enumerate(stage.commands):
            lines.append(f"CMD_{stage.name.upper()}_{i}=({' '.join(q(a) for a in command)})")
    for name, text in stage_fingerprints(r).items():
        lines.append(f"SETTINGS_{name.upper()}={q(hashlib.sha256(text.encode()).hexdigest()[:16] + chr(10) + text)}")
    return "\n".join(lines) + "\n"


def describe_difference(old: str, new: str, limit: int = 3) -> str:
    """The first `limit` changes between two stage settings, word by word, each with the
    word before it (an option's name): "--bpe-size 32000 -> --bpe-size 8000"."""
    old_words, new_words = shlex.split(old.partition("\n")[2]), shlex.split(new.partition("\n")[2])
    changes = []
    matcher = difflib.SequenceMatcher(None, old_words, new_words, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        start_old, start_new = max(i1 - 1, 0), max(j1 - 1, 0)
        was, now = shlex.join(old_words[start_old:i2]), shlex.join(new_words[start_new:j2])
        changes.append(f"{was or '(nothing)'} -> {now or '(nothing)'}")
    if not changes:
        return "no difference"
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    return "; ".join(changes[:limit]) + more


def main(argv: list[str], env: Mapping[str, str]) -> int:
    mode = argv[0] if argv else "show"
    if mode == "difference" and len(argv) == 2:  # stored settings in a file, the current ones on stdin
        print(describe_difference(Path(argv[1]).read_text(encoding="utf-8"), sys.stdin.read()))
        return 0
    if mode not in ("shell", "show"):
        print(f"usage: {Path(__file__).name} shell|show|difference FILE", file=sys.stderr)
        return 2
    try:
        recipe = resolve(env)
        text = plan_text(recipe, dry_run=env.get("DRY_RUN", "0") == "1")
    except PlanError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    sys.stderr.write(text)
    if mode == "shell":
        sys.stdout.write(shell_assignments(recipe))
    return 0


if __name__ == "__main__":
    import os

    sys.exit(main(sys.argv[1:], os.environ))
