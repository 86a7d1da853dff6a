"""Standard streams that were closed when `nmt` started (`<&-`, `>&-`, `2>&-`, as
under cron or a daemon).

Python leaves `sys.stdin`/`sys.stdout`/`sys.stderr` as None then, and the next file the
command opens takes the free descriptor: a checkpoint or `-o` file opened as descriptor
2 would receive every warning. `guard_standard_streams` puts /dev/null on each closed
descriptor first. A closed stderr then silences the command's messages; a closed stdin
or stdout is one error line at its first use, since reading nothing or writing nowhere
would lose data silently.

Stdout is also made UTF-8 whatever the locale (`utf8_stdout`), as every file nmt
writes is.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from nmt_cli.errors import NmtError


class ClosedStream(io.RawIOBase):
    """Stands for stdin or stdout when it was closed: using it is an NmtError."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.reported = False

    def readable(self) -> bool:
        return self.fd == 0

    def writable(self) -> bool:
        return self.fd == 1

    def readinto(self, buffer: object) -> int:
        raise NmtError("cannot read <stdin>: standard input is closed (give the input as a file)")

    def write(self, data: object) -> int:
        if self.reported:  # the error was raised once; Python's final flush must not raise it again
            return len(data)  # type: ignore[arg-type]
        self.reported = True
        raise NmtError("cannot write <stdout>: standard output is closed (give an output file)")


def closed_error(stream: object) -> NmtError | None:
    """The error to raise for a standard stream (text or binary) that stands for a closed one."""
    raw = getattr(getattr(stream, "buffer", stream), "raw", None)
    if not isinstance(raw, ClosedStream):
        return None
    raw.reported = True
    if raw.fd == 0:
        return NmtError("cannot read <stdin>: standard input is closed (give the input as a file)")
    return NmtError("cannot write <stdout>: standard output is closed (give an output file)")


def guard_standard_streams() -> None:
    """Open /dev/null on every closed standard descriptor and give Python streams for them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if fd == 0:
            sys.stdin = io.TextIOWrapper(io.BufferedReader(ClosedStream(0)), encoding="utf-8")
        elif fd == 1:
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(ClosedStream(1)), encoding="utf-8")
        else:
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)


@contextmanager
def write_failures_named(name: str) -> Iterator[None]:
    """A write that fails within the block (a full disk) is one NmtError naming the output
    `name` ("-": <stdout>); a reader gone away (`| head`) stays BrokenPipeError, which the
    CLI ends quietly."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise NmtError(f"cannot write {'<stdout>' if name == '-' else name}: {error.strerror or error}") from None


class _Stdout(io.TextIOWrapper):
    """The process's stdout as `utf8_stdout` makes it: its failed writes name <stdout>."""

    def write(self, text: str) -> int:
        with write_failures_named("-"):
            return super().write(text)

    def flush(self) -> None:
        with write_failures_named("-"):
            super().flush()


def utf8_stdout() -> None:
    """Make stdout UTF-8 whatever the locale (LC_ALL=C, PYTHONIOENCODING=ascii or
    latin-1), as every file nmt writes is: a character the locale cannot encode would
    stop the command after part of its output. A path name that is not UTF-8 is
    written as the bytes it came as (Python's lone surrogates for them).

    The process's own stdout is replaced by `_Stdout`, so that click's writes (a
    command's report, --help) name it when they fail. Another (a closed one's stand-in,
    a test's capture) is only reconfigured: a second wrapper would close its buffer
    when dropped.
    """
    stream = sys.stdout
    if not isinstance(stream, io.TextIOWrapper):
        return
    if stream is sys.__stdout__:
        stream.flush()
        sys.stdout = _Stdout(stream.buffer, encoding="utf-8", errors="surrogateescape", newline="\n",
                             line_buffering=stream.line_buffering, write_through=stream.write_through)
    else:
        stream.reconfigure(encoding="utf-8", errors="surrogateescape")
