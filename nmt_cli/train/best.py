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
    """The kept-best files after a validation scoring `value`: the `count` best, best
    first; on equal values the earlier validation stays ahead. A file whose name (the
    score rounded to two decimals) is already kept is replaced only by a better model."""
    new = ScoredCheckpoint(scored_best_checkpoint(metric, value), value)
    namesake = next((entry for entry in kept if entry.name == new.name), None)
    if count <= 0 or (namesake is not None and not is_better(value, namesake.value, metric)):
        return KeepBestChange(list(kept), None, [])
    others = [entry for entry in kept if entry.name != new.name]
    sign = -1.0 if maximized(metric) else 1.0
    # Stable sort: the earlier of two equal values keeps its place ahead of the new one.
    ranked = sorted([*others, new], key=lambda entry: sign * entry.value)
    survivors = ranked[:count]
    if new not in survivors:
        return KeepBestChange(list(kept), None, [])
    removed = [entry.name for entry in kept if entry not in survivors and entry.name != new.name]
    return KeepBestChange(survivors, new.name, removed)
