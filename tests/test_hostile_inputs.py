"""Hostile inputs, generated: the promise holds for every one, not only for listed cases.

A seeded random generator corrupts copies of a tiny data-bin (bytes flipped, files cut,
offsets swapped), puts values of the wrong type into checkpoints and meta.json, gives
every command random option values, closes standard streams and sends SIGTERM and
SIGINT at random points. Whatever it does, a command either succeeds (exit 0) or exits
non-zero with exactly one error line on stderr and no Python traceback; a signal ends
a command with 143 (SIGTERM) or 130 (SIGINT), one line, and no process left behind;
after a SIGKILL of the main process its workers end within seconds, saying nothing.

Below the generated cases, each defect once found by hand has a named test of its own.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from databin_utils import reversal_data_bin
from fault_utils import REPO, SUBPROCESS_ENV, assert_clean_exit, assert_one_error, tiny_run_dir

from nmt_cli.checkpoints.format import load_checkpoint
from nmt_cli.cli import COMMANDS, main
from nmt_cli.data.indexed import HEADER, MAGIC, IndexedDataset
from nmt_cli.machine import usable_cpus

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

TINY_TRAIN = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
              "--device", "cpu", "--dropout", "0", "--log-interval", "1"]
FAST_TRANSLATE = ["--device", "cpu", "--beam", "1", "--max-len-b", "3", "--quiet"]
SEED = 42

# Values of the wrong type (or of an absurd size) for a field of a checkpoint or meta.json.
HOSTILE_VALUES = [None, True, -1, 2**70, 1.5, float("nan"), "", "x" * 500, "\udcff", [], [1, "a"], {}, {"a": [None]},
                  torch.zeros(3, dtype=torch.int64), torch.zeros(0)]
JSON_HOSTILE_VALUES = [None, True, -1, 2**70, 1.5, "", "x" * 500, "../../x", [], ["en"], {}, {"a": [None]}]


def nmt(args: list, stdin: bytes | str = b""):
    result = CliRunner().invoke(main, [str(a) for a in args], input=stdin)
    assert_clean_exit(result)
    return result


def assert_promise(result, case: object) -> None:
    """Exit 0, or a non-zero exit with one error line and no traceback (click's own usage
    errors say `Error:` and exit 2)."""
    assert_clean_exit(result)
    if result.exit_code == 0:
        return
    stderr = result.stderr
    assert "Traceback" not in stderr, (case, stderr[-3000:])
    errors = [line for line in stderr.splitlines() if line.startswith(("error: ", "Error: "))]
    assert result.exit_code in (1, 2) and len(errors) == 1, (case, result.exit_code, stderr[-3000:])


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """A tiny data-bin, a run directory to translate with and a trained save dir to resume."""
    root = tmp_path_factory.mktemp("hostile")
    data_bin = reversal_data_bin(root / "bin", train=40, valid=8)
    run = tiny_run_dir(data_bin, root / "run")
    save = root / "save"
    result = nmt(["train", data_bin, "--save-dir", save, *TINY_TRAIN, "--max-update", "1"])
    assert result.exit_code == 0, result.output
    return {"data_bin": data_bin, "run": run, "checkpoint": run / "checkpoint_best.pt", "save": save}


# --- corrupted data-bins ---------------------------------------------------------------------------


def corrupt_data_bin(rng: random.Random, data_bin: Path, copy: Path) -> str:
    """Copy `data_bin` and damage one of its .bin/.idx files at random; say how."""
    shutil.copytree(data_bin, copy)
    target = rng.choice(sorted(copy.glob("*.bin")) + sorted(copy.glob("*.idx")))
    data = bytearray(target.read_bytes())
    how = rng.choice(["flip", "cut", "swap"] if target.suffix == ".idx" else ["flip", "cut"])
    if how == "flip":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "cut":
        del data[rng.randrange(len(data)):]
    else:  # swap two offsets
        offsets = np.frombuffer(bytes(data[HEADER.size:]), dtype="<i8").copy()
        i, j = rng.sample(range(len(offsets)), 2)
        offsets[i], offsets[j] = offsets[j], offsets[i]
        data[HEADER.size:] = offsets.tobytes()
    target.write_bytes(bytes(data))
    return f"{how} {target.name}"


def test_corrupted_data_bins_train_or_give_one_error_line(shared, tmp_path):
    rng = random.Random(SEED)
    for k in range(12):
        copy = tmp_path / f"bin{k}"
        how = corrupt_data_bin(rng, shared["data_bin"], copy)
        result = nmt(["train", copy, "--save-dir", tmp_path / f"save{k}", *TINY_TRAIN, "--max-update", "1"])
        assert_promise(result, how)


def test_every_damaged_index_is_read_consistently_or_refused(shared, tmp_path):
    """The library's own promise under the CLI's: an opened corpus only hands out slices of
    its .bin that follow each other, whatever bytes of the .idx were changed."""
    rng = random.Random(SEED + 1)
    from nmt_cli.errors import NmtError

    for k in range(60):
        copy = tmp_path / f"bin{k}"
        corrupt_data_bin(rng, shared["data_bin"], copy)
        for idx in copy.glob("*.idx"):
            try:
                dataset = IndexedDataset(idx.with_suffix(""))
            except NmtError:
                continue
            offsets = np.asarray(dataset.offsets)
            assert offsets[0] == 0 and (np.diff(offsets) >= 0).all() and offsets[-1] == len(dataset.data)
            assert sum(len(dataset[i]) for i in range(len(dataset))) == len(dataset.data)


# --- checkpoints and meta.json with values of the wrong type -----------------------------------------


def wrongly_typed(rng: random.Random, state: dict) -> tuple[dict, str]:
    """`state` with one field, model_config entry or weight replaced by a hostile value."""
    state = dict(state)
    where = rng.choice(["field", "model_config", "weight"])
    value = rng.choice(HOSTILE_VALUES)
    if where == "field":
        key = rng.choice(sorted(state))
        state[key] = value
    elif where == "model_config":
        key = rng.choice(sorted(state["model_config"]))
        state["model_config"] = {**state["model_config"], key: value}
    else:
        key = rng.choice(sorted(state["model"]))
        state["model"] = {**state["model"], key: value}
    return state, f"{where} {key} = {value!r:.40}"


def test_wrongly_typed_checkpoints_translate_or_give_one_error_line(shared, tmp_path):
    rng = random.Random(SEED + 2)
    state = load_checkpoint(shared["checkpoint"])
    for k in range(16):
        broken, how = wrongly_typed(rng, state)
        path = tmp_path / f"c{k}.pt"
        torch.save(broken, path)
        for args in (["translate", "--path", path, "--data-bin", shared["run"], *FAST_TRANSLATE], ["info", "--path", path]):
            assert_promise(nmt(args, "w1 w2\n"), (how, args[0]))


def test_damaged_checkpoint_bytes_translate_or_give_one_error_line(shared, tmp_path):
    rng = random.Random(SEED + 3)
    original = shared["checkpoint"].read_bytes()
    for k in range(10):
        data = bytearray(original)
        if rng.random() < 0.5:
            del data[rng.randrange(len(data)):]
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 0xFF
        path = tmp_path / f"c{k}.pt"
        path.write_bytes(bytes(data))
        result = nmt(["translate", "--path", path, "--data-bin", shared["run"], *FAST_TRANSLATE], "w1 w2\n")
        assert_promise(result, k)


def test_resuming_from_wrongly_typed_training_state_gives_one_error_line(shared, tmp_path):
    """The training-only fields: optimizer, scheduler, RNG, iterator, log window, counters."""
    rng = random.Random(SEED + 4)
    state = load_checkpoint(shared["save"] / "checkpoint_last.pt")
    training_keys = ["optimizer", "scheduler", "scaler", "rng", "iterator", "log_window", "num_updates",
                     "best_metric", "patience_counter", "validated_at", "log_records", "train_config"]
    for k in range(10):
        key = rng.choice(training_keys)
        value = rng.choice(HOSTILE_VALUES + [{"state": 1, "param_groups": "x"}, {"python": [1], "numpy": None}])
        save = tmp_path / f"save{k}"
        shutil.copytree(shared["save"], save)
        torch.save({**state, key: value}, save / "checkpoint_last.pt")
        result = nmt(["train", shared["data_bin"], "--save-dir", save, *TINY_TRAIN, "--max-update", "2"])
        assert_promise(result, (key, value))


def test_wrongly_typed_meta_json_is_read_or_gives_one_error_line(shared, tmp_path):
    rng = random.Random(SEED + 5)
    meta = json.loads((shared["run"] / "meta.json").read_text(encoding="utf-8"))
    meta["bpe"] = {"type": "sentencepiece", "model": "bpe.model"}  # nested fields to damage too
    for k in range(16):
        broken = json.loads(json.dumps(meta))
        section = rng.choice([broken, broken, broken["tokenizer"], broken["bpe"]])
        key = rng.choice(sorted(section) + ["format_version"])
        section[key] = rng.choice(JSON_HOSTILE_VALUES)
        run, data_bin = tmp_path / f"run{k}", tmp_path / f"bin{k}"
        shutil.copytree(shared["run"], run)
        shutil.copytree(shared["data_bin"], data_bin)
        for directory in (run, data_bin):
            (directory / "meta.json").write_text(json.dumps(broken), encoding="utf-8")
        case = (key, section[key])
        assert_promise(nmt(["translate", "--path", run / "checkpoint_best.pt", *FAST_TRANSLATE], "w1 w2\n"), case)
        assert_promise(nmt(["train", data_bin, "--save-dir", tmp_path / f"save{k}", *TINY_TRAIN, "--max-update", "1",
                            "--disable-validation"]), case)


# --- random option values for every command -----------------------------------------------------------

INT_VALUES = ["-1", "0", "1", "100000", str(2**31), str(2**63), "9" * 30, "abc", "1.5", ""]
FLOAT_VALUES = ["nan", "inf", "-inf", "-1", "0", "1e-300", "1e308", "abc", ""]


def text_values(tmp: Path) -> list[str]:
    (tmp / "text.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    (tmp / "dir").mkdir(exist_ok=True)
    return ["", "-", "cuda:abc", "cpu", str(tmp / "missing"), str(tmp / "dir"), str(tmp / "text.txt"), "/dev/null",
            str(tmp / "d\udcff" / "x"), "x" * 300, "\x00"]


def base_arguments(command: str, shared: dict[str, Path], tmp: Path) -> list:
    """A valid, quick invocation of `command`: random options are put before its end."""
    raw = tmp / "raw"
    if not (tmp / "raw.en").exists():
        lines = [f"w{i % 9} w{(i * 3) % 9} w{(i * 5) % 9}\n" for i in range(40)]
        (tmp / "raw.en").write_text("".join(lines), encoding="utf-8")
        (tmp / "raw.de").write_text("".join(lines[::-1]), encoding="utf-8")
    return {
        "preprocess": ["preprocess", "-s", "en", "-t", "de", "--trainpref", raw, "--destdir", tmp / "out",
                       "--joined-dictionary", "--bpe", "none"],
        "learn-bpe": ["learn-bpe", "--input", tmp / "raw.en", "--vocab-size", "12", "--model-prefix", tmp / "m"],
        "apply-bpe": ["apply-bpe", "--model", tmp / "missing.model"],
        "binarize": ["binarize", "--dict", shared["data_bin"] / "dict.src.txt", "--input", tmp / "raw.en",
                     "--output-prefix", tmp / "b"],
        "info": ["info", "--arch", "transformer_tiny"],
        "train": ["train", shared["data_bin"], "--save-dir", tmp / "save", *TINY_TRAIN],
        "translate": ["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE],
        "generate": ["generate", shared["data_bin"], "--path", shared["checkpoint"], "--gen-subset", "valid", "--cpu",
                     "--beam", "1", "--max-len-b", "3"],
        "score": ["score", "--ref", tmp / "raw.en", "--hyp", tmp / "raw.de"],
        "average": ["average", "--inputs", shared["checkpoint"], shared["save"] / "checkpoint_last.pt",
                    "--output", tmp / "avg.pt"],
        "import-fairseq": ["import-fairseq", tmp / "missing.pt", "--dict-dir", tmp, "--out", tmp / "imported"],
        "import-marian": ["import-marian", tmp / "missing-model-dir", "--out", tmp / "imported"],
        "plot": ["plot", shared["save"], "-o", tmp / "c.png"],
        "export": ["export", shared["checkpoint"], tmp / "exported", "--format", "fairseq"],
        "serve": ["serve", "--path", tmp / "missing.pt"],  # refused before it listens: the test must end
    }[command]


# Stopping settings, given last so that a random value cannot make a run long.
QUICK_END = {"train": ["--max-update", "1", "--max-epoch", "1"], "translate": ["--max-len-b", "3", "--beam", "1"]}
# Options whose valid values start something slow (processes, thousands of steps) or a
# server; their bad values are in the battery of tests/test_bad_input.py.
SKIPPED_OPTIONS = {"--workers", "--paired-bs-n", "--max-update", "--max-epoch", "--beam", "--max-len-b", "--help",
                   "--version", "--nproc-per-node"}


def random_options(rng: random.Random, command, tmp: Path) -> list[str]:
    import click

    options = [p for p in command.params if isinstance(p, click.Option) and not set(p.opts) & SKIPPED_OPTIONS]
    chosen = []
    for param in rng.sample(options, min(len(options), rng.randint(1, 3))):
        flag = rng.choice(param.opts)
        if param.is_flag:
            chosen.append(flag)
            continue
        kind = param.type
        if isinstance(kind, click.types.IntParamType):
            values = INT_VALUES
        elif isinstance(kind, click.types.FloatParamType):
            values = FLOAT_VALUES
        elif isinstance(kind, click.Choice):
            values = [*map(str, kind.choices), "nonsense"]
        else:
            values = text_values(tmp) + INT_VALUES[:3]
        chosen += [flag, rng.choice(values)]
    return chosen


@pytest.mark.parametrize("command_name", sorted(COMMANDS))
def test_random_option_values_succeed_or_give_one_error_line(command_name, shared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths among the values land here
    rng = random.Random(f"{SEED}-{command_name}")
    command = main.get_command(None, command_name)
    for k in range(10):
        tmp = tmp_path / str(k)
        tmp.mkdir()
        args = base_arguments(command_name, shared, tmp)
        args = [*args, *random_options(rng, command, tmp), *QUICK_END.get(command_name, [])]
        assert_promise(nmt(args, "w1 w2\n"), args)


# --- closed standard streams -------------------------------------------------------------------------


def run_with_closed(fd: int, args: list, stdin_path: Path | None = None) -> subprocess.CompletedProcess:
    """`nmt ARGS` in a process whose descriptor `fd` is closed (`<&-`, `>&-`, `2>&-`)."""
    stdin = open(stdin_path, "rb") if stdin_path is not None else subprocess.DEVNULL
    try:
        return subprocess.run([sys.executable, "-m", "nmt_cli", *map(str, args)], cwd=REPO, env=SUBPROCESS_ENV,
                              stdin=stdin, capture_output=True, timeout=300, preexec_fn=lambda: os.close(fd))
    finally:
        if stdin_path is not None:
            stdin.close()


def test_closed_stdin_or_stdout_is_one_error_line(shared, tmp_path):
    translate = ["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE]
    score = ["score", "--ref", tmp_path / "in.txt"]
    for fd, args, stream in ((0, translate, "standard input"), (0, score, "standard input"),
                             (1, score + ["--hyp", tmp_path / "in.txt"], "standard output")):
        (tmp_path / "in.txt").write_text("w1 w2\n", encoding="utf-8")
        result = run_with_closed(fd, args)
        stderr = result.stderr.decode()
        assert_one_error(result.returncode, stderr, stream, "is closed")


def test_closed_stderr_runs_silently_and_never_touches_the_output(shared, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("w1 w2\n" + "w3 " * 2000 + "\n", encoding="utf-8")  # the long line is cut, with a warning
    args = ["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE[:-1], "-i", source, "-o", tmp_path / "out.txt"]
    expected = nmt(args).exit_code == 0 and (tmp_path / "out.txt").read_bytes()
    (tmp_path / "out.txt").unlink()
    result = run_with_closed(2, args)
    assert result.returncode == 0 and result.stdout == b""
    assert (tmp_path / "out.txt").read_bytes() == expected
    # A failing run with stderr closed leaves an existing output as it was.
    (tmp_path / "out.txt").write_text("earlier\n")
    failing = ["translate", "--path", tmp_path / "missing.pt", *FAST_TRANSLATE, "-i", source, "-o", tmp_path / "out.txt"]
    assert run_with_closed(2, failing).returncode == 1
    assert (tmp_path / "out.txt").read_text() == "earlier\n"


# --- signals -----------------------------------------------------------------------------------------


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc; zombies are not counted)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def signal_when_workers_run(args: list, signum: int, rng: random.Random, workers: int) -> tuple[int, str, list[int]]:
    """Start `nmt ARGS` in a process group of its own, wait until its `workers` worker
    processes exist, then (after a random further delay) send `signum`: SIGINT to the
    whole group, as a terminal's Ctrl-C does, SIGTERM to the main process only."""
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", *map(str, args)], cwd=REPO, env=SUBPROCESS_ENV,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while len(group_members(process.pid)) < 1 + workers and process.poll() is None:
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.5))
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    deadline = time.monotonic() + 10
    while group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return process.returncode, stderr.decode(), group_members(process.pid)


