"""Corpus scale: time and memory of `nmt preprocess` and of `nmt train`'s start-up as the
training corpus grows, projected to WMT14 En-Fr's 36M pairs.

For each size in --pairs, with generated data (synthetic words; only sizes and lengths
matter here):

  text        generate raw parallel text (Zipf-distributed words, WMT-like lengths) and
              run `nmt preprocess` on it (joint BPE, --workers N): time and peak memory;
  data-bin    or, with --direct, write a binarized data-bin directly (random ids with
              WMT-like subword lengths): no preprocessing, so that large sizes fit a
              small machine's time;
  batch plan  open the data-bin and plan its batches as `nmt train` does, in a process of
              its own: the part of start-up that grows with the corpus, isolated;
  train       `nmt train` on that data-bin for --updates updates of transformer_tiny on
              the CPU: time, peak resident memory (RSS) and peak private anonymous memory
              (RssAnon: what one rank owns; memory-mapped data pages shared by all ranks
              of a machine are file-backed and not in it).

The batch plan's growth per pair is its peak RssAnon above the process's own before it
opened the data-bin, over N; the start-up's is (peak at N pairs - peak at --base-pairs) /
(N - --base-pairs), where the training step's own peak can hide the plan's. The
projection to 36M pairs is that growth times 36M: the part of a rank's memory that grows
with the corpus. Peaks are sampled every 10 ms over each command's process tree, from
outside it.

    python benchmarks/corpus_scale.py --pairs 1000000                   # text, preprocess, train
    python benchmarks/corpus_scale.py --pairs 10000000 --direct         # data-bin written directly, train
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import PeakTreeRss, machine_line, status_kib

WMT14_EN_FR_PAIRS = 36_000_000
SRC, TGT = "src", "tgt"
CHUNK = 1_000_000  # pairs generated at a time: bounds this script's own memory


@dataclass
class Measured:
    seconds: float
    rss_mib: float
    anon_mib: float
    stdout: str
    stderr: str


def measure(command: list[str]) -> Measured:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    with PeakTreeRss(proc.pid, interval=0.01) as peak:
        stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(command[:4])} ... exited {proc.returncode}: {stderr.strip()[-2000:]}")
    return Measured(seconds, peak.peak_mib, peak.peak_anon_mib, stdout, stderr)


# ---------------------------------------------------------------- generated corpora


def sentence_lengths(rng: np.random.Generator, count: int, mean: float, spread: float, longest: int) -> np.ndarray:
    """WMT-like lengths: a log-normal around `mean`, within [1, longest]."""
    sigma = np.sqrt(np.log(1 + (spread / mean) ** 2))
    lengths = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, count)
    return np.clip(np.rint(lengths), 1, longest).astype(np.int64)


def write_text_corpus(prefix: Path, pairs: int, seed: int) -> None:
    """`prefix.src` / `prefix.tgt`: `pairs` lines of Zipf-distributed synthetic words."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = 30_000
    words = np.array(["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(vocab)], dtype=object)
    weights = 1.0 / np.arange(1, vocab + 1)
    weights /= weights.sum()
    with open(f"{prefix}.{SRC}", "w", encoding="utf-8") as src, open(f"{prefix}.{TGT}", "w", encoding="utf-8") as tgt:
        for start in range(0, pairs, CHUNK):
            count = min(CHUNK, pairs - start)
            for out, mean in ((src, 25.0), (tgt, 27.0)):
                lengths = sentence_lengths(rng, count, mean, mean * 0.6, 200)
                ids = rng.choice(vocab, size=int(lengths.sum()), p=weights)
                ends = np.cumsum(lengths)
                chosen = words[ids]
                out.write("\n".join(" ".join(chosen[end - n : end]) for n, end in zip(lengths, ends)))
                out.write("\n")


def write_direct_data_bin(destdir: Path, pairs: int, seed: int, vocab: int = 8000) -> None:
    """A data-bin (docs/FORMATS.md) of `pairs` random sentence pairs with WMT-like subword
    lengths (`</s>` included), written without preprocessing."""
    from nmt_cli.data.dictionary import Dictionary
    from nmt_cli.data.indexed import DTYPES, HEADER, MAGIC, dtype_for_vocab

    destdir.mkdir(parents=True, exist_ok=True)
    dictionary = Dictionary([f"w{i}" for i in range(vocab - 4)])
    for lang in (SRC, TGT):
        dictionary.save(destdir / f"dict.{lang}.txt")
    dtype = dtype_for_vocab(len(dictionary))
    code = next(c for c, d in DTYPES.items() if d == dtype)
    rng = np.random.default_rng(seed)
    counts = {}
    for split, count in (("train", pairs), ("valid", 1000)):
        for lang, mean in ((SRC, 32.0), (TGT, 34.0)):
            prefix = destdir / f"{split}.{SRC}-{TGT}.{lang}"
            with open(f"{prefix}.bin", "wb") as data, open(f"{prefix}.idx", "wb") as index:
                index.write(HEADER.pack(MAGIC, code, count))
                index.write(np.zeros(1, "<i8").tobytes())
                total = 0
                for start in range(0, count, CHUNK):
                    lengths = sentence_lengths(rng, min(CHUNK, count - start), mean, mean * 0.55, 250)
                    ids = rng.integers(4, len(dictionary), size=int(lengths.sum()), dtype=np.int64)
                    ids[np.cumsum(lengths) - 1] = dictionary.eos  # every sentence ends with </s>
                    data.write(ids.astype(dtype).tobytes())
                    index.write((total + np.cumsum(lengths)).astype("<i8").tobytes())
                    total += int(lengths.sum())
        counts[split] = {"sentences": count}
    meta = {"format_version": 1, "source_lang": SRC, "target_lang": TGT, "joined_dictionary": True,
            "tokenizer": {"name": "none", "normalize_punctuation": False}, "bpe": None, "counts": counts}
    (destdir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- stages


def nmt(*args: str) -> list[str]:
    return [sys.executable, "-m", "nmt_cli", *args]


def preprocess(prefix: Path, valid: Path, destdir: Path, workers: int, bpe_size: int, bpe_sample: int) -> Measured:
    return measure(nmt("preprocess", "-s", SRC, "-t", TGT, "--trainpref", str(prefix), "--validpref", str(valid),
                       "--destdir", str(destdir), "--joined-dictionary", "--bpe-size", str(bpe_size),
                       "--bpe-sample", str(bpe_sample), "--workers", str(workers)))


def train(data_bin: Path, save_dir: Path, updates: int) -> Measured:
    return measure(nmt("train", str(data_bin), "--save-dir", str(save_dir), "--arch", "transformer_tiny",
                       "--max-tokens", "4096", "--max-update", str(updates), "--disable-validation",
                       "--save-interval", "0", "--device", "cpu", "--log-interval", "1"))


def planned(stderr: str) -> str:
    match = re.search(r"train: (\d+) pairs in (\d+) batches", stderr)
    return f"{int(match[1]):,} pairs in {int(match[2]):,} batches" if match else "?"


def line(label: str, run: Measured, extra: str = "") -> str:
    return (f"{label:<28} {run.seconds:8.1f} s   peak RSS {run.rss_mib:7.0f} MiB   "
            f"peak RssAnon {run.anon_mib:7.0f} MiB{extra}")


def own_anon_mib() -> float:
    return status_kib(os.getpid(), ("RssAnon",))["RssAnon"] / 1024


def plan_only(data_bin: Path) -> None:
    """In a process of its own: open the data-bin and plan its batches as `nmt train` does
    (transformer defaults: --max-tokens 4096, 1024 positions); the parent samples the peak."""
    from nmt_cli.data.batching import filter_by_size, make_batches
    from nmt_cli.data.pairs import load_data_bin
    from nmt_cli.host_memory import release_freed_memory

    def planned_batches(split):
        kept, _ = filter_by_size(split.src_sizes, split.tgt_sizes, 1024, 1024)
        return make_batches(split.src_sizes, split.tgt_sizes, 4096, None, 8, 1, kept)

    before = own_anon_mib()
    started = time.perf_counter()
    split = load_data_bin(data_bin).split("train")
    batches = planned_batches(split)
    release_freed_memory()  # as nmt train does after planning
    print(json.dumps({"before_mib": before, "after_mib": own_anon_mib(), "pairs": len(split),
                      "batches": len(batches), "seconds": time.perf_counter() - started}))


def plan(data_bin: Path) -> tuple[Measured, dict]:
    run = measure([sys.executable, str(Path(__file__).resolve()), "--plan-only", str(data_bin)])
    return run, json.loads(run.stdout.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="1000000", help="comma-separated corpus sizes (default: %(default)s)")
    p.add_argument("--direct", action="store_true", help="write data-bins directly instead of preprocessing text")
    p.add_argument("--base-pairs", type=int, default=10_000, help="the small corpus growth is measured from")
    p.add_argument("--updates", type=int, default=3, help="training updates per start-up (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="nmt preprocess --workers (default: %(default)s)")
    p.add_argument("--bpe-size", type=int, default=8000, help="joint BPE vocabulary (default: %(default)s)")
    p.add_argument("--bpe-sample", type=int, default=2_000_000,
                   help="nmt preprocess --bpe-sample: sentences BPE is learned from (default: %(default)s)")
    p.add_argument("--work-dir", type=Path, default=None, help="where corpora go (default: a temporary directory)")
    p.add_argument("--plan-only", type=Path, help=argparse.SUPPRESS)
    return p.parse_args()


def growth_line(stage: str, grown_mib: float, pairs: int, note: str) -> str:
    per_pair = grown_mib * 2**20 / pairs
    return (f"{'':<12}{stage:<26} {per_pair:6.1f} bytes/pair -> {per_pair * WMT14_EN_FR_PAIRS / 2**30:5.2f} GiB "
            f"at 36M pairs ({note})")


def main() -> None:
    args = parse_args()
    if args.plan_only:
        plan_only(args.plan_only)
        return
    sizes = [int(n) for n in args.pairs.split(",")]
    print(machine_line())
    base_train: Measured | None = None
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        for pairs in [args.base_pairs, *sizes]:
            root = Path(tmp) / f"{pairs}"
            root.mkdir()
            data_bin = root / "data-bin"
            started = time.perf_counter()
            if args.direct:
                write_direct_data_bin(data_bin, pairs, seed=pairs)
                print(f"{pairs:>11,} pairs: data-bin written directly in {time.perf_counter() - started:.1f} s")
            else:
                write_text_corpus(root / "train", pairs, seed=pairs)
                write_text_corpus(root / "valid", 1000, seed=pairs + 1)
                print(f"{pairs:>11,} pairs: text generated in {time.perf_counter() - started:.1f} s")
                run = preprocess(root / "train", root / "valid", data_bin, args.workers, args.bpe_size, args.bpe_sample)
                print(line(f"{pairs:>11,} preprocess", run, f"   (--workers {args.workers}, --bpe-sample "
                                                            f"{args.bpe_sample:,}; all processes)"))
                for lang in (SRC, TGT):
                    (root / f"train.{lang}").unlink()
            run, planned_info = plan(data_bin)
            print(line(f"{pairs:>11,} batch plan", run, f"   ({planned_info['batches']:,} batches in "
                                                          f"{planned_info['seconds']:.1f} s)"))
            if pairs != args.base_pairs:
                print(growth_line("batch plan, peak RssAnon", run.anon_mib - planned_info["before_mib"], pairs,
                                  "above the process before planning"))
                print(growth_line("batch plan, kept RssAnon", planned_info["after_mib"] - planned_info["before_mib"],
                                  pairs, "held for the whole run"))
            run = train(data_bin, root / "run", args.updates)
            print(line(f"{pairs:>11,} train start-up", run, f"   ({planned(run.stderr)}, {args.updates} updates)"))
            if base_train is None:
                base_train = run
            else:
                grown = pairs - args.base_pairs
                note = f"over {args.base_pairs:,} pairs' peak"
                print(growth_line("train, peak RssAnon", run.anon_mib - base_train.anon_mib, grown, note))
                print(growth_line("train, peak RSS (with mmap)", run.rss_mib - base_train.rss_mib, grown, note))
            shutil.rmtree(root)
    used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# this script's own peak RSS: {used:.0f} MiB")


if __name__ == "__main__":
    main()
