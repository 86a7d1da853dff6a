#!/usr/bin/env bash
# WMT14 English->German, the paper's main result (newstest2014: base 27.3, big 28.4 BLEU,
# tokenized and compound-split).
#
# Data: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs; ~1.7 GB of archives,
# ~15 GB on disk with the extracted, tokenized and binarized copies).
# Time: preprocessing ~1 h on 16 cores. Training base (100k updates): ~12 h on 8 V100s
# in the paper, a few hours on 8 current GPUs, ~12-15 h on one H200 in bf16; big (300k
# updates) about three times longer. CPU-only training is not practical beyond SMOKE=1.
#
#   bash recipes/wmt14_en_de.sh                          # base, all GPUs of this machine
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_de.sh
#   WMT14_DIR=/path/to/archives bash recipes/wmt14_en_de.sh
#   SMOKE=1 bash recipes/wmt14_en_de.sh                  # a couple of minutes on a CPU
set -euo pipefail
PAIR=en-de exec bash "$(dirname "${BASH_SOURCE[0]}")/wmt14.sh" "$@"
