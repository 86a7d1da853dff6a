"""Attention kernels at a training batch's shapes: which kernel torch's
`scaled_dot_product_attention` picks for each of nmt's three kinds of attention call,
and what each of its kernels takes, forward and backward, with a key mask and without.

nmt's training passes no key mask when no source row of a batch is padded, which is
most batches of length-sorted data (`Transformer.forward`'s `src_padded`). This measures
what that buys and which kernel is fastest for short sentences, where attention is a
large share of an update. The last line is an update's attention time with the key
masks against without them (6 encoder self-attention and 6 cross-attention calls per
6-layer model, which lose their mask, plus 6 causal decoder calls, which never had one).

    python benchmarks/attention_kernels.py                  # transformer_base's shapes, bf16, on a GPU
    python benchmarks/attention_kernels.py --heads 16       # transformer_big's
    python benchmarks/attention_kernels.py --device cpu --batch-size 32 --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from device_profile import seconds_per_call

BACKENDS = {
    "default": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
CASES = ("key mask", "no mask", "causal")
LAYERS = 6  # of encoder and of decoder, transformer_base and transformer_big alike


class AttentionOps(TorchDispatchMode):
    """Records the names of the attention operators that run (the kernel torch chose)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if "attention" in name and name not in self.names:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def attention_call(case: str, batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype,
                   device: torch.device) -> Callable[[], None]:
    """Forward and backward of one attention call of `case` on fresh random inputs."""
    q, k, v = (torch.randn(batch, heads, length, head_dim, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, length, head_dim, dtype=dtype, device=device)
    # The mask nmt passes when a batch has padded sources, (B, 1, 1, S) bool, True where
    # allowed; all True here, which is the same work as with pads.
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool, device=device) if case == "key mask" else None

    def run() -> None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case == "causal")
        torch.autograd.grad(out, (q, k, v), grad)  # fresh gradients: no accumulation kernels timed

    return run


def measure(args, case: str, backend: SDPBackend | None, dtype: torch.dtype, device: torch.device):
    """(microseconds per call, operators run), or None where the backend cannot run `case`."""
    run = attention_call(case, args.batch_size, args.heads, args.seq_len, args.head_dim, dtype, device)
    context = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()  # None: torch chooses
    with warnings.catch_warnings(), context:
        warnings.simplefilter("ignore")  # torch warns about each kernel that cannot run
        try:
            ops = AttentionOps()
            with ops:
                run()
            return seconds_per_call(run, args.steps, args.warmup, device) * 1e6, ops.names
        except (RuntimeError, NotImplementedError):
            return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="default: bf16 on GPU, fp32 on CPU")
    parser.add_argument("--batch-size", type=int, default=512, help="sentences (B)")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sentence, queries and keys")
    parser.add_argument("--heads", type=int, default=8, help="8: transformer_base; 16: transformer_big")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="timed calls per kernel")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    print(f"attention forward + backward, {precision}, B {args.batch_size}, H {args.heads}, "
          f"T = S = {args.seq_len}, Dh {args.head_dim}, on {device}")

    default_us: dict[str, float] = {}
    for case in CASES:
        for name, backend in BACKENDS.items():
            result = measure(args, case, backend, dtype, device)
            if result is None:
                print(f"{case:<9} {name:<10} cannot run this call")
                continue
            us, ops = result
            if name == "default":
                default_us[case] = us
            kernels = ", ".join(ops) or "no fused kernel: matrix products and softmax"
            print(f"{case:<9} {name:<10} {us:9.1f} us per call  {kernels}")

    before = LAYERS * (2 * default_us["key mask"] + default_us["causal"])
    after = LAYERS * (2 * default_us["no mask"] + default_us["causal"])
    print(f"per update, torch's choice: {before / 1000:.2f} ms with key masks, {after / 1000:.2f} ms without "
          f"on unpadded batches: {before / after:.2f}x")


if __name__ == "__main__":
    main()
