"""The run directory: its setup, checkpoint files and their retention.

The file names are those of `checkpoints/names.py` (fairseq's).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from nmt_cli.checkpoints.format import serialise_checkpoint
from nmt_cli.checkpoints.names import BEST, LAST, epoch_checkpoint, epoch_of, update_checkpoint, updates_of
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data.meta import text_files
from nmt_cli.data.pairs import DataBin
from nmt_cli.errors import NmtError
from nmt_cli.signals import Terminated
from nmt_cli.staging import (fsync_directory, fsync_path, replace_atomically, replace_keeping_permissions,
                             start_private_file, temp_sibling)

# The journal of a save in progress: which complete temporary files become which checkpoints.
PENDING_SAVE = ".checkpoint_save.json"


def check_writable(save_dir: Path) -> None:
    """NmtError unless `save_dir` exists (or can be made) and accepts new files."""
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        # Named as a temporary file, so that the next run's sweep removes it should this one be killed here.
        probe = save_dir / f".write-test.{secrets.token_hex(4)}.{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise NmtError(f"cannot write to --save-dir {save_dir}: {error.strerror or error}") from None


def prepare_run_dir(save_dir: Path, data: DataBin, cfg: TrainConfig, model_cfg: ModelConfig) -> None:
    """Copy the data-bin's self-description into the run and write `config.json`.

    With meta.json, the dictionaries and the BPE model(s) next to the checkpoints, a
    run directory is all `nmt translate` needs.
    """
    # A fairseq data-bin has no meta.json (and no BPE model): its run translates BPE-segmented text only.
    # A BPE file that meta.json names outside the data-bin itself is not the run's to copy.
    names = [p.name for p in text_files(data.path, (data.source_lang, data.target_lang)) if p.parent == data.path]
    config_text = json.dumps(run_config(cfg, model_cfg), indent=2) + "\n"
    writing = None
    try:
        for name in names:  # text_files lists each once
            writing = save_dir / name
            replace_atomically(writing, partial(shutil.copyfile, data.path / name))
        writing = save_dir / "config.json"
        replace_atomically(writing, lambda tmp: tmp.write_text(config_text, encoding="utf-8"))
    except OSError as error:  # its filename may be the copy's source, or none
        raise NmtError(f"cannot prepare run directory {save_dir}: cannot write {writing}: "
                       f"{error.strerror or error}") from None


def run_config(cfg: TrainConfig, model_cfg: ModelConfig) -> dict[str, Any]:
    """The contents of the run's config.json (as JSON gives it back: tuples become lists)."""
    return json.loads(json.dumps({"arch": cfg.arch, "model": model_cfg.to_dict(), "train": cfg.to_dict()}))


def checkpoint_names(epoch: int, num_updates: int, end_of_epoch: bool, cfg: TrainConfig, is_best: bool,
                     also: str | None = None) -> list[str]:
    """Which files this save writes: the numbered ones its cadence asks for, best, `also`
    (a --keep-best-checkpoints file), then last (renamed into place in this order:
    checkpoint_last.pt marks the save complete)."""
    names = []
    if end_of_epoch and cfg.save_interval and epoch % cfg.save_interval == 0 and not cfg.no_epoch_checkpoints:
        names.append(epoch_checkpoint(epoch))
    if not end_of_epoch and cfg.save_interval_updates and num_updates % cfg.save_interval_updates == 0:
        names.append(update_checkpoint(epoch, num_updates))
    if is_best:
        names.append(BEST)
    if also is not None:
        names.append(also)
    names.append(LAST)
    return names


