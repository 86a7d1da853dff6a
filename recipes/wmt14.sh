#!/usr/bin/env bash
# WMT14 En-De / En-Fr, end to end, as in "Attention Is All You Need" (Vaswani et al., 2017).
# Called by wmt14_en_de.sh and wmt14_en_fr.sh, which set PAIR; see those files for the
# expected time and disk.
#
# Stages (each skips itself when its output is complete, so re-running resumes):
#   1 fetch     training corpora, newstest2013 (valid), newstest2014 full (test), checksummed
#   2 extract   plain parallel text in $WORK/raw/{train,valid,test}.{src,tgt}
#   3 prepare   nmt preprocess: Moses tokenization, cleaning, joint BPE, binarization
#   4 train     nmt train (torchrun when GPUS > 1)
#   5 average   last 5 (base) / 20 (big) checkpoints
#   6 translate newstest2014 with beam 4, GNMT length penalty 0.6, max length input + 50
#   7 score     sacreBLEU (with signature) and tokenized BLEU (compound-split for En-De)
#
# Every setting below can be overridden from the environment, e.g.
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_de.sh
#   WMT14_DIR=/data/wmt14 bash recipes/wmt14_en_de.sh       # archives or extracted files, no download
#   SMOKE=1 bash recipes/wmt14_en_de.sh                      # tiny end-to-end run on local files, CPU
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PAIR=${PAIR:?set PAIR=en-de or PAIR=en-fr}
SRC=${PAIR%-*}
TGT=${PAIR#*-}
SMOKE=${SMOKE:-0}
ARCH=${ARCH:-transformer_base}
GPUS=${GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}
if [ "$SMOKE" = 1 ]; then WORK=${WORK:-$ROOT/work/wmt14_${SRC}_${TGT}_smoke}; else WORK=${WORK:-$ROOT/work/wmt14_${SRC}_${TGT}}; fi
WMT14_DIR=${WMT14_DIR:-}
SHARED_DATA=${SHARED_DATA:-$ROOT/../shared/data}

if [ "$PAIR" = en-de ]; then BPE_SIZE=${BPE_SIZE:-32000}; else BPE_SIZE=${BPE_SIZE:-40000}; fi
if [ "$ARCH" = transformer_big ]; then
    MAX_UPDATE=${MAX_UPDATE:-300000}; AVERAGE=${AVERAGE:-20}
else
    MAX_UPDATE=${MAX_UPDATE:-100000}; AVERAGE=${AVERAGE:-5}
fi
# The paper's batch: about 25k source + 25k target tokens per update, i.e.
# MAX_TOKENS x UPDATE_FREQ x max(GPUS, 1) ~ 25-28k.
MAX_TOKENS=${MAX_TOKENS:-3584}
UPDATE_FREQ=${UPDATE_FREQ:-$(( 8 / (GPUS < 1 ? 1 : (GPUS > 8 ? 8 : GPUS)) ))}
PRECISION=${PRECISION:-$([ "$GPUS" -gt 0 ] && echo bf16 || echo fp32)}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-1000}
WORKERS=${WORKERS:-$(nproc)}
TRAIN_FLAGS=${TRAIN_FLAGS:-}

if [ "$SMOKE" = 1 ]; then
    # Same stages on a tiny slice with a tiny model: a couple of minutes on a CPU.
    ARCH=transformer_tiny BPE_SIZE=${SMOKE_BPE_SIZE:-1000} MAX_UPDATE=${SMOKE_MAX_UPDATE:-40}
    AVERAGE=2 MAX_TOKENS=2048 UPDATE_FREQ=1 SAVE_INTERVAL_UPDATES=10 PRECISION=fp32 GPUS=0
fi

say() { printf '\n== %s\n' "$*" >&2; }
done_marker() { [ -f "$WORK/.done.$1" ]; }
mark_done() { touch "$WORK/.done.$1"; }
mkdir -p "$WORK"

# ---- 1+2: fetch and extract -------------------------------------------------
extract_sgm() {  # newstest SGM -> plain text, as fairseq's prepare-wmt14 does
    grep '<seg id' "$1" | sed -e 's/<seg id="[0-9]*">\s*//g' -e 's/\s*<\/seg>\s*//g' -e "s/\’/\'/g"
}

find_corpus_file() {  # the first of several candidate paths that exists
    local f
    for f in "$@"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
    echo "error: none of these files exists: $*" >&2
    return 1
}

stage_data_smoke() {
    local raw=$WORK/raw
    mkdir -p "$raw"
    if [ "$PAIR" = en-de ]; then
        local news=$SHARED_DATA/wmt_newstest2008-2012_en_de test=$SHARED_DATA/wmt14_en_de
        for lang in en de; do
            cat "$news"/newstest20{08,09,10,11,12}.$lang > "$raw/train.$lang"
            head -n 500 "$test/valid.$lang" > "$raw/valid.$lang"
            head -n 100 "$test/test.$lang" > "$raw/test.$lang"
        done
    else
        # No older En-Fr news sets are at hand: train on most of newstest2013, validate on the rest.
        local dir=$SHARED_DATA/wmt14_en_fr
        for lang in en fr; do
            head -n 2500 "$dir/valid.$lang" > "$raw/train.$lang"
            tail -n 500 "$dir/valid.$lang" > "$raw/valid.$lang"
            head -n 100 "$dir/test.$lang" > "$raw/test.$lang"
        done
    fi
}

