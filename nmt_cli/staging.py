"""Build an output (a directory or a file) next to its destination and move it into place.

A run that is killed half-way leaves only a hidden sibling: `.NAME.partial-PID` (or,
killed while replacing an earlier output, `.NAME.old-PID`) for a directory, and for
`nmt binarize`'s pair of files `.PREFIX.partial-PID.bin/.idx`; `.NAME.PID.tmp` for a
file; never a destination that looks complete. The next run removes such leftovers
once their process is gone, and puts an `.old-PID` back where its replacement never
arrived (a run killed between `publish`'s two renames; an interrupted one puts it back
itself). A NAME too long to leave room for what these add is cut (`hidden_stem`), so
that any name the file system takes can be published.

An output that replaces another keeps that one's permissions, as `cp` onto an existing
file does (`keep_permissions`), and is private while it is built (`start_private_file`,
`create_staging`): a private file or directory never becomes readable by others. A new
output gets the umask's default mode.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from nmt_cli import __version__
from nmt_cli.errors import NmtError

PARTIAL = ".partial-"
REPLACED = ".old-"
# What a hidden name may add after `.NAME`: a marker, a PID of up to 10 digits and a
# suffix, e.g. `.partial-4194304.part12.bin`.
HIDDEN_ROOM = 32

T = TypeVar("T")


def recorded_in_meta(*keys: str) -> Callable[[Path], Any]:
    """What a directory's meta.json records at `keys` (e.g. "imported_from", "fingerprint");
    None when there is no such value."""
    def recorded(directory: Path) -> Any:
        # Not read_meta: a damaged or foreign meta.json is no error here, only not this output,
        # which check_destination refuses to replace without --force.
        try:
            value = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return recorded


def check_destination(dest: Path, flag: str, print_id: str, force: bool, *,
                      recorded: Callable[[Path], Any] = recorded_in_meta("fingerprint"),
                      names: set[str] | None = None, others: str = "a different dataset (or other files)") -> bool:
    """Whether the directory `dest` (given as `flag`) already holds the output `print_id`
    identifies, so that there is nothing to do.

    It does when `recorded(dest)` is `print_id` and, with `names`, it holds exactly the
    files `names`. False when `dest` is missing or empty, or with --force (the caller
    replaces it); otherwise NmtError, saying that it holds `others`: the output replaces
    the whole directory, so its files are only deleted when asked to.
    """
    remove_dead_leftovers(Path(os.path.realpath(dest)))  # an output a killed run left renamed is back
    if dest.exists() and not dest.is_dir():
        raise NmtError(f"{flag} {dest} exists and is not a directory")
    if not dest.exists() or not any(dest.iterdir()) or force:
        return False
    same_files = names is None or {path.name for path in dest.iterdir()} == names
    if same_files and recorded(dest) == print_id:
        return True
    raise NmtError(
        f"{flag} {dest} already holds {others}; "
        f"pass --force to replace the directory (deleting its files), or choose another {flag}"
    )


def build_then_publish(dest: Path, write: Callable[[Path], T], describe: Callable[[OSError], str]) -> T:
    """`write(staging)` into a fresh hidden sibling of `dest`, then move it into place: a
    failed or killed run leaves the previous `dest` (or none), never a mix of old and new
    files. An OSError (a full disk, an unwritable parent) becomes NmtError(describe(error))."""
    # The sibling is named after `dest`, so `dest` is resolved first: `.`, `..` and `sub/..` get a
    # name of their own (`..partial-PID` would land inside `dest`), `../here` from inside `here`
    # becomes a path that does not pass through `dest` (renamed away while publishing), and a
    # link to a directory becomes that directory, which is replaced and locked (run_lock) in its
    # own parent while the link stays as it is. (realpath, unlike Path.resolve, takes a loop.)
    if os.path.islink(dest):  # where earlier versions, which replaced the link itself, left their leftovers
        remove_dead_leftovers(Path(os.path.realpath(dest.parent)) / dest.name)
    dest = Path(os.path.realpath(dest))
    try:
        staging = create_staging(dest)
    except OSError as error:
        raise NmtError(describe(error)) from None
    except BaseException:  # interrupted, maybe just after making it
        remove_entry(partial_sibling(dest))
        raise
    try:
        result = write(staging)
        publish(staging, dest)
    except OSError as error:
        remove_entry(staging)
        raise NmtError(describe(error)) from None
    except BaseException:
        remove_entry(staging)
        raise
    return result


def check_file_name(path: str | os.PathLike, what: str) -> None:
    """NmtError unless `path` (given as `what`, e.g. "--output") can name a file to write.
    An empty path names none, and one ending in `/`, `.` or `..`, or naming an existing
    directory, names a directory: Path and realpath drop a trailing `/`, so that `out/`
    would be written as a file `out`, or over one (an input, a checkpoint)."""
    text = os.fspath(path)
    if not text:
        raise NmtError(f"{what} is empty; give a file name")
    if text.endswith(os.sep) or os.path.basename(text) in (".", "..") or os.path.isdir(text):
        raise NmtError(f"{what} {text} names a directory; give a file name")


def failure_line(action: str, error: OSError) -> str:
    """One line for an OS error (a full disk, an unwritable directory) that stopped `action`."""
    reason = error.strerror or str(error)
    location = f": {error.filename}" if error.filename else ""
    return f"{action} failed: {reason}{location}"


def fingerprint(settings: dict[str, Any], files: Iterable[Path]) -> str:
    """Identifies an output by what made it: nmt's version, settings, and the input files
    (path, size, modification time), so that re-running the same command can be skipped."""
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    blob = json.dumps({"nmt": __version__, "settings": settings, "files": stats}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def file_version(path: Path) -> tuple[int, int, int, int]:
    """What tells one version of a file from the next: a file renamed over it (a run's
    atomic save) is another inode, one written in place another size or time."""
    stats = os.stat(path)
    return stats.st_dev, stats.st_ino, stats.st_size, stats.st_mtime_ns


def check_unchanged(versions: dict[Path, tuple[int, int, int, int]]) -> None:
    """Raise if a file is no longer the version `file_version` gave before it was read: an
    output fingerprinted by its inputs' stats would be taken for up to date with a file it
    was not made from."""
    for path, version in versions.items():
        if file_version(path) != version:
            raise NmtError(f"{path} changed while it was read (a run saving it?); run this again once nothing "
                           "writes it")


def refuse_inputs_inside(inputs: Iterable[Path], dest: Path, flag: str) -> None:
    """Raise if an input file lies inside `dest`: the finished output replaces that directory
    as a whole, which would delete the input."""
    resolved = dest.resolve()
    for path in inputs:
        # Both where the name lies and, for a symlink, where its data lie.
        if any(place.is_relative_to(resolved) for place in (path.parent.resolve() / path.name, path.resolve())):
            raise NmtError(
                f"input file {path} is inside {flag} {dest}, which the output replaces "
                f"(deleting the input); move the input or choose another {flag}"
            )


def create_staging(dest: Path) -> Path:
    """A fresh hidden sibling of `dest` to build into (removing leftovers of dead runs)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(dest)
    staging = partial_sibling(dest)
    if os.path.lexists(staging):
        remove_entry(staging, ignore_errors=False)
    # Replacing an output, which may be private: private until publish gives it that one's mode.
    staging.mkdir(mode=0o700 if os.path.lexists(dest) else 0o777)
    return staging


