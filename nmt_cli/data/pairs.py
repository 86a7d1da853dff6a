"""Parallel data for training: a data-bin's splits as sentence pairs, and padded batches.

`load_data_bin` opens and checks a `data-bin/` directory (docs/FORMATS.md), nmt's or
fairseq-preprocess's;
`collate` turns a list of pairs into the model's teacher-forcing inputs:
`src_tokens` (B, S), `prev_output_tokens` (B, T) = target shifted right with `</s>`
first (fairseq's convention), and `target` (B, T), all right-padded with `<pad>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nmt_cli.data.dictionary import EOS_ID, PAD_ID, Dictionary
from nmt_cli.data.indexed import IndexedDataset, dataset_exists
from nmt_cli.data.meta import read_meta
from nmt_cli.errors import NmtError


@dataclass
class PairDataset:
    """Line-aligned source and target corpora of one split."""

    src: IndexedDataset
    tgt: IndexedDataset

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise NmtError(
                f"{self.src.prefix} has {len(self.src)} sentences but {self.tgt.prefix} has {len(self.tgt)}"
            )

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_sizes(self) -> np.ndarray:
        return self.src.sizes

    @property
    def tgt_sizes(self) -> np.ndarray:
        return self.tgt.sizes


@dataclass
class Batch:
    """Padded tensors of one batch (on the CPU until `to(device)`)."""

    src_tokens: torch.Tensor  # (B, S)
    prev_output_tokens: torch.Tensor  # (B, T)
    target: torch.Tensor  # (B, T)
    ntokens: int  # non-pad target tokens
    nsentences: int
    src_padded: bool = True  # False: every source row is as long as the batch (no pads)

    def to(self, device: torch.device) -> "Batch":
        # Pinned memory + non_blocking lets the copy overlap the previous step on GPU.
        def move(t: torch.Tensor) -> torch.Tensor:
            if device.type == "cuda":
                return t.pin_memory().to(device, non_blocking=True)
            return t.to(device)

        return Batch(move(self.src_tokens), move(self.prev_output_tokens), move(self.target), self.ntokens,
                     self.nsentences, self.src_padded)


def padded_rows(dataset: IndexedDataset, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sentences `indices` right-padded with `<pad>` into one (B, L) array, and their lengths."""
    lengths = dataset.sizes[indices]  # (B,)
    starts = np.asarray(dataset.offsets[indices])  # (B,)
    width = int(lengths.max())
    columns = np.arange(width)
    inside = columns[None, :] < lengths[:, None]  # (B, L)
    positions = np.where(inside, starts[:, None] + columns[None, :], 0)
    rows = np.where(inside, np.asarray(dataset.data[positions.ravel()]).reshape(positions.shape), PAD_ID)
    return rows.astype(np.int64), lengths


def collate(pairs: PairDataset, indices: np.ndarray) -> Batch:
    """The padded batch of the pairs at `indices`. Target sentences end with `</s>`."""
    indices = np.asarray(indices, dtype=np.int64)
    src_tokens, src_lengths = padded_rows(pairs.src, indices)  # (B, S)
    target, tgt_lengths = padded_rows(pairs.tgt, indices)  # (B, T)
    # `</s> y1 ... y_{n-1}`: the decoder predicts target[t] from target[:t].
    prev_output_tokens = np.roll(target, 1, axis=1)
    prev_output_tokens[:, 0] = EOS_ID
    prev_output_tokens[np.arange(target.shape[1])[None, :] >= tgt_lengths[:, None]] = PAD_ID
    return Batch(
        torch.from_numpy(src_tokens), torch.from_numpy(prev_output_tokens), torch.from_numpy(target),
        int(tgt_lengths.sum()), len(indices), src_padded=bool(src_lengths.min() < src_tokens.shape[1]),
    )


