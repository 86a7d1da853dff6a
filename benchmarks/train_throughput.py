"""Training throughput: target tokens/s and peak memory, nmt vs torch.nn.Transformer
(and Hugging Face MarianMTModel and fairseq's TransformerModel when importable here or
in benchmarks/.venv), same configuration, batches and precision.

Every batch is B sentences of exactly L tokens on both sides (shared vocabulary V), or
with `--data-bin` the batches of a binarized corpus's train split (`--max-tokens`),
the same batches for every system. nmt runs its real training step
(`nmt_cli.train.step.train_update`: collation from a binarized corpus, label-smoothed
loss, fused AdamW, ...); the baselines run the plainest equivalent loop on the same
batches, already on the device, with the source pads masked as nmt masks them.

    python benchmarks/train_throughput.py --arch transformer_small --device cpu \\
        --batch-size 64 --seq-len 32 --vocab 8000 --steps 10
    python benchmarks/train_throughput.py --arch transformer_base --precision bf16 --compile
    python benchmarks/train_throughput.py --arch transformer_small --device cpu \\
        --data-bin work/quickstart/data-bin --max-tokens 1024 --steps 100 --share-all-embeddings
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import self_peak_rss_mib
from device_profile import device_busy_line, matrix_rate_tflops, synchronize
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data.batching import epoch_batches, make_batches
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, Dictionary
from nmt_cli.data.indexed import IndexedDatasetBuilder
from nmt_cli.data.pairs import PairDataset, collate, load_data_bin
from nmt_cli.errors import NmtError
from nmt_cli.host_memory import keep_freed_memory
from nmt_cli.models.fast.dropout import set_lane_mask_dropout
from nmt_cli.models.registry import ARCHITECTURES, resolve_config
from nmt_cli.models.size import training_matmul_flops
from nmt_cli.train.loss import LossKernels
from nmt_cli.train.distributed import DistInfo
from nmt_cli.train.step import build_engine, train_update

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # None: no autocast
PEER_PYTHON = Path(__file__).resolve().parent / ".venv" / "bin" / "python"


@dataclass
class Result:
    name: str
    tokens_per_s: float
    peak_mem_gib: float | None


@dataclass
class Workload:
    """The batches that every system trains on, in order: `warmup` untimed, then `steps` timed."""

    data_bin: str
    pairs: PairDataset  # the data-bin's train split
    batches: list[np.ndarray]  # pair indices, one array per batch
    target_tokens: list[int]  # per batch, its target tokens that are not pads (counted once, off the timed loop)
    src_vocab: int
    tgt_vocab: int
    warmup: int

    @property
    def vocab(self) -> int:
        """One vocabulary size for the baselines, whose models share theirs."""
        return max(self.src_vocab, self.tgt_vocab)

    def timed_target_tokens(self) -> int:
        return sum(self.target_tokens[self.warmup:])

    def longest(self) -> int:
        """The most tokens of any sentence in the batches (for the baselines' position tables)."""
        return int(max(max(self.pairs.src_sizes[b].max(), self.pairs.tgt_sizes[b].max()) for b in self.batches))

    def timed_matmul_flops(self, cfg: ModelConfig) -> int:
        """The matrix products of the timed batches, at their padded shapes."""
        return sum(training_matmul_flops(cfg, len(b), int(self.pairs.src_sizes[b].max()),
                                         int(self.pairs.tgt_sizes[b].max()), self.tgt_vocab)
                   for b in self.batches[self.warmup:])


@contextlib.contextmanager
def workload(args) -> Iterator[Workload]:
    """The run's batches: from `--data-bin` (its first `warmup + steps` batches in the order
    of a training epoch), or fixed-length random pairs written to a temporary data-bin."""
    count = args.warmup + args.steps
    with contextlib.ExitStack() as stack:
        if args.data_bin:
            path = args.data_bin
            max_tokens = args.max_tokens
        else:
            path = stack.enter_context(tempfile.TemporaryDirectory())
            write_fixed_length_data_bin(Path(path), args.vocab, args.batch_size * count, args.seq_len, seed=0)
            max_tokens = args.batch_size * args.seq_len
        try:
            data = load_data_bin(path)
            pairs = data.split("train")
        except NmtError as error:
            raise SystemExit(f"--data-bin: {error}") from None
        batches = epoch_batches(make_batches(pairs.src_sizes, pairs.tgt_sizes, max_tokens, seed=0), 0, 0)[:count]
        if len(batches) < count:
            raise SystemExit(f"{path}: its train split makes {len(batches)} batches of {max_tokens} tokens; "
                             f"--warmup + --steps asks for {count}")
        if not args.data_bin:
            assert all(len(b) == args.batch_size for b in batches)
        target_tokens = [int(pairs.tgt_sizes[b].sum()) for b in batches]
        yield Workload(path, pairs, batches, target_tokens, len(data.src_dict), len(data.tgt_dict), args.warmup)


def write_fixed_length_data_bin(path: Path, vocab: int, count: int, length: int, seed: int) -> None:
    """`count` random pairs of exactly `length` tokens (the last one `</s>`)."""
    dictionary = Dictionary([f"w{i}" for i in range(vocab - Dictionary.nspecial)])
    rng = np.random.default_rng(seed)
    for lang in ("src", "tgt"):
        dictionary.save(path / f"dict.{lang}.txt")
        builder = IndexedDatasetBuilder(path / f"train.src-tgt.{lang}", len(dictionary))
        ids = rng.integers(Dictionary.nspecial, len(dictionary), size=(count, length))
        ids[:, -1] = EOS_ID
        for row in ids:
            builder.add(row)
        builder.finalize()
    (path / "meta.json").write_text('{"format_version": 1, "source_lang": "src", "target_lang": "tgt"}\n')


def timed(step: Callable[[int], None], work: Workload, device: torch.device) -> tuple[float, float | None]:
    """Target tokens/s of `step(i)` over the workload's timed batches, after its warm-up
    batches, and the peak GPU memory (None on a CPU)."""
    for i in range(work.warmup):
        step(i)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i in range(work.warmup, len(work.batches)):
        step(i)
    synchronize(device)
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return work.timed_target_tokens() / elapsed, peak


def bench_nmt(args, model_cfg: ModelConfig, device: torch.device, work: Workload,
              precision: str | None = None, lane_mask_dropout: bool = True,
              loss_kernels: LossKernels = LossKernels.AUTO) -> Result:
    """nmt's training step; `precision`: nmt's own --precision in place of the peers'
    (pure-bf16); `lane_mask_dropout` False: F.dropout in the model that runs;
    `loss_kernels`: which implementation of the loss runs."""
    if device.type == "cpu":
        keep_freed_memory()  # as `nmt train` does; the torch.nn.Transformer row, in this process, shares it
    with tempfile.TemporaryDirectory() as save_dir:
        cfg = TrainConfig(data=work.data_bin, save_dir=save_dir, arch=args.arch, precision=precision or args.precision,
                          compile=args.compile, label_smoothing=0.1, warmup_updates=4000, lr=5e-4)
        dist = DistInfo(rank=0, world_size=1, local_rank=0, device=device)
        engine = build_engine(cfg, model_cfg, work.src_vocab, work.tgt_vocab, dist, loss_kernels)
        set_lane_mask_dropout(engine.working_model, lane_mask_dropout)

        def step(i: int) -> None:
            batch = work.batches[i]
            train_update(engine, work.pairs, [batch], batch, work.target_tokens[i], i)

        tps, peak = timed(step, work, device)
        if args.profile:
            print(device_busy_line(lambda: step(0), 3, f"{precision} update" if precision else "update", device), flush=True)
        del engine
    return Result("nmt" + (f" {precision}" if precision else "") + (" (compiled)" if args.compile else ""), tps, peak)


def process_peak_rss_gib() -> float:
    return self_peak_rss_mib() / 1024


class TorchNNSeq2Seq(nn.Module):
    """torch.nn.Transformer with the paper's embedding scaling and sinusoidal positions."""

    def __init__(self, cfg: ModelConfig, vocab: int, max_len: int) -> None:
        super().__init__()
        D = cfg.encoder_embed_dim
        self.embed = nn.Embedding(vocab, D, padding_idx=PAD_ID)
        self.transformer = nn.Transformer(
            d_model=D, nhead=cfg.encoder_attention_heads, num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers, dim_feedforward=cfg.encoder_ffn_embed_dim, dropout=cfg.dropout,
            batch_first=True, norm_first=cfg.normalize_before,
        )
        self.out = nn.Linear(D, vocab, bias=False)
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, D, 2) * (-math.log(10000.0) / D))
        pe = torch.zeros(max_len, D)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe)
        self.scale = math.sqrt(D)

    def forward(self, src: torch.Tensor, prev: torch.Tensor, pads: torch.Tensor | None) -> torch.Tensor:
        T = prev.size(1)
        x = self.embed(src) * self.scale + self.pe[: src.size(1)]  # (B, S, D)
        y = self.embed(prev) * self.scale + self.pe[:T]  # (B, T, D)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=src.device)
        h = self.transformer(x, y, tgt_mask=mask, tgt_is_causal=True, src_key_padding_mask=pads,
                             memory_key_padding_mask=pads)
        return self.out(h)  # (B, T, V)


