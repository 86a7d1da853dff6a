"""Shared helpers for the fault tests: a fork server for cheap kill points, one-error-line
checks, crafted pickles and a tiny translatable run directory.

The fork server is one Python process that imports torch and nmt once and then forks a
child per `nmt` invocation. Killing such a child with SIGKILL is a real crash of a real
`nmt` process, but a kill point costs milliseconds of start-up instead of the seconds
that importing torch takes, so a test can afford dozens of them.

Run as a script (`python fault_utils.py serve`) it is the server; the protocol is one
JSON line per request on stdin (`{"args": [...], "log": PATH}`), answered by
`{"pid": PID}` when the child starts and `{"status": CODE}` when it ends (a negative
CODE is the signal that ended it).
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# One thread: exact reproducibility between processes, and no oversubscription on small CI machines.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# --- one clear error line ------------------------------------------------------------------


def assert_one_error(exit_code: int, stderr: str, *fragments: str) -> str:
    """Exit status 1, exactly one `error: ...` line, no traceback; return that line."""
    assert exit_code == 1, (exit_code, stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def assert_clean_exit(result) -> None:
    """A CliRunner result ended by sys.exit or normally, never by an uncaught exception
    (which the real command would print as a traceback)."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("uncaught exception") from result.exception


# --- files that must not run code ---------------------------------------------------------


def nmt(args: list, input: bytes | str = b""):
    """`nmt ARGS` in this process; it must exit without a traceback."""
    from click.testing import CliRunner

    from nmt_cli.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    assert_clean_exit(result)
    return result


def model_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class CreatesFileWhenUnpickled:
    """A pickle payload that creates `marker` if unpickling runs its code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def write_evil_checkpoint(path: Path, marker: Path, state: dict | None = None) -> Path:
    """A torch.save'd checkpoint (a real one's keys when `state` is given) with a code-running payload."""
    payload = dict(state or {"format_version": 1})
    payload["model_config"] = CreatesFileWhenUnpickled(marker)
    torch.save(payload, path)
    return path


def write_evil_pickle(path: Path, marker: Path) -> Path:
    """A bare pickle (not torch's zip container) with a code-running payload."""
    path.write_bytes(pickle.dumps({"format_version": 1, "model": CreatesFileWhenUnpickled(marker)}, protocol=2))
    return path


# --- a tiny run directory -----------------------------------------------------------------


def tiny_checkpoint_state(data_bin: Path, seed: int = 0, overrides: dict | None = None) -> dict:
    """A randomly initialised transformer_tiny checkpoint for the data-bin's dictionaries."""
    from nmt_cli.checkpoints.format import FORMAT_VERSION
    from nmt_cli.data.pairs import load_data_bin
    from nmt_cli.models.registry import build_model, resolve_config

    data = load_data_bin(data_bin)
    cfg = resolve_config("transformer_tiny", {"dropout": 0.0, **(overrides or {})})
    torch.manual_seed(seed)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict))
    return {
        "format_version": FORMAT_VERSION, "model_config": cfg.to_dict(), "model": model.state_dict(),
        "source_lang": data.source_lang, "target_lang": data.target_lang,
        "src_dict": data.src_dict.symbols, "tgt_dict": data.tgt_dict.symbols,
        "num_updates": 0, "epoch": 1, "best_metric": None,
    }


def tiny_run_dir(data_bin: Path, run: Path) -> Path:
    """A run directory (meta.json, dictionaries, checkpoint_best.pt) that `nmt translate` reads."""
    import shutil

    from nmt_cli.checkpoints.format import save_checkpoint

    run.mkdir(parents=True, exist_ok=True)
    for name in ("meta.json", "dict.src.txt", "dict.tgt.txt"):
        shutil.copyfile(data_bin / name, run / name)
    save_checkpoint(tiny_checkpoint_state(data_bin), run / "checkpoint_best.pt")
    return run


# --- the fork server ----------------------------------------------------------------------


@dataclass
class Attempt:
    """One forked `nmt` invocation: killed after `delay` seconds unless it ended first."""

    killed: bool
    status: int  # exit status, or minus the signal number
    seconds: float


class ForkServer:
    """Client side: start the server, run `nmt` commands in forked children, kill them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "serve"], cwd=REPO, env=SUBPROCESS_ENV,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
        )
        self._buffer = b""
        assert self._read_line(timeout=300) == {"ready": True}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def run(self, args: list[str], log: Path, kill_after: float | None = None, timeout: float = 300) -> Attempt:
        """Run `nmt ARGS` (stdout and stderr to `log`); SIGKILL it after `kill_after` seconds."""
        request = {"args": [str(a) for a in args], "log": str(log)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        started = time.monotonic()
        pid = self._read_line(timeout=60)["pid"]
        answer = self._read_line(timeout=kill_after if kill_after is not None else timeout)
        killed = answer is None and kill_after is not None
        if killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended just now
                pass
            answer = self._read_line(timeout=60)
        assert answer is not None, f"nmt {args} did not finish in {timeout} s"
        return Attempt(killed=killed and answer["status"] == -signal.SIGKILL, status=answer["status"],
                       seconds=time.monotonic() - started)

    def _read_line(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.proc.stdout], [], [], remaining)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            assert chunk, "the fork server died"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(args: list[str], log: str) -> None:
    """In the forked child: run `nmt ARGS` with output to `log`, then exit without cleanup."""
    code = 70
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        from nmt_cli.cli import main

        main(args, prog_name="nmt")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - a bug in nmt: keep its traceback in the log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    # Import everything the commands need before forking, so children start at once.
    import nmt_cli.checkpoints.average  # noqa: F401
    import nmt_cli.commands.average  # noqa: F401
    import nmt_cli.commands.preprocess  # noqa: F401
    import nmt_cli.commands.train  # noqa: F401
    import nmt_cli.preprocess.run  # noqa: F401
    import nmt_cli.train.trainer  # noqa: F401

    torch.set_num_threads(1)
    # Creating an optimizer imports torch's compiler stack (seconds); do it once, here.
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    _answer({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request["args"], request["log"])
        _answer({"pid": pid})
        _, wait_status = os.waitpid(pid, 0)
        _answer({"status": os.waitstatus_to_exitcode(wait_status)})


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    serve()
