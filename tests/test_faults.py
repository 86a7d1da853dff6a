"""Faults: crashes at random moments, full disks, unwritable outputs, unsafe files, bad numerics.

Crash tests kill real `nmt` processes with SIGKILL at seeded random delays (the fork
server of fault_utils makes each kill point cost milliseconds of start-up) and check
after every kill that nothing on disk looks complete when it is not, then that a rerun
finishes with exactly the result of an uninterrupted run.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from databin_utils import reversal_data_bin
from fault_utils import (
    ForkServer,
    assert_one_error,
    model_equal,
    nmt,
    tiny_checkpoint_state,
    tiny_run_dir,
    write_evil_checkpoint,
    write_evil_pickle,
)

import nmt_cli.checkpoints.format as checkpoint_module
import nmt_cli.data.indexed as indexed_module
import nmt_cli.train.log as log_module
import nmt_cli.train.saving as saving_module
from nmt_cli.checkpoints.format import load_checkpoint, save_checkpoint
from nmt_cli.cli import main
from nmt_cli.data.indexed import IndexedDataset
from nmt_cli.train import step as step_module
from nmt_cli.train import trainer as trainer_module

TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "20", "--device", "cpu"]
# Files a run directory may hold besides checkpoints.
RUN_FILES = {"meta.json", "dict.src.txt", "dict.tgt.txt", "config.json", "train_log.jsonl"}
# What a write in progress looks like: a hidden temporary file, for a checkpoint or for
# one of the run files (they are replaced whole too, and train_log.jsonl when a resumed
# run cuts it back), the probe of a writable save directory, or the journal of a save
# (and its own temporary file) that names the checkpoints about to be renamed into place.
TEMP_NAME = re.compile(r"^\.(checkpoint|meta\.json|dict\.|config\.json|train_log\.jsonl|write-test).*\.tmp$"
                       r"|^\.{1,2}checkpoint_save\.json(\.\d+\.tmp)?$")
KILLS = 24  # kill points of the training run (CI requires at least 20)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=120, valid=20)


@pytest.fixture(scope="module")
def server():
    fork_server = ForkServer()
    yield fork_server
    fork_server.close()


# --- crash safety: train --------------------------------------------------------------------


def check_run_dir_after_kill(run: Path) -> dict:
    """Every *.pt loads; anything else is a known run file or a hidden temporary file."""
    if not run.exists():
        return {"last": None, "temp_files": 0}
    names = [p.name for p in run.iterdir()]
    for name in names:
        if name.endswith(".pt"):
            load_checkpoint(run / name)  # raises on a truncated or partial file
        else:
            assert name in RUN_FILES or TEMP_NAME.match(name), f"unexpected file {name}"
    return {"last": resume_point(run, names), "temp_files": sum(bool(TEMP_NAME.match(n)) for n in names)}


def resume_point(run: Path, names: list[str]) -> int | None:
    """The update a restart resumes from: checkpoint_last.pt's, or, when a save's journal
    is there (killed after the save was committed, before its renames), the update of the
    file that the journal renames to checkpoint_last.pt."""
    if saving_module.PENDING_SAVE in names:
        journal = json.loads((run / saving_module.PENDING_SAVE).read_text())
        pending = run / next(tmp for tmp, name in journal["renames"] if name == "checkpoint_last.pt")
        if pending.exists():
            return load_checkpoint(pending)["num_updates"]
    return load_checkpoint(run / "checkpoint_last.pt")["num_updates"] if "checkpoint_last.pt" in names else None


def comparable_log(run: Path) -> list[dict]:
    """train_log.jsonl without the fields that depend on wall-clock time."""
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall", "tokens_per_s", "eval_bleu_seconds")} for r in records]


def test_train_killed_at_many_random_moments_ends_like_an_uninterrupted_run(tmp_path, data_bin, server):
    # Dropout on: the resumed runs must also draw the same dropout masks. A checkpoint
    # every update, validation every 3 and epochs of 4 updates put kills into every phase.
    args = [*TINY, "--dropout", "0.1", "--max-update", "36", "--save-interval-updates", "1",
            "--validate-interval-updates", "3", "--keep-interval-updates", "3", "--keep-last-epochs", "2",
            "--log-interval", "2"]
    straight = tmp_path / "straight"
    full = server.run(["train", data_bin, "--save-dir", straight, *args], tmp_path / "straight.log")
    assert full.status == 0, (tmp_path / "straight.log").read_text()[-3000:]
    # Re-running a finished run only starts up and stops: that is the start-up time.
    startup = server.run(["train", data_bin, "--save-dir", straight, *args], tmp_path / "again.log").seconds
    work = max(full.seconds - startup, 0.5)

    # The delays come from timings, which a busy machine makes wrong: the span shrinks when a
    # kill lets several updates through, and a run that finishes with too few kill points is
    # checked, then followed by another run from scratch, until there are enough in all.
    rng = random.Random(20240611)
    span = 2 * work / KILLS  # of training time per kill: one update on average, if the timings hold
    kills: list[dict] = []
    for round_ in range(1, 5):
        killed = tmp_path / f"killed{round_}"
        round_kills, span = kill_until_finished(server, data_bin, killed, args, KILLS - len(kills),
                                                rng, startup, span, tmp_path)
        check_finished_like(killed, straight, round_kills)
        kills += round_kills
        if len(kills) >= KILLS:
            break
    assert len(kills) >= 20, f"only {len(kills)} kill points in {round_} runs"


def kill_until_finished(server, data_bin, killed, args, wanted, rng, startup, span, tmp_path) -> tuple[list[dict], float]:
    """SIGKILL training in `killed` at random moments, `wanted` times at most, and let it
    finish; the state after each kill, and the span of delays to go on with."""
    kills, stalled = [], 0
    for attempt in itertools.count(1):
        log = tmp_path / f"{killed.name}-attempt{attempt}.log"
        before = check_run_dir_after_kill(killed)["last"]
        delay = rng.uniform(0.5 * startup, startup + span) if len(kills) < wanted else None
        result = server.run(["train", data_bin, "--save-dir", killed, *args], log, kill_after=delay)
        assert_resumed_from(log, killed, before)
        if not result.killed:
            assert result.status == 0, log.read_text()[-3000:]
            return kills, span
        kills.append(check_run_dir_after_kill(killed))
        progress = (kills[-1]["last"] or 0) - (before or 0)
        stalled = stalled + 1 if progress == 0 else 0
        if progress > 3:
            span /= 2  # kill sooner
        elif stalled >= 3:
            span, stalled = span * 2, 0  # kill later: the run must get somewhere


def check_finished_like(killed: Path, straight: Path, kills: list[dict]) -> None:
    """The killed run, finished, equals the uninterrupted one, and its progress never went back."""
    assert comparable_log(killed) == comparable_log(straight)
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        assert model_equal(load_checkpoint(killed / name)["model"], load_checkpoint(straight / name)["model"]), name
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in straight.iterdir())  # no temp files left
    # Progress on disk never goes back: once checkpoint_last.pt exists, its update count only grows.
    saved = [k["last"] for k in kills]
    first = next((i for i, last in enumerate(saved) if last is not None), len(saved))
    assert None not in saved[first:] and saved[first:] == sorted(saved[first:])
    print(f"{len(kills)} kills; {sum(k['temp_files'] > 0 for k in kills)} during a checkpoint write; "
          f"checkpoint_last.pt at updates {saved}")


def assert_resumed_from(log: Path, run: Path, last: int | None) -> None:
    """When the attempt got far enough to say so, it resumed from the last complete checkpoint."""
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    found = re.search(r"resumed from (\S+) at update (\d+)", text)
    if found:
        assert found.group(1) == str(run / "checkpoint_last.pt") and int(found.group(2)) == last, found.group(0)
    elif last is not None:
        assert "model transformer_tiny" not in text, "training started without resuming"


# --- crash safety: preprocess and average ----------------------------------------------------


def write_raw_corpus(root: Path) -> Path:
    rng = random.Random(3)
    words = ["".join(rng.choice("aeioubdfgklmnprst") for _ in range(rng.randint(2, 6))) for _ in range(50)]
    for split, count in (("train", 400), ("valid", 20)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(count)]
        (root / f"{split}.en").write_text("".join(l.capitalize() + ".\n" for l in lines), encoding="utf-8")
        (root / f"{split}.de").write_text("".join(l[::-1] + " .\n" for l in lines), encoding="utf-8")
    return root


def preprocess_args(raw: Path, destdir: Path) -> list:
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "valid",
            "--destdir", destdir, "--joined-dictionary", "--bpe-size", "120"]


def test_preprocess_killed_leaves_no_complete_looking_destdir(tmp_path, server):
    raw = write_raw_corpus(tmp_path)
    straight = server.run(preprocess_args(raw, tmp_path / "straight-bin"), tmp_path / "straight.log")
    assert straight.status == 0, (tmp_path / "straight.log").read_text()
    dest = tmp_path / "data-bin"
    rng = random.Random(7)
    completed = False
    for attempt in range(8):
        result = server.run(preprocess_args(raw, dest), tmp_path / f"attempt{attempt}.log",
                            kill_after=rng.uniform(0, straight.seconds))
        completed = completed or not result.killed
        assert result.killed or result.status == 0
        if dest.exists():
            assert completed, "a killed preprocess left a destdir behind"
            assert_same_data_bin(dest, tmp_path / "straight-bin")
    final = server.run(preprocess_args(raw, dest), tmp_path / "final.log")
    assert final.status == 0, (tmp_path / "final.log").read_text()
    assert_same_data_bin(dest, tmp_path / "straight-bin")
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def assert_same_data_bin(dest: Path, expected: Path) -> None:
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in expected.iterdir())
    for path in expected.iterdir():
        if path.name != "meta.json":  # meta.json records the destination; the data must be identical
            assert (dest / path.name).read_bytes() == path.read_bytes(), path.name
    assert len(IndexedDataset(dest / "train.en-de.en")) > 0


def test_average_killed_leaves_no_partial_output(tmp_path, data_bin, server):
    # Wider layers so that averaging takes long enough to be killed part-way.
    wide = {"encoder_embed_dim": 256, "decoder_embed_dim": 256, "encoder_ffn_embed_dim": 1024,
            "decoder_ffn_embed_dim": 1024}
    inputs = []
    for seed in range(4):
        inputs.append(tmp_path / f"checkpoint_1_{seed + 1}.pt")
        save_checkpoint(tiny_checkpoint_state(data_bin, seed, wide), inputs[-1])
    output = tmp_path / "out" / "avg.pt"
    args = ["average", "--inputs", *inputs, "--output"]
    straight = server.run([*args, tmp_path / "straight.pt"], tmp_path / "straight.log")
    assert straight.status == 0, (tmp_path / "straight.log").read_text()
    expected = load_checkpoint(tmp_path / "straight.pt")["model"]
    rng = random.Random(11)
    for attempt in range(8):
        result = server.run([*args, output], tmp_path / f"attempt{attempt}.log", kill_after=rng.uniform(0, straight.seconds))
        if output.exists():  # only ever the complete average
            assert model_equal(load_checkpoint(output)["model"], expected)
        assert result.killed or result.status == 0
        output.unlink(missing_ok=True)
    assert server.run([*args, output], tmp_path / "final.log").status == 0
    assert model_equal(load_checkpoint(output)["model"], expected)
    assert [p.name for p in output.parent.iterdir()] == ["avg.pt"]  # temporary files of killed runs are gone


# --- disk full and unwritable outputs ------------------------------------------------------------


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fail_on_call(real, failing_call: int):
    """`real`, except that call number `failing_call` (1-based) fails with ENOSPC."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing_call:
            disk_full()
        return real(*args, **kwargs)

    return wrapper


