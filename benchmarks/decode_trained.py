"""Decoding a trained model: nmt, fairseq and CTranslate2 on the same trained weights.

decode_throughput.py forces every output to one length on random weights, so that all
systems do the same work. Real translation differs: a trained model's outputs end where
the model says, the sentences of a batch end at different steps, and short sentences
make each step's fixed costs count for more. This script times the three systems on one
trained fairseq Transformer, imported into nmt (`nmt import-fairseq`) and converted for
CTranslate2 (`ct2-fairseq-converter`), and `nmt translate --engine ctranslate2` (nmt's
Translator with CTranslate2 running the search, on nmt's own export of the imported
run), on its own segmented test sentences: beam search
with fairseq's defaults (at most 200 tokens, length penalty 1), each system stopping on
its own. Every system gets the same batches (sentences sorted by length, --batch-size
each) and runs in a process of its own; it prints sentences/s, target tokens/s (its own
outputs, `</s>` included) and how many outputs are token for token fairseq's.

The model is the one `time_to_bleu.sh` trains for fairseq (keep it with --work-dir):

    benchmarks/time_to_bleu.sh --systems fairseq --work-dir ttb     # 15 minutes
    python3 benchmarks/decode_trained.py ttb/fairseq --threads 1

RUN_DIR holds run/checkpoint_last.pt, data-bin/dict.{en,de}.txt and text/test.en (the
test sentences as sentencepiece pieces). The peers run in benchmarks/.venv
(setup_peers.sh). This file must stay importable without nmt_cli (the peer processes
run it with --system).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import (PEER_PYTHON, convert_fairseq_checkpoint, json_result, machine_line, peer_env, peer_has,
                    self_peak_rss_mib)

PAD, EOS, UNK, FIRST_SYMBOL = 1, 2, 3, 4  # fairseq's numbering: <s> <pad> </s> <unk>, then dict.txt's symbols
MAX_LEN_B = 200  # fairseq-generate's default maximum output length (max_len_a 0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a fairseq run as time_to_bleu.sh leaves it (above)")
    p.add_argument("--source-lang", default="en", help="(default: %(default)s)")
    p.add_argument("--target-lang", default="de", help="(default: %(default)s)")
    p.add_argument("--sentences", type=int, default=None, help="the first N test sentences (default: all)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of every system (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per system; the fastest counts (default: %(default)s)")
    p.add_argument("--system", default=None, help=argparse.SUPPRESS)  # nmt:<precision>:<workers>, fairseq, ct2:<type>:<workers>
    p.add_argument("--work-dir", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def dict_symbols(args: argparse.Namespace, lang: str) -> list[str]:
    """The symbols of the run's dict.LANG.txt, in order: symbol i has id FIRST_SYMBOL + i."""
    with open(args.run_dir / "data-bin" / f"dict.{lang}.txt", encoding="utf-8") as f:
        return [line.split()[0] for line in f]


def source_rows(args: argparse.Namespace) -> list[list[int]]:
    """The test sentences as source ids ending in </s>, numbered as fairseq numbers them."""
    ids = {piece: FIRST_SYMBOL + i for i, piece in enumerate(dict_symbols(args, args.source_lang))}
    with open(args.run_dir / "text" / f"test.{args.source_lang}", encoding="utf-8") as f:
        lines = [line.split() for line in f]
    rows = [[ids.get(piece, UNK) for piece in pieces] + [EOS] for pieces in lines if pieces]
    return rows[: args.sentences]


def batch_order(rows: list[list[int]], size: int) -> list[list[int]]:
    """Indices of `rows`, longest first, in batches of `size` (as a translator batches)."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def timed(run_pass, repeats: int) -> tuple[float, dict[int, list[int]]]:
    """The fastest of `repeats` passes after one untimed one, and the last pass's outputs."""
    run_pass()
    best, outputs = float("inf"), {}
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = run_pass()
        best = min(best, time.perf_counter() - start)
    return best, outputs


def torch_batches(torch, rows: list[list[int]], size: int):
    """(indices, right-padded (B, S) id tensor) per batch of batch_order."""
    for indices in batch_order(rows, size):
        width = max(len(rows[i]) for i in indices)
        tokens = torch.full((len(indices), width), PAD, dtype=torch.long)
        for j, i in enumerate(indices):
            tokens[j, : len(rows[i])] = torch.tensor(rows[i])
        yield indices, tokens


