"""nmt_cli/staging.py: outputs built beside their destination and moved into place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nmt_cli.staging as staging_module
from nmt_cli.run_lock import lock_path_for
from nmt_cli.staging import (HIDDEN_ROOM, PARTIAL, REPLACED, build_then_publish, check_destination, hidden_stem,
                             partial_sibling, remove_dead_leftovers, remove_stale_temp_files, temp_sibling)

DEAD_PID = 2 ** 22 + 1  # above Linux's largest PID: no process has it


def writing(text: str):
    def write(staging: Path) -> str:
        (staging / "out.txt").write_text(text)
        return "written"

    return write


def test_a_destination_that_is_a_link_is_published_into_its_target(tmp_path: Path) -> None:
    target, link = tmp_path / "pdb", tmp_path / "pdbl"
    target.mkdir()
    (target / "stale.txt").write_text("old\n")
    link.symlink_to("pdb")
    # What an earlier version left when it replaced the link itself: a link, which rmtree refuses.
    (tmp_path / f".pdbl{REPLACED}{DEAD_PID}").symlink_to("pdb")
    assert build_then_publish(link, writing("new\n"), str) == "written"
    assert link.is_symlink() and os.readlink(link) == "pdb"
    assert sorted(p.name for p in target.iterdir()) == ["out.txt"] and (target / "out.txt").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pdb", "pdbl"]  # no leftover, no staging


def test_the_lock_and_the_staging_sibling_lie_beside_the_links_target(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "link"
    link.symlink_to(tmp_path / "real")
    seen = []

    def write(staging: Path) -> None:
        seen.append(staging.parent)

    build_then_publish(link, write, str)
    assert seen == [tmp_path] and lock_path_for(link).parent == tmp_path


def test_leftovers_that_are_links_are_removed_and_their_targets_kept(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "data.txt").write_text("mine\n")
    for marker in (PARTIAL, REPLACED):
        (tmp_path / f".out{marker}{DEAD_PID}").symlink_to(kept)
    remove_dead_leftovers(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and (kept / "data.txt").read_text() == "mine\n"


def test_hidden_names_of_the_longest_name_fit_and_keep_apart(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    first, second = tmp_path / ("x" * limit), tmp_path / ("x" * (limit - 1) + "y")
    assert hidden_stem(tmp_path / "short.txt") == ".short.txt"  # a name that fits keeps its hidden names
    assert hidden_stem(first) != hidden_stem(second)
    for dest in (first, second, tmp_path / ("é" * (limit // 2))):
        assert len(os.fsencode(hidden_stem(dest))) <= limit - HIDDEN_ROOM
        for hidden in (temp_sibling(dest), partial_sibling(dest), Path(f"{partial_sibling(dest)}.part12.bin")):
            assert len(os.fsencode(hidden.name)) <= limit
    assert lock_path_for(first).name == f"{hidden_stem(first)}.lock"


def test_leftovers_of_long_names_are_found(tmp_path: Path) -> None:
    dest = tmp_path / ("x" * os.pathconf(tmp_path, "PC_NAME_MAX"))
    stem = hidden_stem(dest)
    temp, partial, old = (tmp_path / f"{stem}.{DEAD_PID}.tmp", tmp_path / f"{stem}{PARTIAL}{DEAD_PID}",
                          tmp_path / f"{stem}{REPLACED}{DEAD_PID}")
    temp.write_text("part\n")
    partial.mkdir()
    old.mkdir()
    dest.mkdir()  # published: the old one is a leftover (without it, it would go back into place)
    remove_stale_temp_files(dest)
    remove_dead_leftovers(dest)
    assert list(tmp_path.iterdir()) == [dest]


def test_a_directory_of_the_longest_name_can_be_published(tmp_path: Path) -> None:
    dest = tmp_path / ("d" * os.pathconf(tmp_path, "PC_NAME_MAX"))
    for text in ("first\n", "second\n"):  # made, then replaced
        build_then_publish(dest, writing(text), str)
        assert (dest / "out.txt").read_text() == text and list(tmp_path.iterdir()) == [dest]


def test_an_interrupt_between_the_two_renames_of_a_publish_leaves_the_old_output(tmp_path: Path, monkeypatch) -> None:
    dest = tmp_path / "out"
    build_then_publish(dest, writing("old\n"), str)
    real_rename = os.rename

    def rename_then_interrupt(source, target):
        real_rename(source, target)
        if Path(target).name.startswith(f".out{REPLACED}"):  # the old output has just moved aside
            raise KeyboardInterrupt

    monkeypatch.setattr(staging_module.os, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        build_then_publish(dest, writing("new\n"), str)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (dest / "out.txt").read_text() == "old\n"


def test_the_old_output_of_a_run_killed_between_the_two_renames_goes_back_into_place(tmp_path: Path) -> None:
    """As a run killed there leaves it: the old output renamed aside, the new one still staged."""
    old, staged = tmp_path / f".out{REPLACED}{DEAD_PID}", tmp_path / f".out{PARTIAL}{DEAD_PID}"
    old.mkdir()
    (old / "id").write_text("the old output")
    staged.mkdir()
    dest = tmp_path / "out"
    assert check_destination(dest, "OUT", "the old output", False, recorded=lambda d: (d / "id").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (dest / "id").read_text() == "the old output"


@pytest.mark.parametrize("step", ["made the staging directory", "published"])
def test_an_interrupt_just_after_a_step_of_a_publish_leaves_no_hidden_copy(tmp_path: Path, monkeypatch, step) -> None:
    dest = tmp_path / "out"
    build_then_publish(dest, writing("old\n"), str)
    real_mkdir, real_rename = Path.mkdir, os.rename

    def mkdir_then_interrupt(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name.startswith(f".out{PARTIAL}"):
            raise KeyboardInterrupt

    def rename_then_interrupt(source, target):
        real_rename(source, target)
        if Path(target) == dest:
            raise KeyboardInterrupt

    if step == "made the staging directory":
        monkeypatch.setattr(Path, "mkdir", mkdir_then_interrupt)
    else:
        monkeypatch.setattr(staging_module.os, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        build_then_publish(dest, writing("new\n"), str)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (dest / "out.txt").read_text() == ("old\n" if step == "made the staging directory" else "new\n")
