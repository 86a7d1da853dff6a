"""The live training display on a terminal: one status line, refreshed in place.

It shows the update (of --max-update), epoch, the last logged loss, learning rate and
tokens/s, the elapsed time and the ETA to the nearest limit (--max-update, --max-time).
The log lines are printed above it through the same rich Console, and rich's Live sends
anything else written to stderr (Python warnings) there too, so nothing is hidden behind
the display. Shown only when stderr is a terminal; otherwise the log lines are all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

REFRESH_PER_SECOND = 4
BAR_WIDTH = 24


@dataclass(frozen=True)
class Limits:
    """The stopping limits an ETA counts down to (0: not set)."""

    max_update: int
    max_time: float  # seconds of this invocation


def eta_seconds(limits: Limits, elapsed: float, updates_here: int, num_updates: int) -> float | None:
    """Seconds until the nearest limit that is set, at this invocation's pace so far
    (`updates_here` updates in `elapsed` seconds); None when no limit applies yet."""
    etas = []
    if limits.max_update and updates_here > 0:
        etas.append(elapsed / updates_here * max(0, limits.max_update - num_updates))
    if limits.max_time:
        etas.append(max(0.0, limits.max_time - elapsed))
    return min(etas, default=None)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass
class LastLogged:
    """What the latest train log line reported (only log points know the loss)."""

    loss: float
    lr: float
    tokens_per_s: float


class LiveProgress:
    """The status line of a training run; `update` once per update, `logged` per log line."""

    def __init__(self, console: Console, limits: Limits, start_time: float, start_updates: int, epoch: int) -> None:
        self.console, self.limits = console, limits
        self.start_time, self.start_updates = start_time, start_updates
        self.num_updates, self.epoch = start_updates, epoch
        self.last: LastLogged | None = None
        self.live = Live(console=console, get_renderable=self.render, refresh_per_second=REFRESH_PER_SECOND,
                         transient=False, redirect_stdout=False, redirect_stderr=True)
        self.live.start()

    def update(self, num_updates: int, epoch: int) -> None:
        self.num_updates, self.epoch = num_updates, epoch

    def logged(self, loss: float, lr: float, tokens_per_s: float) -> None:
        self.last = LastLogged(loss, lr, tokens_per_s)
        self.live.refresh()  # the line printed above it was just logged: show the same numbers below

    def stop(self) -> None:
        self.live.stop()

    def render(self) -> RenderableType:
        elapsed = time.monotonic() - self.start_time
        eta = eta_seconds(self.limits, elapsed, self.num_updates - self.start_updates, self.num_updates)
        of = f"/{self.limits.max_update}" if self.limits.max_update else ""
        parts = [f"update {self.num_updates}{of}", f"epoch {self.epoch}"]
        if self.last is not None:
            parts += [f"loss {self.last.loss:.3f}", f"lr {self.last.lr:.3g}", f"tgt_tok/s {self.last.tokens_per_s:.0f}"]
        parts += [f"elapsed {format_duration(elapsed)}", f"eta {format_duration(eta) if eta is not None else '?'}"]
        status = Text(" | ".join(parts), no_wrap=True, overflow="ellipsis")  # one line, however narrow
        fraction = self.fraction_done(elapsed)
        if fraction is None or self.console.width < len(status) + BAR_WIDTH + 6:
            return status  # the numbers come first; the bar only where it fits beside them
        row = Table.grid(padding=(0, 1))
        row.add_row(ProgressBar(total=1.0, completed=fraction, width=BAR_WIDTH), Text(f"{fraction:4.0%}"), status)
        return row

    def fraction_done(self, elapsed: float) -> float | None:
        """How far along the run is towards the nearest limit, or None without a limit."""
        fractions = []
        if self.limits.max_update:
            fractions.append(self.num_updates / self.limits.max_update)
        if self.limits.max_time:
            fractions.append(elapsed / self.limits.max_time)
        return min(1.0, max(fractions)) if fractions else None
