"""Standard streams that were closed when `nmt` started (`<&-`, `>&-`, `2>&-`, as
under cron or a daemon).

Python leaves `sys.stdin`/`sys.stdout`/`sys.stderr` as None then, and the next file the
command opens takes the free descriptor: a checkpoint or `-o` file opened as descriptor
2 would receive every warning. `guard_standard_streams` puts /dev/null on each closed
descriptor first. A closed stderr then silences the command's messages; a closed stdin
or stdout is one error line at its first use, since reading nothing or writing nowhere
would lose data silently.
"""

from __future__ import annotations

import io
import os
import sys

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


def write_path_names_as_given() -> None:
    """Let stdout write a path name that is not UTF-8 as the bytes it came as.

    Python turns such bytes of a command line into lone surrogates, and a UTF-8 stdout
    with the `strict` error handler (a UTF-8 locale other than C.UTF-8, or
    PYTHONIOENCODING=utf-8) cannot encode them: `wrote DIR/m.model` would be a traceback.
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict" and \
            stream.encoding.lower().replace("-", "") == "utf8":
        stream.reconfigure(errors="surrogateescape")
