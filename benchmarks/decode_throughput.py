"""Decoding throughput: nmt beam search (and greedy) vs Hugging Face `generate`.

Both systems get a model of the same size with random weights and the same synthetic
source sentences, and every output is forced to exactly --tgt-len tokens plus one
final step (nmt: min_len = max_len = tgt-len, then `</s>`; Hugging Face:
min_new_tokens = max_new_tokens = tgt-len + 1), so every system does the same work.
Throughput counts tgt-len + 1 target tokens per sentence.

    python benchmarks/decode_throughput.py                      # CPU, transformer_small, 200 sentences
    python benchmarks/decode_throughput.py --device cuda --precision bf16 --batch-size 128
    python benchmarks/decode_throughput.py --setup-peer         # create benchmarks/.venv with transformers

Hugging Face runs in its own virtual environment (benchmarks/.venv, made by
--setup-peer, with torch pinned to the main environment's version); without it
that line says "skipped (not installed)". This file must stay importable without
nmt_cli (the peer process runs it with --system hf).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEER_VENV = HERE / ".venv"
PEER_CONSTRAINTS = HERE / "peer-constraints.txt"
PAD, EOS, BOS = 1, 2, 0
# transformer_small's sizes, used by the peer process (which cannot import nmt_cli).
SIZES = {"d_model": 256, "ffn": 1024, "layers": 3, "heads": 4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="transformer_small", help="nmt architecture preset (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=200, help="sentences to translate (default: %(default)s)")
    p.add_argument("--src-len", type=int, default=20, help="mean source length in tokens (default: %(default)s)")
    p.add_argument("--tgt-len", type=int, default=32, help="forced output tokens before </s> (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast dtype (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=1, help="seed for weights and data (default: %(default)s)")
    p.add_argument("--skip-peer", action="store_true", help="only measure nmt")
    p.add_argument("--setup-peer", action="store_true", help=f"create {PEER_VENV.relative_to(HERE.parent)} with transformers, then exit")
    p.add_argument("--system", choices=("all", "hf"), default="all", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def source_sentences(args: argparse.Namespace) -> list[list[int]]:
    """Seeded random id sequences (each ending in </s>), sorted by length as a translator would."""
    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.sentences):
        length = rng.randint(max(1, args.src_len // 2), args.src_len * 3 // 2)
        rows.append([rng.randrange(4, args.vocab) for _ in range(length)] + [EOS])
    return sorted(rows, key=len, reverse=True)


def batches(rows: list[list[int]], size: int, torch):
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        width = max(len(r) for r in chunk)
        tokens = torch.full((len(chunk), width), PAD, dtype=torch.long)
        for i, r in enumerate(chunk):
            tokens[i, : len(r)] = torch.tensor(r)
        yield tokens


def autocast(torch, args):
    import contextlib

    if args.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    return torch.autocast(torch.device(args.device).type, dtype=dtype)


def timed(torch, args, run_batch, rows) -> float:
    """Seconds to decode all `rows`, after one untimed warm-up batch."""
    with torch.inference_mode(), autocast(torch, args):
        run_batch(next(batches(rows[: min(8, len(rows))], args.batch_size, torch)).to(args.device))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for tokens in batches(rows, args.batch_size, torch):
            run_batch(tokens.to(args.device))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start


def measure_nmt(args: argparse.Namespace, beam: int) -> float:
    import torch

    from nmt_cli.config import DecodeConfig
    from nmt_cli.decode.search import generate
    from nmt_cli.models.registry import build_model, resolve_config

    torch.manual_seed(args.seed)
    cfg = resolve_config(args.arch, {"dropout": 0.0, "share_all_embeddings": True})
    if args.arch == "transformer_small":  # the peer's model must have the same sizes
        assert (cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim, cfg.encoder_layers, cfg.encoder_attention_heads) == (
            SIZES["d_model"], SIZES["ffn"], SIZES["layers"], SIZES["heads"])
    model = build_model(cfg, args.vocab, args.vocab).to(args.device).eval()
    decode = DecodeConfig(beam=beam, nbest=1, max_len_a=0, max_len_b=args.tgt_len, min_len=args.tgt_len)

    def run_batch(tokens):
        hyps = generate(model, tokens, decode, cfg.max_target_positions)
        assert all(len(h[0].tokens) == args.tgt_len + 1 for h in hyps)

    return timed(torch, args, run_batch, source_sentences(args))


def measure_hf(args: argparse.Namespace) -> float:
    """Runs inside the peer environment."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(args.seed)
    config = MarianConfig(
        vocab_size=args.vocab, d_model=SIZES["d_model"], encoder_layers=SIZES["layers"], decoder_layers=SIZES["layers"],
        encoder_attention_heads=SIZES["heads"], decoder_attention_heads=SIZES["heads"],
        encoder_ffn_dim=SIZES["ffn"], decoder_ffn_dim=SIZES["ffn"], max_position_embeddings=1024,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=EOS,
        scale_embedding=True, share_encoder_decoder_embeddings=True,
    )
    model = MarianMTModel(config).to(args.device).eval()
    steps = args.tgt_len + 1

    def run_batch(tokens):
        out = model.generate(
            input_ids=tokens, attention_mask=tokens.ne(PAD), num_beams=args.beam, num_return_sequences=1,
            do_sample=False, min_new_tokens=steps, max_new_tokens=steps,
        )
        assert out.size(1) == steps + 1  # the start token, then the forced tokens

    return timed(torch, args, run_batch, source_sentences(args))


