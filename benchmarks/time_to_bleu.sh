#!/usr/bin/env bash
# Time to BLEU: the test2016 sacreBLEU that nmt and fairseq reach on Multi30k En->De
# within the same wall-clock budget, everything included (BPE, binarization, training,
# beam search on the test set). Same architecture and hyper-parameters for both, those
# of recipes/quickstart.sh: pre-norm Transformer d 256, 3+3 layers, ffn 1024, 4 heads,
# shared embeddings, dropout 0.1, Adam (0.9, 0.98), lr 2e-3, inverse-sqrt with 480
# warm-up updates, label smoothing 0.1, --max-tokens 1024, joint BPE 4k; decoding beam 4,
# lenpen 0.6; scored with sacreBLEU on raw text.
#
#   benchmarks/time_to_bleu.sh [--budget SECONDS] [--systems "nmt fairseq"] [--data-dir DIR] [--work-dir DIR]
#                              [--device cpu|cuda] [--precision fp32|bf16] [--test-lines N]
#
# Defaults: 900 s per system (the two run one after the other), ../shared/data from the
# repository root, a temporary work directory. fairseq runs from benchmarks/.venv
# (benchmarks/setup_peers.sh). Each system stops training early enough to leave
# --decode-reserve seconds (default 60) for translating and scoring the test set.
# With --device cuda fairseq trains with --fp16 (its --bf16 means TPU). --test-lines N scores
# only the first N test sentences (a quick check that the script runs; not a result).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/.." && pwd)"
budget=900
decode_reserve=60
systems="nmt fairseq"
data_dir="$repo_root/../shared/data"
work_dir=""
device=cpu
precision=fp32
threads=2
test_lines=0

while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget="$2"; shift 2 ;;
        --decode-reserve) decode_reserve="$2"; shift 2 ;;
        --systems) systems="$2"; shift 2 ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --work-dir) work_dir="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        --precision) precision="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --test-lines) test_lines="$2"; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

corpus="$data_dir/multi30k"
[ -f "$corpus/train.en" ] || { echo "missing $corpus/train.en (pass --data-dir)" >&2; exit 1; }
if [ -z "$work_dir" ]; then
    work_dir="$(mktemp -d -t nmt-time-to-bleu-XXXXXX)"
    trap 'rm -rf "$work_dir"' EXIT
fi
mkdir -p "$work_dir"
# The test set both systems translate (all of test2016 unless --test-lines).
test_prefix="$corpus/test"
if [ "$test_lines" -gt 0 ]; then
    test_prefix="$work_dir/test"
    head -n "$test_lines" "$corpus/test.en" > "$test_prefix.en"
    head -n "$test_lines" "$corpus/test.de" > "$test_prefix.de"
fi
peer_python="$here/.venv/bin/python"
peer_bin="$here/.venv/bin"
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"

# Hyper-parameters shared by both systems (fairseq flag names; nmt uses the same).
bpe_size=4000
train_flags=(--max-tokens 1024 --lr 2e-3 --warmup-updates 480 --label-smoothing 0.1 --dropout 0.1
             --adam-betas "(0.9, 0.98)" --lr-scheduler inverse_sqrt --seed 1)

now() { date +%s.%N; }
seconds_since() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$1" "$(now)"; }
# Seconds of training left once what was already spent and the decoding reserve are taken out.
training_seconds() { python3 -c "import sys; print(max(1, int(float(sys.argv[1]) - (float(sys.argv[3]) - float(sys.argv[2])) - float(sys.argv[4]))))" \
    "$budget" "$1" "$(now)" "$decode_reserve"; }
bleu() { python3 -m sacrebleu "$test_prefix.de" -i "$1" -b; }

run_nmt() {
    local dir="$work_dir/nmt" start; start="$(now)"
    rm -rf "$dir"; mkdir -p "$dir"
    python3 -m nmt_cli preprocess -s en -t de --trainpref "$corpus/train" --validpref "$corpus/valid" \
        --testpref "$test_prefix" --destdir "$dir/data-bin" --joined-dictionary --bpe-size "$bpe_size" --workers 2 \
        > "$dir/preprocess.log" 2>&1
    local seconds; seconds="$(training_seconds "$start")"
    python3 -m nmt_cli train "$dir/data-bin" --arch transformer_small --save-dir "$dir/run" --share-all-embeddings --normalize-before \
        "${train_flags[@]}" --max-time "${seconds}s" --device "$device" --precision "$precision" \
        --log-interval 50 > "$dir/train.log" 2>&1
    python3 -m nmt_cli translate --path "$dir/run/checkpoint_last.pt" --beam 4 --lenpen 0.6 \
        --device "$device" --precision "$precision" --threads "$threads" -q \
        -i "$test_prefix.en" -o "$dir/hyp.de" 2> "$dir/translate.log"
    report nmt "$(bleu "$dir/hyp.de")" "$seconds" "$(seconds_since "$start")"
}

