"""One writer per directory: an advisory lock that a command holds while it writes a run
directory (`nmt train --save-dir`, the imports' --out), a data-bin (`nmt preprocess
--destdir`, `nmt binarize`) or an export (`nmt export`'s OUT).

The lock is an flock on a hidden file beside the directory, `.NAME.lock`: beside it, not
inside, because preprocess replaces its destination directory whole (a lock inside would
be replaced with it) and the destination may not exist yet. The OS releases the lock when
the process ends, however it ends (SIGKILL included), so a crashed run never needs a
lock to be removed by hand (the file it leaves is reused). The file records the holder's
PID and host for the refusal, and is removed when the holder is done.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nmt_cli.errors import NmtError
from nmt_cli.staging import hidden_stem


def lock_path_for(directory: Path) -> Path:
    """The lock file of `directory`: every spelling of it (relative, through a link) shares one."""
    resolved = Path(os.path.realpath(directory))
    if not resolved.name:  # the root directory has no parent to hold the file
        return resolved / ".nmt.lock"
    return resolved.parent / f"{hidden_stem(resolved)}.lock"


@contextmanager
def directory_lock(directory: Path, flag: str) -> Iterator[None]:
    """Hold the lock of `directory` (given as `flag`) for the duration of the block; a
    directory another process holds is NmtError naming that process's PID and host."""
    lock_path = lock_path_for(directory)
    fd = _acquire(lock_path, directory, flag)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        except OSError as error:
            raise NmtError(f"cannot write to {flag} {directory}: {error.strerror or error} ({lock_path})") from None
        yield
    finally:
        # Removed while still held, so that a process that opened this file meanwhile finds,
        # once it gets the lock, that the file is no longer the lock file, and tries again.
        # A file that cannot be removed is still no lock once closed: the work is done.
        try:
            lock_path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(fd)  # releases the lock


def _acquire(lock_path: Path, directory: Path, flag: str) -> int:
    """An open descriptor of `lock_path`, locked, that is still the file at that path."""
    while True:
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileExistsError, NotADirectoryError):  # a file stands where a directory of the path should be
            raise NmtError(f"cannot write to {flag} {directory}: a part of its path is a file") from None
        except OSError as error:
            raise NmtError(f"cannot write to {flag} {directory}: {error.strerror or error} ({lock_path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _holder(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise NmtError(f"{flag} {directory} is in use by another nmt process ({holder}, lock "
                               f"{lock_path}); wait for it to end or choose another {flag}") from None
            raise NmtError(f"cannot lock {flag} {directory}: {error.strerror or error} ({lock_path}); "
                           "its file system may not support file locks") from None
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except FileNotFoundError:
            current = False
        if current:
            return fd
        os.close(fd)  # its holder removed it as we opened it: lock the file now at that path


def _holder(fd: int) -> str:
    """What the holder wrote into the lock file ("pid N on host H"), if it has yet."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "its PID is not recorded yet"
