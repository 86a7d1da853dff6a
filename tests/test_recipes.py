"""The shell recipes end to end, in their reduced modes, on the shared data.

Each run must end with a BLEU line, and a second run must skip every finished stage.
Skipped where the shared data is absent (the full recipes would download it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
BLEU_LINE = re.compile(r"^BLEU\|nrefs:1\|.* = \d+\.\d+ ", re.MULTILINE)

pytestmark = pytest.mark.slow


def run_recipe(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # The recipes call `nmt` and `python3`: those of the interpreter running the tests,
    # whether or not its environment is activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    full_env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "2", **env}
    result = subprocess.run(
        ["bash", str(ROOT / "recipes" / script)], env=full_env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stderr[-3000:]}"
    return result


def needs(*names: str) -> None:
    missing = [n for n in names if not (SHARED_DATA / n).is_dir()]
    if missing:
        pytest.skip(f"shared data not present: {', '.join(missing)}")


def test_quickstart_reduced(tmp_path):
    needs("multi30k")
    env = {
        "WORK": str(tmp_path / "quickstart"),
        "DATA_DIR": str(SHARED_DATA / "multi30k"),
        "ARCH": "transformer_tiny",
        "BPE_SIZE": "2000",
        "MAX_UPDATE": "30",
        "AVERAGE": "2",
        "SAVE_INTERVAL_UPDATES": "10",
    }
    first = run_recipe("quickstart.sh", env)
    assert BLEU_LINE.search(first.stdout), first.stdout
    assert "== train" in first.stderr
    hyp = tmp_path / "quickstart" / "test.hyp.de"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 1000

    second = run_recipe("quickstart.sh", env)
    assert BLEU_LINE.search(second.stdout)
    for stage in ("== preprocess", "== train", "== average", "== translate"):
        assert stage not in second.stderr


@pytest.mark.parametrize("script,data", [("wmt14_en_de.sh", "wmt_newstest2008-2012_en_de"), ("wmt14_en_fr.sh", "wmt14_en_fr")])
def test_wmt14_smoke(tmp_path, script, data):
    needs(data, "wmt14_en_de")
    env = {"SMOKE": "1", "WORK": str(tmp_path / "wmt14"), "SHARED_DATA": str(SHARED_DATA)}
    first = run_recipe(script, env)
    assert BLEU_LINE.search(first.stdout), first.stdout
    assert re.search(r"^tokenized-BLEU\|.* = \d+\.\d+", first.stdout, re.MULTILINE), first.stdout
    if script == "wmt14_en_de.sh":
        assert "compound-split:yes" in first.stdout

    second = run_recipe(script, env)
    assert BLEU_LINE.search(second.stdout)
    for stage in ("== data", "== preprocess", "== train", "== average", "== translate"):
        assert stage not in second.stderr
