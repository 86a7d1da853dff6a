#!/usr/bin/env bash
# WMT14 English->French (newstest2014: big 41.8 BLEU in the paper, tokenized, no compound
# splitting).
#
# Data: Europarl v7 + Common Crawl + News Commentary v9 + UN + Gigaword Fr-En (~36M pairs;
# ~6.6 GB of archives, ~60 GB on disk with extracted, tokenized and binarized copies).
# Time: preprocessing several hours on 16 cores. Training big (300k updates): ~3.5 days on
# 8 P100s in the paper, about a day on 8 current GPUs, several days on one H200 in bf16.
#
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_fr.sh
#   WMT14_DIR=/path/to/archives bash recipes/wmt14_en_fr.sh
#   SMOKE=1 bash recipes/wmt14_en_fr.sh                  # a couple of minutes on a CPU
set -euo pipefail
PAIR=en-fr exec bash "$(dirname "${BASH_SOURCE[0]}")/wmt14.sh" "$@"
