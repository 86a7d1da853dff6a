"""`nmt binarize` on its own: already-segmented text and an existing dictionary -> PREFIX.bin/.idx,
published as a pair only once complete."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from nmt_cli.config import BinarizeConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import file_prefix, make_parent_directory, refuse_overwriting_inputs
from nmt_cli.preprocess.progress import StageReporter
from nmt_cli.preprocess.stages import BinarizeResult, JobRunner
from nmt_cli.preprocess.workers import binarize_file
from nmt_cli.run_lock import directory_lock
from nmt_cli.staging import (PARTIAL, fsync_directory, hidden_stem, keep_permissions, leftovers_of_dead_processes,
                             partial_sibling)
from nmt_cli.text.reader import count_lines


def binarize_text(cfg: BinarizeConfig) -> tuple[Path, BinarizeResult]:
    """Binarize `cfg.input_path` with `cfg.dict_path` into `cfg.output_prefix`.bin/.idx;
    returns the prefix written and the counts."""
    source, prefix = Path(cfg.input_path), file_prefix(cfg.output_prefix, "--output-prefix", (".bin", ".idx"))
    if not Path(cfg.dict_path).is_file():
        raise NmtError(f"dictionary not found: {cfg.dict_path}")
    for suffix in (".bin", ".idx"):
        refuse_overwriting_inputs(f"{prefix}{suffix}", [("--input", cfg.input_path), ("--dict", cfg.dict_path)],
                                  "--output-prefix")
    num_lines = count_lines(source)
    make_parent_directory(prefix)
    with directory_lock(prefix.parent, "the --output-prefix directory"):  # one writer per data-bin
        _remove_files_of_killed_runs(prefix)
        reporter = StageReporter()
        partial = partial_sibling(prefix)  # hidden, so that a killed run leaves no visible file beside the outputs
        try:
            with JobRunner(cfg.workers) as runner:
                result = binarize_file(source, num_lines, Path(cfg.dict_path), partial, runner, reporter,
                                       f"binarize {source}")
            _publish_pair(partial, prefix)
        except BaseException as error:
            # Bad input (NmtError), a full disk or Ctrl-C: none may leave a partial file behind.
            # The with-block has waited for the workers, so no part is still being written.
            _remove_partial_files(partial)
            if isinstance(error, OSError):
                raise NmtError(f"cannot write {prefix}.bin/.idx: {error.strerror or error}") from None
            raise
    return prefix, result


def _publish_pair(partial: Path, prefix: Path) -> None:
    """Move PARTIAL.bin/.idx to PREFIX.bin/.idx as a unit. The .idx says where the .bin's
    sentences lie, so it is the record of a complete pair: the old one goes first and the
    new one comes last. A process killed in between leaves a .bin without its .idx, which
    readers take for a missing split (and the next binarize replaces), never a new .bin
    read through an old .idx; one interrupted (Ctrl-C, SIGTERM) puts the new pair in place
    before it stops. Replaced files' permissions stay (see staging.keep_permissions)."""
    for suffix in (".bin", ".idx"):
        keep_permissions(Path(f"{prefix}{suffix}"), Path(f"{partial}{suffix}"))
    try:
        Path(f"{prefix}.idx").unlink(missing_ok=True)
        fsync_directory(prefix.parent)
        _move_new_pair(partial, prefix)
    except OSError:
        raise
    except BaseException:  # Ctrl-C or SIGTERM once the old .idx may be gone: the new pair goes into place
        if not os.path.exists(f"{prefix}.idx"):
            _move_new_pair(partial, prefix)
        raise
    fsync_directory(prefix.parent)


def _move_new_pair(partial: Path, prefix: Path) -> None:
    """PARTIAL.bin, unless it has moved already, then PARTIAL.idx, to PREFIX.bin/.idx."""
    if os.path.exists(f"{partial}.bin"):
        os.replace(f"{partial}.bin", f"{prefix}.bin")
        fsync_directory(prefix.parent)
    os.replace(f"{partial}.idx", f"{prefix}.idx")


def _remove_files_of_killed_runs(prefix: Path) -> None:
    """Delete the .PREFIX.partial-PID files of earlier runs whose process no longer runs
    (killed outright, they could not remove their own)."""
    for path in leftovers_of_dead_processes(prefix.parent, f"{hidden_stem(prefix)}{PARTIAL}"):
        try:
            path.unlink()
        except OSError:
            pass  # not a file of ours, or gone already: leaving it loses nothing


def _remove_partial_files(partial: Path) -> None:
    """Delete this run's files under its temporary name: PARTIAL.bin/.idx and, when several
    chunks were binarized, each chunk's PARTIAL.partN.bin/.idx."""
    for path in partial.parent.glob(f"{glob.escape(partial.name)}.*"):
        try:
            path.unlink()
        except OSError:
            pass  # cleaning up must not hide the error that stopped the run