def bench_baseline(name: str, model: nn.Module, args, device: torch.device, work: Workload) -> Result:
    model = model.to(device)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                  fused=device.type in ("cpu", "cuda"))  # as nmt's
    batches = [collate(work.pairs, b).to(device) for b in work.batches]
    dtype = DTYPES[args.precision]
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None

    def step(i: int) -> None:
        batch = batches[i]
        src, prev, target = batch.src_tokens, batch.prev_output_tokens, batch.target
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with autocast:
            # As nmt and fairseq: a batch without source pads is attended without a mask
            # (collate tells on the host, so the device is not asked).
            pads = src.eq(PAD_ID) if batch.src_padded else None  # (B, S) True at pads
            logits = model(src, prev, pads)
            if not torch.is_tensor(logits):
                logits = logits.logits
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=PAD_ID,
                                   label_smoothing=0.1, reduction="sum")
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    tps, peak = timed(step, work, device)
    return Result(name + (" (compiled)" if args.compile else ""), tps, peak)


def marian_model(cfg: ModelConfig, vocab: int, max_len: int) -> nn.Module | None:
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    config = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=cfg.encoder_embed_dim,
        encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.encoder_attention_heads, decoder_attention_heads=cfg.decoder_attention_heads,
        encoder_ffn_dim=cfg.encoder_ffn_embed_dim, decoder_ffn_dim=cfg.decoder_ffn_embed_dim,
        dropout=cfg.dropout, max_position_embeddings=max_len, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
        decoder_start_token_id=EOS_ID, scale_embedding=True, activation_function="relu",
    )
    model = MarianMTModel(config)

    class Adapter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, src: torch.Tensor, prev: torch.Tensor, pads: torch.Tensor | None) -> torch.Tensor:
            attention_mask = None if pads is None else pads.logical_not().long()
            return self.inner(input_ids=src, attention_mask=attention_mask, decoder_input_ids=prev).logits

    return Adapter()


