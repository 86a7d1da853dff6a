#!/usr/bin/env bash
# WMT14 English->German, the paper's main result (newstest2014: base 27.3, big 28.4 BLEU,
# tokenized and compound-split).
#
# Data: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs).
# Estimates, as `DRY_RUN=1` computes them (recipes/wmt14_plan.py, from nmt's training
# throughput on one H200 in benchmarks/README.md, real batches at 0.58-1.0 of it):
#   base (100k updates): 1.6-2.8 h on one H200, 0.2-0.3 h on 8 (linear scaling assumed);
#                        the paper: 11.1 h on 8 P100s (0.4 s per update)
#   big  (300k updates): 9.6-16.6 h on one H200 (6x base), 1.2-2.1 h on 8;
#                        the paper: 3.5 days on 8 P100s (1.0 s per update)
#   disk: base ~15 GB, big ~67 GB, checkpoints included (each with Adam's state: 0.7 GB
#   base, 2.5 GB big; the last 5 / 20 update checkpoints are kept, and one epoch
#   checkpoint; KEEP_LAST_EPOCHS=-1 keeps every epoch's: ~25 GB base, ~178 GB big).
# CPU-only training is not practical beyond SMOKE=1.
#
#   DRY_RUN=1 GPUS=8 bash recipes/wmt14_en_de.sh         # the plan: settings, batch, time, disk, commands
#   bash recipes/wmt14_en_de.sh                          # base, all GPUs of this machine
#   ARCH=transformer_big GPUS=8 bash recipes/wmt14_en_de.sh
#   WMT14_DIR=/path/to/archives bash recipes/wmt14_en_de.sh
#   SMOKE=1 bash recipes/wmt14_en_de.sh                  # generated data, tiny model: ~2 minutes on a CPU
set -euo pipefail
PAIR=en-de exec bash "$(dirname "${BASH_SOURCE[0]}")/wmt14.sh" "$@"