@dataclass
class DataBin:
    """An opened data-bin directory: its metadata, dictionaries and splits."""

    path: Path
    meta: dict
    source_lang: str
    target_lang: str
    src_dict: Dictionary
    tgt_dict: Dictionary

    def split(self, name: str) -> PairDataset:
        """The split `name` (e.g. `train`, `valid`); a clear error when it is missing."""
        pair = f"{self.source_lang}-{self.target_lang}"
        prefixes = [self.path / f"{name}.{pair}.{lang}" for lang in (self.source_lang, self.target_lang)]
        for prefix in prefixes:
            if not dataset_exists(prefix):
                raise NmtError(f"data-bin has no {name!r} split for {pair}: {prefix}.bin/.idx not found")
        data = PairDataset(IndexedDataset(prefixes[0]), IndexedDataset(prefixes[1]))
        for dataset, dictionary, lang in ((data.src, self.src_dict, "source"), (data.tgt, self.tgt_dict, "target")):
            smallest, largest = dataset.id_range()
            if largest >= len(dictionary):
                raise NmtError(f"{dataset.prefix}.bin has id {largest} beyond the {lang} dictionary ({len(dictionary)} symbols)")
            if smallest < 0:
                raise NmtError(f"{dataset.prefix}.bin has id {smallest}, below 0 (a corrupt file)")
        self._check_counts(name, data)
        return data

    def _check_counts(self, name: str, data: PairDataset) -> None:
        """A split's files against what meta.json counted when it wrote them: the files of the
        other language, or of another split, are sound files of their own, and every other
        check passes them (fairseq's data-bins have no counts)."""
        entry = (self.meta.get("counts") or {}).get(name)
        if not isinstance(entry, dict):
            return
        for dataset, lang in ((data.src, self.source_lang), (data.tgt, self.target_lang)):
            found = (len(dataset), int(dataset.offsets[-1]))
            counted = (entry.get("sentences"), (entry.get("tokens") or {}).get(lang))
            if any(isinstance(n, int) and n != have for n, have in zip(counted, found)):  # what meta.json counts
                raise NmtError(
                    f"{dataset.prefix}.bin/.idx hold {found[0]} sentences and {found[1]} tokens, but "
                    f"{self.path / 'meta.json'} counted {counted[0]} and {counted[1]} for {name}'s {lang} side: the "
                    "files of another language or split, or replaced since (give a split of `nmt binarize` a name "
                    "of its own)")


def load_data_bin(path: str | Path, source_lang: str | None = None, target_lang: str | None = None) -> DataBin:
    """Open `path`: a data-bin of `nmt preprocess` (languages default to its meta.json's) or
    one of `fairseq-preprocess` (no meta.json; languages default to its files' names)."""
    path = Path(path)
    if not path.is_dir():
        raise NmtError(f"data-bin directory not found: {path}")
    if (path / "meta.json").is_file() or not any(path.glob("dict.*.txt")):
        meta = read_meta(path)
        meta_path = path / "meta.json"
        src = source_lang or meta.get("source_lang")
        tgt = target_lang or meta.get("target_lang")
        if not src or not tgt:
            raise NmtError(f"{meta_path} names no source_lang/target_lang; pass --source-lang and --target-lang")
    else:
        meta = {}
        src, tgt = fairseq_languages(path, source_lang, target_lang)
    for lang in (src, tgt):
        if not (path / f"dict.{lang}.txt").is_file():
            raise NmtError(f"data-bin has no language {lang!r}: {path / f'dict.{lang}.txt'} not found")
    return DataBin(path, meta, src, tgt, Dictionary.load(path / f"dict.{src}.txt"), Dictionary.load(path / f"dict.{tgt}.txt"))


def fairseq_languages(path: Path, source_lang: str | None, target_lang: str | None) -> tuple[str, str]:
    """The language pair of a fairseq data-bin: the flags, else the one pair its split files
    (`{split}.{src}-{tgt}.{lang}.idx`) are named after; several pairs need the flags."""
    if source_lang and target_lang:
        return source_lang, target_lang
    pairs = set()
    for idx in path.glob("*.idx"):
        parts = idx.name.split(".")
        if len(parts) == 4 and parts[1].count("-") == 1:
            src, tgt = parts[1].split("-")
            if parts[2] in (src, tgt):
                pairs.add((src, tgt))
    candidates = sorted(p for p in pairs if source_lang in (None, p[0]) and target_lang in (None, p[1]))
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(f"{s}-{t}" for s, t in sorted(pairs)) or "none"
    reason = "several language pairs" if candidates else "no split files for the languages asked"
    raise NmtError(f"{path} is a fairseq data-bin (no meta.json) with {reason} (found: {found}); "
                   "pass --source-lang and --target-lang")