def fairseq_model(cfg: ModelConfig, vocab: int) -> nn.Module | None:
    """fairseq 0.12's TransformerModel with the same sizes, sharing and dropout as nmt's."""
    try:
        from fairseq import options
        from fairseq.data import Dictionary as FairseqDictionary
        from fairseq.models.transformer import TransformerModel
    except ImportError:
        return None
    flags = ["unused-data-dir", "--task", "translation", "--arch", "transformer",
             "--encoder-embed-dim", str(cfg.encoder_embed_dim), "--encoder-ffn-embed-dim", str(cfg.encoder_ffn_embed_dim),
             "--encoder-layers", str(cfg.encoder_layers), "--encoder-attention-heads", str(cfg.encoder_attention_heads),
             "--decoder-embed-dim", str(cfg.decoder_embed_dim), "--decoder-ffn-embed-dim", str(cfg.decoder_ffn_embed_dim),
             "--decoder-layers", str(cfg.decoder_layers), "--decoder-attention-heads", str(cfg.decoder_attention_heads),
             "--dropout", str(cfg.dropout), "--attention-dropout", str(cfg.attention_dropout),
             "--activation-dropout", str(cfg.activation_dropout)]
    flags += ["--share-all-embeddings"] if cfg.share_all_embeddings else []
    flags += ["--share-decoder-input-output-embed"] if cfg.share_decoder_input_output_embed else []
    flags += ["--encoder-normalize-before", "--decoder-normalize-before"] if cfg.normalize_before else []
    args = options.parse_args_and_arch(options.get_training_parser(), flags)
    dictionary = FairseqDictionary()  # <s>, <pad>, </s>, <unk> first, as nmt's
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")

    class Task:  # what build_model reads of a translation task
        source_dictionary = target_dictionary = dictionary

    model = TransformerModel.build_model(args, Task())

    class Adapter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, src: torch.Tensor, prev: torch.Tensor, pads: torch.Tensor | None) -> torch.Tensor:
            src_lengths = src.ne(PAD_ID).sum(1)  # fairseq makes its own mask (none without pads)
            return self.inner(src, src_lengths, prev)[0]

    return Adapter()