def train_args(data_bin: Path, run: Path, updates: int) -> list:
    return ["train", data_bin, "--save-dir", run, *TINY, "--max-update", updates, "--save-interval-updates", "1",
            "--disable-validation", "--log-interval", "1"]


def partial_write_then_disk_full(real_save, failing_call: int):
    """torch.save, except that call `failing_call` writes a few bytes and then fails with ENOSPC."""
    calls = []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == failing_call:
            f.write(b"PK\x03\x04 partial")
            disk_full()
        return real_save(obj, f, *args, **kwargs)

    return save


# (what fails, the update checkpoint_last.pt must still hold, the file the error names)
DISK_FULL_CASES = {
    "serialise": (2, "checkpoint_1_3.pt"),  # the 3rd checkpoint's temporary file
    "copy": (1, "checkpoint_last.pt"),  # copies 1-3 are the run files, 4 and 5 the checkpoints
    "log": (2, "train_log.jsonl"),  # the 3rd record, logged before the 3rd checkpoint
}


@pytest.mark.parametrize("where", list(DISK_FULL_CASES))
def test_disk_full_during_training_keeps_the_previous_checkpoint(tmp_path, data_bin, monkeypatch, where):
    expected_last, named_file = DISK_FULL_CASES[where]
    if where == "serialise":
        monkeypatch.setattr(checkpoint_module.torch, "save", partial_write_then_disk_full(torch.save, 3))
    elif where == "copy":
        monkeypatch.setattr(saving_module.shutil, "copyfile", fail_on_call(shutil.copyfile, 5))
    else:  # the module's own `open` shadows the builtin for the metrics log alone
        monkeypatch.setattr(log_module, "open", fail_on_call(open, 3), raising=False)
    run = tmp_path / "run"
    result = nmt(train_args(data_bin, run, 6))
    monkeypatch.undo()
    assert_one_error(result.exit_code, result.stderr, "No space left on device", named_file)
    assert load_checkpoint(run / "checkpoint_last.pt")["num_updates"] == expected_last
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    # Once there is space again, the run resumes from that checkpoint.
    resumed = nmt(train_args(data_bin, run, 6))
    assert resumed.exit_code == 0 and f"at update {expected_last}" in resumed.stderr


