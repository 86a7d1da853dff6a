"""Training output: human-readable lines on stderr, JSON lines in `RUN/train_log.jsonl`.

Only the main rank prints or writes. Losses are reported in bits per token (base 2)
as fairseq reports them, so `ppl = 2 ** nll`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console

from nmt_cli.errors import NmtError, where
from nmt_cli.staging import replace_atomically
from nmt_cli.train.live import Limits, LiveProgress, format_duration

LOG_NAME = "train_log.jsonl"


class MetricsLog:
    """`train_log.jsonl`, cut back to its first `keep_records` lines when resuming.

    The cut replaces the file atomically: a run killed while resuming must not lose the
    records of the updates its checkpoint holds. A last line without its line feed (a
    crash or a full disk cut the write short) is ended if it is a whole record and left
    out if not: appending to it would join the next record onto it, and a reader would
    then refuse the log.
    """

    def __init__(self, path: Path, enabled: bool, keep_records: int) -> None:
        self.path = path
        self.enabled = enabled
        self.missing_records = 0  # records the checkpoint expects but the file lacks
        if enabled:
            lines = _read_records(path, keep_records)
            unended = bool(lines) and not lines[-1].endswith(b"\n")
            if unended:
                lines[-1:] = [lines[-1] + b"\n"] if _is_record(lines[-1]) else []
            self.missing_records = max(0, keep_records - len(lines))
            if len(lines) > keep_records or unended:
                kept = b"".join(lines[:keep_records])
                try:
                    replace_atomically(path, lambda tmp: tmp.write_bytes(kept))
                except OSError as error:
                    raise NmtError(f"cannot write {path}: {error.strerror or error}") from None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as error:
            raise NmtError(f"cannot write {self.path}: {error.strerror or error}") from None


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # not UTF-8, or not JSON
        return False


def _read_records(path: Path, keep_records: int) -> list[bytes]:
    """The lines of an existing log, newlines kept (the last may lack its own). Read as
    bytes: lines past those the checkpoint holds are cut unread; a damaged one among the
    kept is one error line, but for an unended last line (see MetricsLog)."""
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
    except OSError as error:
        raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    for number, line in enumerate(lines[:keep_records], start=1):
        if not line.endswith(b"\n"):
            break
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            raise NmtError(f"invalid UTF-8 at {where(path, number)}, a record the checkpoint counts on; repair the "
                           "line, or remove the file to resume with a new log") from None
    return lines


class Reporter:
    """Progress lines on stderr (rich adds colour on a terminal, plain text otherwise), and
    on a terminal the live status line below them (`train/live.py`)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.live: LiveProgress | None = None

    def start_live(self, limits: Limits, start_time: float, start_updates: int, epoch: int) -> None:
        """Show the live status line, when stderr is a terminal (never on other ranks)."""
        if self.enabled and self.console.is_terminal and self.live is None:
            self.live = LiveProgress(self.console, limits, start_time, start_updates, epoch)

    def updated(self, num_updates: int, epoch: int) -> None:
        if self.live is not None:
            self.live.update(num_updates, epoch)

    def stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def info(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, markup=False)

    def warning(self, message: str) -> None:
        if self.enabled:
            self.console.print(f"warning: {message}", markup=False, style="yellow")

    def train_line(self, record: dict[str, Any], eta_seconds: float | None) -> None:
        parts = [
            f"epoch {record['epoch']:03d}",
            f"update {record['update']}",
            f"loss {record['loss']:.3f}",
            f"nll {record['nll']:.3f}",
            f"ppl {record['ppl']:.2f}",
            f"lr {record['lr']:.3g}",
            f"gnorm {record['gnorm']:.3f}",
            f"tgt_tok/s {record['tokens_per_s']:.0f}",
            f"wall {format_duration(record['wall'])}",
        ]
        if record.get("overflows"):
            parts.append(f"fp16 overflows {record['overflows']}")
        if eta_seconds is not None:
            parts.append(f"eta {format_duration(eta_seconds)}")
        self.info(" | ".join(parts))
        if self.live is not None:
            self.live.logged(record["loss"], record["lr"], record["tokens_per_s"])

    def valid_line(self, record: dict[str, Any]) -> None:
        best = record.get("best")
        self.info(
            f"epoch {record['epoch']:03d} | valid on '{record['subset']}' | update {record['update']} | "
            f"loss {record['loss']:.3f} | nll {record['nll']:.3f} | ppl {record['ppl']:.2f}"
            + (f" | bleu {record['bleu']:.2f}" if "bleu" in record else "")
            + (f" | chrf {record['chrf']:.2f}" if "chrf" in record else "")
            + (f" | best {best:.3f}" if best is not None else "")
        )


def per_token_bits(total_nats: float, tokens: int) -> float:
    return total_nats / max(tokens, 1) / math.log(2)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `1d` or `1h30m` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    total, number = 0.0, ""
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total += float(number) * units[char]
            number = ""
        else:
            raise NmtError(f"--max-time {text!r} is not a duration such as 3600, 90s, 15m, 2h or 1h30m")
    if number:
        raise NmtError(f"--max-time {text!r}: the number {number} has no unit (s, m, h, d)")
    return total