PEER_LABELS = {"hf": "hf MarianMTModel", "fairseq": "fairseq TransformerModel"}


def bench_in_peer_venv(argv: list[str], system: str) -> Result | None:
    """Run one peer system (hf or fairseq) in benchmarks/.venv (benchmarks/setup_peers.sh),
    which has the peers next to the same torch version."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    command = [str(PEER_PYTHON), __file__, *argv, "--systems", system, "--rounds", "1", "--machine-readable"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"{PEER_LABELS[system]}: failed in {PEER_PYTHON} ({last[0]})")
        return None
    name, tokens_per_s, peak = proc.stdout.strip().splitlines()[-1].split("\t")
    return Result(name, float(tokens_per_s), float(peak) if peak != "None" else None)


def measure_round(args, model_cfg: ModelConfig, device: torch.device, systems: set[str], work: Workload) -> list[Result]:
    """One measurement of every system in `systems`, nmt first."""
    results: list[Result] = []
    if "nmt" in systems:
        results.append(bench_nmt(args, model_cfg, device, work))
        if device.type == "cpu":  # measured first in this process, so the process peak is nmt's
            results[-1].peak_mem_gib = process_peak_rss_gib()
        if args.chunked_loss:  # the loss of a CPU (row chunks) in place of the fused GPU kernels
            result = bench_nmt(args, model_cfg, device, work, loss_kernels=LossKernels.CHUNKED)
            results.append(Result(f"{result.name} (chunked loss)", result.tokens_per_s, result.peak_mem_gib))
        if args.torch_dropout:  # F.dropout in place of the CPU's lane masks
            result = bench_nmt(args, model_cfg, device, work, lane_mask_dropout=False)
            results.append(Result(f"{result.name} (torch dropout)", result.tokens_per_s, result.peak_mem_gib))
        if args.pure_bf16:
            results.append(bench_nmt(args, model_cfg, device, work, precision="pure-bf16"))
    positions = work.longest() + 1  # the baselines' position tables; targets are fed with a leading </s>
    if "torch" in systems:
        torch.manual_seed(0)
        model = TorchNNSeq2Seq(model_cfg, work.vocab, positions)
        results.append(bench_baseline("torch.nn.Transformer", model, args, device, work))
    if "hf" in systems:
        model = marian_model(model_cfg, work.vocab, positions)
        if model is not None:
            results.append(bench_baseline("hf MarianMTModel", model, args, device, work))
        elif PEER_PYTHON.is_file():
            peer = bench_in_peer_venv(sys.argv[1:], "hf")
            results += [peer] if peer is not None else []
        else:
            print("hf MarianMTModel: skipped (transformers not installed)")
    if "fairseq" in systems:
        torch.manual_seed(0)
        model = fairseq_model(model_cfg, work.vocab)
        if model is not None:
            results.append(bench_baseline(PEER_LABELS["fairseq"], model, args, device, work))
        elif PEER_PYTHON.is_file():
            peer = bench_in_peer_venv(sys.argv[1:], "fairseq")
            results += [peer] if peer is not None else []
        else:
            print("fairseq TransformerModel: skipped (run benchmarks/setup_peers.sh)")
    if device.type == "cpu" and args.machine_readable and len(results) == 1:  # a peer process: its peak is its own
        results[0].peak_mem_gib = process_peak_rss_gib()
    return results


FIXED_SHAPE_DEFAULTS = {"batch_size": 512, "seq_len": 32, "vocab": 32000}
MAX_TOKENS_DEFAULT = 4096


def fill_batch_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults for the options of the mode chosen (fixed shapes, or --data-bin); an
    option of the other mode is an error rather than silently unused."""
    if args.data_bin:
        given = [f"--{name.replace('_', '-')}" for name in FIXED_SHAPE_DEFAULTS if getattr(args, name) is not None]
        if given:
            parser.error(f"{', '.join(given)}: the fixed-length batches' shape; with --data-bin the corpus sets it")
        if args.max_tokens is None:
            args.max_tokens = MAX_TOKENS_DEFAULT
    elif args.max_tokens is not None:
        parser.error("--max-tokens: cuts a --data-bin corpus into batches; without one, use --batch-size and --seq-len")
    else:
        for name, default in FIXED_SHAPE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="transformer_base", choices=sorted(ARCHITECTURES))
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    parser.add_argument("--precision", default=None, choices=sorted(DTYPES), help="default: bf16 on GPU, fp32 on CPU")
    parser.add_argument("--batch-size", type=int, help="sentences per batch (B; default 512)")
    parser.add_argument("--seq-len", type=int, help="tokens per sentence, source and target (L; default 32)")
    parser.add_argument("--vocab", type=int, help="shared vocabulary size (V; default 32000)")
    parser.add_argument("--steps", type=int, default=20, help="timed updates per system")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates first (compilation, allocator)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times in turn; each system's median round counts")
    parser.add_argument("--compile", action="store_true", help="torch.compile every system")
    parser.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    parser.add_argument("--profile", action="store_true",
                        help="print nmt's top operators (torch.profiler, stderr) and how busy the device is per update")
    parser.add_argument("--chunked-loss", action="store_true",
                        help="also measure nmt with the CPU's chunked loss instead of its fused GPU kernels")
    parser.add_argument("--torch-dropout", action="store_true",
                        help="also measure nmt with torch's F.dropout instead of its CPU dropout (masks from 16-bit lanes)")
    parser.add_argument("--pure-bf16", action="store_true",
                        help="also measure nmt with --precision pure-bf16 (the model in bf16, float32 master "
                        "weights); the peers stay under autocast")
    parser.add_argument("--machine-readable", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--systems", default="nmt,torch,hf,fairseq", help="comma-separated subset of nmt,torch,hf,fairseq")
    parser.add_argument("--share-all-embeddings", action="store_true", help="override the preset: one shared embedding matrix")
    parser.add_argument("--data-bin", default=None,
                        help="train on this data-bin's train split (real lengths and padding) instead of fixed-length "
                        "random pairs; the corpus then sets what --batch-size, --seq-len and --vocab set")
    parser.add_argument("--max-tokens", type=int, help="padded tokens per batch with --data-bin (default 4096)")
    args = parser.parse_args()
    fill_batch_options(parser, args)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    args.precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    if device.type == "cuda" and args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
    overrides = {"dropout": args.dropout} if args.dropout is not None else {}
    if args.share_all_embeddings:
        overrides["share_all_embeddings"] = True
    model_cfg = resolve_config(args.arch, overrides)
    systems = set(args.systems.split(","))
    batches = (f"{args.data_bin}, {args.max_tokens}-token batches" if args.data_bin
               else f"batch {args.batch_size}x{args.seq_len} tokens, vocab {args.vocab}")
    print(f"# {args.arch}, {device}, {args.precision}, {batches}, "
          f"{args.steps} steps{' , compiled' if args.compile else ''}; torch {torch.__version__}", file=sys.stderr)

    # Each system's median round: a slow (or fast) moment of a shared machine then moves no
    # system's figure alone. Peak memory is the first round's (on a CPU, nmt's own only then).
    by_name: dict[str, list[Result]] = {}
    with workload(args) as work:
        for i in range(args.rounds):
            measured = measure_round(args, model_cfg, device, systems, work)
            if args.rounds > 1:
                print(f"# round {i + 1}: " + ", ".join(f"{r.name} {r.tokens_per_s:,.0f}" for r in measured), file=sys.stderr)
            for r in measured:
                by_name.setdefault(r.name, []).append(r)
        flops_per_token = work.timed_matmul_flops(model_cfg) / work.timed_target_tokens()
    results = [Result(name, statistics.median(r.tokens_per_s for r in runs), runs[0].peak_mem_gib)
               for name, runs in by_name.items()]
    if args.machine_readable:
        for r in results:
            print(f"{r.name}\t{r.tokens_per_s}\t{r.peak_mem_gib}")
        return
    kind = "GPU memory" if device.type == "cuda" else "process RSS"
    for r in results:
        memory = f"{r.peak_mem_gib:.2f} GiB peak {kind}" if r.peak_mem_gib is not None else "peak n/a (measured in a shared process)"
        print(f"{r.name:32s} {r.tokens_per_s:12,.0f} target tok/s   {memory}")
    if len(results) > 1 and results[0].name.startswith("nmt"):
        ratios = ", ".join(f"{results[0].tokens_per_s / r.tokens_per_s:.2f}x {r.name}" for r in results[1:])
        print(f"ratio: nmt = {ratios}")
        peers = [r for r in results if not r.name.startswith("nmt")]
        if peers:
            best = max(peers, key=lambda r: r.tokens_per_s)
            for nmt in [r for r in results if r.name.startswith("nmt") and "chunked" not in r.name]:
                print(f"ratio {nmt.name} / best peer ({best.name}): {nmt.tokens_per_s / best.tokens_per_s:.2f}x target tok/s")
    print_hardware_limit(args.precision, device, flops_per_token, [r for r in results if r.name.startswith("nmt")])


def print_hardware_limit(precision: str, device: torch.device, flops_per_token: float, nmt_results: list[Result]) -> None:
    """The target tokens/s at which the update's matrix products alone would keep the
    device's matrix units as busy as one large product does, and nmt's share of it."""
    rate, size = matrix_rate_tflops(device, DTYPES[precision] or torch.float32)
    limit = rate * 1e12 / flops_per_token
    print(f"{'hardware limit':32s} {limit:12,.0f} target tok/s   {flops_per_token / 1e6:,.1f} MFLOP of matrix products "
          f"per target token at this device's {precision} rate: {rate:.3g} TFLOP/s ({size}x{size} products, timed here)")
    for r in nmt_results:
        achieved = r.tokens_per_s * flops_per_token / 1e12
        print(f"ratio {r.name} / hardware limit: {r.tokens_per_s / limit:.2f} ({achieved:.3g} TFLOP/s of matrix products)")


if __name__ == "__main__":
    main()
