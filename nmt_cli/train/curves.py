"""A run's learning curves, read from its `train_log.jsonl` (what `nmt plot` draws).

Each train record gives a point of the train loss, each valid record one of the valid
loss (and of BLEU / chrF when the record has them), at its update and at its wall time.
`wall` counts from the start of each invocation of `nmt train`, so after a resume it
starts again near 0: the curves add the wall time the earlier invocations had reached
by their last record, which leaves out the time between that record and the kill.
Valid records of older logs have no `wall`: theirs is taken from the train records
around their update.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmt_cli.errors import NmtError, where
from nmt_cli.json_text import json_object
from nmt_cli.train.log import LOG_NAME

VALID_METRICS = ("loss", "bleu", "chrf")
# The largest magnitude a logged number may have: float32's. nmt train computes in float32
# at most, and beyond it an axis' range (up to twice it) can leave float64's and break
# matplotlib's ticks.
LARGEST_LOGGED = float(np.finfo(np.float32).max)


@dataclass
class Curve:
    """One quantity of one run: y at each update and at each wall time (seconds)."""

    updates: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)  # NaN where unknown
    values: list[float] = field(default_factory=list)

    def add(self, update: int, wall: float, value: float) -> None:
        self.updates.append(update)
        self.wall.append(wall)
        self.values.append(value)


@dataclass
class RunCurves:
    name: str  # the legend's label
    train_loss: Curve = field(default_factory=Curve)
    valid: dict[str, Curve] = field(default_factory=dict)  # VALID_METRICS -> curve, those logged


def log_path_of(run: str) -> Path:
    """RUN is a run directory (its train_log.jsonl) or the log file itself."""
    path = Path(run)
    if path.is_dir():
        path = path / LOG_NAME
    if not path.is_file():
        raise NmtError(f"no training log {path}: give a run directory of `nmt train` or its {LOG_NAME}")
    return path


def read_runs(runs: tuple[str, ...]) -> list[RunCurves]:
    paths = [log_path_of(run) for run in runs]
    # A run's name: its directory's (`.` named too), or a log file's own when it is not
    # train_log.jsonl (two logs copied into one folder); where names clash, the paths.
    def run_of(path: Path) -> Path:
        return path.parent if path.name == LOG_NAME else path

    names = [run_of(path.resolve()).name for path in paths]
    if len(set(names)) < len(names):
        names = [str(run_of(path)) for path in paths]
    if len(set(names)) < len(names):
        names = [str(run_of(path.resolve())) for path in paths]
    return [read_curves(path, _label(name)) for path, name in zip(paths, names)]


def _label(name: str) -> str:
    """A run's name as text that matplotlib and the HTML page can hold: the bytes of a
    name that is not UTF-8 (Python's lone surrogates for them) as `\\xff`."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def read_curves(path: Path, name: str) -> RunCurves:
    """The curves of one log; a line that is not a record is one NmtError naming it."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
    curves = RunCurves(name)
    offset, last_wall = 0.0, 0.0  # wall time of the earlier invocations; the last wall seen
    count = 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        record = json_object(raw, where(path, number), "a record of `nmt train`")
        kind, update = record.get("type"), record.get("update")
        if kind not in ("train", "valid"):
            continue  # a record type of a later version: not a curve here
        if not isinstance(update, int) or isinstance(update, bool):
            raise NmtError(f"{where(path, number)}: a {kind} record without an integer 'update'")
        wall = _number(record, "wall", path, number, required=False)
        if wall is not None:
            if wall < last_wall:  # a new invocation: a resume
                offset += last_wall
            last_wall = wall
        at = offset + wall if wall is not None else math.nan
        count += 1
        if kind == "train":
            curves.train_loss.add(update, at, _number(record, "loss", path, number, required=True))
            continue
        for metric in VALID_METRICS:
            value = _number(record, metric, path, number, required=metric == "loss")
            if value is not None:
                curves.valid.setdefault(metric, Curve()).add(update, at, value)
    if count == 0:
        what = "is empty" if not data.strip() else "holds no train or valid records"
        raise NmtError(f"{path} {what}: nothing to plot")
    _fill_valid_wall(curves)
    return curves


def _number(record: dict, key: str, path: Path, number: int, required: bool) -> float | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise NmtError(f"{where(path, number)}: {record.get('type')} record's {key!r} is {value!r}, not a finite number")
    if abs(value) > LARGEST_LOGGED:
        raise NmtError(f"{where(path, number)}: {record.get('type')} record's {key!r} is {value!r}, beyond float32's "
                       "range: not a value nmt train logs")
    return float(value)


def _fill_valid_wall(curves: RunCurves) -> None:
    """Valid points without a wall time get the train records' time at their update."""
    train = curves.train_loss
    known = [(u, w) for u, w in zip(train.updates, train.wall) if not math.isnan(w)]
    if not known:
        return
    updates, walls = np.array([u for u, _ in known], dtype=float), np.array([w for _, w in known])
    for curve in curves.valid.values():
        curve.wall = [float(np.interp(u, updates, walls)) if math.isnan(w) else w
                      for u, w in zip(curve.updates, curve.wall)]
