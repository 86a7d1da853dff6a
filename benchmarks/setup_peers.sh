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

say "installing transformers, ctranslate2==$ctranslate2_version, sentencepiece (torch pinned)"
"${pip[@]}" transformers "ctranslate2==$ctranslate2_version" sentencepiece

check="import fairseq, transformers, ctranslate2, sentencepiece, sacremoses, torch"
say "checking: $check"
"$venv/bin/python" -c "$check; print('torch', torch.__version__, '| fairseq', fairseq.__version__, '| transformers', transformers.__version__, '| ctranslate2', ctranslate2.__version__)"
say "done: $venv"