def setup_peer() -> None:
    """Create the peer venv: torch pinned to this environment's version first, then transformers."""
    import torch

    version = torch.__version__.split("+")[0]
    PEER_CONSTRAINTS.write_text(f"torch=={version}\n")
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"torch=={version}"], check=True)
    subprocess.run([*pip, "-c", str(PEER_CONSTRAINTS), "transformers"], check=True)


def run_peer(args: argparse.Namespace, argv: list[str]) -> float | str:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        return "skipped (not installed; run with --setup-peer)"
    check = subprocess.run([str(python), "-c", "import transformers"], capture_output=True)
    if check.returncode != 0:
        return "skipped (not installed; run with --setup-peer)"
    proc = subprocess.run([str(python), __file__, *argv, "--system", "hf"], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def report(name: str, args: argparse.Namespace, seconds: float | str) -> None:
    if isinstance(seconds, str):
        print(f"{name:<16} {seconds}")
        return
    sent = args.sentences / seconds
    print(f"{name:<16} {args.sentences} sentences in {seconds:7.2f} s: {sent:8.1f} sentences/s "
          f"{sent * (args.tgt_len + 1):9.0f} target tokens/s")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.setup_peer:
        setup_peer()
        return
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.system == "hf":
        print(json.dumps({"seconds": measure_hf(args)}))
        return
    print(f"# {args.arch} sizes, vocab {args.vocab}, {args.sentences} sentences, batch {args.batch_size}, "
          f"beam {args.beam}, {args.tgt_len}+1 target tokens each, {args.device} {args.precision}, "
          f"{torch.get_num_threads()} threads")
    ours = measure_nmt(args, args.beam)
    report(f"nmt beam{args.beam}", args, ours)
    report("nmt greedy", args, measure_nmt(args, 1))
    if args.arch != "transformer_small":
        print("# the Hugging Face model has transformer_small's sizes; skipped for other --arch")
        return
    theirs = "skipped (--skip-peer)" if args.skip_peer else run_peer(args, argv)
    report(f"hf beam{args.beam}", args, theirs)
    if not isinstance(theirs, str):
        print(f"ratio nmt/hf beam{args.beam}: {theirs / ours:.2f}x sentences/s")


if __name__ == "__main__":
    main()