def translate_with_two_workers(shared: dict, tmp_path: Path, lines: int) -> list:
    """translate's arguments for `lines` lines of input, with --workers 2."""
    source = tmp_path / "in.txt"
    source.write_text("w1 w2 w3 w4 w5 w6\n" * lines, encoding="utf-8")
    return ["translate", "--path", shared["checkpoint"], "--device", "cpu", "--beam", "2", "--workers", "2",
            "-i", source, "-o", tmp_path / "out.txt"]


def preprocess_with_two_workers(tmp_path: Path) -> list:
    """preprocess's arguments for a corpus of 400,000 pairs in tmp_path, with --workers 2."""
    lines = "".join(f"w{i % 7} w{i % 5} w{i % 3} w{i % 11}\n" for i in range(400_000))
    (tmp_path / "raw.en").write_text(lines, encoding="utf-8")
    (tmp_path / "raw.de").write_text(lines, encoding="utf-8")
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "raw", "--destdir", tmp_path / "out",
            "--joined-dictionary", "--bpe", "none", "--workers", "2"]


@pytest.mark.skipif(usable_cpus() < 2, reason="--workers 2 needs two CPUs")
@pytest.mark.parametrize("signum, status, line", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_stops_translate_and_its_workers(shared, tmp_path, signum, status, line):
    args = translate_with_two_workers(shared, tmp_path, 200_000)
    code, stderr, left = signal_when_workers_run(args, signum, random.Random(f"{SEED}-{signum}"), workers=1)
    assert code == status, stderr
    assert stderr.strip().splitlines() == [line], stderr
    assert left == []


@pytest.mark.skipif(usable_cpus() < 2, reason="--workers 2 needs two CPUs")
def test_sigterm_stops_preprocess_and_its_workers(tmp_path):
    args = preprocess_with_two_workers(tmp_path)
    code, stderr, left = signal_when_workers_run(args, signal.SIGTERM, random.Random(SEED), workers=2)
    assert code == 143, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "terminated", stderr
    assert left == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.de", "raw.en"]  # no output, whole or partial


def spawned_workers(pgid: int) -> list[int]:
    """The live multiprocessing workers of a process group (not its resource tracker)."""
    workers = []
    for pid in group_members(pgid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.append(pid)
        except OSError:
            continue
    return workers


def kill_when_workers_run(args: list, workers: int, delay: float, log: Path) -> tuple[str, list[int]]:
    """Start `nmt ARGS` in a process group of its own, wait until its `workers` worker
    processes exist and `delay` seconds more, SIGKILL the main process alone (as the OOM
    killer does), and give what reached stderr after the kill and the processes of the
    group still alive 5 s later (any left are killed then)."""
    with open(log, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "nmt_cli", *map(str, args)], cwd=REPO, env=SUBPROCESS_ENV,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(spawned_workers(process.pid)) < workers:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.02)
        time.sleep(delay)
        process.kill()
        process.wait()
        before = log.stat().st_size
        deadline = time.monotonic() + 5
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return log.read_bytes()[before:].decode(errors="replace"), group_members(process.pid)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what a failing run left behind
        except ProcessLookupError:
            pass


@pytest.mark.skipif(usable_cpus() < 2, reason="--workers 2 needs two CPUs")
@pytest.mark.parametrize("moment, delay", [("loading", 0.0), ("translating", 3.0)])
def test_translate_workers_end_quietly_when_the_main_process_is_killed(shared, tmp_path, moment, delay):
    # At once, the worker is still loading the model; 3 s on, it is translating its share.
    args = translate_with_two_workers(shared, tmp_path, 50_000) + ["--quiet"]
    after_kill, left = kill_when_workers_run(args, 1, delay, tmp_path / "stderr.txt")
    assert after_kill == "", after_kill
    assert left == []


@pytest.mark.skipif(usable_cpus() < 2, reason="--workers 2 needs two CPUs")
def test_preprocess_workers_end_quietly_when_the_main_process_is_killed(tmp_path):
    args = preprocess_with_two_workers(tmp_path)
    # Nothing after the kill: neither a worker nor the pool's resource tracker, which
    # removes the pool's semaphores once the workers are gone, says anything.
    after_kill, left = kill_when_workers_run(args, 2, 0.3, tmp_path / "stderr.txt")
    assert after_kill == "", after_kill
    assert left == []


# --- the defects found by hand, one test each --------------------------------------------------------


def rewrite_index(prefix: Path, change) -> None:
    """Apply `change` to the offsets of `{prefix}.idx` (read into memory first)."""
    idx = Path(f"{prefix}.idx")
    data = idx.read_bytes()
    offsets = np.frombuffer(data[HEADER.size:], dtype="<i8").copy()
    change(offsets)
    idx.write_bytes(data[:HEADER.size] + offsets.tobytes())


@pytest.mark.parametrize("damage, fragment", [
    (lambda o: o.__setitem__(slice(3, 5), o[3:5][::-1].copy()), "sentence 4 ends at offset"),
    (lambda o: o.__setitem__(3, -5), "sentence 3 ends at offset -5"),
    (lambda o: o.__setitem__(0, 4), "first offset is 4"),
], ids=["swapped offsets", "a negative offset", "a first offset beyond 0"])
def test_train_refuses_an_index_with_misordered_offsets(shared, tmp_path, damage, fragment):
    copy = tmp_path / "bin"
    shutil.copytree(shared["data_bin"], copy)
    rewrite_index(copy / "train.src-tgt.src", damage)
    result = nmt(["train", copy, "--save-dir", tmp_path / "save", *TINY_TRAIN, "--max-update", "1"])
    assert_one_error(result.exit_code, result.stderr, fragment, "train.src-tgt.src.idx")


def test_train_refuses_an_id_below_zero_in_an_int32_bin(shared, tmp_path):
    copy = tmp_path / "bin"
    shutil.copytree(shared["data_bin"], copy)
    prefix = copy / "valid.src-tgt.tgt"
    dataset = IndexedDataset(prefix)
    ids, offsets = np.asarray(dataset.data).astype("<i4"), np.asarray(dataset.offsets).copy()
    del dataset
    ids[5] = -3
    Path(f"{prefix}.bin").write_bytes(ids.tobytes())
    Path(f"{prefix}.idx").write_bytes(HEADER.pack(MAGIC, 2, len(offsets) - 1) + offsets.astype("<i8").tobytes())
    result = nmt(["train", copy, "--save-dir", tmp_path / "save", *TINY_TRAIN, "--max-update", "1"])
    assert_one_error(result.exit_code, result.stderr, "valid.src-tgt.tgt.bin has id -3, below 0")


@pytest.mark.parametrize("weight, fragment", [
    ([0.0] * 4, "is a list, not a tensor"),
    ("weights", "is a str, not a tensor"),
    ("int tensor", "not of floating-point numbers"),
], ids=["a list", "a string", "an integer tensor"])
def test_checkpoint_weights_must_be_floating_point_tensors(shared, tmp_path, weight, fragment):
    state = load_checkpoint(shared["checkpoint"])
    name = sorted(state["model"])[0]
    if weight == "int tensor":
        weight = state["model"][name].to(torch.int64)
    torch.save({**state, "model": {**state["model"], name: weight}}, tmp_path / "c.pt")
    for args in (["translate", "--path", tmp_path / "c.pt", "--data-bin", shared["run"], *FAST_TRANSLATE],
                 ["info", "--path", tmp_path / "c.pt"], ["average", "--inputs", tmp_path / "c.pt", shared["checkpoint"],
                                                        "--output", tmp_path / "avg.pt"]):
        result = nmt(args, "w1\n")
        # Averaging compares the checkpoints (shapes and types) before any model is built.
        expected = "different parameters" if args[0] == "average" and weight is not None and isinstance(
            weight, torch.Tensor) else fragment
        assert_one_error(result.exit_code, result.stderr, "c.pt", name, expected)


@pytest.mark.parametrize("key, value, fragment", [
    ("optimizer", "x", "'optimizer' is a str"),
    ("optimizer", {"state": {}, "param_groups": "x"}, "optimizer state cannot be restored"),
    ("rng", {"python": 1}, "random number generator states cannot be restored"),
    ("log_window", {"sums": 3}, "log window cannot be restored"),
    ("num_updates", "5", "'num_updates' is a str"),
    ("optimizer", "moments of another shape", "exp_avg of shape (3,)"),
])
def test_resume_refuses_a_wrongly_typed_training_state(shared, tmp_path, key, value, fragment):
    save = tmp_path / "save"
    shutil.copytree(shared["save"], save)
    state = load_checkpoint(save / "checkpoint_last.pt")
    if value == "moments of another shape":
        value = {**state["optimizer"], "state": {k: {**v, "exp_avg": torch.zeros(3)} for k, v in state["optimizer"]["state"].items()}}
    torch.save({**state, key: value}, save / "checkpoint_last.pt")
    result = nmt(["train", shared["data_bin"], "--save-dir", save, *TINY_TRAIN, "--max-update", "2"])
    assert_one_error(result.exit_code, result.stderr, "checkpoint_last.pt", fragment)


@pytest.mark.parametrize("change, fragment", [
    (lambda m: m.update(bpe={"type": "sentencepiece", "model": 5}), "field bpe.model is 5, not a string"),
    (lambda m: m.update(source_lang=["src"]), 'field source_lang is ["src"], not a string'),
    (lambda m: m["tokenizer"].update(name=None), "field tokenizer.name is null, not a string"),
    (lambda m: m.update(tokenizer="moses"), 'field tokenizer is "moses", not an object or null'),
    (lambda m: m.update(segmented_input=5), "field segmented_input is 5, not a string"),
], ids=["bpe model a number", "language a list", "tokenizer name null", "tokenizer a string", "segmentation marker a number"])
def test_meta_json_fields_are_type_checked(shared, tmp_path, change, fragment):
    run, data_bin = tmp_path / "run", tmp_path / "bin"
    shutil.copytree(shared["run"], run)
    shutil.copytree(shared["data_bin"], data_bin)
    meta = json.loads((run / "meta.json").read_text(encoding="utf-8"))
    change(meta)
    for directory in (run, data_bin):
        (directory / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    result = nmt(["translate", "--path", run / "checkpoint_best.pt", *FAST_TRANSLATE], "w1\n")
    assert_one_error(result.exit_code, result.stderr, "meta.json", fragment)
    result = nmt(["train", data_bin, "--save-dir", tmp_path / "save", *TINY_TRAIN, "--max-update", "1"])
    assert_one_error(result.exit_code, result.stderr, "meta.json", fragment)


@pytest.mark.parametrize("device", ["cuda:abc", "cuda:-1", "cuda:99999999999999999999", "gpu", "cpu:0"])
def test_device_strings_are_checked(shared, tmp_path, device):
    translate = nmt(["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE, "--device", device], "w1\n")
    assert_one_error(translate.exit_code, translate.stderr, "--device must be cpu, cuda or cuda:N")
    train = nmt(["train", shared["data_bin"], "--save-dir", tmp_path / "save", *TINY_TRAIN, "--device", device])
    assert_one_error(train.exit_code, train.stderr, "--device must be auto, cpu, cuda or cuda:N")


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() > 99, reason="a machine with 100 GPUs")
def test_a_cuda_device_this_machine_lacks_is_one_error_line(shared):
    result = nmt(["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE, "--device", "cuda:99"], "w1\n")
    assert_one_error(result.exit_code, result.stderr, "--device cuda:99")


def test_thread_and_worker_counts_are_bounded_by_the_machine(shared, tmp_path):
    # preprocess runs more --workers than CPUs as that many (its output is the same for any
    # count; fairseq's recipes say --workers 20): tests/test_fairseq_flags.py.
    too_many = str(usable_cpus() + 1)
    translate = ["translate", "--path", shared["checkpoint"], *FAST_TRANSLATE]
    for args, flag in ((translate + ["--threads", "100000"], "--threads 100000"),
                       (translate + ["--workers", "1000"], "--workers 1000"),
                       (translate + ["--workers", too_many], f"--workers {too_many}"),
                       (base_arguments("binarize", shared, tmp_path) + ["--workers", "1000"], "--workers 1000")):
        result = nmt(args, "w1\n")
        assert_one_error(result.exit_code, result.stderr, flag, f"the {usable_cpus()} CPU(s)")


@pytest.mark.parametrize("update_freq", [str(10**12), "1000"])
def test_update_freq_beyond_an_epoch_is_refused(shared, tmp_path, update_freq):
    result = nmt(["train", shared["data_bin"], "--save-dir", tmp_path / "save", *TINY_TRAIN, "--max-update", "1",
                  "--update-freq", update_freq])
    assert_one_error(result.exit_code, result.stderr, f"--update-freq {update_freq}", "batches of an epoch")


def test_update_freq_of_an_epoch_still_trains(shared, tmp_path):
    """The bound is exact: an update of all the epoch's batches is allowed."""
    result = nmt(["train", shared["data_bin"], "--save-dir", tmp_path / "save", *TINY_TRAIN, "--max-update", "1",
                  "--update-freq", "1"])
    assert result.exit_code == 0
    batches = int(result.stderr.split("train: ")[1].split(" batches")[0].split(" in ")[1])
    ok = nmt(["train", shared["data_bin"], "--save-dir", tmp_path / "save2", *TINY_TRAIN, "--max-update", "1",
              "--update-freq", str(batches)])
    assert ok.exit_code == 0, ok.output
    too_many = nmt(["train", shared["data_bin"], "--save-dir", tmp_path / "save3", *TINY_TRAIN, "--max-update", "1",
                    "--update-freq", str(batches + 1)])
    assert_one_error(too_many.exit_code, too_many.stderr, f"use at most {batches}")


def test_sizes_beyond_sentencepiece_are_refused_before_it(shared, tmp_path):
    base = base_arguments("preprocess", shared, tmp_path)[:-2]  # with sentencepiece BPE
    huge = str(2**40)
    for args, flag in ((base + ["--bpe-size", huge], "--bpe-size"), (base + ["--bpe-size", "12", "--bpe-sample", huge], "--bpe-sample"),
                       (["learn-bpe", "--input", tmp_path / "raw.en", "--vocab-size", huge, "--model-prefix", tmp_path / "m"],
                        "--vocab-size"),
                       (["learn-bpe", "--input", tmp_path / "raw.en", "--vocab-size", "12", "--sample", huge,
                         "--model-prefix", tmp_path / "m"], "--sample")):
        result = nmt(args)
        assert_one_error(result.exit_code, result.stderr, f"{flag} must be at most 2147483647")


def test_path_names_that_are_not_utf8_work(shared, tmp_path):
    """sentencepiece takes paths as UTF-8 text only; the models are read from their bytes."""
    directory = tmp_path / "d\udcff"
    base_arguments("preprocess", shared, tmp_path)
    learned = nmt(["learn-bpe", "--input", tmp_path / "raw.en", "--vocab-size", "14", "--model-prefix", directory / "m"])
    assert learned.exit_code == 0, learned.output
    applied = nmt(["apply-bpe", "--model", directory / "m.model"], "w1 w2\n")
    assert applied.exit_code == 0 and applied.stdout.replace(" ", "").replace("\u2581", "") == "w1w2\n"
    args = base_arguments("preprocess", shared, tmp_path)[:-2] + ["--bpe-size", "14"]
    args[args.index("--destdir") + 1] = directory / "out"
    assert nmt(args).exit_code == 0


def test_resume_with_a_damaged_train_log(shared, tmp_path):
    save = tmp_path / "save"
    shutil.copytree(shared["save"], save)
    log = save / "train_log.jsonl"
    records = log.read_bytes()
    # A damaged line past the records the checkpoint holds is cut unread.
    log.write_bytes(records + b'{"broken": "\xff\xfe"}\n')
    resumed = nmt(["train", shared["data_bin"], "--save-dir", save, *TINY_TRAIN, "--max-update", "1"])
    assert resumed.exit_code == 0, resumed.output
    assert log.read_bytes() == records
    # One among them is one error line naming the line.
    log.write_bytes(records[:2] + b"\xff" + records[3:])
    result = nmt(["train", shared["data_bin"], "--save-dir", save, *TINY_TRAIN, "--max-update", "2"])
    assert_one_error(result.exit_code, result.stderr, "invalid UTF-8", "train_log.jsonl:1")


TRIP_DURING_TORCH_IMPORT = """
import os, signal, sys
class Trip:
    # Sends the signal while torch's C start-up imports numpy, which drops an exception raised there.
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "torch" in sys.modules and "numpy" not in sys.modules:
            sys.meta_path.remove(self)
            print("signal sent", file=sys.stderr, flush=True)
            os.kill(os.getpid(), {signum})
        return None
sys.meta_path.insert(0, Trip())
from nmt_cli.cli import main
main({args!r})
"""


# info's module loads torch; average's command does, once its options are parsed.
@pytest.mark.parametrize("args", [["info", "--arch", "transformer_tiny"], ["average", "--inputs", "missing.pt", "--output", "out.pt"]])
@pytest.mark.parametrize("signum, status, line", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_torch_loads_stops_the_command(tmp_path, args, signum, status, line):
    """Not lost in torch's start-up: a server started then would have run on, deaf to Ctrl-C."""
    script = TRIP_DURING_TORCH_IMPORT.format(signum=int(signum), args=args)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path,
                            env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines() == ["signal sent", line], result.stderr
    assert result.returncode == status and result.stdout == ""
