#!/usr/bin/env bash
# Create the virtual environment that holds the reference fairseq used by
# tests/test_fairseq_import.py (fairseq is never a dependency of nmt itself).
#
#   scripts/setup_fairseq_env.sh [VENV_DIR]      (default: .venv-fairseq in the repo root)
#
# Idempotent: an environment where fairseq and the references' tools already import
# is left as it is. Besides fairseq: sacremoses and subword-nmt (fairseq's own
# `--tokenizer moses --bpe subword_nmt`), which the tests compare nmt against.
# fairseq-fixed 0.12.3.1 builds C/Cython extensions from source (minutes on 2 cores).
# Its torchaudio requirement is only for speech tasks; when no torchaudio release
# fits torch 2.13 it is installed without dependencies and its runtime needs by hand.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo_root/.venv-fairseq}"
python_bin="${PYTHON:-python3}"
torch_version="2.13.0"
fairseq_version="0.12.3.1"

say() { echo "[setup_fairseq_env] $*"; }

check_imports="import fairseq, fairseq.models.transformer, sacremoses, subword_nmt"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check_imports" 2>/dev/null; then
    say "fairseq, sacremoses and subword-nmt already importable in $venv; nothing to do"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    say "creating virtual environment $venv"
    "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)

constraints="$venv/constraints.txt"
echo "torch==$torch_version" > "$constraints"

say "installing torch==$torch_version"
"${pip[@]}" "torch==$torch_version"

# Build requirements installed up front so the sdist builds against this torch
# (no isolated build environment pulling another torch).
say "installing build requirements (setuptools, wheel, cython, numpy)"
"${pip[@]}" -c "$constraints" setuptools wheel cython numpy

if "$venv/bin/python" -c "import fairseq, fairseq.models.transformer" 2>/dev/null; then
    say "fairseq-fixed already installed"
else
    say "installing fairseq-fixed==$fairseq_version with its dependencies (torch pinned)"
    if "${pip[@]}" -c "$constraints" --no-build-isolation "fairseq-fixed==$fairseq_version"; then
        say "installed with dependencies"
    else
        say "dependencies not satisfiable with torch==$torch_version (torchaudio);"
        say "installing fairseq-fixed without dependencies, then its runtime needs"
        "${pip[@]}" -c "$constraints" cffi "hydra-core==1.3.2" "omegaconf==2.3.0" regex \
            "sacrebleu>=1.4.12" tqdm bitarray scikit-learn packaging
        "${pip[@]}" -c "$constraints" --no-build-isolation --no-deps "fairseq-fixed==$fairseq_version"
    fi
fi

say "installing sacremoses and subword-nmt (fairseq's Moses tokenizer and BPE)"
"${pip[@]}" -c "$constraints" sacremoses subword-nmt

say "checking: $check_imports"
"$venv/bin/python" -c "$check_imports; print('fairseq', fairseq.__version__)"
say "done: $venv"