def test_disk_full_in_preprocess_translate_and_average(tmp_path, data_bin, monkeypatch):
    raw = write_raw_corpus(tmp_path)
    monkeypatch.setattr(indexed_module.os, "fsync", disk_full)
    result = nmt(preprocess_args(raw, tmp_path / "data-bin"))
    monkeypatch.undo()
    assert_one_error(result.exit_code, result.stderr, "No space left on device")
    assert not (tmp_path / "data-bin").exists()

    run = tiny_run_dir(data_bin, tmp_path / "run")
    monkeypatch.setattr(checkpoint_module.os, "fsync", disk_full)
    result = nmt(["average", "--inputs", run / "checkpoint_best.pt", "--output", tmp_path / "avg.pt"])
    monkeypatch.undo()
    assert_one_error(result.exit_code, result.stderr, "No space left on device", "avg.pt")
    assert not [p for p in tmp_path.iterdir() if "avg.pt" in p.name]

    class FullDisk:
        """A file whose writes fail once some bytes are in, as on a full disk."""

        def __init__(self, path: str, mode: str) -> None:
            self.file = open(path, mode)  # noqa: SIM115 - closed by close()/__exit__
            self.written = 0

        def write(self, data: bytes) -> int:
            if self.written > 100:
                disk_full()
            self.written += len(data)
            return self.file.write(data)

        def flush(self) -> None:
            self.file.flush()

        def close(self) -> None:
            self.file.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc_info) -> None:
            self.file.close()

    import nmt_cli.files as files_module  # where translate opens its output

    monkeypatch.setattr(files_module, "open", FullDisk, raising=False)
    lines = "".join(f"w{i % 16} w{(i * 7) % 16}\n" for i in range(200))
    result = nmt(["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu", "--beam", "1",
                  "--max-len-b", "3", "--buffer-size", "10", "-i", "-", "-o", tmp_path / "out.txt"], input=lines)
    monkeypatch.undo()
    assert_one_error(result.exit_code, result.stderr, "No space left on device", "out.txt")


