"""The checkpoint file names of a run directory, as fairseq names them.

`checkpoint_last.pt` (what a resumed run reads), `checkpoint_best.pt`,
`checkpoint{EPOCH}.pt` (end of an epoch), `checkpoint_{EPOCH}_{UPDATES}.pt`
(every N updates) and `checkpoint.best_{METRIC}_{SCORE}.pt` (the N best validations,
`--keep-best-checkpoints`). Training writes them and `average --num-*-checkpoints` reads them.
"""

from __future__ import annotations

import re
from pathlib import Path

from nmt_cli.errors import NmtError

LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
EPOCH_NAME = re.compile(r"checkpoint(\d+)\.pt")
UPDATE_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
SCORED_BEST_NAME = re.compile(r"checkpoint\.best_([a-z]+)_(-?\d+\.\d+)\.pt")
EPOCH_PATTERN, UPDATE_PATTERN = "checkpoint{EPOCH}.pt", "checkpoint_{EPOCH}_{UPDATES}.pt"  # for messages


def epoch_checkpoint(epoch: int) -> str:
    return f"checkpoint{epoch}.pt"


def update_checkpoint(epoch: int, num_updates: int) -> str:
    return f"checkpoint_{epoch}_{num_updates}.pt"


def scored_best_checkpoint(metric: str, value: float, decimals: int = 2) -> str:
    """fairseq's name for one of the --keep-best-checkpoints: the score with two decimals
    (more where two would give the name of another kept score)."""
    return f"checkpoint.best_{metric}_{value:.{decimals}f}.pt"


def is_scored_best(name: str) -> bool:
    return SCORED_BEST_NAME.fullmatch(name) is not None


def epoch_of(name: str) -> int | None:
    """EPOCH of a `checkpoint{EPOCH}.pt` name, else None."""
    match = EPOCH_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def updates_of(name: str) -> int | None:
    """UPDATES of a `checkpoint_{EPOCH}_{UPDATES}.pt` name, else None."""
    match = UPDATE_NAME.fullmatch(name)
    return int(match.group(2)) if match else None


def is_numbered(name: str) -> bool:
    return epoch_of(name) is not None or updates_of(name) is not None


def is_training_checkpoint(name: str) -> bool:
    """Any checkpoint that training writes: last, best, numbered or scored best."""
    return name in (LAST, BEST) or is_numbered(name) or is_scored_best(name)


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file: `path` itself, or a run directory's checkpoint_best.pt (else checkpoint_last.pt)."""
    if path.is_dir():
        for name in (BEST, LAST):
            if (path / name).is_file():
                return path / name
        raise NmtError(f"{path} is a directory without {BEST} or {LAST}: pass a checkpoint file")
    if not path.is_file():
        raise NmtError(f"checkpoint not found: {path}")
    return path
