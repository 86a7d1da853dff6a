"""Tiny generated data-bins for tests: a reversal task over a small vocabulary.

Built directly with `Dictionary` and `IndexedDatasetBuilder` plus a `meta.json`, in the
layout of docs/FORMATS.md, so training tests need no preprocessing step.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from nmt_cli.data.dictionary import Dictionary
from nmt_cli.data.indexed import IndexedDatasetBuilder

WORDS = [f"w{i}" for i in range(16)]


def reversal_pairs(count: int, seed: int, min_len: int = 3, max_len: int = 8) -> list[tuple[list[str], list[str]]]:
    """`count` pairs (tokens, reversed tokens) of random length in [min_len, max_len]."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        src = [rng.choice(WORDS) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((src, src[::-1]))
    return pairs


def write_data_bin(
    destdir: Path,
    splits: dict[str, list[tuple[list[str], list[str]]]],
    src: str = "src",
    tgt: str = "tgt",
) -> Path:
    """Write a joined-dictionary data-bin with the given splits; return its path."""
    destdir.mkdir(parents=True, exist_ok=True)
    dictionary = Dictionary(WORDS)
    for lang in (src, tgt):
        dictionary.save(destdir / f"dict.{lang}.txt")
    counts = {}
    for split, pairs in splits.items():
        for side, lang in enumerate((src, tgt)):
            builder = IndexedDatasetBuilder(destdir / f"{split}.{src}-{tgt}.{lang}", len(dictionary))
            for pair in pairs:
                builder.add(dictionary.encode(pair[side]))
            builder.finalize()
        counts[split] = {"sentences": len(pairs)}
    meta = {
        "format_version": 1,
        "source_lang": src,
        "target_lang": tgt,
        "joined_dictionary": True,
        "tokenizer": {"name": "none", "normalize_punctuation": False},
        "bpe": None,
        "counts": counts,
    }
    (destdir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return destdir


def reversal_data_bin(destdir: Path, train: int = 400, valid: int = 40, seed: int = 0) -> Path:
    """A data-bin of the reversal task with `train` and `valid` splits."""
    return write_data_bin(destdir, {"train": reversal_pairs(train, seed), "valid": reversal_pairs(valid, seed + 1)})
