"""Nothing lost, nothing mixed: directory locks, outputs that appear only whole, checkpoint
saves that a kill at any moment cannot tear apart, earlier runs and inputs never overwritten.

Kill points are real: a forked child of this process runs the command and SIGKILLs itself
right after a chosen rename, so nothing of its own cleanup runs, as in a crash.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from databin_utils import WORDS, reversal_data_bin, reversal_pairs, write_data_bin
from fault_utils import REPO, SUBPROCESS_ENV, assert_one_error, model_equal, nmt, tiny_run_dir

from nmt_cli.checkpoints.format import load_checkpoint, save_checkpoint
from nmt_cli.cli import main
from nmt_cli.data.indexed import IndexedDataset, dataset_exists
from nmt_cli.errors import NmtError
from nmt_cli.run_lock import directory_lock, lock_path_for
from nmt_cli.train.saving import PENDING_SAVE

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "20", "--device", "cpu"]
# Eight updates in two epochs, validated and saved every two (four saves, each a new best),
# the newest two numbered by updates kept.
RUN = [*TINY, "--max-update", "8", "--save-interval-updates", "2", "--validate-interval-updates", "2",
       "--keep-interval-updates", "2", "--log-interval", "1"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=120, valid=20)


def run_killed_at_rename(args: list, kill_at: Callable[[str], bool], occurrence: int = 1, before: bool = False) -> int:
    """Run `nmt ARGS` in a forked child that SIGKILLs itself right after (or `before`) its
    `occurrence`-th rename onto a file whose name `kill_at` accepts; return the child's exit
    status (minus the signal number when killed)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            real_replace, seen = os.replace, []

            def replace(src, dst, *rest, **kwargs):
                if kill_at(Path(dst).name):
                    seen.append(dst)
                if before and len(seen) == occurrence:
                    os.kill(os.getpid(), signal.SIGKILL)
                real_replace(src, dst, *rest, **kwargs)
                if len(seen) == occurrence:
                    os.kill(os.getpid(), signal.SIGKILL)

            os.replace = replace
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            main([str(a) for a in args], prog_name="nmt", standalone_mode=False)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001
            code = 71
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


# --- item 1: one writer per directory ----------------------------------------------------------


HOLDER = """
import sys
from pathlib import Path
from nmt_cli.run_lock import directory_lock
with directory_lock(Path(sys.argv[1]), "--save-dir"):
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes stdin (or kills this process)
"""


