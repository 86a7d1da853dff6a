"""Opening the commands' files: a path that cannot be read or written is one error line."""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from nmt_cli.errors import NmtError
from nmt_cli.staging import check_file_name, published_on_success
from nmt_cli.streams import closed_error, write_failures_named


def make_parent_directory(path: Path) -> None:
    """Create the directory that will hold `path`, or raise NmtError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error} ({error.filename})") from None


def file_prefix(prefix: str, flag: str, suffixes: tuple[str, ...]) -> Path:
    """`prefix` (to which the command appends `suffixes`) as a Path, or NmtError unless it
    ends in a file name. An empty prefix or one ending in `/`, `.` or `..` names a
    directory: `{prefix}.model` would be a hidden file in it, and Path drops a trailing
    `/`, so that `bz/` would write `bz.bin` beside the directory bz, not in it."""
    if os.path.basename(prefix) in ("", ".", ".."):
        names = " and ".join(f"DIR/NAME{suffix}" for suffix in suffixes)
        raise NmtError(f"{flag} must name a file, e.g. DIR/NAME for {names} (got {prefix!r})")
    return Path(prefix)


@contextmanager
def opened(path: str, mode: str) -> Iterator[IO]:
    """`path` opened in `mode`: "rb", "wb" or "w" (UTF-8 text with `\\n` line ends, whatever
    the locale); "-" is stdin or stdout.

    Failing to open or to close (where a full disk shows) is NmtError naming the file.
    After any other failure the file is closed quietly, so that the first error shows.
    """
    if path == "-":
        standard = {"rb": sys.stdin.buffer, "wb": sys.stdout.buffer, "w": sys.stdout}[mode]
        closed = closed_error(standard)
        if closed is not None:
            raise closed
        yield standard
        return
    verb = "read" if mode == "rb" else "write"
    try:
        stream = open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8", newline="\n")
    except OSError as error:
        raise NmtError(f"cannot {verb} {path}: {error.strerror or error}") from None
    with _closed_at_end(stream, f"cannot {verb} {path}"):
        yield stream


@contextmanager
def _closed_at_end(stream: IO, failure: str) -> Iterator[None]:
    """Close `stream` when the block ends: a failure to close is NmtError(`failure`: why);
    after a failure within the block it is closed quietly, so that the first error shows."""
    try:
        yield
    except BaseException:
        close_quietly(stream)
        raise
    try:
        stream.close()
    except OSError as error:
        raise NmtError(f"{failure}: {error.strerror or error}") from None


def close_quietly(stream: IO) -> None:
    """Close after a failure: closing flushes again, and that error must not hide the first."""
    try:
        stream.close()
    except OSError:
        pass


def refuse_overwriting_inputs(output_path: str | Path, inputs: Iterable[tuple[str, str | Path]],
                              output_flag: str = "--output") -> None:
    """Raise if `output_path` is one of the files a command reads: `inputs` are (flag, path)
    pairs, "-" standard input. Compared by resolved path and by file identity (device and
    inode: a hard link, another mount of the same disk), as writing either destroys the input.

    Only an existing regular file can be destroyed: a path that does not exist yet, or a
    device such as /dev/null, is no input's data. A path that names no file (empty, or a
    directory: `t.en/`) is refused first.
    """
    if str(output_path) == "-":
        return
    check_file_name(output_path, output_flag)
    try:
        output_stat = os.stat(output_path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(output_stat.st_mode):
        return
    output_real = os.path.realpath(output_path)
    for flag, path in inputs:
        if str(path) == "-":
            source, same_path = "standard input", False
            try:
                input_stat = os.fstat(sys.stdin.fileno())
            except (OSError, ValueError, AttributeError):  # closed or replaced stdin
                continue
        else:
            source, same_path = f"{flag} {path}", os.path.realpath(path) == output_real
            try:
                input_stat = os.stat(path)
            except (OSError, ValueError):
                input_stat = None
        if same_path or (input_stat is not None and os.path.samestat(input_stat, output_stat)):
            raise NmtError(f"{output_flag} {output_path} is the input ({source}): writing it would destroy "
                           f"the input; choose another {output_flag}")


def write_output(sink: IO, data: bytes | str, output_path: str, flush: bool = True) -> None:
    """Write `data` to an output opened by `published_output` (and flush it, so that a
    reader waiting for these lines gets them now); a full disk is one error line naming
    the output. A reader gone away (`| head`) stays BrokenPipeError: the CLI ends quietly."""
    with write_failures_named(output_path):
        if isinstance(sink, io.RawIOBase):  # stdout under `python -u` or PYTHONUNBUFFERED
            _write_all(sink, data)
        else:
            sink.write(data)
        if flush:
            sink.flush()


def _write_all(sink: io.RawIOBase, data: bytes) -> None:
    """A raw stream's write may take part of the data and say how much (a disk that
    fills up mid-write): write the rest until it is all out or the write fails."""
    view = memoryview(data)
    while view:
        view = view[sink.write(view):]


# Where /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N lead on Linux: the
# descriptors of a process (or of one of its threads, which share them).
_DESCRIPTOR_DIRECTORY = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")


def descriptor_named(path: str) -> tuple[int, int] | None:
    """(PID, N) when `path` leads, link by link, to the open descriptor N of process PID
    (/dev/stdout, /dev/fd/N, /proc/self/fd/N); None for any other path.

    Such a path is a stream, whatever it is open on: its last link, read, names the
    file the descriptor has open (`>> log.txt`), which realpath and stat follow, but a
    file renamed over that name would drop what the file held and what is appended to it.
    """
    current = os.path.abspath(path)
    for _ in range(40):  # as many links as Linux follows
        parent, name = os.path.realpath(os.path.dirname(current)), os.path.basename(current)
        found = _DESCRIPTOR_DIRECTORY.fullmatch(parent)
        if found:
            return (int(found.group(1)), int(name)) if name.isdigit() else None
        try:
            target = os.readlink(os.path.join(parent, name))
        except (OSError, ValueError):  # not a link, or not there: the path names a file of its own
            return None
        current = os.path.normpath(os.path.join(parent, target))
    return None


def _descriptor_stream(path: str, descriptor: tuple[int, int], mode: str) -> IO:
    """A stream writing to the open descriptor that `path` names (`descriptor_named`): this
    process's own through a copy of it, so that it writes where the descriptor stands
    (after what the shell wrote, and before what it writes later); another's opened anew
    for appending. Neither truncates what the descriptor's file already holds."""
    pid, number = descriptor
    try:
        if pid == os.getpid():
            fd = os.dup(number)
            return os.fdopen(fd, "wb") if mode == "wb" else os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        return open(path, "ab") if mode == "wb" else open(path, "a", encoding="utf-8", newline="\n")
    except OSError as error:
        raise NmtError(f"cannot write {path}: {error.strerror or error}") from None


