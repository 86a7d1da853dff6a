"""Preprocessing speed: lines/s and peak memory of `nmt preprocess` against the fairseq
chain that does the same work, at 1 and 2 worker processes.

The corpus is Multi30k En-De train repeated to --lines sentence pairs. Both systems
take raw text to a binarized, joined-dictionary data-bin:

  nmt      `nmt preprocess --joined-dictionary --bpe-size 8000 --workers N`
           (punctuation normalization, Moses tokenization, cleaning, sentencepiece BPE
           learned and applied, dictionary, binarization)
  fairseq  a small driver in the peer environment (this file, --peer-chain): the same
           normalization and Moses tokenization with sacremoses and the same cleaning
           in N processes, the same sentencepiece BPE learned and applied (N
           processes), then `fairseq-preprocess --joined-dictionary --workers N` on
           the segmented text. The whole chain is timed.

Peak memory is the sampled sum of resident memory over each command's process tree
(all workers together).

    python benchmarks/preprocess_speed.py                      # 200k lines, 1 and 2 workers
    python benchmarks/preprocess_speed.py --lines 1000000      # the full-size figure
    benchmarks/setup_peers.sh                                  # once: the fairseq environment

This file must stay importable without nmt_cli (the peer driver runs it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (DEFAULT_DATA_DIR, PEER_PYTHON, REPO_ROOT, CommandFailed, machine_line, peer_bin, peer_env,
                    peer_has, ratio_line, result_line, run_measured)

SRC, TGT = "en", "de"
# The same settings as nmt preprocess's defaults, so both systems do the same work.
MAX_LEN, MAX_RATIO = 250, 9.0
SPM_SETTINGS = dict(model_type="bpe", character_coverage=1.0, normalization_rule_name="identity",
                    byte_fallback=False, num_threads=4, shuffle_input_sentence=True, minloglevel=2)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000, help="sentence pairs in the corpus (default: %(default)s)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default: %(default)s)")
    p.add_argument("--bpe-size", type=int, default=8000, help="joint BPE vocabulary (default: %(default)s)")
    p.add_argument("--systems", default="nmt,fairseq", help="comma-separated subset of nmt,fairseq")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="holds multi30k/train.{en,de}")
    p.add_argument("--work-dir", type=Path, default=None, help="where corpus and outputs go (default: a temporary directory)")
    # The peer driver (runs with the peer environment's python).
    p.add_argument("--peer-chain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prefix", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--destdir", type=Path, help=argparse.SUPPRESS)
    return p.parse_args()


def build_corpus(data_dir: Path, lines: int, prefix: Path) -> None:
    """Multi30k train repeated (and cut) to exactly `lines` pairs at `prefix`.{en,de}."""
    for lang in (SRC, TGT):
        source = data_dir / "multi30k" / f"train.{lang}"
        if not source.is_file():
            sys.exit(f"missing {source} (pass --data-dir)")
        text = source.read_text(encoding="utf-8").splitlines(keepends=True)
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as out:
            out.writelines(itertools.islice(itertools.cycle(text), lines))


def nmt_command(prefix: Path, destdir: Path, workers: int, bpe_size: int) -> list[str]:
    return [sys.executable, "-m", "nmt_cli", "preprocess", "-s", SRC, "-t", TGT, "--trainpref", str(prefix),
            "--destdir", str(destdir), "--joined-dictionary", "--bpe-size", str(bpe_size),
            "--workers", str(workers), "--force"]


def peer_command(prefix: Path, destdir: Path, workers: int, bpe_size: int) -> list[str]:
    return [str(PEER_PYTHON), __file__, "--peer-chain", "--prefix", str(prefix), "--destdir", str(destdir),
            "--workers", str(workers), "--bpe-size", str(bpe_size)]


def measure(args: argparse.Namespace) -> None:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="nmt-preprocess-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / "corpus" / "train"
    prefix.parent.mkdir(exist_ok=True)
    build_corpus(args.data_dir, args.lines, prefix)
    systems = args.systems.split(",")
    fairseq_ready = "fairseq" in systems and peer_has("fairseq", "sacremoses", "sentencepiece")
    print(machine_line())
    print(f"# {args.lines:,} Multi30k En-De train pairs (repeated), joint BPE {args.bpe_size}; "
          f"lines/s counts sentence pairs")
    lines_per_s: dict[tuple[str, int], float] = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        for system in systems:
            name = f"{system} ({workers} worker{'s' if workers > 1 else ''})"
            if system == "fairseq" and not fairseq_ready:
                print(result_line(name, {"skipped (run benchmarks/setup_peers.sh)": ""}))
                continue
            destdir = work / f"{system}-{workers}"
            shutil.rmtree(destdir, ignore_errors=True)
            make = nmt_command if system == "nmt" else peer_command
            env = peer_env() if system == "fairseq" else None
            try:
                run = run_measured(make(prefix, destdir, workers, args.bpe_size), env=env, cwd=REPO_ROOT)
            except CommandFailed as e:
                print(result_line(name, {"failed": ""}))
                print(e, file=sys.stderr)
                continue
            speed = args.lines / run.seconds
            lines_per_s[(system, workers)] = speed
            fields = {"lines/s": f"{speed:9,.0f}", "s": f"{run.seconds:7.1f}",
                      "MiB peak RSS (all processes)": f"{run.peak_tree_rss_mib:6,.0f}"}
            print(result_line(name, fields), flush=True)
            if system == "fairseq" and run.stdout.strip():
                stages = json.loads(run.stdout.strip().splitlines()[-1])
                print("#   fairseq chain stages (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()), flush=True)
    for workers in sorted({w for _, w in lines_per_s}):
        ours = lines_per_s.get(("nmt", workers))
        peers = {f"fairseq, {workers} workers": v for (s, w), v in lines_per_s.items() if s != "nmt" and w == workers}
        if ours is not None:
            print(ratio_line(f"lines/s at {workers} worker(s)", ours, peers))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the peer chain (peer environment)

_tokenizers: dict = {}
# Moses' remove-non-printing-char: control characters (category Cc) become spaces.
CONTROL_TO_SPACE = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0))}


def _peer_tokenize(pair: tuple[str, str]) -> tuple[str, str] | None:
    """Normalize and Moses-tokenize one pair as nmt does; None when cleaning drops it."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    out = []
    for lang, line in zip((SRC, TGT), pair):
        if lang not in _tokenizers:
            _tokenizers[lang] = (MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang))
        normalizer, tokenizer = _tokenizers[lang]
        text = normalizer.normalize(line.translate(CONTROL_TO_SPACE)).strip()
        text = tokenizer.tokenize(text, escape=False, return_str=True) if text else ""
        out.append(" ".join(text.split()))
    n_src, n_tgt = len(out[0].split()), len(out[1].split())
    if min(n_src, n_tgt) < 1 or max(n_src, n_tgt) > MAX_LEN or max(n_src, n_tgt) > MAX_RATIO * min(n_src, n_tgt):
        return None
    return out[0], out[1]


