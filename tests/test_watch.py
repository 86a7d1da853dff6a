"""Watching a run: TensorBoard scalars, `nmt plot`, the live status line on a terminal.

TensorBoard files are read back with TensorBoard's own reader and compared with
train_log.jsonl; plots are checked by their file format; the live display runs on a
real pseudo-terminal. A missing optional extra is simulated by blocking its import.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from databin_utils import reversal_data_bin
from fault_utils import assert_one_error
from rich.console import Console

from nmt_cli.cli import main
from nmt_cli.train import trainer as trainer_module
from nmt_cli.train.curves import read_curves, read_runs
from nmt_cli.train.live import Limits, eta_seconds
from nmt_cli.train.log import Reporter

REPO = Path(__file__).resolve().parents[1]
TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "20", "--device", "cpu"]
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=120, valid=20)


def train(args: list) -> "click.testing.Result":  # noqa: F821
    return CliRunner().invoke(main, ["train", *map(str, args)], catch_exceptions=False)


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in `logdir`, as TensorBoard itself reads it (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def expected_scalars(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """What the log says TensorBoard must hold: each numeric field of each record at its update."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for name, value in record.items():
            if name not in ("type", "update", "subset") and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(f"{record['type']}/{name}", []).append((record["update"], float(value)))
    return expected


def assert_same_scalars(found: dict, expected: dict) -> None:
    assert set(found) == set(expected)
    for tag, points in expected.items():
        assert [step for step, _ in found[tag]] == [step for step, _ in points], tag
        for (_, got), (_, want) in zip(found[tag], points):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-30), tag  # stored as float32


def one_error_line(stderr: str, fragment: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], stderr


# --- TensorBoard ------------------------------------------------------------------------


def test_tensorboard_holds_every_numeric_field_of_the_log(tmp_path: Path, data_bin: Path) -> None:
    pytest.importorskip("tensorboard")
    run, logdir = tmp_path / "run", tmp_path / "tb"
    result = train([data_bin, "--save-dir", run, *TINY, "--max-update", "12", "--log-interval", "4",
                    "--validate-interval-updates", "6", "--tensorboard-logdir", logdir])
    assert result.exit_code == 0, result.output
    records = log_records(run)
    assert {"train", "valid"} == {r["type"] for r in records}
    found = scalars(logdir)
    assert {"train/loss", "train/nll", "train/ppl", "train/lr", "train/gnorm", "train/tokens_per_s",
            "valid/loss", "valid/nll", "valid/ppl"} <= set(found)
    assert_same_scalars(found, expected_scalars(records))