def nmt_config(args: argparse.Namespace, precision: str, workers: int, sentences: int):
    """`nmt translate`'s settings for the imported model: ids in, --batch-size sentences per
    batch, every sentence in one chunk, --threads / workers threads per process."""
    from nmt_cli.config import DecodeConfig, TranslateConfig

    return TranslateConfig(
        checkpoints=(str(args.work_dir / "nmt-run" / "checkpoint.pt"),),
        decode=DecodeConfig(beam=args.beam, nbest=1, max_len_a=0, max_len_b=MAX_LEN_B), input_format="ids",
        output_format="bpe", buffer_size=sentences, batch_size=args.batch_size, threads=args.threads // workers,
        workers=workers, precision=precision, quiet=True)


def measure_nmt(args: argparse.Namespace, precision: str) -> tuple[float, dict[int, list[int]]]:
    """nmt's beam search on the imported weights, loaded as `nmt translate --precision` loads them."""
    import torch

    from nmt_cli.decode.loading import load_models
    from nmt_cli.decode.search import generate
    from nmt_cli.decode.translator import prepare_process

    rows = source_rows(args)
    cfg = nmt_config(args, precision, 1, len(rows))
    prepare_process(cfg)  # as translate does
    loaded = load_models(cfg.checkpoints, torch.device(cfg.device), precision)
    batches = list(torch_batches(torch, rows, args.batch_size))

    def run_pass():
        outputs = {}
        for indices, tokens in batches:
            for i, hyps in zip(indices, generate(loaded.decoder, tokens, cfg.decode, loaded.max_target_positions)):
                outputs[i] = hyps[0].tokens
        return outputs

    with torch.inference_mode():
        return timed(run_pass, args.repeats)


def measure_nmt_workers(args: argparse.Namespace, precision: str, workers: int) -> tuple[float, dict[int, list[int]]]:
    """`nmt translate --workers`: this process and workers - 1 more, on --threads / workers
    threads each, share the sentences (given as ids, in batches of --batch-size)."""
    from nmt_cli.decode.lines import InputLine
    from nmt_cli.decode.translator import Translator, prepare_process
    from nmt_cli.decode.workers import ParallelTranslator

    rows = source_rows(args)
    cfg = nmt_config(args, precision, workers, len(rows))
    prepare_process(cfg)  # as translate does
    lines = [InputLine(number + 1, " ".join(map(str, row[:-1]))) for number, row in enumerate(rows)]
    with ParallelTranslator(cfg) as pool:
        translator = pool.use(Translator(cfg, warn=lambda message: print(message, file=sys.stderr)))

        def run_pass():
            return {i: t.hypotheses[0].tokens for i, t in enumerate(translator.translate(lines, "test"))}

        return timed(run_pass, args.repeats)


def measure_nmt_ct2(args: argparse.Namespace, precision: str) -> tuple[float, dict[int, list[int]]]:
    """`nmt translate --engine ctranslate2` on the imported run: its Translator (ids in, batches of
    --batch-size) with CTranslate2 running the search, on the export it makes once beside the
    checkpoint (before timing)."""
    from dataclasses import replace

    from nmt_cli.decode.lines import InputLine
    from nmt_cli.decode.translator import Translator, prepare_process

    rows = source_rows(args)
    cfg = replace(nmt_config(args, precision, 1, len(rows)), engine="ctranslate2")
    prepare_process(cfg)  # as translate does
    lines = [InputLine(number + 1, " ".join(map(str, row[:-1]))) for number, row in enumerate(rows)]
    translator = Translator(cfg, warn=lambda message: print(message, file=sys.stderr))

    def run_pass():
        return {i: t.hypotheses[0].tokens for i, t in enumerate(translator.translate(lines, "test"))}

    return timed(run_pass, args.repeats)


