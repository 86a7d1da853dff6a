"""Load: `nmt translate` streams a 1M-line stdin in bounded memory and keeps line alignment.

The stream is mostly empty lines (the model does not run on them) with a short
sentence every 1000th line, so the model work stays small and the test measures the
streaming itself. Peak memory comes from `os.wait4`, which reports the child's own
maximum resident set size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from databin_utils import reversal_data_bin
from fault_utils import REPO, SUBPROCESS_ENV, tiny_run_dir

LINES = 1_000_000
SENTENCE_EVERY = 1000
# Holding the stream would take far more: 1M Python line objects alone are ~150 MB.
MAX_EXTRA_RSS_MB = 60


def input_line(i: int) -> str:
    """Line i (0-based): a sentence every 1000th line, repeated sentences, else empty."""
    if i % SENTENCE_EVERY == 7:
        return f"w{i % 16} w{(i // SENTENCE_EVERY) % 16} w3"
    return ""


def translate_stream(run: Path, num_lines: int, output: Path) -> tuple[int, int]:
    """Feed `num_lines` generated lines to `nmt translate` on stdin; return (exit status, peak RSS in kB)."""
    command = [sys.executable, "-m", "nmt_cli", "translate", "--path", str(run / "checkpoint_best.pt"),
               "--device", "cpu", "--threads", "1", "--beam", "1", "--max-len-b", "3", "--quiet"]
    with open(output, "wb") as sink:
        proc = subprocess.Popen(command, cwd=REPO, env=SUBPROCESS_ENV, stdin=subprocess.PIPE, stdout=sink,
                                stderr=subprocess.PIPE)

        def feed() -> None:
            block = []
            for i in range(num_lines):
                block.append(input_line(i) + "\n")
                if len(block) == 50_000:
                    proc.stdin.write("".join(block).encode())
                    block = []
            proc.stdin.write("".join(block).encode())
            proc.stdin.close()

        feeder = threading.Thread(target=feed)
        feeder.start()
        stderr = proc.stderr.read()
        _, wait_status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        feeder.join()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return proc.returncode, usage.ru_maxrss


@pytest.mark.slow
def test_one_million_line_stream_in_bounded_memory_keeps_alignment(tmp_path):
    data_bin = reversal_data_bin(tmp_path / "bin", train=16, valid=4)
    run = tiny_run_dir(data_bin, tmp_path / "run")
    _, small_rss = translate_stream(run, 10_000, tmp_path / "small.txt")
    _, big_rss = translate_stream(run, LINES, tmp_path / "big.txt")
    extra_mb = (big_rss - small_rss) / 1024
    print(f"peak RSS: {small_rss / 1024:.0f} MB for 10k lines, {big_rss / 1024:.0f} MB for {LINES} lines")
    assert extra_mb < MAX_EXTRA_RSS_MB, (small_rss, big_rss)

    with open(tmp_path / "big.txt", "rb") as f:
        outputs = f.read().split(b"\n")
    assert outputs[-1] == b"" and len(outputs) - 1 == LINES
    small = (tmp_path / "small.txt").read_bytes().split(b"\n")
    for i in range(0, LINES, 997):  # empty in, empty out
        if not input_line(i):
            assert outputs[i] == b"", i
    # Sentence lines: the same translation as in the small run (same sentence, same model).
    for i in range(7, 10_000, SENTENCE_EVERY):
        assert outputs[i] and outputs[i] == small[i], i
    repeats = {input_line(i): outputs[i] for i in range(7, SENTENCE_EVERY * 16, SENTENCE_EVERY)}
    for i in range(7, LINES, SENTENCE_EVERY):
        assert outputs[i] == repeats[input_line(i)], i