run_fairseq() {
    [ -x "$peer_python" ] || { echo "fairseq: skipped (run benchmarks/setup_peers.sh)"; return; }
    local dir="$work_dir/fairseq" start; start="$(now)"
    rm -rf "$dir"; mkdir -p "$dir/text"
    # Joint sentencepiece BPE on raw text, applied to every split (fairseq's usual recipe).
    "$peer_python" - "$corpus" "$dir/text" "$test_prefix" "$bpe_size" <<'PY'
import sys, sentencepiece as spm
corpus, out, test_prefix, bpe_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spm.SentencePieceTrainer.train(input=f"{corpus}/train.en,{corpus}/train.de", model_prefix=f"{out}/spm",
                               vocab_size=bpe_size, model_type="bpe", character_coverage=1.0, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=f"{out}/spm.model")
for split, prefix in (("train", f"{corpus}/train"), ("valid", f"{corpus}/valid"), ("test", test_prefix)):
    for lang in ("en", "de"):
        with open(f"{prefix}.{lang}", encoding="utf-8") as f, open(f"{out}/{split}.{lang}", "w", encoding="utf-8") as g:
            g.writelines(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n" for line in f)
PY
    "$peer_bin/fairseq-preprocess" -s en -t de --trainpref "$dir/text/train" --validpref "$dir/text/valid" \
        --testpref "$dir/text/test" --destdir "$dir/data-bin" --joined-dictionary --workers 2 > "$dir/preprocess.log" 2>&1
    local seconds; seconds="$(training_seconds "$start")"
    local fp16=(); [ "$device" = cuda ] && [ "$precision" != fp32 ] && fp16=(--fp16)
    local cpu=(); [ "$device" = cpu ] && cpu=(--cpu)
    "$peer_bin/fairseq-train" "$dir/data-bin" --arch transformer --share-all-embeddings \
        --encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3 --encoder-attention-heads 4 \
        --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-layers 3 --decoder-attention-heads 4 \
        --encoder-normalize-before --decoder-normalize-before \
        --optimizer adam --criterion label_smoothed_cross_entropy "${train_flags[@]}" \
        --stop-time-hours "$(python3 -c "print($seconds / 3600)")" --save-dir "$dir/run" --no-epoch-checkpoints \
        --log-format simple --log-interval 50 "${cpu[@]}" "${fp16[@]}" > "$dir/train.log" 2>&1
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$peer_bin/fairseq-generate" "$dir/data-bin" --path "$dir/run/checkpoint_last.pt" \
        --gen-subset test --beam 4 --lenpen 0.6 --remove-bpe sentencepiece --batch-size 128 "${cpu[@]}" "${fp16[@]}" \
        > "$dir/generate.log" 2>&1
    # One line per test sentence, in order; a sentence fairseq-generate left out scores as empty.
    python3 - "$dir/generate.log" "$test_prefix.en" "$dir/hyp.de" <<'PY'
import sys
log, source, out = sys.argv[1:]
hyps = {}
for line in open(log, encoding="utf-8"):
    if line.startswith("H-"):
        fields = line.rstrip("\n").split("\t")
        hyps[int(fields[0][2:])] = fields[2] if len(fields) > 2 else ""
count = sum(1 for _ in open(source, encoding="utf-8"))
if len(hyps) < count:
    print(f"fairseq-generate gave {len(hyps)} of {count} hypotheses; the others score as empty", file=sys.stderr)
with open(out, "w", encoding="utf-8") as f:
    f.writelines(hyps.get(i, "") + "\n" for i in range(count))
PY
    report fairseq "$(bleu "$dir/hyp.de")" "$seconds" "$(seconds_since "$start")"
}

declare -A scores=()
report() {  # system bleu training_budget_s total_s
    scores[$1]="$2"
    printf '%-10s sacreBLEU %5s   training budget %5s s   total %6s s (budget %s s)\n' "$1" "$2" "$3" "$4" "$budget"
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); device $device $precision"
echo "# Multi30k En->De, test2016 ($([ "$test_lines" -gt 0 ] && echo "first $test_lines lines" || echo "all 1000 lines")), budget ${budget} s per system"
for system in $systems; do
    case "$system" in
        nmt) run_nmt ;;
        fairseq) run_fairseq ;;
        *) echo "unknown system $system" >&2; exit 2 ;;
    esac
done
if [ -n "${scores[nmt]:-}" ] && [ -n "${scores[fairseq]:-}" ]; then
    python3 -c "import sys; print(f'ratio nmt / best peer (fairseq), BLEU: {float(sys.argv[1]) / float(sys.argv[2]):.2f}x ({float(sys.argv[1]) - float(sys.argv[2]):+.1f} BLEU)')" \
        "${scores[nmt]}" "${scores[fairseq]}"
fi
