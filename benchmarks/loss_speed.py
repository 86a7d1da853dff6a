"""The label-smoothed loss alone, forward and backward, on a CPU: nmt's chunked loss at
several chunk sizes against torch's `F.cross_entropy` with label smoothing (what the
baselines of train_throughput.py train with).

The chunk size decides whether each pass over a chunk (the cast of bf16 logits to
float32, the softmax, the gradient) runs in cache or in memory; nmt's default on a CPU
is `CPU_CHUNK_ELEMENTS` of nmt_cli/train/loss.py.

    python benchmarks/loss_speed.py                                  # 4096 x 8000, fp32 and bf16
    python benchmarks/loss_speed.py --rows 4096 --vocab 32000 --threads 1
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import machine_line, ratio_line
from device_profile import seconds_per_call
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.host_memory import keep_freed_memory
from nmt_cli.train import loss as loss_module

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LABEL_SMOOTHING = 0.1


def nmt_loss(logits: torch.Tensor, target: torch.Tensor, chunk_elements: int) -> None:
    x = logits.clone().requires_grad_(True)  # fresh memory for the gradient, as in training
    loss, _ = loss_module.label_smoothed_nll_loss(x, target, LABEL_SMOOTHING, PAD_ID, chunk_elements=chunk_elements)
    loss.backward()


def torch_loss(logits: torch.Tensor, target: torch.Tensor) -> None:
    x = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(x.float(), target, ignore_index=PAD_ID, label_smoothing=LABEL_SMOOTHING, reduction="sum")
    loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="target tokens (rows of the logits)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-elements", default="67108864,1048576,524288,262144,131072",
                        help="comma-separated chunk sizes (float32 elements) to time besides the default")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `nmt train` does on a CPU
    default = loss_module.CPU_CHUNK_ELEMENTS
    sizes = sorted({int(n) for n in args.chunk_elements.split(",")} | {default}, reverse=True)
    print(machine_line())
    print(f"# loss forward + backward, {args.rows} x {args.vocab} logits, {args.threads} thread(s); "
          f"torch {torch.__version__}")
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(PAD_ID + 1, args.vocab, (args.rows,), generator=generator)
    for name in args.precision.split(","):
        logits = torch.randn(args.rows, args.vocab, generator=generator).to(DTYPES[name])
        peer = seconds_per_call(lambda: torch_loss(logits, target), args.repeats, 1, cpu)
        print(f"{name}  {'torch F.cross_entropy':36s} {peer * 1e3:8.1f} ms")
        ours = {}
        for size in sizes:
            ours[size] = seconds_per_call(lambda: nmt_loss(logits, target, size), args.repeats, 1, cpu)
            mark = "  (default)" if size == default else ""
            label = f"nmt, chunks of {size:,} elements"
            print(f"{name}  {label:36s} {ours[size] * 1e3:8.1f} ms{mark}")
        print(f"# {name}: nmt's default chunks = {ours[max(sizes)] / ours[default]:.2f}x its chunks of {max(sizes):,}")
        print(ratio_line(f"{name} ms", ours[default], {"torch F.cross_entropy": peer}, higher_is_better=False))


if __name__ == "__main__":
    main()
