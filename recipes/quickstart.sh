#!/usr/bin/env bash
# Quickstart: Multi30k English->German end to end on a laptop CPU (or a GPU when there is one):
# data -> nmt preprocess -> nmt train -> nmt average -> nmt translate -> nmt score.
#
#   bash recipes/quickstart.sh                 # downloads Multi30k (checksummed)
#   bash recipes/quickstart.sh DIR             # or DATA_DIR=DIR: train/valid/test.{en,de} already here
#
# About 15 minutes on 2 CPU cores, most of it training (TRAIN_TIME). Re-running skips
# finished steps and resumes training. Settings can be overridden from the environment:
# WORK (output directory), TRAIN_TIME (training budget, e.g. 13m), MAX_UPDATE, ARCH, BPE_SIZE,
# MAX_TOKENS, DROPOUT, AVERAGE (checkpoints to average), SAVE_INTERVAL_UPDATES, LR, WARMUP,
# TRAIN_FLAGS (more `nmt train` flags), SELECT (average: translate the average of the last
# AVERAGE update checkpoints; bleu: score validation BLEU at each epoch's validation with the
# test's search settings and translate the checkpoint with the best one), and the search:
# BEAM, LENPEN, MAX_LEN_A, MAX_LEN_B.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_DIR=${1:-${DATA_DIR:-}}
WORK=${WORK:-$ROOT/work/quickstart}
ARCH=${ARCH:-transformer_small}
TRAIN_TIME=${TRAIN_TIME:-13m}
MAX_UPDATE=${MAX_UPDATE:-100000}
BPE_SIZE=${BPE_SIZE:-4000}
AVERAGE=${AVERAGE:-3}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-100}
# Tuned for a 15-minute CPU budget (about 2.5 epochs): many small updates (at the same
# token budget, 1k-token batches reached twice the BLEU of 4k-token ones), light dropout
# (overfitting is not yet a risk), a high peak rate that pre-norm layers tolerate, and a
# 4k vocabulary that keeps the output layer cheap.
MAX_TOKENS=${MAX_TOKENS:-1024}
DROPOUT=${DROPOUT:-0.1}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-480}
TRAIN_FLAGS=${TRAIN_FLAGS:-}
SELECT=${SELECT:-average}
# One search for the test set and, with SELECT=bleu, for the validation BLEU that selects.
BEAM=${BEAM:-4} LENPEN=${LENPEN:-0.6} MAX_LEN_A=${MAX_LEN_A:-1} MAX_LEN_B=${MAX_LEN_B:-50}
SEARCH_FLAGS=(--beam "$BEAM" --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B")
SELECT_FLAGS=()
case $SELECT in
    average) ;;
    bleu) SELECT_FLAGS=(--eval-bleu --eval-bleu-beam "$BEAM" --eval-bleu-lenpen "$LENPEN"
                        --eval-bleu-max-len-a "$MAX_LEN_A" --eval-bleu-max-len-b "$MAX_LEN_B"
                        --best-checkpoint-metric bleu) ;;
    *) echo "error: SELECT must be average or bleu (got $SELECT)" >&2; exit 1 ;;
esac
WORKERS=${WORKERS:-$(nproc)}

say() { printf '\n== %s\n' "$*" >&2; }
start=$(date +%s)
RAW=$WORK/raw
mkdir -p "$RAW"

say "data -> $RAW"
files=()
for split in train valid test; do for lang in en de; do files+=("multi30k/$split.$lang"); done; done
python3 "$ROOT/data/fetch.py" "${files[@]}" --dest "$RAW" ${DATA_DIR:+--local "$DATA_DIR"}

DATA_BIN=$WORK/data-bin
if [ ! -f "$DATA_BIN/meta.json" ]; then
    say "preprocess -> $DATA_BIN"
    nmt preprocess -s en -t de --trainpref "$RAW/train" --validpref "$RAW/valid" --testpref "$RAW/test" \
        --destdir "$DATA_BIN" --joined-dictionary --bpe-size "$BPE_SIZE" --workers "$WORKERS"
fi

RUN=$WORK/run
if [ ! -f "$RUN/.done" ]; then
    say "train $ARCH for at most $TRAIN_TIME -> $RUN"
    nmt train "$DATA_BIN" --arch "$ARCH" --save-dir "$RUN" --share-all-embeddings --normalize-before \
        --dropout "$DROPOUT" --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" $TRAIN_FLAGS \
        --label-smoothing 0.1 --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --max-time "$TRAIN_TIME" \
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$AVERAGE" --log-interval 100 \
        ${SELECT_FLAGS[@]+"${SELECT_FLAGS[@]}"}
    touch "$RUN/.done"
fi

AVG=$RUN/checkpoint_avg.pt
if [ "$SELECT" = bleu ]; then
    # The best validation BLEU; before any validation, the last checkpoint.
    AVG=$RUN/checkpoint_best.pt
    [ -f "$AVG" ] || AVG=$RUN/checkpoint_last.pt
    say "the checkpoint of the best validation BLEU -> $AVG"
elif [ ! -f "$AVG" ]; then
    # A short time budget may leave fewer update checkpoints than AVERAGE, or none (then
    # the last checkpoint alone is the model).
    saved=$(find "$RUN" -maxdepth 1 -name 'checkpoint_*_*.pt' | wc -l)
    count=$(( saved < AVERAGE ? saved : AVERAGE ))
    if [ "$count" -gt 0 ]; then
        say "average the last $count checkpoints -> $AVG"
        nmt average --inputs "$RUN" --num-update-checkpoints "$count" --output "$AVG"
    else
        say "no update checkpoint yet: the last checkpoint's weights -> $AVG"
        nmt average --inputs "$RUN/checkpoint_last.pt" --output "$AVG"
    fi
fi

HYP=$WORK/test.hyp.de
if [ ! -f "$HYP" ]; then
    say "translate $RAW/test.en -> $HYP"
    nmt translate --path "$AVG" --input "$RAW/test.en" --output "$HYP.tmp" "${SEARCH_FLAGS[@]}"
    mv "$HYP.tmp" "$HYP"
fi

say "score (Multi30k test2016, En->De)"
nmt score --ref "$RAW/test.de" --hyp "$HYP"

# The learning curves; when they cannot be drawn, plot's reason (the extra to install, or no
# training log yet: a run shorter than its --log-interval) and the command that draws them.
CURVES=$WORK/curves.png
if nmt plot "$RUN" -o "$CURVES" 2>"$WORK/plot.err"; then
    curves="$CURVES"
else
    curves="not drawn ($(tail -n 1 "$WORK/plot.err")); to draw them: nmt plot $RUN -o $CURVES"
fi
cat >&2 <<EOF

Done in $(( $(date +%s) - start )) s.
  data-bin:     $DATA_BIN
  checkpoints:  $RUN (translated: $AVG)
  translations: $HYP
  curves:       $curves
EOF