def measure_fairseq(args: argparse.Namespace) -> tuple[float, dict[int, list[int]]]:
    """fairseq's SequenceGenerator (fairseq-generate's search), float32."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    overrides = {"data": str(args.run_dir / "data-bin"), "source_lang": args.source_lang, "target_lang": args.target_lang}
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(args.run_dir / "run" / "checkpoint_last.pt")],
                                                                    arg_overrides=overrides)
    model = models[0].eval()
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=0, max_len_b=MAX_LEN_B)
    rows = source_rows(args)
    batches = list(torch_batches(torch, rows, args.batch_size))

    def run_pass():
        outputs = {}
        for indices, tokens in batches:
            sample = {"net_input": {"src_tokens": tokens, "src_lengths": tokens.ne(PAD).sum(1)}}
            for i, hyps in zip(indices, generator.generate([model], sample)):
                outputs[i] = hyps[0]["tokens"].tolist()
        return outputs

    with torch.inference_mode():
        return timed(run_pass, args.repeats)


def measure_ct2(args: argparse.Namespace, compute_type: str, workers: int) -> tuple[float, dict[int, list[int]]]:
    """CTranslate2 on the converted model, `workers` batches at once on --threads / workers
    threads each; its hypotheses leave out </s>, which is put back."""
    import ctranslate2

    translator = ctranslate2.Translator(str(args.work_dir / "ct2"), device="cpu", compute_type=compute_type,
                                       intra_threads=args.threads // workers, inter_threads=workers)
    target_ids = {piece: FIRST_SYMBOL + i for i, piece in enumerate(dict_symbols(args, args.target_lang))}
    pieces = dict_symbols(args, args.source_lang)
    rows = source_rows(args)
    order = [i for indices in batch_order(rows, args.batch_size) for i in indices]
    # The same ids as the other systems get, back as pieces (an unknown piece becomes <unk>).
    sources = [[pieces[t - FIRST_SYMBOL] if t >= FIRST_SYMBOL else "<unk>" for t in rows[i][:-1]] for i in order]

    def run_pass():
        results = translator.translate_batch(sources, beam_size=args.beam, max_batch_size=args.batch_size,
                                             max_decoding_length=MAX_LEN_B)
        return {i: [target_ids.get(p, UNK) for p in r.hypotheses[0]] + [EOS] for i, r in zip(order, results)}

    return timed(run_pass, args.repeats)


def run_system(args: argparse.Namespace, argv: list[str], system: str) -> dict | str:
    """One system in a process of its own (the peers with benchmarks/.venv's python): its
    last stdout line is JSON with seconds, outputs and peak memory; or a one-line failure."""
    env = peer_env(args.threads)
    python = str(PEER_PYTHON)
    if system.startswith("nmt"):  # nmt's own python, and its own safe checkpoint loading
        python = sys.executable
        del env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]
    command = [python, __file__, *argv, "--system", system, "--work-dir", str(args.work_dir)]
    return json_result(command, env)


def nmt_precisions() -> list[str]:
    """float32 and int8; bf16 too where oneDNN has bf16 kernels (as decode_throughput.py)."""
    import torch

    from nmt_cli.models.fast.packed import packed_unavailable_reason

    return ["fp32", "int8"] + (["bf16"] if packed_unavailable_reason(torch.bfloat16) is None else [])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.system is not None:  # one system, in its own process
        worker_processes = 0  # nmt's, besides this one
        if args.system.startswith("ct2:"):  # before importing torch: the memory is CTranslate2's alone
            _, compute_type, workers = args.system.split(":")
            seconds, outputs = measure_ct2(args, compute_type, int(workers))
        else:
            import torch

            torch.set_num_threads(args.threads)
            if args.system == "fairseq":
                seconds, outputs = measure_fairseq(args)
            elif args.system.startswith("nmt-ct2:"):
                seconds, outputs = measure_nmt_ct2(args, args.system.split(":")[1])
            else:
                _, precision, workers = args.system.split(":")
                worker_processes = int(workers) - 1
                if worker_processes == 0:
                    seconds, outputs = measure_nmt(args, precision)
                else:
                    seconds, outputs = measure_nmt_workers(args, precision, int(workers))
        # nmt's worker processes have ended: the largest one's peak counts for each of them.
        workers_peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps({"seconds": seconds, "outputs": [outputs[i] for i in sorted(outputs)],
                          "peak_rss_mib": self_peak_rss_mib() + worker_processes * workers_peak_mib}))
        return

    for needed in (args.run_dir / "run" / "checkpoint_last.pt", args.run_dir / "text" / f"test.{args.source_lang}"):
        if not needed.is_file():
            sys.exit(f"error: {needed} is missing; {args.run_dir} must be a fairseq run of time_to_bleu.sh (see --help)")
    if not peer_has("fairseq", "ctranslate2"):
        sys.exit("error: the peers are not installed (run benchmarks/setup_peers.sh)")
    sentences = len(source_rows(args))
    print(machine_line())
    print(f"# {args.run_dir}: {sentences} test sentences, batch {args.batch_size}, beam {args.beam}, "
          f"at most {MAX_LEN_B} tokens, length penalty 1, {args.threads} threads")
    args.work_dir = Path(tempfile.mkdtemp(prefix="nmt-decode-trained-"))
    try:
        convert_fairseq_checkpoint(args.run_dir / "run" / "checkpoint_last.pt", args.run_dir / "data-bin",
                                   args.source_lang, args.target_lang, args.work_dir)
        systems = {"fairseq": "fairseq", "ct2 float32": "ct2:float32:1", "ct2 int8": "ct2:int8:1"}
        if args.threads > 1:  # CTranslate2's way to use several cores for throughput: a worker per core
            systems.update({f"ct2 {kind}, {args.threads} workers": f"ct2:{kind}:{args.threads}" for kind in ("float32", "int8")})
        for precision in nmt_precisions():
            systems[f"nmt {precision}"] = f"nmt:{precision}:1"
            if args.threads > 1:  # nmt translate --workers, the counterpart of CTranslate2's workers
                systems[f"nmt {precision}, {args.threads} workers"] = f"nmt:{precision}:{args.threads}"
        for precision, kind in (("fp32", "float32"), ("int8", "int8")):  # nmt translate --engine ctranslate2
            systems[f"nmt-ct2 {kind}"] = f"nmt-ct2:{precision}"
        results = {name: run_system(args, argv, system) for name, system in systems.items()}
    finally:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    report(results, sentences)


def report(results: dict[str, dict | str], sentences: int) -> None:
    """One line per system (nmt's first), then nmt's ratios to CTranslate2 and to the best peer."""
    reference = results["fairseq"]["outputs"] if isinstance(results["fairseq"], dict) else None
    speed = {}
    for name, result in sorted(results.items(), key=lambda item: item[0].startswith("nmt"), reverse=True):
        if isinstance(result, str):
            print(f"{name:<22} {result}")
            continue
        seconds, outputs = result["seconds"], result["outputs"]
        speed[name] = sentences / seconds
        same = "" if reference is None else f", {sum(a == b for a, b in zip(outputs, reference))} outputs as fairseq's"
        print(f"{name:<22} {sentences} sentences in {seconds:6.2f} s: {speed[name]:7.1f} sentences/s "
              f"{sum(map(len, outputs)) / seconds:8.0f} target tokens/s, peak RSS {result['peak_rss_mib']:.0f} MiB{same}")
    for nmt_rows, ct2_rows in (("nmt fp32", "ct2 float32"), ("nmt int8", "ct2 int8"), ("nmt bf16", "ct2 int8"),
                               ("nmt-ct2 float32", "ct2 float32"), ("nmt-ct2 int8", "ct2 int8")):
        # Each system's faster configuration at that precision (threads or workers).
        nmt_speeds = {name: value for name, value in speed.items() if name.startswith(nmt_rows)}
        ct2_speeds = {name: value for name, value in speed.items() if name.startswith(ct2_rows)}
        if nmt_speeds and ct2_speeds:
            mine, theirs = max(nmt_speeds, key=nmt_speeds.get), max(ct2_speeds, key=ct2_speeds.get)
            print(f"ratio {mine} / {theirs}: {nmt_speeds[mine] / ct2_speeds[theirs]:.2f}x sentences/s")
    peers = {name: value for name, value in speed.items() if not name.startswith("nmt")}
    ours = {name: value for name, value in speed.items() if name.startswith("nmt ")}  # nmt's own engine
    if peers and ours:
        best, fastest = max(peers, key=peers.get), max(ours, key=ours.get)
        print(f"ratio nmt / best peer ({fastest} / {best}): {ours[fastest] / peers[best]:.2f}x sentences/s")


if __name__ == "__main__":
    main()
