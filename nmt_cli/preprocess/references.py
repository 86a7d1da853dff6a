"""The raw target text of the valid and test splits, kept in the data-bin.

Scoring a translation of a split (`nmt train --eval-bleu`) needs its references as
they were before tokenization and BPE; the binarized split holds only piece ids. Each
non-training split's target file is copied as `{split}.{src}-{tgt}.{tgt}.txt`, one
line per sentence of the binarized split (these splits are never cleaned), decoded
as every other input is (UTF-8, BOM and CRLF removed), and meta.json's `references`
names the copies.
"""

from __future__ import annotations

from pathlib import Path

from nmt_cli.text.reader import read_lines


def reference_name(split: str, source_lang: str, target_lang: str) -> str:
    return f"{split}.{source_lang}-{target_lang}.{target_lang}.txt"


def keep_references(targets: dict[str, Path], source_lang: str, target_lang: str, out: Path) -> dict[str, str]:
    """Copy each split's raw target file (`targets`: split name -> path) into `out`;
    return meta.json's `references` entry (split name -> file name)."""
    names = {}
    for split, path in targets.items():
        name = reference_name(split, source_lang, target_lang)
        with open(out / name, "w", encoding="utf-8", newline="\n") as f:
            for line in read_lines(path):
                f.write(line + "\n")
        names[split] = name
    return names


def read_references(data_bin: Path, meta: dict, split: str) -> list[str] | None:
    """The raw reference lines of `split`, or None when the data-bin kept none."""
    name = (meta.get("references") or {}).get(split)
    if not isinstance(name, str) or "/" in name or not (data_bin / name).is_file():
        return None
    return list(read_lines(data_bin / name))