def start_holder(directory: Path) -> subprocess.Popen:
    """Another process holding the lock of `directory` until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], cwd=REPO, env=SUBPROCESS_ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_writer_of_a_run_directory_or_data_bin_is_refused_naming_the_holder(tmp_path, data_bin):
    run, dest = tmp_path / "run", tmp_path / "data-bin"
    raw = tmp_path / "raw"
    pairs = reversal_pairs(30, seed=3)
    for lang, side in (("src", 0), ("tgt", 1)):
        Path(f"{raw}.{lang}").write_text("".join(" ".join(p[side]) + "\n" for p in pairs))
    commands = {
        run: ["train", data_bin, "--save-dir", run, *RUN],
        dest: ["preprocess", "-s", "src", "-t", "tgt", "--trainpref", raw, "--destdir", dest, "--bpe", "none",
               "--tokenizer", "none"],
    }
    for directory, args in commands.items():
        holder = start_holder(directory)
        try:
            result = nmt(args)
            line = assert_one_error(result.exit_code, result.stderr, "in use by another nmt process",
                                    f"pid {holder.pid} on host {socket.gethostname()}")
            assert str(directory) in line
            assert not directory.exists() or not any(directory.iterdir())  # nothing written
        finally:
            holder.stdin.close()
            assert holder.wait(timeout=60) == 0
        assert nmt(args).exit_code == 0  # free again once the holder has ended
    # binarize into that data-bin takes the same lock as preprocess --destdir.
    holder = start_holder(dest)
    try:
        result = nmt(["binarize", "--dict", dest / "dict.src.txt", "--input", f"{raw}.src",
                      "--output-prefix", dest / "test1.src-tgt.src"])
        assert_one_error(result.exit_code, result.stderr, "in use by another nmt process", f"pid {holder.pid}")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_the_lock_of_a_killed_process_is_released_by_the_os(tmp_path):
    run = tmp_path / "run"
    holder = start_holder(run)
    with pytest.raises(NmtError, match=f"pid {holder.pid}"):
        with directory_lock(run, "--save-dir"):
            pass
    holder.kill()
    holder.wait(timeout=60)
    assert lock_path_for(run) == tmp_path / ".run.lock" and lock_path_for(run).exists()  # left, but not held
    with directory_lock(tmp_path / "." / "run", "--save-dir"):  # another spelling, the same lock
        with pytest.raises(NmtError, match=f"pid {os.getpid()} on host"):
            with directory_lock(run, "--save-dir"):
                pass
    assert not lock_path_for(run).exists()  # a holder that ends normally removes it


# --- the input read once ---------------------------------------------------------------------------


def test_a_piped_input_is_translated_whole_with_the_progress_bar_on(tmp_path, data_bin):
    """`-i /dev/stdin` (or `<(zcat x.gz)`) with stderr on a terminal: counting lines for the
    progress bar must not drain the pipe before translating it."""
    run = tiny_run_dir(data_bin, tmp_path / "run")
    lines = [" ".join(WORDS[i % 7: i % 7 + 3]) for i in range(25)]
    out = tmp_path / "hyp.txt"
    master, slave = pty.openpty()  # stderr is a terminal, so the progress bar is shown
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "translate", "--path", run / "checkpoint_best.pt", "--device", "cpu",
         "--beam", "1", "-i", "/dev/stdin", "-o", out],
        cwd=REPO, env=SUBPROCESS_ENV, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    terminal = []
    reader = threading.Thread(target=_drain, args=(master, terminal), daemon=True)
    reader.start()
    proc.communicate("".join(line + "\n" for line in lines).encode(), timeout=300)
    reader.join(timeout=30)
    os.close(master)
    assert proc.returncode == 0, b"".join(terminal).decode(errors="replace")[-2000:]
    assert len(out.read_text().splitlines()) == len(lines)


def _drain(fd: int, sink: list) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            return
        if not chunk:
            return
        sink.append(chunk)


# --- item 2: outputs that appear only whole --------------------------------------------------------


def test_translate_output_is_left_untouched_when_translating_stops(tmp_path, data_bin, monkeypatch):
    run = tiny_run_dir(data_bin, tmp_path / "run")
    out = tmp_path / "hyp.txt"
    out.write_text("an earlier translation\n")
    os.chmod(out, 0o640)
    args = ["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu", "--beam", "1",
            "--buffer-size", "1", "-o", out]
    bad_utf8 = b"w1 w2\nw3 w4\n\xff w5\nw6\n"
    result = nmt(args, input=bad_utf8)  # stops at line 3, after two lines were translated
    assert_one_error(result.exit_code, result.stderr, "invalid UTF-8")
    assert out.read_text() == "an earlier translation\n"

    import nmt_cli.decode.translator as translator_module

    real_translate, calls = translator_module.Translator.translate, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_translate(self, *args, **kwargs)

    monkeypatch.setattr(translator_module.Translator, "translate", interrupted)
    result = nmt(args, input="w1 w2\nw3 w4\nw5\n")  # Ctrl-C after the first chunk
    assert result.exit_code == 130
    assert out.read_text() == "an earlier translation\n"
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    result = nmt(args, input="w1 w2\nw3 w4\nw5\n")
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 3
    assert out.stat().st_mode & 0o777 == 0o640  # the file replaced keeps its permissions
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_apply_bpe_output_is_left_untouched_when_segmenting_stops(tmp_path):
    from nmt_cli.text.bpe import learn_bpe

    model = tmp_path / "bpe.model"
    learn_bpe((" ".join(WORDS[i % 9: i % 9 + 4]) for i in range(200)), model, 18, 0, 1)
    out = tmp_path / "out.txt"
    out.write_text("earlier pieces\n")
    source = tmp_path / "in.txt"
    source.write_bytes(b"w1 w2\nw3\n\xff w4\n")
    result = nmt(["apply-bpe", "--model", model, "--input", source, "--output", out])
    assert_one_error(result.exit_code, result.stderr, f"{source}:3")
    assert out.read_text() == "earlier pieces\n" and not list(tmp_path.glob(".out.txt.*"))
    source.write_bytes(b"w1 w2\nw3\n")
    assert nmt(["apply-bpe", "--model", model, "--input", source, "--output", out]).exit_code == 0
    assert len(out.read_text().splitlines()) == 2


def binarize_text(path: Path, rows: list[list[str]]) -> Path:
    path.write_text("".join(" ".join(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("kill_after", [".bin", ".idx"])
def test_binarize_replaces_bin_and_idx_as_a_unit(tmp_path, data_bin, kill_after):
    """A kill between the two renames must not leave a new .bin read through the old .idx:
    both texts have the same sentence lengths, so the sizes alone cannot tell them apart."""
    prefix, reference = tmp_path / "bin" / "test1.src-tgt.src", tmp_path / "ref" / "test1.src-tgt.src"
    old_text = binarize_text(tmp_path / "old.txt", [["w1", "w2", "w3"], ["w4", "w5"]])
    new_text = binarize_text(tmp_path / "new.txt", [["w6", "w7", "w8"], ["w9", "w10"]])

    def binarize(text: Path, output: Path) -> list:
        return ["binarize", "--dict", data_bin / "dict.src.txt", "--input", text, "--output-prefix", output]

    def contents(output: Path) -> list[list[int]]:
        dataset = IndexedDataset(output)
        return [dataset[i].tolist() for i in range(len(dataset))]

    assert nmt(binarize(new_text, reference)).exit_code == 0
    assert nmt(binarize(old_text, prefix)).exit_code == 0
    old, new = contents(prefix), contents(reference)
    status = run_killed_at_rename(binarize(new_text, prefix), lambda name: name == prefix.name + kill_after)
    assert status == -signal.SIGKILL
    if kill_after == ".idx":
        assert contents(prefix) == new  # the .idx comes last: once it is in place the pair is complete
    else:
        assert not dataset_exists(prefix)  # a .bin without its .idx: a missing split, never a mixed one
        assert old != new
    assert nmt(binarize(new_text, prefix)).exit_code == 0  # a rerun completes the pair
    assert contents(prefix) == new


# --- item 3: checkpoint saves that resume can trust -------------------------------------------------


@pytest.fixture(scope="module")
def straight_run(data_bin, tmp_path_factory) -> tuple[Path, list[str]]:
    """The uninterrupted run the killed ones must end like, and the names it renamed onto, in order."""
    run = tmp_path_factory.mktemp("straight") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    real_replace, renamed = os.replace, []

    def replace(src, dst, *rest, **kwargs):
        renamed.append(Path(dst).name)
        real_replace(src, dst, *rest, **kwargs)

    os.replace = replace
    try:
        result = nmt(["train", data_bin, "--save-dir", run, *RUN])
    finally:
        os.replace = real_replace
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    assert load_checkpoint(run / "checkpoint_best.pt")["num_updates"] == 8, "the last save should be a best"
    return run, renamed


def assert_same_run(run: Path, straight: Path) -> None:
    names = sorted(p.name for p in run.iterdir())
    assert names == sorted(p.name for p in straight.iterdir())  # no journal, no temporary file left
    for name in names:
        if name.endswith(".pt"):
            mine, theirs = load_checkpoint(run / name), load_checkpoint(straight / name)
            assert mine["num_updates"] == theirs["num_updates"], name
            assert model_equal(mine["model"], theirs["model"]), name


NUMBERED_8 = re.compile(r"checkpoint_\d+_8\.pt")


# Where in the last save (update 8, a best) the child is killed: right after or before
# (True) it renames a file onto the name that the function accepts.
KILL_POINTS = {
    "before the journal, its files written": (lambda name: name == PENDING_SAVE, True),
    "after the journal": (lambda name: name == PENDING_SAVE, False),
    "after the numbered checkpoint": (lambda name: bool(NUMBERED_8.fullmatch(name)), False),
    "after checkpoint_best.pt": (lambda name: name == "checkpoint_best.pt", False),
    "after checkpoint_last.pt": (lambda name: name == "checkpoint_last.pt", False),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_run_killed_at_any_point_of_a_save_resumes_to_the_uninterrupted_result(tmp_path, data_bin,
                                                                                straight_run, point):
    straight, renamed = straight_run
    kill_at, before = KILL_POINTS[point]
    last_save = sum(map(kill_at, renamed))  # the occurrence in the final save
    assert last_save > 0
    run = tmp_path / "run"
    status = run_killed_at_rename(["train", data_bin, "--save-dir", run, *RUN], kill_at, last_save, before)
    assert status == -signal.SIGKILL
    result = nmt(["train", data_bin, "--save-dir", run, *RUN])
    assert result.exit_code == 0, result.output
    assert_same_run(run, straight)


def test_a_stale_best_checkpoint_is_repaired_on_resume(tmp_path, data_bin, straight_run):
    """An earlier version wrote checkpoint_best.pt after checkpoint_last.pt: killed between the
    two, the best file kept an older model while the run recorded a better one."""
    run = tmp_path / "run"
    straight, _ = straight_run
    shutil.copytree(straight, run)
    older = next(run.glob("checkpoint_*_6.pt"))
    shutil.copyfile(older, run / "checkpoint_best.pt")
    result = nmt(["train", data_bin, "--save-dir", run, *RUN])
    assert result.exit_code == 0, result.output
    assert "checkpoint_best.pt was stale" in result.stderr and "copy of checkpoint_last.pt" in result.stderr
    assert_same_run(run, straight)
    (run / "checkpoint_best.pt").unlink()
    (run / "checkpoint_last.pt").unlink()
    shutil.copyfile(next(run.glob("checkpoint_*_6.pt")), run / "checkpoint_last.pt")  # a non-final last: not a best
    for numbered in run.glob("checkpoint_*_8.pt"):
        numbered.unlink()
    result = nmt(["train", data_bin, "--save-dir", run, *RUN, "--max-update", "6"])
    assert "checkpoint_best.pt was missing" in result.stderr
    assert model_equal(load_checkpoint(run / "checkpoint_best.pt")["model"],
                       load_checkpoint(next(run.glob("checkpoint_*_6.pt")))["model"])


# --- item 4: an earlier run is never trained over ---------------------------------------------------


def test_a_run_directory_with_history_but_no_last_checkpoint_is_refused(tmp_path, data_bin):
    run = tmp_path / "run"
    run.mkdir()
    earlier = {"checkpoint_best.pt": b"an earlier model", "checkpoint_3_900.pt": b"another",
               "train_log.jsonl": b'{"type": "train"}\n'}
    for name, content in earlier.items():
        (run / name).write_bytes(content)
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "2"])
    assert_one_error(result.exit_code, result.stderr, "holds an earlier run", "checkpoint_best.pt",
                     "checkpoint_3_900.pt", "train_log.jsonl", "no checkpoint_last.pt", "--reset-run")
    assert {name: (run / name).read_bytes() for name in earlier} == earlier
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "2", "--reset-run"])
    assert result.exit_code == 0, result.output
    assert not (run / "checkpoint_3_900.pt").exists()  # nothing of the earlier run is left to mix with
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert [(r["type"], r["update"]) for r in records] == [("valid", 2)]  # this run's record alone


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path, data_bin):
    """Its log alone, beside the config.json of the same command, is no earlier run to keep."""
    args = ["train", data_bin, "--save-dir", tmp_path / "run", *TINY, "--max-update", "2", "--log-interval", "1"]
    assert nmt(args).exit_code == 0
    log = (tmp_path / "run" / "train_log.jsonl").read_text()
    for checkpoint in (tmp_path / "run").glob("*.pt"):
        checkpoint.unlink()
    assert nmt(args).exit_code == 0
    assert (tmp_path / "run" / "train_log.jsonl").read_text().count("\n") == log.count("\n")
    for checkpoint in (tmp_path / "run").glob("*.pt"):
        checkpoint.unlink()
    result = nmt([*args, "--lr", "1e-3"])  # another command: the log is another run's
    assert_one_error(result.exit_code, result.stderr, "holds an earlier run (train_log.jsonl)")


def test_reset_run_never_deletes_the_checkpoint_it_is_to_finetune_from(tmp_path, data_bin):
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(load_checkpoint(tiny_run_dir(data_bin, tmp_path / "tiny") / "checkpoint_best.pt"),
                    run / "checkpoint_best.pt")
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "2", "--reset-run",
                  "--finetune-from", run / "checkpoint_best.pt"])
    assert_one_error(result.exit_code, result.stderr, "--finetune-from", "--reset-run deletes")
    assert (run / "checkpoint_best.pt").exists()


def test_resuming_on_another_data_bin_is_refused(tmp_path, data_bin):
    other = write_data_bin(tmp_path / "other", {"train": reversal_pairs(120, seed=7), "valid": reversal_pairs(20, 1)})
    run = tmp_path / "run"
    assert nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "2"]).exit_code == 0
    before = (run / "checkpoint_last.pt").read_bytes()
    result = nmt(["train", other, "--save-dir", run, *TINY, "--max-update", "4"])
    assert_one_error(result.exit_code, result.stderr, "trained on other data", str(other), "--finetune-from")
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "4"]).exit_code == 0  # its own: fine


# --- item 5: no command writes over its own inputs --------------------------------------------------


def test_no_command_writes_over_one_of_its_inputs(tmp_path, data_bin):
    run = tiny_run_dir(data_bin, tmp_path / "run")
    checkpoint = run / "checkpoint_best.pt"
    os.link(checkpoint, tmp_path / "hard-link.pt")
    text = tmp_path / "in.txt"
    text.write_text("w1 w2\n")
    bpe_model = tmp_path / "bpe.model"  # the refusal comes before the model is read
    bpe_model.write_bytes(b"a model")
    for numbered in ("checkpoint_1_2.pt", "checkpoint_1_4.pt"):
        shutil.copyfile(checkpoint, run / numbered)
    shutil.copyfile(checkpoint, run / "checkpoint_last.pt")
    translate = ["translate", "--path", checkpoint, "--device", "cpu", "-i", text]
    cases = {
        "translate -o its checkpoint": ([*translate, "-o", checkpoint], "--path"),
        "translate -o a hard link to its checkpoint": ([*translate, "-o", tmp_path / "hard-link.pt"], "--path"),
        "translate -o its dictionary": ([*translate, "-o", run / "dict.src.txt"], "data file"),
        "apply-bpe --output its model": (["apply-bpe", "--model", bpe_model, "--input", text, "--output", bpe_model],
                                         "--model"),
        "average --output the run's last checkpoint": (
            ["average", "--inputs", run, "--num-update-checkpoints", "2", "--output", run / "checkpoint_last.pt"],
            "--inputs"),
        "learn-bpe over its input": (["learn-bpe", "--input", bpe_model, "--vocab-size", "8", "--model-prefix",
                                      tmp_path / "bpe"], "--input"),
        "binarize over its input": (["binarize", "--dict", run / "dict.src.txt", "--input", tmp_path / "x.bin",
                                     "--output-prefix", tmp_path / "x"], "--input"),
    }
    shutil.copyfile(text, tmp_path / "x.bin")
    files = [checkpoint, run / "dict.src.txt", bpe_model, run / "checkpoint_last.pt", tmp_path / "x.bin"]
    before = {path: path.read_bytes() for path in files}
    for case, (args, flag) in cases.items():
        result = nmt(args)
        assert result.exit_code == 1, (case, result.output)
        assert_one_error(result.exit_code, result.stderr, "is the input", flag)
    assert {path: path.read_bytes() for path in files} == before
    dictionary = tmp_path / "dest" / "dict.src.txt"
    dictionary.parent.mkdir()
    shutil.copyfile(run / "dict.src.txt", dictionary)
    result = nmt(["preprocess", "-s", "src", "-t", "tgt", "--trainpref", tmp_path / "in", "--destdir",
                  tmp_path / "dest", "--srcdict", dictionary, "--bpe", "none", "--force"])
    assert_one_error(result.exit_code, result.stderr, "inside --destdir")
    assert dictionary.read_bytes() == (run / "dict.src.txt").read_bytes()