_sp = None


def _peer_segment(line: str) -> str:
    return " ".join(_sp.encode(line, out_type=str))


def peer_chain(args: argparse.Namespace) -> None:
    """Raw text -> Moses tokens -> sentencepiece pieces -> fairseq-preprocess data-bin."""
    import multiprocessing

    import sentencepiece as spm

    global _sp
    stages: dict[str, float] = {}
    work = args.destdir.parent / f"{args.destdir.name}-text"
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(f"{args.prefix}.{SRC}", encoding="utf-8") as f_src, open(f"{args.prefix}.{TGT}", encoding="utf-8") as f_tgt:
        pairs = list(zip((line.rstrip("\n") for line in f_src), (line.rstrip("\n") for line in f_tgt)))
    with multiprocessing.Pool(args.workers) as pool:
        tokenized = [p for p in pool.imap(_peer_tokenize, pairs, chunksize=1000) if p is not None]
    stages["tokenize"] = time.perf_counter() - start

    start = time.perf_counter()
    model_prefix = work / "spm"
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for pair in tokenized for s in pair]),
                                   model_prefix=str(model_prefix), vocab_size=args.bpe_size,
                                   input_sentence_size=2_000_000, **SPM_SETTINGS)
    stages["learn BPE"] = time.perf_counter() - start

    start = time.perf_counter()
    _sp = spm.SentencePieceProcessor(model_file=f"{model_prefix}.model")
    with multiprocessing.Pool(args.workers) as pool:  # forked after loading: workers share the model
        for side, lang in enumerate((SRC, TGT)):
            lines = pool.imap(_peer_segment, (pair[side] for pair in tokenized), chunksize=1000)
            with open(work / f"train.{lang}", "w", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in lines)
    stages["apply BPE"] = time.perf_counter() - start

    start = time.perf_counter()
    subprocess.run([peer_bin("fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT,
                    "--trainpref", str(work / "train"), "--destdir", str(args.destdir), "--joined-dictionary",
                    "--workers", str(args.workers)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stages["fairseq-preprocess"] = time.perf_counter() - start
    print(json.dumps(stages))


def main() -> None:
    args = parse_args()
    if args.peer_chain:
        args.workers = int(args.workers)
        peer_chain(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
