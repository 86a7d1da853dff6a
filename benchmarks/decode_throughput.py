"""Decoding throughput: nmt beam search (and greedy) vs Hugging Face `generate`.

Both systems get a model of the same size with random weights and the same synthetic
source sentences, and every output is forced to exactly --tgt-len tokens plus one
final step (nmt: min_len = max_len = tgt-len, then `</s>`; Hugging Face:
min_new_tokens = max_new_tokens = tgt-len + 1), so every system does the same work.
Throughput counts tgt-len + 1 target tokens per sentence.

With --tgt-len-from-source (nmt alone) each output is instead forced to as many tokens
as its source (max_len_a 1, max_len_b 0, min_len above every maximum), so that, as in
real translation, the sentences of a batch finish at different steps and batches have
many shapes. That is the workload that shows whether CUDA graphs pay for their
captures (translate replays its steps as graphs by default on a GPU): it prints how many
step graphs it built.

    python benchmarks/decode_throughput.py                      # CPU, transformer_small, 200 sentences
    python benchmarks/decode_throughput.py --device cuda --precision bf16 --batch-size 128 --cuda-graphs
    python benchmarks/decode_throughput.py --setup-peer         # create benchmarks/.peer-hf/.venv with transformers

Hugging Face runs in its own virtual environment (benchmarks/.peer-hf/.venv, made by
--setup-peer, with torch pinned to the main environment's version); without it
that line says "skipped (not installed)". This file must stay importable without
nmt_cli (the peer process runs it with --system hf).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from common import (PEER_PYTHON, convert_fairseq_checkpoint, json_result, machine_line, peer_env, peer_has,
                    self_peak_rss_mib)

HERE = Path(__file__).resolve().parent
# Its own environment (git-ignored as any .venv/): other benchmarks install other peers elsewhere.
PEER_VENV = HERE / ".peer-hf" / ".venv"
PEER_CONSTRAINTS = HERE / "peer-constraints.txt"
PAD, EOS, BOS = 1, 2, 0
# The peer processes cannot import nmt_cli: the main process passes the sizes of --arch
# as --peer-sizes d_model,ffn,layers,heads (these are transformer_small's).
DEFAULT_PEER_SIZES = "256,1024,3,4"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="transformer_small", help="nmt architecture preset (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=200, help="sentences to translate (default: %(default)s)")
    p.add_argument("--src-len", type=int, default=20, help="mean source length in tokens (default: %(default)s)")
    p.add_argument("--tgt-len", type=int, default=32, help="forced output tokens before </s> (default: %(default)s)")
    p.add_argument("--tgt-len-from-source", action="store_true",
                   help="force each output to as many tokens as its source instead (nmt alone; varied lengths)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast dtype (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--profile", action="store_true",
                   help="profile nmt's beam search on one batch: top operators (stderr) and how busy the device is")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also measure nmt with its decoding steps replayed as CUDA graphs "
                        "(on a CPU: the same fixed-shape steps, without graphs)")
    p.add_argument("--seed", type=int, default=1, help="seed for weights and data (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system; the fastest counts (default: %(default)s)")
    p.add_argument("--skip-peer", action="store_true", help="only measure nmt")
    p.add_argument("--peer-python", type=Path, default=PEER_VENV / "bin" / "python",
                   help="python of an environment with transformers (default: the one --setup-peer makes)")
    p.add_argument("--setup-peer", action="store_true", help=f"create {PEER_VENV.relative_to(HERE.parent)} with transformers, then exit")
    p.add_argument("--source-text", type=Path, default=None,
                   help="take the first --sentences lines of this file as sources (words hashed to ids), "
                        "e.g. ../shared/data/wmt14_en_de/test.en (default: random ids)")
    p.add_argument("--fairseq-peers", action="store_true",
                   help="also measure fairseq and CTranslate2 (benchmarks/.venv from setup_peers.sh) and nmt "
                        "on the same fairseq weights (via `nmt import-fairseq`)")
    p.add_argument("--system", choices=("all", "hf", "fairseq-checkpoint", "fairseq", "ct2"), default="all", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer-sizes", default=DEFAULT_PEER_SIZES, help=argparse.SUPPRESS)
    p.add_argument("--compute-type", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--ct2-workers", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def peer_sizes(args: argparse.Namespace) -> dict[str, int]:
    d_model, ffn, layers, heads = (int(n) for n in args.peer_sizes.split(","))
    return {"d_model": d_model, "ffn": ffn, "layers": layers, "heads": heads}


def arch_sizes(arch: str) -> str:
    """--peer-sizes for an nmt preset (the main process only: it imports nmt_cli)."""
    from nmt_cli.models.registry import resolve_config

    cfg = resolve_config(arch, {})
    return f"{cfg.encoder_embed_dim},{cfg.encoder_ffn_embed_dim},{cfg.encoder_layers},{cfg.encoder_attention_heads}"


def source_sentences(args: argparse.Namespace) -> list[list[int]]:
    """Seeded random id sequences (each ending in </s>), sorted by length as a translator would;
    with --source-text, its first lines with each word hashed to an id (real sentence lengths)."""
    if args.source_text is not None:
        with open(args.source_text, encoding="utf-8") as f:
            lines = [line.split() for line, _ in zip(f, range(args.sentences))]
        rows = [[4 + zlib.crc32(w.encode()) % (args.vocab - 4) for w in words] + [EOS] for words in lines if words]
        if len(rows) < args.sentences:
            sys.exit(f"{args.source_text} has only {len(rows)} non-empty lines among its first {args.sentences}")
        return sorted(rows, key=len, reverse=True)
    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.sentences):
        length = rng.randint(max(1, args.src_len // 2), args.src_len * 3 // 2)
        rows.append([rng.randrange(4, args.vocab) for _ in range(length)] + [EOS])
    return sorted(rows, key=len, reverse=True)


def batches(rows: list[list[int]], size: int, torch):
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        width = max(len(r) for r in chunk)
        tokens = torch.full((len(chunk), width), PAD, dtype=torch.long)
        for i, r in enumerate(chunk):
            tokens[i, : len(r)] = torch.tensor(r)
        yield tokens


def autocast(torch, device: str, precision: str):
    """The autocast context of translate's --precision (int8 layers run outside autocast)."""
    import contextlib

    if precision in ("fp32", "int8"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(torch.device(device).type, dtype=dtype)


def timed(torch, args, run_batch, rows, precision: str | None = None) -> float:
    """Seconds to decode all `rows` (best of --repeats), after one untimed warm-up batch,
    in `precision` (default --precision)."""
    best = float("inf")
    with torch.inference_mode(), autocast(torch, args.device, precision or args.precision):
        run_batch(next(batches(rows[: min(8, len(rows))], args.batch_size, torch)).to(args.device))
        for _ in range(args.repeats):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            for tokens in batches(rows, args.batch_size, torch):
                run_batch(tokens.to(args.device))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
    return best


def forced_lengths(args: argparse.Namespace, beam: int, max_target_positions: int):
    """nmt's DecodeConfig that forces every output to its length (see output_lengths)."""
    from nmt_cli.config import DecodeConfig

    if args.tgt_len_from_source:  # a * src_len + b tokens, min_len never reached first
        return DecodeConfig(beam=beam, nbest=1, max_len_a=1.0, max_len_b=0, min_len=max_target_positions)
    return DecodeConfig(beam=beam, nbest=1, max_len_a=0, max_len_b=args.tgt_len, min_len=args.tgt_len)


def output_lengths(args: argparse.Namespace, src_lengths: list[int]) -> list[int]:
    """Tokens of each forced output, `</s>` included (source lengths count theirs)."""
    if args.tgt_len_from_source:
        return [n + 1 for n in src_lengths]
    return [args.tgt_len + 1] * len(src_lengths)


def as_nmt_translate(args: argparse.Namespace) -> None:
    """The process settings `nmt translate` makes before decoding."""
    from nmt_cli.host_memory import keep_freed_memory

    if not args.device.startswith("cuda"):
        keep_freed_memory()


def measure_nmt(args: argparse.Namespace, beam: int, cuda_graphs: str = "") -> float:
    """Seconds for nmt's search; cuda_graphs "model": the model's step replayed as a CUDA
    graph, "whole": model and search together (what translate does on a GPU)."""
    import torch

    from nmt_cli.decode.fixed_search import FixedSearch
    from nmt_cli.decode.graphs import with_fixed_steps
    from nmt_cli.decode.loading import prepare_linears
    from nmt_cli.decode.search import generate
    from nmt_cli.models.registry import build_model, resolve_config

    as_nmt_translate(args)
    torch.manual_seed(args.seed)
    cfg = resolve_config(args.arch, {"dropout": 0.0, "share_all_embeddings": True})
    model = build_model(cfg, args.vocab, args.vocab).to(args.device).eval()
    prepare_linears(model, args.precision, torch.device(args.device))  # as translate: packed on a CPU
    # As translate on a GPU; on a CPU the same fixed-shape steps run without graphs.
    capture_failures: list[str] = []
    decoder = model
    if cuda_graphs:
        decoder = with_fixed_steps(model, use_graphs=args.device.startswith("cuda"), warn=capture_failures.append)
    decode = forced_lengths(args, beam, cfg.max_target_positions)

    fixed = None
    if cuda_graphs == "whole":  # as translate: buffers and graphs kept from batch to batch
        fixed = FixedSearch(decoder, decode)

        def search(tokens):
            return fixed.generate(tokens, cfg.max_target_positions)
    else:
        def search(tokens):
            return generate(decoder, tokens, decode, cfg.max_target_positions)

    def run_batch(tokens):
        hyps = search(tokens)
        assert [len(h[0].tokens) for h in hyps] == output_lengths(args, tokens.ne(PAD).sum(1).tolist())

    rows = source_sentences(args)
    seconds = timed(torch, args, run_batch, rows)
    if capture_failures:  # translate goes on without graphs; a figure would be mislabelled
        raise RuntimeError(capture_failures[0])
    if fixed is not None and beam == args.beam:
        batches_run = -(-len(rows) // args.batch_size) * args.repeats + 1
        print(f"# nmt beam{beam} --cuda-graphs: {fixed.steps_built} step graphs built for {batches_run} batches "
              f"(the timed ones and one warm-up)")
    if args.profile and beam == args.beam:
        from device_profile import device_busy_line

        first = next(batches(rows, args.batch_size, torch)).to(args.device)
        unit = f"batch of {first.size(0)} ({max(output_lengths(args, [first.size(1)]))} steps at most), nmt beam{beam}"
        if cuda_graphs:
            unit += f" graphed {cuda_graphs}"
        print(device_busy_line(lambda: run_batch(first), 2, unit, torch.device(args.device)), flush=True)
    return seconds


def measure_hf(args: argparse.Namespace) -> float:
    """Runs inside the peer environment."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(args.seed)
    sizes = peer_sizes(args)
    config = MarianConfig(
        vocab_size=args.vocab, d_model=sizes["d_model"], encoder_layers=sizes["layers"], decoder_layers=sizes["layers"],
        encoder_attention_heads=sizes["heads"], decoder_attention_heads=sizes["heads"],
        encoder_ffn_dim=sizes["ffn"], decoder_ffn_dim=sizes["ffn"], max_position_embeddings=1024,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=EOS,
        scale_embedding=True, share_encoder_decoder_embeddings=True,
    )
    model = MarianMTModel(config).to(args.device).eval()
    steps = args.tgt_len + 1

    def run_batch(tokens):
        out = model.generate(
            input_ids=tokens, attention_mask=tokens.ne(PAD), num_beams=args.beam, num_return_sequences=1,
            do_sample=False, min_new_tokens=steps, max_new_tokens=steps,
        )
        assert out.size(1) == steps + 1  # the start token, then the forced tokens

    return timed(torch, args, run_batch, source_sentences(args))


def setup_peer() -> None:
    """Create the peer venv: torch pinned to this environment's version first, then transformers."""
    import torch

    version = torch.__version__.split("+")[0]
    PEER_CONSTRAINTS.write_text(f"torch=={version}\n")
    PEER_VENV.parent.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"torch=={version}"], check=True)
    subprocess.run([*pip, "-c", str(PEER_CONSTRAINTS), "transformers"], check=True)


