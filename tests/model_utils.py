"""Tiny random Transformers and token batches for model-level tests."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from nmt_cli.models.fast.options import DecodingOptions
from nmt_cli.models.registry import build_model, resolve_config

PAD, EOS = 1, 2
SRC_V, TGT_V = 23, 29
# Tests of the models' CTranslate2 export and engine need the optional extra.
ct2_installed = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                                   reason="needs pip install 'nmt-cli[ctranslate2]'")


def tiny_model(seed: int = 0, src_v: int = SRC_V, tgt_v: int = TGT_V, dtype: torch.dtype = torch.float64,
               decoding: DecodingOptions = DecodingOptions(), **overrides) -> nn.Module:
    """transformer_tiny with `overrides`, dropout off, in eval mode, decoding with `decoding`."""
    torch.manual_seed(seed)
    cfg = resolve_config("transformer_tiny", {"dropout": 0.0, **overrides})
    return build_model(cfg, src_v, tgt_v, decoding=decoding).to(dtype).eval()


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (shared embeddings count once)."""
    return sum(p.numel() for p in model.parameters())


def padded_batch(seed: int, lengths: list[int], vocab: int, bos: int | None = None) -> torch.Tensor:
    """Right-padded (B, max(lengths)) random tokens; the first column is `bos` when given."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), PAD)
    for row, length in enumerate(lengths):
        tokens[row, :length] = torch.randint(4, vocab, (length,), generator=gen)
        if bos is not None:
            tokens[row, 0] = bos
    return tokens


def source_batch(lengths: list[int], vocab: int, seed: int = 21) -> torch.Tensor:
    """padded_batch whose rows end in `</s>`, as sources reach the search."""
    tokens = padded_batch(seed, lengths, vocab)
    for row, length in enumerate(lengths):
        tokens[row, length - 1] = EOS
    return tokens


def eos_prone(model: torch.nn.Module, alpha: float = 2.5) -> torch.nn.Module:
    """`model` with a bias towards `</s>` in its last hidden states, so that hypotheses end
    at many different lengths (a random tiny model mostly runs to its maximum length)."""
    decoder = model.decoder
    norm = decoder.layer_norm if decoder.layer_norm is not None else decoder.layers[-1].final_layer_norm
    bias = torch.randn(norm.bias.shape, generator=torch.Generator().manual_seed(3), dtype=norm.bias.dtype) * 0.5
    with torch.no_grad():
        norm.bias.copy_(bias)
        decoder.output_projection.weight[EOS] += alpha * bias / bias.dot(bias)
    return model


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on `count` threads for a while: tiny models gain nothing from more (several only
    contend on a shared CPU), and runs stay bit-reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
