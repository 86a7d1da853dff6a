"""An output that replaces another keeps its permissions (staging.keep_permissions).

The truth is what `cp` does: copied onto an existing file, that file keeps its mode and
group; copied into an existing directory (`cp -rT`), the directory keeps its mode and the
new files inside get the umask's. A new output gets the umask's mode, as a file made by
the shell's `>` or a directory by `mkdir` does.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from databin_utils import reversal_data_bin
from fault_utils import nmt, tiny_checkpoint_state, tiny_run_dir

from nmt_cli.checkpoints.format import save_checkpoint
from nmt_cli.staging import build_then_publish, published_on_success, replace_atomically
from nmt_cli.train.saving import LAST, finish_pending_save, write_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

OTHER_GID = 12345  # a group nobody here is in; only root can give a file to it


@pytest.fixture(autouse=True)
def umask_022():
    """The usual umask, under which the default mode (644, 755) is readable by everyone."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=60, valid=10)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def existing_file(path: Path, permissions: int) -> Path:
    path.write_text("old\n")
    os.chmod(path, permissions)
    return path


def cp_onto(tmp_path: Path, permissions: int) -> int:
    """The mode `cp` leaves on an existing file of mode `permissions` that it copies onto."""
    source = tmp_path / "cp-source"
    source.write_text("new\n")
    target = existing_file(tmp_path / "cp-target", permissions)
    subprocess.run(["cp", source, target], check=True)
    result = mode(target)
    source.unlink()
    target.unlink()
    return result


def new_file_mode(tmp_path: Path) -> int:
    """The mode of a new file the shell makes under this umask."""
    made = tmp_path / "made-by-sh"
    subprocess.run(["sh", "-c", f": > '{made}'"], check=True)
    result = mode(made)
    made.unlink()
    return result


def new_directory_mode(tmp_path: Path) -> int:
    made = tmp_path / "made-by-mkdir"
    subprocess.run(["mkdir", made], check=True)
    result = mode(made)
    made.rmdir()
    return result


@pytest.mark.parametrize("permissions", [0o600, 0o640, 0o400, 0o755], ids=oct)
def test_a_replaced_file_keeps_its_mode_as_cp_leaves_it(tmp_path: Path, permissions: int) -> None:
    expected = cp_onto(tmp_path, permissions)
    target = existing_file(tmp_path / "model.bin", permissions)
    replace_atomically(target, lambda tmp: tmp.write_text("new\n"))
    assert target.read_text() == "new\n" and mode(target) == expected == permissions


def test_a_new_file_gets_the_umasks_mode(tmp_path: Path) -> None:
    target = tmp_path / "model.bin"
    replace_atomically(target, lambda tmp: tmp.write_text("new\n"))
    assert mode(target) == new_file_mode(tmp_path) == 0o644


def test_a_file_replacing_a_private_one_is_private_while_written(tmp_path: Path) -> None:
    target = existing_file(tmp_path / "model.bin", 0o600)
    seen = []
    with published_on_success(target) as tmp:
        tmp.write_text("new\n")
        seen.append(mode(tmp))
    assert seen == [0o600] and mode(target) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to a group it is not in")
def test_a_replaced_file_keeps_its_group_as_cp_leaves_it(tmp_path: Path) -> None:
    source, copied = tmp_path / "cp-source", existing_file(tmp_path / "cp-target", 0o640)
    source.write_text("new\n")
    os.chown(copied, -1, OTHER_GID)
    subprocess.run(["cp", source, copied], check=True)
    target = existing_file(tmp_path / "model.bin", 0o640)
    os.chown(target, -1, OTHER_GID)
    replace_atomically(target, lambda tmp: tmp.write_text("new\n"))
    assert (target.stat().st_gid, mode(target)) == (copied.stat().st_gid, mode(copied)) == (OTHER_GID, 0o640)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to a group it is not in")
def test_a_group_that_cannot_be_kept_gets_no_group_bits(tmp_path: Path, monkeypatch) -> None:
    # As a user not in the replaced file's group: the new file stays in our group, which the
    # replaced file's group bits were not meant for.
    target = existing_file(tmp_path / "model.bin", 0o640)
    os.chown(target, -1, OTHER_GID)

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chown", refused)
    replace_atomically(target, lambda tmp: tmp.write_text("new\n"))
    assert mode(target) == 0o600


@pytest.mark.parametrize("refusal", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EPERM])
def test_a_mount_that_keeps_no_unix_modes_still_has_its_file_replaced(tmp_path: Path, monkeypatch, refusal) -> None:
    """Some network and FUSE mounts refuse chmod and chown outright: the output is replaced
    all the same, with the mode the mount gives it."""
    target = existing_file(tmp_path / "model.bin", 0o640)
    os.chown(target, -1, OTHER_GID)

    def refused(*args, **kwargs):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "chown", refused)
    monkeypatch.setattr(os, "chmod", refused)
    replace_atomically(target, lambda tmp: tmp.write_text("new\n"))
    assert target.read_text() == "new\n"


def test_a_replaced_directory_keeps_its_mode_as_cp_into_it_leaves_it(tmp_path: Path) -> None:
    source, copied = tmp_path / "cp-source", tmp_path / "cp-target"
    source.mkdir()
    (source / "out.txt").write_text("new\n")
    copied.mkdir(mode=0o700)
    subprocess.run(["cp", "-rT", source, copied], check=True)
    dest = tmp_path / "data-bin"
    dest.mkdir(mode=0o700)
    seen = []

    def write(staging: Path) -> None:
        seen.append(mode(staging))
        (staging / "out.txt").write_text("new\n")

    build_then_publish(dest, write, str)
    assert seen == [0o700]  # private while it is built
    assert (mode(dest), mode(dest / "out.txt")) == (mode(copied), mode(copied / "out.txt")) == (0o700, 0o644)