@contextmanager
def published_output(path: str, mode: str = "wb", flag: str = "--output") -> Iterator[IO]:
    """`path` (given as `flag`; "-": stdout) opened for writing, in `mode` "wb" or "w" (as
    `opened`), so that a reader never finds part of it: a file is written as a hidden
    temporary sibling and renamed over `path` when the block ends normally. After an error
    or an interrupt the temporary file is removed and an earlier `path` is left as it was.
    Stdout, a descriptor (/dev/stdout, /dev/fd/N), a device or a FIFO streams as it is
    written."""
    if path == "-":
        yield sys.stdout.buffer if mode == "wb" else sys.stdout
        return
    check_file_name(path, flag)
    descriptor = descriptor_named(path)
    if descriptor is not None:
        stream = _descriptor_stream(path, descriptor, mode)
        with _closed_at_end(stream, f"cannot write {path}"):
            yield stream
        return
    try:
        existing = os.stat(path)
    except (OSError, ValueError):
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):  # /dev/null, a FIFO: stream
        with opened(path, mode) as stream:
            yield stream
        return
    target = Path(os.path.realpath(path))  # through a link: replace the file it names, keep the link
    in_body = False
    try:
        with published_on_success(target) as tmp:  # which makes the hidden temporary file
            try:
                stream = open(tmp, "wb") if mode == "wb" else open(tmp, "w", encoding="utf-8", newline="\n")
            except OSError as error:
                raise NmtError(f"cannot write {path}: {error.strerror or error}") from None
            in_body = True
            try:
                yield stream
            except BaseException:
                close_quietly(stream)
                raise
            in_body = False
            stream.close()
    except OSError as error:
        if in_body:
            raise  # the command's own failure, not the output's
        raise NmtError(f"cannot write {path}: {error.strerror or error}") from None
