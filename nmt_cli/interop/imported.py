"""What the imports (`nmt import-fairseq`, `nmt import-marian`) share: the check of
--out, the layout of meta.json, the publication of --out, and their result (their
options are in config.py).

An import writes its run directory as a whole. An --out that holds anything else (an nmt
training run, another import) is refused unless --force; one that holds this same import
(same input files and languages, same nmt) is left as it is, so re-running an import is
harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.data.meta import META_FORMAT_VERSION
from nmt_cli.staging import build_then_publish, check_destination, failure_line, recorded_in_meta, refuse_inputs_inside


@dataclass(frozen=True)
class ImportResult:
    checkpoint: Path  # the run's checkpoint.pt
    written: bool  # False when out_dir already held this same import, left as it was


def holds_this_import(out_dir: Path, print_id: str, force: bool, names: set[str], inputs: Iterable[Path]) -> bool:
    """True when `out_dir` already holds the import fingerprinted `print_id` (of the run
    files `names`); NmtError when it holds anything else and not `force`, or when an input
    lies inside it (replacing it would delete the input)."""
    if check_destination(out_dir, "--out", print_id, force, recorded=recorded_in_meta("imported_from", "fingerprint"),
                         names=names, others="files other than this import's (e.g. an nmt run, or another import)"):
        return True
    refuse_inputs_inside(inputs, out_dir, "--out")
    return False


def publish_import(out_dir: Path, write: Callable[[Path], None]) -> None:
    """`write(staging)` the run's files, then put them in place of `out_dir` as a whole.
    The caller holds the directory lock of `out_dir` (run_lock.py) from before
    `holds_this_import`, so that no training run or other import writes there between
    the check and the publication."""
    build_then_publish(out_dir, write, lambda error: failure_line(f"writing --out {out_dir}", error))


def imported_run_meta(src_lang: str, tgt_lang: str, joined: bool, tokenizer: dict[str, Any], bpe: dict[str, Any] | None,
                      imported_from: dict[str, Any]) -> dict[str, Any]:
    """meta.json of an imported run: the text processing that `nmt translate` applies as the
    model's own toolkit did, and `imported_from` (the toolkit, the source, and the
    fingerprint of the inputs, which tells a re-run of the same import)."""
    return {"format_version": META_FORMAT_VERSION, "source_lang": src_lang, "target_lang": tgt_lang,
            "joined_dictionary": joined, "tokenizer": tokenizer, "bpe": bpe, "imported_from": imported_from}