def test_a_new_directory_gets_the_umasks_mode(tmp_path: Path) -> None:
    dest = tmp_path / "data-bin"
    build_then_publish(dest, lambda staging: (staging / "out.txt").write_text("new\n"), str)
    assert mode(dest) == new_directory_mode(tmp_path) == 0o755
    assert mode(dest / "out.txt") == new_file_mode(tmp_path)


def test_checkpoints_of_a_journaled_save_keep_their_modes(tmp_path: Path, data_bin: Path) -> None:
    state = tiny_checkpoint_state(data_bin)
    existing_file(tmp_path / LAST, 0o600)
    existing_file(tmp_path / "checkpoint_best.pt", 0o640)
    write_checkpoints(state, tmp_path, ["checkpoint1.pt", "checkpoint_best.pt", LAST])
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == {
        "checkpoint1.pt": new_file_mode(tmp_path), "checkpoint_best.pt": 0o640, LAST: 0o600}


def test_checkpoints_replacing_private_ones_are_private_while_written(tmp_path: Path, data_bin: Path,
                                                                     monkeypatch) -> None:
    import nmt_cli.train.saving as saving

    existing_file(tmp_path / LAST, 0o600)
    seen = []

    def serialise(state, tmp, path):
        seen.append(mode(tmp))
        real_serialise(state, tmp, path)

    real_serialise = saving.serialise_checkpoint
    monkeypatch.setattr(saving, "serialise_checkpoint", serialise)
    write_checkpoints(tiny_checkpoint_state(data_bin), tmp_path, [LAST])
    assert seen == [0o600] and mode(tmp_path / LAST) == 0o600


def test_a_save_finished_after_a_kill_keeps_the_mode(tmp_path: Path, data_bin: Path) -> None:
    # What a save killed after its journal leaves: the renames, which the next start finishes.
    existing_file(tmp_path / LAST, 0o600)
    tmp = tmp_path / ".checkpoint_last.pt.4194305.tmp"
    save_checkpoint(tiny_checkpoint_state(data_bin), tmp)
    (tmp_path / ".checkpoint_save.json").write_text(f'{{"renames": [["{tmp.name}", "{LAST}"]], "deletions": []}}\n')
    finish_pending_save(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [LAST] and mode(tmp_path / LAST) == 0o600


def test_average_over_a_private_file_keeps_it_private(tmp_path: Path, data_bin: Path) -> None:
    run = tiny_run_dir(data_bin, tmp_path / "run")
    save_checkpoint(tiny_checkpoint_state(data_bin, seed=1), run / "checkpoint_last.pt")
    out = existing_file(tmp_path / "avg.pt", 0o600)
    new = tmp_path / "new.pt"
    for output in (out, new):
        result = nmt(["average", "--inputs", run / "checkpoint_best.pt", "--inputs", run / "checkpoint_last.pt",
                      "-o", output])
        assert result.exit_code == 0, result.output
    assert (mode(out), mode(new)) == (cp_onto(tmp_path, 0o600), new_file_mode(tmp_path))


def test_learn_bpe_over_a_private_model_keeps_it_private(tmp_path: Path) -> None:
    text = tmp_path / "train.txt"
    text.write_text("".join(f"w{i} w{i + 1} w{i * 7 % 13}\n" for i in range(200)))
    existing_file(tmp_path / "m.model", 0o600)
    for prefix in (tmp_path / "m", tmp_path / "fresh"):
        result = nmt(["learn-bpe", "--input", text, "--vocab-size", "30", "--model-prefix", prefix])
        assert result.exit_code == 0, result.output
    assert (mode(tmp_path / "m.model"), mode(tmp_path / "fresh.model")) == (0o600, new_file_mode(tmp_path))


def test_export_force_over_a_private_directory_keeps_it_private(tmp_path: Path, data_bin: Path) -> None:
    run = tiny_run_dir(data_bin, tmp_path / "run")
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    out.mkdir(mode=0o700)
    shutil.copyfile(run / "meta.json", out / "other.json")  # files of another output: --force replaces them
    for dest in (out, fresh):
        result = nmt(["export", run / "checkpoint_best.pt", dest, "--format", "fairseq", "--force"])
        assert result.exit_code == 0, result.output
    assert (mode(out), mode(fresh)) == (0o700, new_directory_mode(tmp_path))
    assert "other.json" not in os.listdir(out)
    assert {mode(p) for p in out.iterdir()} == {new_file_mode(tmp_path)}  # new files: the umask's mode


def test_binarize_over_private_files_keeps_them_private(tmp_path: Path) -> None:
    dictionary = tmp_path / "dict.txt"
    dictionary.write_text("a 3\nb 2\n")
    text = tmp_path / "text.txt"
    text.write_text("a b\nb a a\n")
    old = [existing_file(tmp_path / f"t{suffix}", permissions) for suffix, permissions in ((".bin", 0o600),
                                                                                         (".idx", 0o640))]
    for prefix in (tmp_path / "t", tmp_path / "fresh"):
        result = nmt(["binarize", "--dict", dictionary, "--input", text, "--output-prefix", prefix])
        assert result.exit_code == 0, result.output
    assert [mode(path) for path in old] == [cp_onto(tmp_path, 0o600), cp_onto(tmp_path, 0o640)]
    assert {mode(tmp_path / f"fresh{suffix}") for suffix in (".bin", ".idx")} == {new_file_mode(tmp_path)}
