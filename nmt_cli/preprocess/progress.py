"""Stage messages and progress bars on stderr, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StageReporter:
    """`log` a line or show a bar per stage; silent when `enabled` is False (e.g. stderr is a file)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.console = Console(stderr=True)
        self.started = time.monotonic()

    def log(self, message: str) -> None:
        if self.enabled:
            self.console.print(f"[dim]{self.elapsed():7.1f}s[/dim] {message}", highlight=False)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @contextmanager
    def stage(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        """A progress bar of `total` steps; yields the function that advances it by one."""
        if not self.enabled:
            yield lambda: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda: progress.advance(task)
        self.log(f"{description}: done")