@pytest.mark.parametrize("command", ["preprocess", "translate", "average", "apply-bpe", "learn-bpe", "binarize"])
def test_unwritable_output_is_one_error_line(tmp_path, data_bin, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    target = blocker / "sub" / "out"
    run = tiny_run_dir(data_bin, tmp_path / "run")
    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3\nw4 w5\n" * 40, encoding="utf-8")
    if command in ("apply-bpe", "learn-bpe"):
        assert nmt(["learn-bpe", "--input", text, "--vocab-size", "10", "--model-prefix", tmp_path / "bpe"]).exit_code == 0
    args = {
        "preprocess": preprocess_args(write_raw_corpus(tmp_path), target),
        "translate": ["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu", "-o", target],
        "average": ["average", "--inputs", run / "checkpoint_best.pt", "--output", target],
        "apply-bpe": ["apply-bpe", "--model", tmp_path / "bpe.model", "--input", text, "--output", target],
        "learn-bpe": ["learn-bpe", "--input", text, "--vocab-size", "10", "--model-prefix", target],
        "binarize": ["binarize", "--dict", data_bin / "dict.src.txt", "--input", text, "--output-prefix", target],
    }[command]
    result = nmt(args, input="w1 w2\n")
    assert_one_error(result.exit_code, result.stderr, str(blocker))


def test_cli_reports_full_or_read_only_disks_in_one_line_and_keeps_bugs_visible(monkeypatch):
    import nmt_cli.models.describe as info_module

    def read_only(*args):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), "/data/run/checkpoint_last.pt")

    monkeypatch.setattr(info_module, "describe", read_only)
    result = nmt(["info", "--arch", "transformer_tiny"])
    assert_one_error(result.exit_code, result.stderr, "Read-only file system: /data/run/checkpoint_last.pt")

    def no_descriptors(*args):  # the process's open-file limit reached (ulimit -n)
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), "/data/out/.hyp.txt.77.tmp")

    monkeypatch.setattr(info_module, "describe", no_descriptors)
    result = nmt(["info", "--arch", "transformer_tiny"])
    assert_one_error(result.exit_code, result.stderr, "Too many open files: /data/out/.hyp.txt.77.tmp")

    def missing(*args):  # not the machine's state: a bug, whose traceback must stay visible
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "x")

    monkeypatch.setattr(info_module, "describe", missing)
    result = CliRunner().invoke(main, ["info", "--arch", "transformer_tiny"])
    assert isinstance(result.exception, FileNotFoundError)


