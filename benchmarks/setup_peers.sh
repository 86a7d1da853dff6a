#!/usr/bin/env bash
# Build the virtual environment that holds the peers the benchmarks compare nmt with:
# fairseq (fairseq-fixed 0.12.3.1, with sacremoses and subword-nmt), Hugging Face
# transformers, CTranslate2 and sentencepiece. nmt itself never imports any of them;
# the benchmark scripts run the peers as subprocesses with this environment's python.
#
#   benchmarks/setup_peers.sh [VENV_DIR]        (default: benchmarks/.venv, git-ignored)
#
# torch is pinned to the main environment's version (torch==2.13.0) in every install,
# so that no requirement pulls in another (multi-GB CUDA) torch build. Idempotent.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/.." && pwd)"
venv="${1:-$here/.venv}"
torch_version="2.13.0"
ctranslate2_version="4.8.5"

say() { echo "[setup_peers] $*"; }

# torch first, then fairseq with its Moses/BPE tools (builds C extensions: minutes).
bash "$repo_root/scripts/setup_fairseq_env.sh" "$venv"

constraints="$venv/constraints.txt"
echo "torch==$torch_version" > "$constraints"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -c "$constraints")

# fairseq pulls torchaudio, whose compiled library fits another torch; translation never
# imports it, but transformers does when it is installed (and then fails to load).
if "$venv/bin/python" -m pip show torchaudio > /dev/null 2>&1; then
    say "removing torchaudio (built for another torch; only fairseq's speech tasks use it)"
    "$venv/bin/python" -m pip uninstall -y torchaudio
fi

say "installing transformers, ctranslate2==$ctranslate2_version, sentencepiece (torch pinned)"
"${pip[@]}" transformers "ctranslate2==$ctranslate2_version" sentencepiece

check="import fairseq, fairseq.sequence_generator, ctranslate2, sentencepiece, sacremoses, torch, transformers; from transformers import MarianMTModel"
say "checking: $check"
"$venv/bin/python" -c "$check; print('torch', torch.__version__, '| fairseq', fairseq.__version__, '| transformers', transformers.__version__, '| ctranslate2', ctranslate2.__version__)"
say "done: $venv"
