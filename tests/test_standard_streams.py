"""The process's standard streams as `nmt` finds them: a locale that is not UTF-8, a full
stdout, a file name holding a newline. Each runs the CLI in a subprocess, as the faults
are the process's own streams."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_utils import assert_one_error

from nmt_cli.cli import main

REPOSITORY = Path(__file__).resolve().parent.parent


def run_nmt(args: list, stdin: bytes = b"", stdout=subprocess.PIPE, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt_cli", *map(str, args)], input=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPOSITORY), **env},
                          timeout=120)


@pytest.fixture
def bpe_model(tmp_path: Path) -> Path:
    text = tmp_path / "bpe-train.txt"
    text.write_text("".join(f"w{i} w{i + 1} w{i + 2}\n" for i in range(14)))
    result = CliRunner().invoke(main, ["learn-bpe", "--input", str(text), "--vocab-size", "20",
                                       "--model-prefix", str(tmp_path / "bpe")])
    assert result.exit_code == 0, result.output
    return tmp_path / "bpe.model"


@pytest.mark.parametrize("env", [{"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"},
                                 {"PYTHONUTF8": "0", "LC_ALL": "C"}])
def test_stdout_is_utf8_whatever_the_locale(bpe_model: Path, env: dict[str, str]) -> None:
    args, text = ["apply-bpe", "--decode", "--model", bpe_model], "x y\nü\n".encode()
    result = run_nmt(args, text, **env)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == run_nmt(args, text, LC_ALL="C.UTF-8").stdout and "ü".encode() in result.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["score", "--help"], ["score", "--ref", "{t}", "--hyp", "{t}"]])
def test_a_full_stdout_is_one_error_line_naming_it(tmp_path: Path, args: list[str]) -> None:
    text = tmp_path / "t.de"
    text.write_text("a b c d\n")
    with open("/dev/full", "w") as full:
        result = run_nmt([arg.format(t=text) for arg in args], stdout=full)
    assert_one_error(result.returncode, result.stderr.decode(), "cannot write <stdout>: No space left on device")


@pytest.mark.parametrize("args", [["score", "--ref", "{bad}", "--hyp", "{t}"], ["info", "--path", "{bad}"]])
def test_a_file_name_holding_a_newline_is_one_error_line(tmp_path: Path, args: list[str]) -> None:
    text = tmp_path / "t.de"
    text.write_text("a b c d\n")
    result = run_nmt([arg.format(t=text, bad=tmp_path / "a\nb.en") for arg in args])
    stderr = result.stderr.decode()
    assert result.returncode == 1 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("error: ") and "a\\nb.en" in stderr