def hidden_stem(dest: Path) -> str:
    """`.NAME` for `dest` named NAME: what begins each of its hidden siblings' names.

    A NAME too long to leave `HIDDEN_ROOM` bytes within the file system's limit on a name
    is cut and given a digest of the whole NAME (`.NAMESTART~DIGEST`), so that long names
    that start alike keep apart. It depends on NAME alone, never on the PID, so that a
    later run finds the leftovers of a dead one.
    """
    stem = f".{dest.name}"
    limit = name_max(dest.parent) - HIDDEN_ROOM
    if len(os.fsencode(stem)) <= limit:
        return stem
    digest = "~" + hashlib.sha256(os.fsencode(dest.name)).hexdigest()[:12]
    start = dest.name
    while start and len(os.fsencode(f".{start}{digest}")) > limit:
        start = start[:-1]
    return f".{start}{digest}"


def name_max(directory: Path) -> int:
    """The longest name, in bytes, that `directory`'s file system takes (255 where it cannot say)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):  # not there yet, or no such setting on this platform
        return 255


def partial_sibling(dest: Path) -> Path:
    """This process's hidden name for `dest` while it is built: `.NAME.partial-PID`."""
    return dest.parent / f"{hidden_stem(dest)}{PARTIAL}{os.getpid()}"


def publish(staging: Path, dest: Path) -> None:
    """Move the finished `staging` directory to `dest` (absolute, resolved), replacing what was there."""
    old = None
    # A process standing in `dest` (`--destdir .`) would be left in the deleted old directory.
    stands_in_dest = dest.exists() and os.path.samestat(os.lstat(dest), os.stat("."))
    if os.path.lexists(dest):
        keep_permissions(dest, staging)
        old = dest.parent / f"{hidden_stem(dest)}{REPLACED}{os.getpid()}"
    try:
        if old is not None:
            os.rename(dest, old)
        os.rename(staging, dest)
        if stands_in_dest:
            os.chdir(dest)
    except BaseException:  # Ctrl-C, SIGTERM or an OS error between the two renames: the old output is back
        if old is not None and not os.path.lexists(dest) and os.path.lexists(old):
            os.rename(old, dest)
        raise
    finally:
        if old is not None and os.path.lexists(old) and os.path.lexists(dest):  # the new output stands
            remove_entry(old)


def remove_dead_leftovers(dest: Path) -> None:
    """Delete `.NAME.partial-PID` and `.NAME.old-PID` directories whose process no longer runs;
    but where `dest` is missing, an `.old-PID` directory is the output of a run killed between
    the two renames of `publish`, and it goes back into place. (A link is what versions that
    replaced a link to `dest` itself left: removed.)"""
    for marker in (PARTIAL, REPLACED):
        for path in leftovers_of_dead_processes(dest.parent, f"{hidden_stem(dest)}{marker}"):
            if marker == REPLACED and not os.path.lexists(dest) and not os.path.islink(path):
                os.rename(path, dest)
            else:
                remove_entry(path)


