#!/usr/bin/env bash
# WMT14 English->French (newstest2014, tokenized BLEU, no compound splitting: base 38.1,
# big 41.8 in the paper).
#
# Data: Europarl v7 + Common Crawl + News Commentary v9 + UN + Gigaword Fr-En (~36M pairs
# after cleaning).
# Estimates, as `DRY_RUN=1` computes them (recipes/wmt14_plan.py, from nmt's training
# throughput on one H200 in benchmarks/README.md, real batches at 0.58-1.0 of it):
#   base (100k updates): 1.6-2.8 h on one H200, 0.2-0.3 h on 8 (linear scaling assumed)
#   big  (300k updates): 9.6-16.6 h on one H200, 1.2-2.1 h on 8;
#                        the paper: 3.5 days on 8 P100s (1.0 s per update)
#   disk: base ~53 GB, big ~107 GB, checkpoints included (each with Adam's state: 0.8 GB
#   base, 2.6 GB big; the last 5 / 20 update checkpoints are kept, and one epoch
#   checkpoint); preprocessing 36M pairs takes hours.
#
#   DRY_RUN=1 ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_fr.sh
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_fr.sh
#   WMT14_DIR=/path/to/archives bash recipes/wmt14_en_fr.sh
#   SMOKE=1 bash recipes/wmt14_en_fr.sh                  # generated data, tiny model: ~2 minutes on a CPU
set -euo pipefail
PAIR=en-fr exec bash "$(dirname "${BASH_SOURCE[0]}")/wmt14.sh" "$@"
