#!/usr/bin/env bash
# WMT14 En-De / En-Fr, end to end, as in "Attention Is All You Need" (Vaswani et al., 2017).
# Called by wmt14_en_de.sh and wmt14_en_fr.sh, which set PAIR; see those files for the
# expected time and disk, and recipes/wmt14_plan.py for the paper's settings, the batch
# arithmetic and every stage's command (printed at the start of every run).
#
# Stages (each records the settings that made it; a re-run skips a stage done with the
# same settings, redoes one whose settings changed, and refuses to continue a training
# run with other settings):
#   1 data      training corpora, newstest2013 (valid), newstest2014 full (test): fetched,
#               checksummed, extracted to $WORK/raw/{train,valid,test}.{src,tgt}
#   2 prepare   nmt preprocess: Moses tokenization (no punctuation normalization), cleaning,
#               joint BPE, binarization
#   3 train     nmt train (torchrun with several GPUs or nodes)
#   4 average   the last 5 (base) / 20 (big) update checkpoints
#   5 translate newstest2014, beam 4, GNMT length penalty 0.6, max length input + 50
#   6 score     sacreBLEU (with signature) against the reference as WMT's SGM has it, and
#               tokenized BLEU (compound-split for En-De)
# A failing stage stops the recipe with a line naming it and leaves no done marker.
#
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_de.sh
#   DRY_RUN=1 GPUS=8 bash recipes/wmt14_en_de.sh             # print the plan, run nothing
#   WMT14_DIR=/data/wmt14 bash recipes/wmt14_en_de.sh        # archives or extracted files, no download
#   SMOKE=1 bash recipes/wmt14_en_de.sh                       # generated data, tiny model, CPU: minutes
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 GPUS=8 bash ...    # on every node (NODE_RANK 0, 1, ...)
#   WMT14_MANIFEST=mirror.tsv bash ...                        # another manifest (a mirror's URLs)
#
# Settings: any row of the printed table by its name (LR, DROPOUT, MAX_UPDATE, AVERAGE,
# TOKENS_PER_UPDATE, ...), BPE_SIZE, MAX_TOKENS (a process's batch cap), UPDATE_FREQ,
# PRECISION, KEEP_LAST_EPOCHS, TRAIN_FLAGS (more `nmt train` flags), WORK, WORKERS.
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT; WORK must be on a filesystem
# that every node shares (see README.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${PAIR:?set PAIR=en-de or PAIR=en-fr}"
SMOKE=${SMOKE:-0}
DRY_RUN=${DRY_RUN:-0}
if [ "$SMOKE" != 1 ] && [ -z "${GPUS:-}" ]; then
    GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
fi
WORKERS=${WORKERS:-$(nproc)}
SHARED_WORK_TIMEOUT=${SHARED_WORK_TIMEOUT:-600}  # seconds a node waits to see node rank 0's WORK
WAIT_POLL=${WAIT_POLL:-30}  # seconds between a waiting node's looks at the done markers
export PAIR SMOKE DRY_RUN GPUS WORKERS ROOT

# The plan (stderr) and the variables it sets here: paths, CMD_<STAGE>_<N> arrays, SETTINGS_<STAGE>.
plan=$(python3 "$ROOT/recipes/wmt14_plan.py" shell) || exit $?
eval "$plan"
if [ "$DRY_RUN" = 1 ]; then exit 0; fi

say() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
plan_hash() { printf '%s' "${SETTINGS_SCORE%%$'\n'*}"; }  # first line: a hash of every stage's settings

stage_done() {  # NAME SETTINGS: the stage finished with these settings
    [ -f "$WORK/.done.$1" ] && [ "$(cat "$WORK/.done.$1")" = "$2" ]
}

run_stage() {  # NAME SETTINGS ON_CHANGE(redo|refuse) FUNCTION
    local name=$1 settings=$2 on_change=$3 body=$4
    local started=$WORK/.settings.$name
    if stage_done "$name" "$settings"; then
        printf '%s: done with these settings, skipped\n' "$name" >&2
        return 0
    fi
    if [ -f "$started" ] && [ "$(cat "$started")" != "$settings" ]; then
        local difference
        difference=$(printf '%s' "$settings" | python3 "$ROOT/recipes/wmt14_plan.py" difference "$started")
        if [ "$on_change" = refuse ]; then
            die "stage $name: $WORK holds a run started with other settings ($difference); use another WORK, or remove $started to continue that run with these settings"
        fi
        say "$name: the settings changed ($difference), redoing it"
    fi
    rm -f "$WORK/.done.$name" "$WORK/.failed.$name"
    printf '%s\n' "$settings" > "$started"
    say "$name"
    # A subshell outside any `||` or `if`, so that `set -e` holds for every command in it.
    set +e
    (set -e; "$body")
    local status=$?
    set -e
    if [ "$status" != 0 ]; then
        printf '%s\n' "$status" > "$WORK/.failed.$name"
        die "stage $name failed (exit $status) and left no done marker; fix the cause above and run the recipe again"
    fi
    printf '%s\n' "$settings" > "$WORK/.done.$name"
}

