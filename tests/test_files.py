"""nmt_cli/files.py: where a file output may go, and how it reaches its place."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt_cli.checkpoints.format import save_checkpoint
from nmt_cli.errors import NmtError
from nmt_cli.files import published_output, refuse_overwriting_inputs, write_output

REPOSITORY = Path(__file__).resolve().parent.parent
linux_descriptors = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


@pytest.mark.parametrize("spelling", ["{input}/", "{input}/.", "{dir}", "{dir}/", "{new}/"])
def test_an_output_naming_a_directory_is_one_error_and_writes_nothing(tmp_path: Path, spelling: str) -> None:
    source = tmp_path / "t.en"
    source.write_text("the input\n")
    (tmp_path / "d").mkdir()
    output = spelling.format(input=source, dir=tmp_path / "d", new=tmp_path / "new")
    for check in (lambda: refuse_overwriting_inputs(output, [("--input", source)]),
                  lambda: published_output(output, "w").__enter__()):
        with pytest.raises(NmtError, match=r"^--output .* names a directory; give a file name$"):
            check()
    assert source.read_text() == "the input\n"  # `t.en/` was renamed over t.en
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t.en"]  # `new/` was written as a file `new`


def test_an_empty_output_is_its_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for check in (lambda: refuse_overwriting_inputs("", [("--input", "t.en")]),
                  lambda: published_output("", "w").__enter__()):
        with pytest.raises(NmtError, match="^--output is empty; give a file name$"):
            check()


def write_to(output: str, stdout, **redirects) -> None:
    """`published_output(output)` writing "new" in a process whose stdout is `stdout`."""
    code = f"from nmt_cli.files import published_output\nwith published_output({output!r}, 'w') as out: out.write('new\\n')"
    subprocess.run([sys.executable, "-c", code], stdout=stdout, check=True, **redirects,
                   env={**os.environ, "PYTHONPATH": str(REPOSITORY)})


@linux_descriptors
@pytest.mark.parametrize("output", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/dev/stderr"])
def test_a_descriptor_of_a_file_opened_for_appending_is_appended_to(tmp_path: Path, output: str) -> None:
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    with open(log, "a") as appending:  # `nmt ... -o /dev/stdout >> log.txt`
        write_to(output, appending, stderr=appending)
    assert log.read_text() == "earlier\nnew\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]


@linux_descriptors
def test_a_descriptor_is_written_where_it_stands(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    with open(log, "w") as shared:  # `{ echo before; nmt ... -o /dev/stdout; echo after; } > log.txt`
        shared.write("before\n")
        shared.flush()
        write_to("/dev/stdout", shared)
        shared.write("after\n")
    assert log.read_text() == "before\nnew\nafter\n"


@linux_descriptors
def test_a_descriptor_that_is_not_open_is_one_error(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)  # a number this process has no descriptor for
    with pytest.raises(NmtError, match=f"^cannot write /dev/fd/{fd}: Bad file descriptor$"):
        published_output(f"/dev/fd/{fd}", "w").__enter__()


def test_a_file_output_is_still_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with published_output(str(out), "w") as stream:
        stream.write("new\n")
        assert out.read_text() == "old\n"
    assert out.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_the_longest_file_name_can_be_published(tmp_path: Path) -> None:
    name = "x" * os.pathconf(tmp_path, "PC_NAME_MAX")
    with published_output(str(tmp_path / name), "w") as stream:
        stream.write("new\n")
    assert [p.name for p in tmp_path.iterdir()] == [name] and (tmp_path / name).read_text() == "new\n"


@pytest.mark.parametrize("spelling", ["{run}/checkpoint_last.pt/", "{run}", "{run}/.", ""])
def test_a_checkpoint_path_naming_a_directory_is_one_error(tmp_path: Path, spelling: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"the run's checkpoint")
    with pytest.raises(NmtError, match=r"^checkpoint .*(names a directory|is empty); give a file name$"):
        save_checkpoint({"model": {}}, spelling.format(run=run))
    assert (run / "checkpoint_last.pt").read_bytes() == b"the run's checkpoint"


class _FillingDisk(io.RawIOBase):
    """A raw stream (stdout under PYTHONUNBUFFERED) that takes at most 3 bytes a write,
    as a disk filling up does, and then none: its next write fails."""

    def __init__(self, room: int) -> None:
        self.written, self.room = bytearray(), room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.room == 0:
            raise OSError(errno.EFBIG, "File too large")
        taken = bytes(data[: min(3, self.room)])
        self.written += taken
        self.room -= len(taken)
        return len(taken)


def test_a_raw_output_that_takes_part_of_a_write_gets_the_rest_or_an_error() -> None:
    roomy = _FillingDisk(room=100)
    write_output(roomy, b"one line\nanother\n", "-")
    assert bytes(roomy.written) == b"one line\nanother\n"  # each write took 3 bytes of it
    full = _FillingDisk(room=7)
    with pytest.raises(NmtError, match="^cannot write <stdout>: File too large$"):
        write_output(full, b"one line\nanother\n", "-")
