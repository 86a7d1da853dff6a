# The WMT14 recipe's data stage: fetch, checksum, extract, SGM -> plain text.
# Sourced by wmt14.sh (and by the tests), which set ROOT, PAIR, SRC, TGT, SMOKE, ORIG,
# RAW, WMT14_DIR, ARCHIVES and CMD_DATA_0 (the fetch command) from recipes/wmt14_plan.py.
# Every function returns non-zero with an `error:` line on stderr when it fails.

find_corpus_file() {  # the first of several candidate paths that exists
    local f
    for f in "$@"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
    echo "error: none of these files exists: $*" >&2
    return 1
}

extract_sgm() {  # newstest SGM -> plain text, one line per <seg>, the text itself untouched
    grep '<seg[ >]' "$1" | sed -e 's/^.*<seg[^>]*>[[:space:]]*//' -e 's/[[:space:]]*<\/seg>.*$//'
}

extract_archive() {  # ARCHIVE: its members into $ORIG, once
    [ -f "$1.extracted" ] && return 0
    printf 'extract %s\n' "$1" >&2
    if ! tar -xf "$1" -C "$ORIG"; then
        echo "error: cannot extract $1 (damaged or truncated, or the disk is full); remove it to fetch it again" >&2
        return 1
    fi
    touch "$1.extracted"
}

gunzip_kept() {  # FILE.gz -> FILE, the .gz kept, never a partial FILE
    [ -f "${1%.gz}" ] && return 0
    if ! gunzip -c "$1" > "${1%.gz}.tmp"; then
        echo "error: cannot decompress $1" >&2
        return 1
    fi
    mv "${1%.gz}.tmp" "${1%.gz}"
}

stage_data() {
    mkdir -p "$ORIG" "$RAW"
    if [ "$SMOKE" = 1 ]; then python3 "$ROOT/recipes/wmt14_smoke_data.py" --pair "$PAIR" --dest "$WMT14_DIR"; fi
    local extracted=$ORIG
    if [ -n "$WMT14_DIR" ] && [ -f "$WMT14_DIR/training/europarl-v7.$TGT-en.en" ]; then
        extracted=$WMT14_DIR  # already extracted by the user
    else
        "${CMD_DATA_0[@]}"
        local archive
        for archive in "${ARCHIVES[@]}"; do extract_archive "$ORIG/$archive"; done
        if [ "$PAIR" = en-fr ]; then
            gunzip_kept "$ORIG/giga-fren.release2.fixed.$SRC.gz"
            gunzip_kept "$ORIG/giga-fren.release2.fixed.$TGT.gz"
        fi
    fi
    local corpora=("training/europarl-v7.$TGT-en" "commoncrawl.$TGT-en" "training/news-commentary-v9.$TGT-en")
    if [ "$PAIR" = en-fr ]; then corpora+=("un/undoc.2000.fr-en" "giga-fren.release2.fixed"); fi
    local lang corpus file pair_id=${TGT}en
    for lang in "$SRC" "$TGT"; do
        : > "$RAW/train.$lang.tmp"
        for corpus in "${corpora[@]}"; do
            file=$(find_corpus_file "$extracted/$corpus.$lang")
            cat "$file" >> "$RAW/train.$lang.tmp"
        done
        mv "$RAW/train.$lang.tmp" "$RAW/train.$lang"
        file=$(find_corpus_file "$extracted/dev/newstest2013.$lang" "$extracted/dev/dev/newstest2013.$lang")
        cp "$file" "$RAW/valid.$lang"
    done
    local kind side
    for kind in src ref; do
        side=$([ "$kind" = src ] && echo "$SRC" || echo "$TGT")
        file=$(find_corpus_file "$extracted/dev/newstest2014-$pair_id-$kind.$side.sgm" \
            "$extracted/dev/sgm/newstest2014-$pair_id-$kind.$side.sgm")
        if ! extract_sgm "$file" > "$RAW/test.$side"; then
            echo "error: no <seg> lines in $file" >&2
            return 1
        fi
    done
    local src_lines tgt_lines
    src_lines=$(wc -l < "$RAW/test.$SRC")
    tgt_lines=$(wc -l < "$RAW/test.$TGT")
    if [ "$src_lines" != "$tgt_lines" ] || [ "$src_lines" = 0 ]; then
        echo "error: newstest2014 gave $src_lines source and $tgt_lines reference lines" >&2
        return 1
    fi
}
