"""SIGTERM and SIGINT: every command stops with its worker processes, without a traceback.

SIGTERM (what `kill`, systemd and batch schedulers send) is turned into `Terminated`,
which unwinds the stack as Ctrl-C's KeyboardInterrupt does: with-blocks remove their
temporary files and stop the worker processes, and the CLI ends with one line and exit
status 143 (130 for Ctrl-C). Both are BaseExceptions, so that no `except Exception`
takes them for an input error.

Ctrl-C reaches every process of the terminal's process group; worker processes leave
it to the main process, which stops them (see `workers_ignore_interrupts`).

torch is imported with both signals held (`signals_held`, `import_torch`): its C start-up
imports numpy and drops an exception raised within, so a Ctrl-C or SIGTERM in that second
would be lost, and a command (a server) would run on.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Terminated(BaseException):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def _in_main_thread(change: Callable[[], Any], restore: Callable[[Any], object]) -> Iterator[None]:
    """Within the block, what `change()` sets, then `restore(what it returned)`; in the main
    thread, which alone runs Python's signal handlers (elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = change()
    try:
        yield
    finally:
        restore(previous)


def terminate_by_exception() -> AbstractContextManager[None]:
    """Within the block, SIGTERM raises `Terminated`."""
    return _in_main_thread(lambda: signal.signal(signal.SIGTERM, _raise_terminated),
                           lambda previous: signal.signal(signal.SIGTERM, previous))


def workers_ignore_interrupts() -> AbstractContextManager[None]:
    """Processes started within the block ignore Ctrl-C from their first instruction on.

    A spawned Python process whose SIGINT is ignored from the start installs no
    KeyboardInterrupt handler, so a Ctrl-C while it starts up prints no traceback. The
    main process ignores SIGINT too for the milliseconds the block lasts.
    """
    return _in_main_thread(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                           lambda previous: signal.signal(signal.SIGINT, previous))


def signals_held() -> AbstractContextManager[None]:
    """SIGINT and SIGTERM held within the block; one that came meanwhile is delivered at
    its end (KeyboardInterrupt, Terminated)."""
    return _in_main_thread(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}),
                           lambda previous: signal.pthread_sigmask(signal.SIG_SETMASK, previous))


def import_torch() -> None:
    """Import torch with SIGINT and SIGTERM held until it is loaded."""
    if "torch" not in sys.modules:
        with signals_held():
            importlib.import_module("torch")