# ---- 1: data (recipes/wmt14_data.sh) ------------------------------------------------
# shellcheck source=recipes/wmt14_data.sh
source "$ROOT/recipes/wmt14_data.sh"

stage_prepare() { "${CMD_PREPARE_0[@]}"; }
stage_train() { "${CMD_TRAIN_0[@]}"; }
stage_average() { "${CMD_AVERAGE_0[@]}"; }
stage_translate() { "${CMD_TRANSLATE_0[@]}"; mv "$HYP.tmp" "$HYP"; }

# ---- multi-node: stages other than training run on node rank 0 ----------------------
await_node0() {  # the other nodes: see node rank 0's WORK, with the same plan
    local waited=0
    while [ "$(cat "$WORK/.node0" 2>/dev/null)" != "$(plan_hash)" ]; do
        if [ "$waited" -ge "$SHARED_WORK_TIMEOUT" ]; then
            if [ -f "$WORK/.node0" ]; then
                die "node rank 0 runs other settings (plan $(cat "$WORK/.node0"), here $(plan_hash)): start every node with the same settings"
            fi
            die "node rank 0's $WORK/.node0 did not appear within $SHARED_WORK_TIMEOUT s: a multi-node run needs WORK on a filesystem that every node shares"
        fi
        sleep "$WAIT_POLL"
        waited=$((waited + WAIT_POLL))
    done
}

await_stage() {  # NAME SETTINGS: wait for node rank 0 to finish a stage
    local waited=0 next_report=0
    until stage_done "$1" "$2"; do
        if [ -f "$WORK/.failed.$1" ] && [ "$WORK/.failed.$1" -nt "$WORK/.node0" ]; then
            die "stage $1 failed on node rank 0 (see its output); this node stops too"
        fi
        if [ "$waited" -ge "$next_report" ]; then
            printf 'node rank %s: waiting for node rank 0 to finish stage %s (%s s so far)\n' "$NODE_RANK" "$1" "$waited" >&2
            next_report=$((waited + 600))
        fi
        sleep "$WAIT_POLL"
        waited=$((waited + WAIT_POLL))
    done
}

mkdir -p "$WORK"
if [ "$NODE_RANK" = 0 ]; then
    rm -f "$WORK"/.failed.*
    plan_hash > "$WORK/.node0"
else
    await_node0
fi

step() {  # NAME SETTINGS ON_CHANGE FUNCTION: run on node rank 0, wait for it elsewhere
    if [ "$NODE_RANK" = 0 ]; then run_stage "$@"; else await_stage "$1" "$2"; fi
}

step data "$SETTINGS_DATA" redo stage_data
step prepare "$SETTINGS_PREPARE" redo stage_prepare
if [ "$NODE_RANK" = 0 ]; then
    run_stage train "$SETTINGS_TRAIN" refuse stage_train
else
    # Every node joins the same torchrun; node rank 0 keeps the markers.
    if stage_done train "$SETTINGS_TRAIN"; then
        printf 'train: done with these settings, skipped\n' >&2
    else
        say "train (node rank $NODE_RANK of $NNODES)"
        "${CMD_TRAIN_0[@]}" || die "stage train failed on node rank $NODE_RANK (exit $?)"
    fi
    say "node rank $NODE_RANK: training done; node rank 0 averages, translates and scores"
    exit 0
fi
run_stage average "$SETTINGS_AVERAGE" redo stage_average
run_stage translate "$SETTINGS_TRANSLATE" redo stage_translate

# ---- 6: score ----------------------------------------------------------------------
say "score: newstest2014 $SRC->$TGT ($ARCH, average of $AVERAGE)"
"${CMD_SCORE_0[@]}" || die "stage score failed (exit $?)"
"${CMD_SCORE_1[@]}" || die "stage score failed (exit $?)"
if [ -n "$PAPER_BLEU" ]; then
    split=$([ "$PAIR" = en-de ] && echo ", compound-split" || echo "")
    echo "paper ($ARCH, tokenized BLEU$split): $PAPER_BLEU" >&2
fi
