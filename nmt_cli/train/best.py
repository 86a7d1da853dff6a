"""Which validation is the best so far, and which checkpoints `--keep-best-checkpoints` keeps.

`--best-checkpoint-metric` names the metric; loss and nll are minimized, bleu and chrf
maximized (`config.MAXIMIZED_METRICS`). The kept-best list is part of the resumed
progress (`Progress.best_checkpoints`), so a resumed run keeps and removes the same
files as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt_cli.checkpoints.names import scored_best_checkpoint
from nmt_cli.config import MAXIMIZED_METRICS


@dataclass(frozen=True)
class ScoredCheckpoint:
    """One of the --keep-best-checkpoints: its file and its exact validation value."""

    name: str
    value: float


@dataclass(frozen=True)
class KeepBestChange:
    """What one validation does to the kept-best files: the list after it, the file to
    write with the next save (None: not among the best), the files to remove."""

    kept: list[ScoredCheckpoint]
    write: str | None
    remove: list[str]


def maximized(metric: str) -> bool:
    return metric in MAXIMIZED_METRICS


def is_better(value: float, best: float | None, metric: str) -> bool:
    """Whether `value` beats the best so far (any value beats none; a tie does not)."""
    if best is None:
        return True
    return value > best if maximized(metric) else value < best


def keep_best(kept: list[ScoredCheckpoint], value: float, metric: str, count: int) -> KeepBestChange:
    """The kept-best files after a validation scoring `value`: the `count` best values,
    best first; on equal values the earlier validation stays ahead (the new one is not
    kept). A value's file name has two decimals, as fairseq's, or as many more as tell
    it from the other kept values' names (fairseq's would overwrite the file of a value
    that rounds alike, and keep one best fewer)."""
    if count <= 0 or any(entry.value == value for entry in kept):
        return KeepBestChange(list(kept), None, [])
    decimals = 2
    while any(entry.name == scored_best_checkpoint(metric, value, decimals) for entry in kept):
        decimals += 1
    new = ScoredCheckpoint(scored_best_checkpoint(metric, value, decimals), value)
    sign = -1.0 if maximized(metric) else 1.0
    # Stable sort: the earlier of two equal values keeps its place ahead of the new one.
    ranked = sorted([*kept, new], key=lambda entry: sign * entry.value)
    survivors = ranked[:count]
    if new not in survivors:
        return KeepBestChange(list(kept), None, [])
    removed = [entry.name for entry in kept if entry not in survivors]
    return KeepBestChange(survivors, new.name, removed)