def run_peer(args: argparse.Namespace, argv: list[str]) -> float | str:
    python = args.peer_python
    if not python.exists():
        return "skipped (not installed; run with --setup-peer)"
    check = subprocess.run([str(python), "-c", "from transformers import MarianMTModel"], capture_output=True)
    if check.returncode != 0:
        return "skipped (not installed; run with --setup-peer)"
    out = json_result([str(python), __file__, *argv, "--system", "hf"])
    return out if isinstance(out, str) else float(out["seconds"])


def fairseq_flags(args: argparse.Namespace) -> list[str]:
    """fairseq-train flags for the --peer-sizes with shared embeddings."""
    sizes = peer_sizes(args)
    flags = ["--encoder-embed-dim", str(sizes["d_model"]), "--encoder-ffn-embed-dim", str(sizes["ffn"]),
             "--encoder-layers", str(sizes["layers"]), "--encoder-attention-heads", str(sizes["heads"])]
    flags += [flag.replace("encoder", "decoder") for flag in flags]
    return [str(args.work_dir), "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "transformer",
            "--share-all-embeddings", *flags, "--dropout", "0.0", "--seed", str(args.seed)]


def make_fairseq_checkpoint(args: argparse.Namespace) -> None:
    """Runs inside the peer environment: a random-weight fairseq Transformer saved as fairseq
    0.12 saves a checkpoint (args Namespace), with dictionaries of --vocab symbols."""
    import torch
    from fairseq import options, tasks

    for lang in ("src", "tgt"):  # fairseq adds <s>, <pad>, </s>, <unk> itself: V in all
        (args.work_dir / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(4, args.vocab)))
    fairseq_args = options.parse_args_and_arch(options.get_training_parser(), fairseq_flags(args))
    torch.manual_seed(args.seed)
    model = tasks.setup_task(fairseq_args).build_model(fairseq_args)
    history = [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": None}, "num_updates": 0}]
    torch.save({"args": fairseq_args, "model": model.state_dict(), "optimizer_history": history, "extra_state": {},
                "last_optimizer_state": None}, args.work_dir / "checkpoint.pt")


def measure_fairseq(args: argparse.Namespace) -> float:
    """Runs inside the peer environment: fairseq's SequenceGenerator (fairseq-generate's search)."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(args.work_dir / "checkpoint.pt")])
    model = models[0].to(args.device).eval()
    if args.precision != "fp32":
        model = model.half() if args.precision == "fp16" else model.to(torch.bfloat16)
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=0,
                                  max_len_b=args.tgt_len, min_len=args.tgt_len)

    def run_batch(tokens):
        lengths = tokens.ne(PAD).sum(1)
        hyps = generator.generate([model], {"net_input": {"src_tokens": tokens, "src_lengths": lengths}})
        assert all(len(h[0]["tokens"]) == args.tgt_len + 1 for h in hyps)

    precision, args.precision = args.precision, "fp32"  # the model itself is cast, no autocast
    seconds = timed(torch, args, run_batch, source_sentences(args))
    args.precision = precision
    return seconds


def measure_ct2(args: argparse.Namespace) -> float:
    """Runs inside the peer environment: CTranslate2 on the converted fairseq model. It counts
    decoding length without </s>, so min = max = tgt-len + 1 runs the same tgt-len + 1 steps.
    With --ct2-workers N, N batches run at once, on --threads / N threads each."""
    import ctranslate2

    device = "cuda" if args.device.startswith("cuda") else "cpu"
    intra_threads = (args.threads or 0) // args.ct2_workers
    translator = ctranslate2.Translator(str(args.work_dir / "ct2"), device=device, compute_type=args.compute_type,
                                       intra_threads=intra_threads, inter_threads=args.ct2_workers)
    sources = [[f"w{i}" for i in row[:-1]] for row in source_sentences(args)]
    options = dict(beam_size=args.beam, min_decoding_length=args.tgt_len + 1, max_decoding_length=args.tgt_len + 1,
                   max_batch_size=args.batch_size)
    translator.translate_batch(sources[:8], **options)  # warm-up
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        results = translator.translate_batch(sources, **options)
        best = min(best, time.perf_counter() - start)
    assert all(len(r.hypotheses[0]) == args.tgt_len + 1 for r in results)
    return best


def measure_nmt_imported(args: argparse.Namespace, checkpoint: Path, precision: str) -> float:
    """nmt's beam search on the weights of the fairseq model (imported by `nmt import-fairseq`),
    loaded as `nmt translate --precision <precision>` loads it."""
    import torch

    from nmt_cli.decode.loading import load_models
    from nmt_cli.decode.search import generate

    as_nmt_translate(args)
    loaded = load_models((str(checkpoint),), torch.device(args.device), precision)
    decode = forced_lengths(args, args.beam, loaded.max_target_positions)

    def run_batch(tokens):
        hyps = generate(loaded.decoder, tokens, decode, loaded.max_target_positions)
        assert all(len(h[0].tokens) == args.tgt_len + 1 for h in hyps)

    return timed(torch, args, run_batch, source_sentences(args), precision)


def run_in_peer_env(args: argparse.Namespace, argv: list[str], system: str, *extra: str) -> dict | str:
    """Run one --system of this file with benchmarks/.venv's python; its last stdout line is JSON."""
    command = [str(PEER_PYTHON), __file__, *argv, "--system", system, "--work-dir", str(args.work_dir), *extra]
    return json_result(command, peer_env(args.threads))


def fairseq_peers(args: argparse.Namespace, argv: list[str]) -> dict[str, float | str]:
    """fairseq, CTranslate2 (float32, int8) and nmt, all on one random-weight fairseq model."""
    import torch

    from nmt_cli.models.fast.packed import packed_unavailable_reason

    if not peer_has("fairseq", "ctranslate2"):
        return {"fairseq": "skipped (run benchmarks/setup_peers.sh)"}
    args.work_dir = Path(tempfile.mkdtemp(prefix="nmt-decode-bench-"))
    made = run_in_peer_env(args, argv, "fairseq-checkpoint")
    if isinstance(made, str):
        return {"fairseq": made}
    convert_fairseq_checkpoint(args.work_dir / "checkpoint.pt", args.work_dir, "src", "tgt", args.work_dir)
    imported = args.work_dir / "nmt-run" / "checkpoint.pt"
    results: dict[str, float | str] = {
        f"nmt beam{args.beam}, fairseq weights": measure_nmt_imported(args, imported, args.precision)}
    if not args.device.startswith("cuda"):
        results[f"nmt int8 beam{args.beam}, fairseq weights"] = measure_nmt_imported(args, imported, "int8")
        if args.precision == "fp32" and packed_unavailable_reason(torch.bfloat16) is None:  # a CPU with bf16 instructions
            results[f"nmt bf16 beam{args.beam}, fairseq weights"] = measure_nmt_imported(args, imported, "bf16")
    peers = [(f"fairseq beam{args.beam}", "fairseq", ()),
             (f"ct2 float32 beam{args.beam}", "ct2", ("--compute-type", "float32")),
             (f"ct2 int8 beam{args.beam}", "ct2", ("--compute-type", "int8"))]
    if not args.device.startswith("cuda") and (args.threads or 0) > 1:
        # CTranslate2's way to use several cores for throughput: one single-threaded worker
        # per core, each on batches of its own (inter_threads).
        workers = ("--ct2-workers", str(args.threads))
        peers += [(f"ct2 float32 beam{args.beam}, {args.threads} workers", "ct2", ("--compute-type", "float32", *workers)),
                  (f"ct2 int8 beam{args.beam}, {args.threads} workers", "ct2", ("--compute-type", "int8", *workers))]
    for name, system, extra in peers:
        if args.device.startswith("cuda") and system == "ct2" and "int8" in extra:
            extra = ("--compute-type", "int8_float16")
        out = run_in_peer_env(args, argv, system, *extra)
        results[name] = out if isinstance(out, str) else out["seconds"]
        if not isinstance(out, str):
            print(f"# {name}: peak RSS of its process {out['peak_rss_mib']:.0f} MiB")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    return results


def guarded(measure) -> float | str:
    """measure(), or a one-line reason when it fails: a new code path on a rented GPU
    must not cost the figures measured after it."""
    try:
        return measure()
    except Exception as error:  # noqa: BLE001 - reported, and the run goes on
        reason = str(error).splitlines()[0] if str(error) else ""
        return f"failed: {type(error).__name__}: {reason}"[:300]


def report(name: str, args: argparse.Namespace, seconds: float | str, target_tokens: int) -> None:
    if isinstance(seconds, str):
        print(f"{name:<32} {seconds}")
        return
    print(f"{name:<32} {args.sentences} sentences in {seconds:7.2f} s: {args.sentences / seconds:8.1f} sentences/s "
          f"{target_tokens / seconds:9.0f} target tokens/s")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.setup_peer:
        setup_peer()
        return
    if args.system == "ct2":  # before importing torch, so that its memory is CTranslate2's alone
        print(json.dumps({"seconds": measure_ct2(args), "peak_rss_mib": self_peak_rss_mib()}))
        return
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.system == "hf":
        print(json.dumps({"seconds": measure_hf(args)}))
        return
    if args.system != "all":  # a system of the fairseq comparison, inside the peer environment
        if args.system == "fairseq-checkpoint":
            make_fairseq_checkpoint(args)
            print(json.dumps({}))
            return
        print(json.dumps({"seconds": measure_fairseq(args), "peak_rss_mib": self_peak_rss_mib()}))
        return
    print(machine_line())
    each = "as many target tokens as source tokens" if args.tgt_len_from_source else f"{args.tgt_len}+1 target tokens"
    print(f"# {args.arch} sizes, vocab {args.vocab}, {args.sentences} sentences, batch {args.batch_size}, "
          f"beam {args.beam}, {each} each, {args.device} {args.precision}, {torch.get_num_threads()} threads")
    target_tokens = sum(output_lengths(args, [len(row) for row in source_sentences(args)]))
    ours = ours_eager = measure_nmt(args, args.beam)
    report(f"nmt beam{args.beam}", args, ours, target_tokens)
    graphs_work = False
    if args.cuda_graphs:
        # The model's step alone in a graph, then the whole step (translate on a GPU).
        for scope, name in (("model", "graphed model"), ("whole", "--cuda-graphs")):
            graphed = guarded(lambda: measure_nmt(args, args.beam, cuda_graphs=scope))
            report(f"nmt beam{args.beam} {name}", args, graphed, target_tokens)
            if not isinstance(graphed, str):
                print(f"ratio nmt {name} / nmt beam{args.beam}: {ours_eager / graphed:.2f}x sentences/s")
                ours = min(ours, graphed)  # the peers are compared with the fastest nmt
                graphs_work = scope == "whole"
    report("nmt greedy", args, measure_nmt(args, 1, cuda_graphs="whole" if graphs_work else ""), target_tokens)
    argv = [*argv, "--peer-sizes", arch_sizes(args.arch)]  # every peer builds a model of --arch's sizes
    if args.skip_peer or args.tgt_len_from_source:
        theirs = "skipped (--skip-peer)" if args.skip_peer else "skipped (not with --tgt-len-from-source)"
    else:
        theirs = run_peer(args, argv)
    report(f"hf beam{args.beam}", args, theirs, target_tokens)
    if not isinstance(theirs, str):
        print(f"ratio nmt/hf beam{args.beam}: {theirs / ours:.2f}x sentences/s")
    if args.fairseq_peers and not args.skip_peer and not args.tgt_len_from_source:
        same_weights = fairseq_peers(args, argv)
        for name, seconds in same_weights.items():
            report(name, args, seconds, target_tokens)
        peers = {name: seconds for name, seconds in same_weights.items() if not name.startswith("nmt") and not isinstance(seconds, str)}
        if not isinstance(theirs, str):
            peers[f"hf beam{args.beam}"] = theirs
        for ours_name, ct2_rows in ((f"nmt beam{args.beam}, fairseq weights", f"ct2 float32 beam{args.beam}"),
                                    (f"nmt int8 beam{args.beam}, fairseq weights", f"ct2 int8 beam{args.beam}")):
            # Against CTranslate2's faster configuration at this precision (threaded or workers).
            theirs_rows = {name: seconds for name, seconds in same_weights.items()
                           if name.startswith(ct2_rows) and isinstance(seconds, float)}
            mine = same_weights.get(ours_name)
            if isinstance(mine, float) and theirs_rows:
                fastest_ct2 = min(theirs_rows, key=theirs_rows.get)
                print(f"ratio {ours_name.split(',')[0]} / {fastest_ct2}: {theirs_rows[fastest_ct2] / mine:.2f}x sentences/s")
        if peers:
            best = min(peers, key=peers.get)
            ours_rows = {name: seconds for name, seconds in same_weights.items()
                         if name.startswith("nmt") and isinstance(seconds, float)} or {f"nmt beam{args.beam}": ours}
            fastest = min(ours_rows, key=ours_rows.get)
            print(f"ratio nmt / best peer ({fastest.split(',')[0]} / {best}): {peers[best] / ours_rows[fastest]:.2f}x sentences/s")


if __name__ == "__main__":
    main()
