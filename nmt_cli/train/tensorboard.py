"""TensorBoard scalars from the records of `train_log.jsonl` (`nmt train --tensorboard-logdir`).

The JSONL log stays the source of truth: this writer sees exactly the records written
there and turns each numeric field into a scalar, `train/<field>` or `valid/<field>`,
at the record's update. So fields other features add to a record (BLEU, chrF) appear
without changes here.

The writer is torch's `torch.utils.tensorboard.SummaryWriter`: it ships with torch (only
its event protobufs come from the `tensorboard` package) and its `purge_step` is what a
resumed run needs: TensorBoard then drops the scalars an interrupted run wrote after the
checkpoint it resumes from, so no update appears twice.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError

EXTRA_HINT = "pip install 'nmt-cli[tensorboard]'"
# Fields that place a record rather than measure it.
NOT_SCALARS = frozenset({"type", "update", "subset"})


def require_tensorboard() -> None:
    """Fail at startup, before any training, when the extra is not installed."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise NmtError(f"--tensorboard-logdir needs TensorBoard: {EXTRA_HINT}") from None


class TensorBoardLog:
    """Scalars of train and valid records, written to one TensorBoard log directory."""

    def __init__(self, logdir: Path, resumed_at_update: int) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        try:
            logdir.mkdir(parents=True, exist_ok=True)
            # TensorBoard drops what earlier writers of DIR logged from this step on: after a
            # resume, what the interrupted run wrote past its checkpoint; for a fresh run, all.
            self.writer = SummaryWriter(log_dir=str(logdir), purge_step=resumed_at_update + 1)
        except OSError as error:
            raise NmtError(f"cannot write --tensorboard-logdir {logdir}: {error.strerror or error}") from None

    def write(self, record: dict[str, Any]) -> None:
        kind, step = record.get("type"), record.get("update")
        if not isinstance(kind, str) or not isinstance(step, int):
            return
        for name, value in scalar_fields(record).items():
            self.writer.add_scalar(f"{kind}/{name}", value, global_step=step)
        self.writer.flush()  # once per log line or validation: TensorBoard shows it at once

    def close(self) -> None:
        self.writer.close()


def scalar_fields(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record, by field name (booleans and text left out)."""
    return {name: float(value) for name, value in record.items()
            if name not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}