def test_a_lock_that_cannot_be_written_names_the_directory_and_one_that_cannot_be_removed_fails_nothing(
        tmp_path, monkeypatch):
    from nmt_cli.errors import NmtError
    from nmt_cli.run_lock import directory_lock, lock_path_for

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr("nmt_cli.run_lock.os.pwrite", disk_full)
        with pytest.raises(NmtError, match=rf"^cannot write to --out {out}: No space left on device \(.*\.out\.lock\)$"):
            with directory_lock(out, "--out"):
                pass
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self == lock_path_for(out):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        real_unlink(self, missing_ok=missing_ok)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", unlink)
        with directory_lock(out, "--out"):  # the work done: a lock file left is no failure
            pass
    with directory_lock(out, "--out"):  # nor a lock still held by this process
        pass


def test_a_hidden_output_file_that_cannot_be_made_is_the_outputs_error(tmp_path, monkeypatch):
    from nmt_cli.errors import NmtError
    from nmt_cli.files import published_output

    target = tmp_path / "hyp.txt"
    target.write_text("old\n")
    real_open = os.open
    monkeypatch.setattr("nmt_cli.staging.os.open", lambda path, *args: disk_full() if str(path).endswith(".tmp")
                        else real_open(path, *args))
    with pytest.raises(NmtError, match=rf"^cannot write {target}: No space left on device$"):
        with published_output(str(target), "w"):
            pass
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["hyp.txt"]


def test_a_run_directory_that_cannot_be_prepared_names_the_file_being_written(tmp_path, data_bin, monkeypatch):
    def copy_fails(source, destination):  # as shutil does on a full disk: the source's name
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source))

    monkeypatch.setattr("nmt_cli.train.saving.shutil.copyfile", copy_fails)
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "1"])
    line = assert_one_error(result.exit_code, result.stderr,
                            f"cannot prepare run directory {run}: cannot write {run}/")
    assert line.endswith(": No space left on device") and str(data_bin) not in line


# --- safe loading ----------------------------------------------------------------------------


def test_crafted_pickles_never_run_through_any_command(tmp_path, data_bin):
    marker = tmp_path / "payload-ran"
    run = tiny_run_dir(data_bin, tmp_path / "run")
    good = load_checkpoint(run / "checkpoint_best.pt")
    evil_zip = write_evil_checkpoint(tmp_path / "evil.pt", marker, good)
    evil_raw = write_evil_pickle(tmp_path / "evil-raw.pt", marker)
    resume = tmp_path / "resume"
    resume.mkdir()
    write_evil_checkpoint(resume / "checkpoint_last.pt", marker, good)
    commands = [
        ["translate", "--path", evil_zip, "--data-bin", run, "--device", "cpu"],
        ["translate", "--path", f"{run / 'checkpoint_best.pt'}:{evil_raw}", "--device", "cpu"],
        ["average", "--inputs", run / "checkpoint_best.pt", evil_zip, "--output", tmp_path / "avg.pt"],
        ["average", "--inputs", evil_raw, "--output", tmp_path / "avg.pt"],
        ["train", data_bin, "--save-dir", resume, *TINY, "--max-update", "1"],
        ["train", data_bin, "--save-dir", tmp_path / "fresh", *TINY, "--max-update", "1", "--finetune-from", evil_zip],
        ["info", "--path", evil_zip],
        ["info", "--path", evil_raw],
    ]
    for args in commands:
        result = nmt(args, input="w1 w2\n")
        line = assert_one_error(result.exit_code, result.stderr, "could run code")
        assert "evil" in line or "checkpoint_last.pt" in line, line
        assert not marker.exists(), args
    assert not (tmp_path / "avg.pt").exists()