stage_data_full() {
    local orig=$WORK/orig raw=$WORK/raw
    mkdir -p "$orig" "$raw"
    local archives=(wmt14/europarl-v7.tgz wmt14/commoncrawl.tgz wmt14/nc-v9.tgz wmt/dev.tgz)
    if [ "$PAIR" = en-fr ]; then archives+=(wmt14/un.tgz wmt14/giga-fren.tar); fi
    local extracted=$orig
    if [ -n "$WMT14_DIR" ] && [ -f "$WMT14_DIR/training/europarl-v7.$TGT-en.en" ]; then
        extracted=$WMT14_DIR  # already extracted by the user
    else
        python3 "$ROOT/data/fetch.py" "${archives[@]}" --dest "$orig" ${WMT14_DIR:+--local "$WMT14_DIR"}
        for archive in "$orig"/*.tgz "$orig"/*.tar; do
            [ -f "$archive.extracted" ] || { tar -xf "$archive" -C "$orig" && touch "$archive.extracted"; }
        done
        if [ "$PAIR" = en-fr ] && [ ! -f "$orig/giga-fren.release2.fixed.en" ]; then
            gunzip -k "$orig"/giga-fren.release2.fixed.*.gz
        fi
    fi
    local corpora=("training/europarl-v7.$TGT-en" "commoncrawl.$TGT-en" "training/news-commentary-v9.$TGT-en")
    if [ "$PAIR" = en-fr ]; then corpora+=("un/undoc.2000.fr-en" "giga-fren.release2.fixed"); fi
    for lang in "$SRC" "$TGT"; do
        : > "$raw/train.$lang.tmp"
        for corpus in "${corpora[@]}"; do
            cat "$(find_corpus_file "$extracted/$corpus.$lang")" >> "$raw/train.$lang.tmp"
        done
        mv "$raw/train.$lang.tmp" "$raw/train.$lang"
        cp "$(find_corpus_file "$extracted/dev/newstest2013.$lang")" "$raw/valid.$lang"
    done
    local pair_id=$([ "$PAIR" = en-de ] && echo deen || echo fren)
    extract_sgm "$(find_corpus_file "$extracted/dev/newstest2014-$pair_id-src.$SRC.sgm")" > "$raw/test.$SRC"
    extract_sgm "$(find_corpus_file "$extracted/dev/newstest2014-$pair_id-ref.$TGT.sgm")" > "$raw/test.$TGT"
}

if ! done_marker data; then
    say "data -> $WORK/raw"
    if [ "$SMOKE" = 1 ]; then stage_data_smoke; else stage_data_full; fi
    mark_done data
fi

# ---- 3: prepare ----------------------------------------------------------------
DATA_BIN=$WORK/data-bin
if ! done_marker prepare; then
    say "preprocess -> $DATA_BIN"
    nmt preprocess -s "$SRC" -t "$TGT" \
        --trainpref "$WORK/raw/train" --validpref "$WORK/raw/valid" --testpref "$WORK/raw/test" \
        --destdir "$DATA_BIN" --joined-dictionary --bpe-size "$BPE_SIZE" --bpe-sample 2000000 \
        --max-len 250 --max-ratio 1.5 --workers "$WORKERS" --force
    mark_done prepare
fi

# ---- 4: train ------------------------------------------------------------------
RUN=$WORK/run_$ARCH
if ! done_marker "train_$ARCH"; then
    say "train $ARCH on $GPUS GPU(s) -> $RUN"
    launcher=(nmt)
    if [ "$GPUS" -gt 1 ]; then launcher=(torchrun --nproc-per-node "$GPUS" -m nmt_cli); fi
    # shellcheck disable=SC2086  # TRAIN_FLAGS is a list of extra flags
    "${launcher[@]}" train "$DATA_BIN" --arch "$ARCH" --save-dir "$RUN" --share-all-embeddings \
        --adam-betas '0.9 0.98' --adam-eps 1e-9 --clip-norm 0.0 \
        --lr 7e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7 \
        --label-smoothing 0.1 --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" \
        --precision "$PRECISION" --max-update "$MAX_UPDATE" \
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$((AVERAGE + 5))" \
        --log-interval 100 $TRAIN_FLAGS
    mark_done "train_$ARCH"
fi

# ---- 5: average ----------------------------------------------------------------
AVG=$RUN/checkpoint_avg$AVERAGE.pt
if [ ! -f "$AVG" ]; then
    say "average the last $AVERAGE checkpoints -> $AVG"
    nmt average --inputs "$RUN" --num-update-checkpoints "$AVERAGE" --output "$AVG"
fi

# ---- 6: translate -------------------------------------------------------------
HYP=$RUN/newstest2014.$SRC-$TGT.$TGT
if [ ! -f "$HYP" ]; then
    say "translate newstest2014 -> $HYP"
    nmt translate --path "$AVG" --input "$WORK/raw/test.$SRC" --output "$HYP.tmp" \
        --beam 4 --lenpen 0.6 --lenpen-style gnmt --max-len-a 1 --max-len-b 50 --max-tokens 8000
    mv "$HYP.tmp" "$HYP"
fi

# ---- 7: score -------------------------------------------------------------------
say "newstest2014 $SRC->$TGT ($ARCH, average of $AVERAGE)"
nmt score --ref "$WORK/raw/test.$TGT" --hyp "$HYP"
if [ "$PAIR" = en-de ]; then
    nmt score --ref "$WORK/raw/test.$TGT" --hyp "$HYP" --tokenized-bleu --target-lang "$TGT" --compound-split
    echo "paper (tokenized, compound-split): base 27.3, big 28.4" >&2
else
    nmt score --ref "$WORK/raw/test.$TGT" --hyp "$HYP" --tokenized-bleu --target-lang "$TGT"
    echo "paper (tokenized): big 41.8" >&2
fi
