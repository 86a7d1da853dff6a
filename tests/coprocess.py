"""Driving an nmt command as a co-process: a line written, its answer read, in turn."""

from __future__ import annotations

import os
import select
import subprocess
import sys


def answers_line_by_line(args: list[str], lines: list[str], timeout: float = 120) -> list[str]:
    """Run `python -m nmt_cli ARGS` with pipes, write each line and wait for its output line
    before writing the next, as a program that wraps the command does; then close its
    input and check that it ends cleanly. A line whose answer does not come within
    `timeout` seconds (a liveness bound, not a speed check) fails the test. The command's
    output is a pipe as users get it: block-buffered (PYTHONUNBUFFERED, which CI sets, would
    hide a missing flush)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", *args], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        answers = []
        for line in lines:
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], timeout)
            assert ready, f"no answer to {line!r}: the command waited for more input or held its output back"
            answers.append(process.stdout.readline().decode().rstrip("\n"))
        process.stdin.close()
        assert process.stdout.read() == b"" and process.wait(60) == 0, process.stderr.read()
        return answers
    finally:
        process.kill()
        process.wait()
