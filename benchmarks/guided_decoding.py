"""The speed cost of guided decoding against plain beam search, on one trained model.

Translates the first N test sentences with the same beam and batches, plain and with
each feature of `nmt translate`: a target prefix (the reference's first two words), one
and two unordered constraints (the reference's longest words), --print-alignment, and
--score-reference (teacher forcing of the references, no search). Each pass runs
Translator.translate and formats every output line, as the command does; the fastest
of --repeats rounds (each over every feature in turn) counts. Prints seconds, lines/s,
the ratio to plain beam search and the output tokens (`</s>` included), and for
constraints how many outputs contain their phrases.

    bash recipes/quickstart.sh          # a Multi30k model in work/quickstart/run
    python3 benchmarks/guided_decoding.py work/quickstart/run/checkpoint_last.pt \\
        work/quickstart/raw/test.en work/quickstart/raw/test.de --threads 2
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from common import machine_line
from nmt_cli.config import DecodeConfig, GuidedConfig, TranslateConfig
from nmt_cli.decode.lines import InputLine
from nmt_cli.decode.translator import Translator, prepare_process


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("source", type=Path, help="raw source sentences, one per line")
    p.add_argument("reference", type=Path, help="their raw reference translations")
    p.add_argument("--sentences", type=int, default=500, help="(default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="(default: %(default)s)")
    p.add_argument("--max-len-a", type=float, default=0.0, help="(default: %(default)s, fairseq's)")
    p.add_argument("--max-len-b", type=int, default=200, help="(default: %(default)s, fairseq's)")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds over all features (default: %(default)s)")
    return p.parse_args()


def longest_words(text: str, count: int) -> list[str]:
    words = sorted({w.strip(".,!?;:") for w in text.split()}, key=lambda w: (-len(w), w))
    return [w for w in words if w][:count]


def main() -> None:
    args = parse_args()
    sources = args.source.read_text(encoding="utf-8").splitlines()[: args.sentences]
    references = args.reference.read_text(encoding="utf-8").splitlines()[: len(sources)]
    base = TranslateConfig(checkpoints=(str(args.checkpoint),), decode=DecodeConfig(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b),
                           threads=args.threads, quiet=True)
    prepare_process(base)
    plain = [InputLine(i + 1, s) for i, s in enumerate(sources)]
    one = ["\t".join([s, *longest_words(r, 1)]) for s, r in zip(sources, references)]
    two = ["\t".join([s, *longest_words(r, 2)]) for s, r in zip(sources, references)]
    features = [
        ("plain beam search", GuidedConfig(), plain),
        ("prefix (2 words)", GuidedConfig(), [replace(line, prefix=" ".join(r.split()[:2]))
                                              for line, r in zip(plain, references)]),
        ("1 constraint", GuidedConfig(constraints="unordered"), [InputLine(i + 1, t) for i, t in enumerate(one)]),
        ("2 constraints", GuidedConfig(constraints="unordered"), [InputLine(i + 1, t) for i, t in enumerate(two)]),
        ("--print-alignment", GuidedConfig(print_alignment=True), plain),
        ("--score-reference", GuidedConfig(score_reference=True),
         [InputLine(i + 1, f"{s}\t{r}") for i, (s, r) in enumerate(zip(sources, references))]),
    ]
    print(machine_line())
    print(f"{args.checkpoint}: {len(sources)} sentences, beam {args.beam}, max length {args.max_len_a:g} * "
          f"source + {args.max_len_b}, {args.threads} thread(s), torch {torch.__version__}")
    translators = [Translator(replace(base, guided=guided), warn=lambda message: None) for _, guided, _ in features]
    best = [float("inf")] * len(features)
    translated: list[list] = [[] for _ in features]
    # Round after round over all features, the fastest pass of each counting: a load that
    # drifts during the run then reaches every feature alike (and the first pass warms up).
    for _ in range(args.repeats):
        for i, ((_, _, lines), translator) in enumerate(zip(features, translators)):
            start = time.perf_counter()
            translated[i] = translator.translate(lines, "<bench>")
            for translation in translated[i]:
                translator.format(translation)
            best[i] = min(best[i], time.perf_counter() - start)
    for (name, guided, lines), translator, seconds, done in zip(features, translators, best, translated):
        note = ""
        if guided.constraints:
            wanted = one if name.startswith("1") else two
            outputs = [translator.format(t) for t in done]
            met = sum(all(w in out for w in line.split("\t")[1:]) for line, out in zip(wanted, outputs))
            note = f"\tphrases in output: {met}/{len(outputs)}"
        tokens = sum(len(t.hypotheses[0].tokens) for t in done if t.hypotheses)
        print(f"{name}\t{seconds:.2f} s\t{len(lines) / seconds:.1f} lines/s\t{seconds / best[0]:.2f}x plain time"
              f"{note}\toutput tokens: {tokens}")

if __name__ == "__main__":
    main()
