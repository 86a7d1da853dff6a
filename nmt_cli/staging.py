"""Build an output directory next to its destination and move it into place at the end.

A run that is killed half-way leaves only a hidden `.NAME.partial-PID` sibling (or,
killed while replacing an earlier output, `.NAME.old-PID`), never a destination that
looks complete; the next run removes such leftovers once their process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from nmt_cli.errors import NmtError

PARTIAL = ".partial-"
REPLACED = ".old-"


def check_destination(dest: Path, fingerprint: str, force: bool) -> bool:
    """True when `dest` already holds this exact dataset; raise if it holds another (without --force)."""
    if dest.exists() and not dest.is_dir():
        raise NmtError(f"--destdir {dest} exists and is not a directory")
    if not dest.exists() or not any(dest.iterdir()):
        return False
    if force:
        return False
    meta_path = dest / "meta.json"
    if meta_path.is_file():
        try:
            old = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            old = {}
        if old.get("fingerprint") == fingerprint:
            return True
    raise NmtError(
        f"--destdir {dest} already holds a different dataset (or other files); "
        "pass --force to replace it, or choose another --destdir"
    )


def create_staging(dest: Path) -> Path:
    """A fresh hidden sibling of `dest` to build into (removing leftovers of dead runs)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(dest)
    staging = dest.parent / f".{dest.name}{PARTIAL}{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def publish(staging: Path, dest: Path) -> None:
    """Move the finished `staging` directory to `dest`, replacing what was there."""
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}{REPLACED}{os.getpid()}"
        os.rename(dest, old)
    os.rename(staging, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_dead_leftovers(dest: Path) -> None:
    """Delete `.NAME.partial-PID` and `.NAME.old-PID` directories whose process no longer runs."""
    for prefix in (f".{dest.name}{PARTIAL}", f".{dest.name}{REPLACED}"):
        for path in dest.parent.glob(f"{prefix}*"):
            pid_text = path.name[len(prefix):]
            if pid_text.isdigit() and not process_alive(int(pid_text)):
                shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