def write_checkpoints(state: dict[str, Any], save_dir: Path, names: list[str], doomed: Sequence[str] = ()) -> None:
    """Write the files `names` of one save so that, whatever the moment of a kill, the run
    directory holds the previous save or this one whole: never a checkpoint_last.pt beside
    a checkpoint_best.pt (or numbered file) that the save did not finish.

    Every file is first written whole under its temporary name (serialised once, then
    copied); then a journal naming them is written; then they are renamed into place,
    checkpoint_last.pt (what a resumed run trusts) last; then the numbered checkpoints
    `doomed` by retention are deleted; then the journal goes. Killed before the journal
    exists, the previous save stands and its temporary files are swept; killed after, the
    next start finishes the renames and deletions (`finish_pending_save`). Interrupted
    (Ctrl-C, SIGTERM) after, the save is finished before the interrupt goes on.
    """
    temps = [temp_sibling(save_dir / name) for name in names]
    journal = None
    try:
        for name, tmp in zip(names, temps):  # private while written where they replace files (maybe private)
            try:
                start_private_file(tmp, save_dir / name)
            except OSError as error:
                raise NmtError(f"cannot write checkpoint {save_dir / name}: {error.strerror or error}") from None
        serialise_checkpoint(state, temps[0], save_dir / names[0])
        for name, tmp in zip(names[1:], temps[1:]):
            try:
                shutil.copyfile(temps[0], tmp)
                fsync_path(tmp)
            except OSError as error:
                raise NmtError(f"cannot write checkpoint {save_dir / name}: {error.strerror or error}") from None
        journal = json.dumps({"renames": [[tmp.name, name] for tmp, name in zip(temps, names)],
                              "deletions": list(doomed)}) + "\n"
        try:
            replace_atomically(save_dir / PENDING_SAVE, lambda path: path.write_text(journal, encoding="utf-8"))
        except OSError as error:
            raise NmtError(f"cannot write {save_dir / PENDING_SAVE}: {error.strerror or error}") from None
    except BaseException:
        if journal is not None and _holds(save_dir / PENDING_SAVE, journal):
            _finish_despite_interrupts(save_dir)  # interrupted once it was in place: the save is taken
        else:
            for tmp in temps:
                tmp.unlink(missing_ok=True)
        raise
    _finish_despite_interrupts(save_dir)


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except OSError:
        return False


def _finish_despite_interrupts(save_dir: Path) -> None:
    """`finish_pending_save`, the renames ended before a Ctrl-C or SIGTERM that comes within
    them goes on: stopped there, the run directory would mix two saves until its next start."""
    try:
        finish_pending_save(save_dir)
    except (KeyboardInterrupt, Terminated):
        finish_pending_save(save_dir)  # it takes up where it was: each step is done once
        raise


def finish_pending_save(save_dir: Path) -> None:
    """Complete the renames of a save whose journal exists (one killed half-way through
    them, or this process's own), then drop the journal."""
    journal_path = save_dir / PENDING_SAVE
    if not journal_path.exists():
        return
    try:
        journal = json.loads(journal_path.read_text(encoding="utf-8"))
        pairs = [(str(tmp), str(name)) for tmp, name in journal["renames"]]
        deletions = [str(name) for name in journal["deletions"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise NmtError(f"{journal_path} is damaged: it should name the checkpoint files of an unfinished save; "
                       "remove it to resume from checkpoint_last.pt as it is") from None
    try:
        if any("/" in name for name in [*deletions, *(n for pair in pairs for n in pair)]):
            raise NmtError(f"{journal_path} names a file outside the run directory")
        for tmp, name in pairs:
            if (save_dir / tmp).is_file():  # gone: renamed before the kill
                replace_keeping_permissions(save_dir / tmp, save_dir / name)
        fsync_directory(save_dir)
        for name in deletions:
            (save_dir / name).unlink(missing_ok=True)
        journal_path.unlink()
        fsync_directory(save_dir)
    except OSError as error:
        raise NmtError(f"cannot finish the checkpoint save recorded in {journal_path}: "
                       f"{error.strerror or error}") from None


def files_to_prune(names: list[str], keep_last_epochs: int, keep_interval_updates: int) -> list[str]:
    """Numbered checkpoints beyond the newest `keep_*` of their kind (-1: keep all)."""
    doomed = []
    if keep_last_epochs > 0:
        epochs = sorted((e, n) for n in names if (e := epoch_of(n)) is not None)
        doomed += [n for _, n in epochs[:-keep_last_epochs]]
    if keep_interval_updates > 0:
        updates = sorted((u, n) for n in names if (u := updates_of(n)) is not None)
        doomed += [n for _, n in updates[:-keep_interval_updates]]
    return doomed


def checkpoints_to_prune(save_dir: Path, names: list[str], cfg: TrainConfig) -> list[str]:
    """The numbered checkpoints that retention deletes once the save of `names` is in place."""
    existing = [p.name for p in save_dir.iterdir()]
    return [name for name in files_to_prune(sorted(set(existing) | set(names)), cfg.keep_last_epochs,
                                            cfg.keep_interval_updates) if name not in names]
