"""Fixtures shared by several test modules."""

import os
import subprocess
from pathlib import Path

import pytest

from model_utils import torch_threads

REPO = Path(__file__).resolve().parents[1]
# The reference environment (scripts/setup_fairseq_env.sh, benchmarks/setup_peers.sh).
FAIRSEQ_PYTHON = Path(os.environ.get("NMT_FAIRSEQ_PYTHON", REPO / ".venv-fairseq" / "bin" / "python"))


@pytest.fixture
def one_thread():
    """Run torch on one thread: tiny models gain nothing from more, and runs stay bit-reproducible."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def fairseq_python() -> Path:
    """The reference environment's interpreter; skips the test where there is none, or where it
    cannot import fairseq, sacremoses and subword_nmt (checked once a session)."""
    if not FAIRSEQ_PYTHON.exists():
        pytest.skip(f"no fairseq environment at {FAIRSEQ_PYTHON} (run scripts/setup_fairseq_env.sh or set NMT_FAIRSEQ_PYTHON)")
    check = subprocess.run([str(FAIRSEQ_PYTHON), "-c", "import fairseq, sacremoses, subword_nmt"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"{FAIRSEQ_PYTHON} cannot import fairseq, sacremoses and subword_nmt: {check.stderr.strip().splitlines()[-1:]}")
    return FAIRSEQ_PYTHON
