"""Decoding's encoder on a padded batch: every position, against the tokens alone.

Before its first decoding step, a search runs the encoder and projects every decoder
layer's cross-attention keys and values (`Transformer.encode`, then
`cross_attention_state`). On a CPU nmt runs both on the batch's token positions alone
and leaves the pads out of everything but attention (nmt_cli/models/fast/token_rows.py),
once its pads are at least `DecodingOptions.token_rows_from_pads` of its positions. This
times that work both ways on one batch shape with a growing share of pads (spread evenly
over the sentences), to show what the token rows save and where they stop paying (that
share is set to 0 here, so that every batch is packed). The peer is the padded path.

    python benchmarks/encoder_padding.py                          # transformer_small, random weights
    python benchmarks/encoder_padding.py --path run/ --batch-size 32 --length 30
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from common import machine_line, ratio_line, result_line

from nmt_cli.checkpoints.names import resolve_checkpoint
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.decode.loading import load_models, prepare_linears
from nmt_cli.models.registry import build_model, resolve_config



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", type=Path, default=None, help="a run or checkpoint (default: --arch with random weights)")
    p.add_argument("--arch", default="transformer_small", help="(default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8000, help="random weights' vocabulary (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences (default: %(default)s)")
    p.add_argument("--length", type=int, default=30, help="the longest sentence, in tokens (default: %(default)s)")
    p.add_argument("--pad-shares", default="0,0.02,0.05,0.1,0.2,0.33",
                   help="shares of pads to time, comma-separated (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=31, help="timed calls per way; the median counts (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="(default: %(default)s)")
    return p.parse_args(argv)


def load_model(args: argparse.Namespace) -> torch.nn.Module:
    """The model as `nmt translate` runs it on a CPU in float32 (packed linear layers)."""
    cpu = torch.device("cpu")
    if args.path is not None:
        return load_models((str(resolve_checkpoint(args.path)),), cpu).transformers[0]
    torch.manual_seed(0)
    model = build_model(resolve_config(args.arch, {}), args.vocab, args.vocab).eval()
    prepare_linears(model, "fp32", cpu)
    return model


def padded_batch(batch_size: int, length: int, pad_share: float, vocab: int) -> torch.Tensor:
    """(B, length) random tokens, right-padded: pads spread over the rows, about `pad_share` of all."""
    tokens = torch.randint(4, vocab, (batch_size, length), generator=torch.Generator().manual_seed(1))
    lengths = [length] * batch_size
    for i in range(round(pad_share * batch_size * length)):
        lengths[i % batch_size] -= 1
    for row, row_length in enumerate(lengths):
        tokens[row, max(row_length, 1):] = PAD_ID
    return tokens


def medians_ms(model: torch.nn.Module, src: torch.Tensor, repeats: int) -> dict[bool, float]:
    """Median ms of the work, padded (False) and on token rows (True), the two ways taking
    turns call by call so that a machine's drift touches both alike."""
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        for i in range(repeats + 3):  # three untimed warm-up rounds
            for use_token_rows in (i % 2 == 0, i % 2 == 1):
                from_pads = 0.0 if use_token_rows else None
                model.decoding = dataclasses.replace(model.decoding, token_rows_from_pads=from_pads)
                start = time.perf_counter()
                model.cross_attention_state(model.encode(src))
                if i >= 3:
                    times[use_token_rows].append(time.perf_counter() - start)
    return {way: 1000 * statistics.median(seconds) for way, seconds in times.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args)
    vocab = model.encoder.embed_tokens.num_embeddings
    print(machine_line())
    print(f"# {args.batch_size} sentences of at most {args.length} tokens, {args.threads} thread(s); "
          "encoder and cross-attention keys/values, median of "
          f"{args.repeats} calls")
    for share in (float(s) for s in args.pad_shares.split(",")):
        src = padded_batch(args.batch_size, args.length, share, vocab)
        real_share = float(src.eq(PAD_ID).float().mean())
        medians = medians_ms(model, src, args.repeats)
        padded, packed = medians[False], medians[True]
        print(result_line(f"nmt token rows, {real_share:.0%} pads", {"ms": f"{packed:.2f}"}))
        print(result_line(f"padded, {real_share:.0%} pads", {"ms": f"{padded:.2f}"}))
        print(ratio_line(f"{real_share:.0%} pads, time", packed, {"padded": padded}, higher_is_better=False))


if __name__ == "__main__":
    main()
