"""fairseq's command-line tools, several in one process; runs in the reference environment.

    python fairseq_commands.py COMMANDS_JSON OUTPUTS_JSON
        COMMANDS_JSON: [[TOOL, ARG, ...], ...], e.g. [["preprocess", "--source-lang", "de", ...],
        ["generate", DATA_BIN, "--path", ...]]. Each runs as `fairseq-TOOL ARG ...` would
        (fairseq_cli.TOOL.cli_main with those arguments), in order; OUTPUTS_JSON gets what
        each wrote to stdout. Importing fairseq is most of a short command's time.

The tests call `run_fairseq_commands` (this module imports nothing of fairseq's at the top, so
nmt's environment imports it too).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path


def run_fairseq_commands(python: str | Path, commands: list[list[object]], work: Path) -> list[str]:
    """What each of `commands` ([tool, arg, ...]) writes to stdout, run in order by the
    reference environment's `python` (one thread; `work` holds the command list)."""
    spec, outputs = work / "fairseq_commands.json", work / "fairseq_outputs.json"
    spec.write_text(json.dumps([[str(part) for part in command] for command in commands]), encoding="utf-8")
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([str(python), __file__, str(spec), str(outputs)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(outputs.read_text(encoding="utf-8"))


def run(tool: str, args: list[str]) -> str:
    cli = importlib.import_module(f"fairseq_cli.{tool}")
    out = io.StringIO()
    sys.argv = [f"fairseq-{tool}", *args]
    with contextlib.redirect_stdout(out):
        cli.cli_main()
    return out.getvalue()


if __name__ == "__main__":
    # fairseq's tools configure logging on stdout once, on their first call; stderr for all.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    commands_path, outputs_path = Path(sys.argv[1]), Path(sys.argv[2])  # before `run` replaces sys.argv
    commands = json.loads(commands_path.read_text(encoding="utf-8"))
    outputs_path.write_text(json.dumps([run(tool, args) for tool, *args in commands]), encoding="utf-8")
