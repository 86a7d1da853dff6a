#!/usr/bin/env bash
# What a GPU machine should check and measure, in one command that ends within a time
# budget (default 540 s): the accelerator tests, then the GPU variants of the decoding
# and training benchmarks, most wanted first. Each step runs under the time still left,
# so one slow step cannot take the others' time, and what finished is kept.
#
#   bash benchmarks/gpu_session.sh                    # one CUDA GPU, bf16
#   SMOKE=1 bash benchmarks/gpu_session.sh            # the same steps, tiny, on the CPU
#
# Output in $OUT (default benchmarks/out/gpu): summary.txt (each step's exit status,
# seconds and result lines) and session.log (everything). BUDGET=seconds changes the
# budget. WHEELS=dir installs the wheels in dir first, for a machine without network
# that lacks a dependency (sacremoses, say). SOURCE_TEXT=file gives the varied-length
# decoding step real sentence lengths (newstest2014's test.en, say); without it they
# are random. STEPS="tests feature_tests" runs only the steps named (their names as in
# summary.txt), in this script's order: the steps add up to more than one budget. The
# exit status is 1 when a step failed, timed out or reported a system as "failed:" (the
# other steps still run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu}
BUDGET=${BUDGET:-540}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
LOG=$OUT/session.log
: >"$SUMMARY"
: >"$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ -n "${WHEELS:-}" ]; then
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --target "$site" "$WHEELS"/*.whl >>"$LOG" 2>&1
    export PYTHONPATH="$PYTHONPATH:$site"
fi

if [ -n "${SMOKE:-}" ]; then  # tiny sizes on the CPU: checks this script, measures nothing
    TRAIN_BASE="--arch transformer_tiny --device cpu --batch-size 8 --seq-len 8 --vocab 100 --steps 2 --warmup 1"
    TRAIN_BIG=$TRAIN_BASE
    ATTENTION="--device cpu --batch-size 8 --steps 2 --warmup 1"
    DECODE="--arch transformer_tiny --vocab 100 --sentences 16 --tgt-len 4 --device cpu --cuda-graphs"
    DECODE_LARGE_BATCH=16
    DECODE_BATCH=8
else
    TRAIN_BASE="--arch transformer_base --device cuda --precision bf16"
    TRAIN_BIG="--arch transformer_big --device cuda --precision bf16"
    ATTENTION="--device cuda --precision bf16"
    DECODE="--arch transformer_base --vocab 32000 --sentences 2048 --device cuda --precision bf16 --cuda-graphs"
    DECODE_LARGE_BATCH=512
    DECODE_BATCH=128
fi
# Outputs as long as their sources: sentences finish at different steps, batches vary in shape.
VARIED="--tgt-len-from-source"
[ -n "${SOURCE_TEXT:-}" ] && VARIED="$VARIED --source-text $SOURCE_TEXT"
# The decoding benchmark runs Hugging Face in a python of its own; this one has it or not.
PEER_PYTHON=$(command -v python3)
FAILED_STEPS=0

# step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS (less if the budget is
# nearly spent), append its output to the log and its result lines to the summary.
step() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then
        printf '%-24s skipped: not in STEPS\n' "$name" >>"$SUMMARY"
        return
    fi
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 20 ]; then
        printf '%-24s skipped: the time budget is spent\n' "$name" >>"$SUMMARY"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local start=$SECONDS
    echo "### $name: $*" >>"$LOG"
    timeout "$limit" "$@" >"$OUT/.step" 2>&1
    local rc=$?
    cat "$OUT/.step" >>"$LOG"
    printf '%-24s exit %3d after %3d s (limit %d s)\n' "$name" "$rc" $((SECONDS - start)) "$limit" >>"$SUMMARY"
    if [ "$rc" -ne 0 ] || grep -q ' failed: ' "$OUT/.step"; then
        FAILED_STEPS=$((FAILED_STEPS + 1))
    fi
    grep -E '^(nmt|torch|hf|fairseq|ratio|hardware limit|#|[0-9]+ (passed|failed)|FAILED|ERROR|key mask|no mask|causal|per update)' "$OUT/.step" | sed 's/^/    /' >>"$SUMMARY"
}

step machine 30 bash -c 'nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; python3 -c "
import torch
print(\"# torch\", torch.__version__, \"cuda\", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\")"'
step tests 150 python3 -m pytest -q -ra tests/test_accelerator.py
step train_base 100 python3 benchmarks/train_throughput.py $TRAIN_BASE --share-all-embeddings --systems nmt,torch,hf \
    --pure-bf16 --profile
step train_big 80 python3 benchmarks/train_throughput.py $TRAIN_BIG --share-all-embeddings --systems nmt,hf \
    --pure-bf16 --profile
step attention_base 30 python3 benchmarks/attention_kernels.py $ATTENTION --heads 8
step attention_big 30 python3 benchmarks/attention_kernels.py $ATTENTION --heads 16
step train_base_compiled 180 python3 benchmarks/train_throughput.py $TRAIN_BASE --share-all-embeddings \
    --systems nmt,torch --compile --pure-bf16 --profile
step train_big_compiled 150 python3 benchmarks/train_throughput.py $TRAIN_BIG --share-all-embeddings \
    --systems nmt --compile --pure-bf16
step decode_varied_lengths 120 python3 benchmarks/decode_throughput.py $DECODE $VARIED \
    --batch-size "$DECODE_BATCH" --skip-peer
step decode_batch_$DECODE_LARGE_BATCH 60 python3 benchmarks/decode_throughput.py $DECODE \
    --batch-size "$DECODE_LARGE_BATCH" --skip-peer --profile
step decode_batch_$DECODE_BATCH 120 python3 benchmarks/decode_throughput.py $DECODE \
    --batch-size "$DECODE_BATCH" --peer-python "$PEER_PYTHON" --profile
# generate, guided decoding, --engine ctranslate2 and serve on the GPU against the CPU (the
# last two skip where their extras are missing: carry their wheels in WHEELS).
step feature_tests 120 python3 -m pytest -q -ra tests/test_accelerator_features.py
rm -f "$OUT/.step"
echo "total: $SECONDS s of a $BUDGET s budget; steps with a failure: $FAILED_STEPS" >>"$SUMMARY"
cat "$SUMMARY"
[ "$FAILED_STEPS" -eq 0 ]