def test_data_files_with_odd_content_are_data(tmp_path, data_bin):
    """Strings that look like code or paths in meta.json and dictionaries are never executed."""
    marker = tmp_path / "payload-ran"
    odd = tmp_path / "odd"
    shutil.copytree(data_bin, odd)
    meta = json.loads((odd / "meta.json").read_text())
    meta["tokenizer"]["name"] = f"__import__('pathlib').Path('{marker}').touch()"
    (odd / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    run = tiny_run_dir(data_bin, tmp_path / "run")
    shutil.copyfile(odd / "meta.json", run / "meta.json")
    result = nmt(["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu"], input="w1\n")
    assert_one_error(result.exit_code, result.stderr, "meta.json")
    assert not marker.exists()
    # A dictionary whose symbols look like code, shell and format strings: plain symbols.
    symbols = [f"$(touch {marker})", "{0.__class__}", "%s%n", "__import__('os')", "<script>"]
    weird = tmp_path / "weird"
    from databin_utils import write_data_bin

    from nmt_cli.data.dictionary import Dictionary

    write_data_bin(weird, {"train": [(symbols, symbols[::-1])] * 8, "valid": [(symbols[:2], symbols[:2])]})
    Dictionary(symbols).save(weird / "dict.src.txt")
    Dictionary(symbols).save(weird / "dict.tgt.txt")
    result = nmt(["train", weird, "--save-dir", tmp_path / "weird-run", *TINY, "--max-update", "1"])
    assert result.exit_code == 0, result.output
    assert load_checkpoint(tmp_path / "weird-run" / "checkpoint_last.pt")["src_dict"][4:9] == symbols
    assert not marker.exists()


# --- numerics ----------------------------------------------------------------------------------


def poison_weights_before_update(monkeypatch, poisoned: int) -> None:
    """Fill a weight with NaN just before update `poisoned` (1-based) runs."""
    real_update = trainer_module.train_update

    def poisoned_update(engine, data, shares, fallback, ntokens, num_updates):
        if num_updates == poisoned - 1:
            with torch.no_grad():
                next(engine.model.parameters()).fill_(float("nan"))
        return real_update(engine, data, shares, fallback, ntokens, num_updates)

    monkeypatch.setattr(trainer_module, "train_update", poisoned_update)


def test_nan_loss_is_caught_at_the_update_that_produced_it(tmp_path, data_bin, monkeypatch):
    """Weights poisoned before update 3: the error names update 3 and no checkpoint holds NaN."""
    poison_weights_before_update(monkeypatch, 3)
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "8", "--save-interval-updates", "1",
                  "--log-interval", "100"])
    assert_one_error(result.exit_code, result.stderr, "NaN/inf at update 3", "(checkpoint_last.pt predates it)")
    for path in run.glob("*.pt"):
        state = load_checkpoint(path)
        assert state["num_updates"] <= 2 and all(torch.isfinite(t).all() for t in state["model"].values()), path


def test_nan_loss_before_any_checkpoint_names_none(tmp_path, data_bin, monkeypatch):
    poison_weights_before_update(monkeypatch, 2)
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "8", "--log-interval", "100"])
    line = assert_one_error(result.exit_code, result.stderr, "NaN/inf at update 2")
    assert "checkpoint" not in line and not list(run.glob("*.pt"))


def test_fp16_overflow_is_absorbed_by_loss_scaling_end_to_end(tmp_path, data_bin, monkeypatch):
    """A loss scale far too large: the first updates overflow and are skipped, the scale
    falls, and training goes on with finite weights (CPU fp16 autocast, which `nmt train`
    refuses on a CPU for its speed alone: the refusal is lifted here)."""
    monkeypatch.setattr(trainer_module, "check_precision_fits_device", lambda precision, device: None)
    real_scaler = torch.amp.GradScaler
    # Each overflow divides the scale by 2**10 (a fast back-off keeps the test short).
    monkeypatch.setattr(step_module.torch.amp, "GradScaler",
                        lambda device: real_scaler(device, init_scale=2.0**36, backoff_factor=2.0**-10))
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--precision", "fp16", "--max-update", "8",
                  "--log-interval", "4", "--validate-interval", "0", "--save-interval", "0"])
    assert result.exit_code == 0, result.output
    lines = (run / "train_log.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["type"] == "train"]
    assert records[0]["overflows"] >= 1 and records[-1]["overflows"] == 0, records
    assert records[-1]["loss_scale"] < 2.0**36 and all(r["loss"] == r["loss"] for r in records)
    state = load_checkpoint(run / "checkpoint_last.pt")
    assert state["num_updates"] == 8 and all(torch.isfinite(t).all() for t in state["model"].values())