def remove_entry(path: Path, ignore_errors: bool = True) -> None:
    """Delete the directory tree, file or link `path` (a link, not what it points to)."""
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)
    except OSError:
        if not ignore_errors:
            raise


def replace_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """`write` a temporary file beside `target`, then rename it over `target`: a process
    killed at any moment leaves the old file (or none), never part of the new one."""
    with published_on_success(target) as tmp:
        write(tmp)


@contextmanager
def published_on_success(target: Path) -> Iterator[Path]:
    """A temporary sibling of `target` to write within the block; when the block ends
    normally it is renamed over `target`, otherwise removed (the old `target` untouched).

    The data reach the disk before the rename, and the rename before the block is left,
    so that a machine that crashes afterwards, too, finds the old file or the whole new one.
    """
    if target.exists() and not target.is_file():
        # A rename would swap a device or a directory for our file (`-o /dev/null` as root).
        raise NmtError(f"{target} exists and is not a regular file; refusing to replace it")
    tmp = temp_sibling(target)
    try:
        remove_stale_temp_files(target)
        start_private_file(tmp, target)
        yield tmp
        fsync_path(tmp)
        replace_keeping_permissions(tmp, target)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # never made (a file stands where its directory should be): the error to report is the first
            pass
        raise
    fsync_directory(target.parent)


def start_private_file(tmp: Path, target: Path) -> None:
    """Create `tmp`, empty and readable by its owner only (0600), where it is to replace an
    existing `target`, which may be private; its writer opens it again and writes it (`wb`
    keeps the mode). Where `target` is new, the writer creates `tmp` with the umask's mode."""
    if os.path.exists(target):
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))


def replace_keeping_permissions(new: Path, target: Path) -> None:
    """Rename the file `new` over `target`, which keeps its permissions (`keep_permissions`)."""
    keep_permissions(target, new)
    os.replace(new, target)


def keep_permissions(replaced: Path, new: Path) -> None:
    """Give `new`, about to be renamed over `replaced`, the group and permission bits of
    `replaced` (what it names, through a link), as `cp` onto an existing file keeps them;
    nothing where `replaced` does not exist. `new` is ours, so its mode can be set; its
    group only to one of ours (or as root), and otherwise it gets no group bits."""
    try:
        old = os.stat(replaced)
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(old.st_mode)
    if os.stat(new).st_gid != old.st_gid:
        try:
            os.chown(new, -1, old.st_gid)
        except OSError:  # not our group (EPERM), or a mount without Unix owners (EOPNOTSUPP, ENOSYS, ...)
            mode &= ~0o070  # our group is not the one those bits were meant for
    try:
        os.chmod(new, mode)
    except OSError:
        pass  # a file system without Unix modes (vfat, some network mounts): they are the mount's


def temp_sibling(target: Path) -> Path:
    """This process's temporary name for `target`: `.NAME.PID.tmp`, swept once the process is gone."""
    return target.with_name(f"{hidden_stem(target)}.{os.getpid()}.tmp")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """Make a rename durable; some platforms and file systems cannot sync a directory, which is fine."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temp_files(path: Path) -> None:
    """Delete `.NAME.PID.tmp` files next to `path` (NAME its name) left by killed processes
    (they can be as large as a checkpoint); those of live processes are theirs to finish."""
    _remove_dead_temp_files(path.parent, hidden_stem(path))


def remove_stale_temp_files_in(directory: Path) -> None:
    """Delete every `.NAME.PID.tmp` file in `directory` whose process no longer runs,
    whatever NAME: also those of files that are never written again."""
    _remove_dead_temp_files(directory, None)


def _remove_dead_temp_files(directory: Path, stem: str | None) -> None:
    """Delete the `.NAME.PID.tmp` files of `directory` (only those whose `.NAME` is `stem`,
    a `hidden_stem`, unless None) whose process no longer runs."""
    pattern = f"{glob.escape(f'{stem}.')}*.tmp" if stem is not None else ".*.tmp"
    for path in directory.glob(pattern):
        found, _, pid_text = path.name[: -len(".tmp")].rpartition(".")  # NAME may hold dots, PID does not
        if stem is not None and found != stem:
            continue
        if pid_text.isdigit() and path.is_file() and not process_alive(int(pid_text)):
            try:
                path.unlink()
            except OSError:
                pass  # gone already, or not ours to delete: leaving it loses nothing


def leftovers_of_dead_processes(directory: Path, prefix: str) -> list[Path]:
    """Entries `{prefix}PID[.MORE]` of `directory` whose process PID no longer runs."""
    found = []
    for path in directory.glob(f"{glob.escape(prefix)}*"):
        pid_text = path.name[len(prefix):].split(".")[0]
        if pid_text.isdigit() and not process_alive(int(pid_text)):
            found.append(path)
    return found


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