def test_tensorboard_takes_new_fields_of_a_record_by_name(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from nmt_cli.train.tensorboard import TensorBoardLog

    log = TensorBoardLog(tmp_path / "tb", resumed_at_update=0)
    record = {"type": "valid", "subset": "valid", "update": 7, "loss": 3.5, "bleu": 21.25, "chrf": 48.5,
              "best": None, "bleu_signature": "nrefs:1|case:mixed", "improved": True}
    log.write(record)
    log.close()
    assert scalars(tmp_path / "tb") == {"valid/loss": [(7, 3.5)], "valid/bleu": [(7, 21.25)], "valid/chrf": [(7, 48.5)]}


def test_a_resumed_run_leaves_each_update_once_in_tensorboard(tmp_path: Path, data_bin: Path, monkeypatch) -> None:
    """Interrupted in update 9 with its checkpoint at update 6: the scalars it wrote for
    update 8 are replaced by the resumed run's, as the JSONL log's are."""
    pytest.importorskip("tensorboard")
    run, logdir = tmp_path / "run", tmp_path / "tb"
    # Saved at update 6 only: no validation (a new best saves) and no epoch checkpoints.
    args = [data_bin, "--save-dir", run, *TINY, "--max-update", "12", "--log-interval", "2",
            "--save-interval-updates", "6", "--save-interval", "0", "--disable-validation", "--tensorboard-logdir", logdir]
    real_update = trainer_module.train_update

    def interrupted_update(engine, split, shares, fallback, ntokens, num_updates):
        if num_updates == 9:
            raise KeyboardInterrupt
        return real_update(engine, split, shares, fallback, ntokens, num_updates)

    monkeypatch.setattr(trainer_module, "train_update", interrupted_update)
    assert train(args).exit_code != 0
    assert max(step for step, _ in scalars(logdir)["train/loss"]) == 8  # written past the checkpoint
    monkeypatch.setattr(trainer_module, "train_update", real_update)
    resumed = train(args)
    assert resumed.exit_code == 0 and "at update 6" in resumed.stderr
    records = log_records(run)
    assert [r["update"] for r in records if r["type"] == "train"] == [2, 4, 6, 8, 10, 12]
    assert_same_scalars(scalars(logdir), expected_scalars(records))


def run_without(module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`nmt ARGS` in a process where importing `module` fails, as when its extra is not installed."""
    code = f"import sys; sys.modules[{module!r}] = None; from nmt_cli.cli import main; sys.argv[0] = 'nmt'; main()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=SUBPROCESS_ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_tensorboard_missing_is_one_line_before_training(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    result = run_without("tensorboard", ["train", data_bin, "--save-dir", run, *TINY, "--max-update", "2",
                                         "--tensorboard-logdir", tmp_path / "tb"])
    assert result.returncode == 1
    one_error_line(result.stderr, "--tensorboard-logdir needs TensorBoard: pip install 'nmt-cli[tensorboard]'")
    assert not (run / "train_log.jsonl").exists() and not (tmp_path / "tb").exists()


# --- nmt plot ---------------------------------------------------------------------------


def write_log(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def train_record(update: int, loss: float, wall: float) -> dict:
    return {"type": "train", "epoch": 1, "update": update, "loss": loss, "nll": loss, "ppl": 2**loss, "lr": 1e-3,
            "gnorm": 1.0, "tokens_per_s": 1000.0, "wall": wall}


def valid_record(update: int, loss: float, **extra) -> dict:
    return {"type": "valid", "subset": "valid", "epoch": 1, "update": update, "loss": loss, "nll": loss,
            "ppl": 2**loss, "best": loss, **extra}


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    # a: resumed after update 20 (wall starts again), valid records of an older log without wall.
    a = write_log(tmp_path / "a", [train_record(10, 5.0, 60.0), valid_record(10, 4.8), train_record(20, 4.0, 120.0),
                                   valid_record(20, 3.9), train_record(30, 3.5, 30.0), valid_record(30, 3.4, wall=31.0)])
    b = write_log(tmp_path / "b", [train_record(10, 5.5, 50.0), valid_record(10, 5.0, bleu=3.5, chrf=20.0, wall=55.0),
                                   train_record(20, 4.5, 100.0), valid_record(20, 4.2, bleu=9.25, chrf=31.0, wall=105.0)])
    return [a, b]


def test_curves_add_up_wall_time_across_resumes(two_runs: list[Path]) -> None:
    a = read_curves(two_runs[0] / "train_log.jsonl", "a")
    assert a.train_loss.updates == [10, 20, 30] and a.train_loss.values == [5.0, 4.0, 3.5]
    assert a.train_loss.wall == [60.0, 120.0, 150.0]  # the resumed invocation starts after 120 s
    assert a.valid["loss"].wall == [60.0, 120.0, 151.0]  # older records: the train records' time at their update
    assert set(a.valid) == {"loss"}
    b = read_curves(two_runs[1] / "train_log.jsonl", "b")
    assert b.valid["bleu"].values == [3.5, 9.25] and b.valid["chrf"].updates == [10, 20]


@pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
def test_plot_draws_two_runs(tmp_path: Path, two_runs: list[Path], suffix: str) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / f"curves{suffix}"
    result = CliRunner().invoke(main, ["plot", *map(str, two_runs), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
        return
    text = data.decode("utf-8")
    if suffix == ".html":
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
        text = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    labels = {"".join(node.itertext()) for node in root.iter()}
    # Both runs' legends, and the BLEU row since run b logged BLEU (matplotlib writes text as glyph
    # paths, with each text's own string in a comment, which ElementTree drops: look in the raw SVG).
    assert all(f"<!-- {label} -->" in text for label in ("a train", "b valid", "valid BLEU", "updates")), labels


def test_runs_are_named_apart_when_their_logs_share_a_folder(tmp_path: Path, two_runs: list[Path],
                                                           monkeypatch) -> None:
    """Two logs copied into one folder were both named `.` (the folder), and so was `nmt plot .`."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for run, name in zip(two_runs, ("base.jsonl", "big.jsonl")):
        shutil.copy(run / "train_log.jsonl", logs / name)
    monkeypatch.chdir(logs)
    assert [run.name for run in read_runs(("base.jsonl", "big.jsonl"))] == ["base.jsonl", "big.jsonl"]
    monkeypatch.chdir(two_runs[0])
    assert [run.name for run in read_runs((".", str(two_runs[1])))] == ["a", "b"]
    # Runs of one name are told apart by their paths as given, or else in full.
    twin = write_log(tmp_path / "other" / "a", [train_record(10, 5.0, 60.0)])
    assert [run.name for run in read_runs((".", str(twin)))] == [".", str(twin)]
    assert [run.name for run in read_runs((".", "train_log.jsonl"))] == [str(two_runs[0].resolve())] * 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
def test_plot_onto_a_full_device_is_one_error_line_naming_it(tmp_path: Path, two_runs: list[Path]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.svg"
    out.symlink_to("/dev/full")
    result = CliRunner().invoke(main, ["plot", *map(str, two_runs), "-o", str(out)])
    assert_one_error(result.exit_code, result.stderr, f"cannot write {out}: No space left on device")


def test_plot_of_a_real_run(tmp_path: Path, data_bin: Path) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    assert train([data_bin, "--save-dir", run, *TINY, "--max-update", "6", "--log-interval", "2"]).exit_code == 0
    result = CliRunner().invoke(main, ["plot", str(run / "train_log.jsonl"), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("content, fragment", [
    (None, "no training log"),
    ("", "train_log.jsonl is empty"),
    ('{"type": "train", "update": 1, "loss": 2.0, "wall": 1.0}\n{"type": "train", "upd\n', "train_log.jsonl:2: not JSON (Unterminated string starting at: column 19), so not a record of `nmt train`"),
    ('[1, 2]\n', "train_log.jsonl:1: not a JSON object (it holds a list), so not a record of `nmt train`"),
    ('{"type": "valid", "update": 1, "loss": "high"}\n', "train_log.jsonl:1: valid record's 'loss' is 'high'"),
    ('{"type": "train", "loss": 1.0}\n', "train_log.jsonl:1: a train record without an integer 'update'"),
])
def test_plot_bad_logs_are_one_line_naming_file_and_line(tmp_path: Path, content: str | None, fragment: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "train_log.jsonl").write_text(content)
    result = CliRunner().invoke(main, ["plot", str(run), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == 1
    one_error_line(result.stderr, fragment)
    assert not (tmp_path / "c.png").exists()


def test_plot_refuses_an_unknown_format(tmp_path: Path, two_runs: list[Path]) -> None:
    result = CliRunner().invoke(main, ["plot", str(two_runs[0]), "-o", str(tmp_path / "c.jpg")])
    assert result.exit_code == 1
    one_error_line(result.stderr, "must end in .png, .svg, .html")


def test_plot_without_matplotlib_is_one_line(tmp_path: Path, two_runs: list[Path]) -> None:
    result = run_without("matplotlib", ["plot", two_runs[0], "-o", tmp_path / "c.png"])
    assert result.returncode == 1
    one_error_line(result.stderr, "nmt plot needs matplotlib: pip install 'nmt-cli[plot]'")


def test_plot_labels_a_run_whose_name_is_not_utf8(tmp_path: Path, two_runs: list[Path]) -> None:
    run = Path(os.fsdecode(os.fsencode(tmp_path) + b"/r\xff"))
    shutil.copytree(two_runs[0], run)
    for suffix in (".png", ".html"):
        result = CliRunner().invoke(main, ["plot", str(run), "-o", str(tmp_path / f"c{suffix}")])
        assert result.exit_code == 0, result.output
    assert "<title>training curves: r\\xff</title>" in (tmp_path / "c.html").read_text(encoding="utf-8")


def test_plot_without_a_writable_matplotlib_cache_is_one_line(tmp_path: Path, two_runs: list[Path]) -> None:
    """No config or cache directory (MPLCONFIGDIR a file here) and no temporary one."""
    (tmp_path / "not-a-dir").write_text("")
    code = ("import tempfile, sys\n"
            "def refuse(*args, **kwargs): raise FileNotFoundError(2, 'No usable temporary directory found')\n"
            "tempfile.mkdtemp = refuse\n"
            "from nmt_cli.cli import main; sys.argv[0] = 'nmt'; main()")
    result = subprocess.run([sys.executable, "-c", code, "plot", str(two_runs[0]), "-o", str(tmp_path / "c.png")],
                            env={**SUBPROCESS_ENV, "MPLCONFIGDIR": str(tmp_path / "not-a-dir")}, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert_one_error(result.returncode, result.stderr, "nmt plot cannot start matplotlib", "MPLCONFIGDIR")
    assert not (tmp_path / "c.png").exists()


# --- live progress ----------------------------------------------------------------------


def test_eta_is_the_nearest_limit() -> None:
    # 20 updates in 10 s, 60 to go: 30 s; a 25 s budget leaves 15 s.
    assert eta_seconds(Limits(max_update=100, max_time=0), 10.0, 20, 40) == pytest.approx(30.0)
    assert eta_seconds(Limits(max_update=100, max_time=25.0), 10.0, 20, 40) == pytest.approx(15.0)
    assert eta_seconds(Limits(max_update=100, max_time=0), 10.0, 0, 40) is None  # no pace yet
    assert eta_seconds(Limits(max_update=0, max_time=0), 10.0, 20, 40) is None


def run_on_a_terminal(args: list) -> tuple[str, str, int]:
    """`nmt ARGS` with stderr on a pseudo-terminal of 160 columns: (terminal output, stdout, status)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {key: value for key, value in SUBPROCESS_ENV.items() if key not in ("COLUMNS", "LINES", "NO_COLOR")}
    proc = subprocess.Popen([sys.executable, "-m", "nmt_cli", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env={**env, "TERM": "xterm-256color"}, cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    return b"".join(chunks).decode("utf-8", errors="replace"), stdout, proc.wait(timeout=120)


def test_live_display_on_a_terminal_shows_progress_and_eta(tmp_path: Path, data_bin: Path) -> None:
    terminal, stdout, status = run_on_a_terminal(["train", data_bin, "--save-dir", tmp_path / "run", *TINY,
                                                  "--max-update", "16", "--log-interval", "4"])
    assert status == 0 and "stopped (max_update) after 16 updates" in stdout
    assert "\r\x1b[2K" in terminal  # the status line is redrawn in place
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    final = re.findall(r"100% update 16/16 \| epoch \d+ \| loss [\d.]+ \| lr [\d.e-]+ \| tgt_tok/s \d+ \| "
                       r"elapsed \d+:\d\d:\d\d \| eta \d+:\d\d:\d\d", plain)
    assert final, plain[-2000:]
    # The log lines are all still there, above the display.
    assert len(re.findall(r"epoch \d{3} \| update (?:4|8|12|16) \| loss", plain)) == 4
    assert "valid on 'valid'" in plain


def test_live_display_keeps_warnings_and_stderr_writes(capsys) -> None:
    reporter = Reporter(enabled=True)
    screen = io.StringIO()
    reporter.console = Console(file=screen, force_terminal=True, width=200, highlight=False, soft_wrap=True)
    reporter.start_live(Limits(max_update=50, max_time=0), start_time=0.0, start_updates=0, epoch=1)
    reporter.updated(10, 1)
    reporter.warning("out of GPU memory in update 11; skipped its batches")
    print("a library wrote this to stderr", file=sys.stderr)
    reporter.stop_live()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "warning: out of GPU memory in update 11; skipped its batches" in shown
    assert "a library wrote this to stderr" in shown
    assert "update 10/50 | epoch 1" in shown


def test_off_a_terminal_the_log_lines_are_plain(tmp_path: Path, data_bin: Path) -> None:
    result = train([data_bin, "--save-dir", tmp_path / "run", *TINY, "--max-update", "8", "--log-interval", "4"])
    assert result.exit_code == 0
    assert "\x1b" not in result.stderr and "\r" not in result.stderr and "elapsed" not in result.stderr
    train_lines = [line for line in result.stderr.splitlines() if re.match(r"epoch \d{3} \| update", line)]
    pattern = (r"epoch \d{3} \| update \d+ \| loss [\d.]+ \| nll [\d.]+ \| ppl [\d.]+ \| lr [\d.e-]+ \| "
               r"gnorm [\d.]+ \| tgt_tok/s \d+ \| wall \d+:\d\d:\d\d \| eta \d+:\d\d:\d\d")
    assert len(train_lines) == 2 and all(re.fullmatch(pattern, line) for line in train_lines), train_lines
