"""Reference outputs from the real fairseq, for tests/test_fairseq_import.py.

Runs inside the fairseq virtual environment (scripts/setup_fairseq_env.sh), never
imported by nmt. One call trains a tiny fairseq Transformer per variant (in parallel,
a process each) the way a fairseq user would (Moses tokenization, subword-nmt BPE,
fairseq-preprocess, fairseq-train), then writes what fairseq computes with them as JSON:

    python fairseq_reference.py SPEC.json OUT.json

SPEC keys: workdir, src_lang, tgt_lang, train/valid/test (each {"src": [...], "tgt": [...]}
raw lines), bpe_merges, variants (a list of {"name", "arch", "train_flags"}: fairseq-train
architecture and extra flags), max_update, beam, lenpen, max_len_a, max_len_b,
score_pairs (how many test pairs to teacher-force), dict_probe (lines of a dict.txt to
load with fairseq's Dictionary), bpe_probe (tokenized lines to segment with subword-nmt),
bpe_v01_codes (a headerless codes file's text, segmented with the version 0.1 rules).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # fairseq 0.12 with torch >= 2.6

import torch  # noqa: E402
from sacremoses import MosesTokenizer  # noqa: E402
from subword_nmt import apply_bpe, learn_bpe  # noqa: E402


def tokenize_and_bpe(spec: dict, work: Path) -> Path:
    """fairseq's `--tokenizer moses` settings (escape, -a), joint subword-nmt BPE; returns the codes."""
    tokenizers = {lang: MosesTokenizer(lang) for lang in (spec["src_lang"], spec["tgt_lang"])}
    tokenized = {}
    for split in ("train", "valid"):
        for side, lang in (("src", spec["src_lang"]), ("tgt", spec["tgt_lang"])):
            tokenized[split, lang] = [
                tokenizers[lang].tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
                for line in spec[split][side]
            ]
    codes = work / "bpe.codes"
    with open(codes, "w", encoding="utf-8") as out:
        joint = tokenized["train", spec["src_lang"]] + tokenized["train", spec["tgt_lang"]]
        learn_bpe.learn_bpe(joint, out, spec["bpe_merges"], min_frequency=2)
    with open(codes, encoding="utf-8") as f:
        bpe = apply_bpe.BPE(f)
    for (split, lang), lines in tokenized.items():
        text = "".join(bpe.process_line(line) + "\n" for line in lines)
        (work / f"{split}.bpe.{lang}").write_text(text, encoding="utf-8")
    return codes


def preprocess_and_train(spec: dict, variant: dict, work: Path, out: Path) -> Path:
    """fairseq-preprocess and fairseq-train of one variant into `out`; returns checkpoint_last.pt."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import preprocess, train

    data_bin, save_dir = out / "data-bin", out / "checkpoints"
    parser = options.get_preprocessing_parser()
    langs = ["--source-lang", spec["src_lang"], "--target-lang", spec["tgt_lang"]]
    joined = ["--joined-dictionary"] if "--share-all-embeddings" in variant["train_flags"] else []
    preprocess.main(parser.parse_args(langs + joined + [
        "--trainpref", str(work / "train.bpe"), "--validpref", str(work / "valid.bpe"),
        "--destdir", str(data_bin), "--workers", "1",
    ]))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        str(data_bin), "--arch", variant["arch"], *variant["train_flags"],
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "40",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "1000", "--max-update", str(spec["max_update"]), "--seed", "1",
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--disable-validation",
        "--cpu", "--num-workers", "0", "--log-format", "none", "--log-interval", "1000",
    ])
    train.main(convert_namespace_to_omegaconf(args))
    return save_dir / "checkpoint_last.pt"


def load_hub(checkpoint: Path, data_bin: Path, codes: Path, spec: dict):
    """fairseq's hub interface with `--tokenizer moses --bpe subword_nmt` (its defaults otherwise)."""
    from fairseq import checkpoint_utils
    from fairseq.data import encoders
    from fairseq.hub_utils import GeneratorHubInterface

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data_bin)})
    hub = GeneratorHubInterface(cfg, task, models)
    # Set after loading: passing them as overrides trips omegaconf on checkpoints saved with a cfg.
    hub.tokenizer = encoders.build_tokenizer(argparse.Namespace(
        tokenizer="moses", source_lang=spec["src_lang"], target_lang=spec["tgt_lang"],
        moses_no_dash_splits=False, moses_no_escape=False))
    hub.bpe = encoders.build_bpe(argparse.Namespace(bpe="subword_nmt", bpe_codes=str(codes), bpe_separator="@@"))
    hub.eval()
    return hub


def teacher_forced(hub, src_lines: list[str], tgt_lines: list[str]) -> dict:
    """Per pair: source/target ids and fairseq's log-prob of each target token."""
    from fairseq.data import data_utils

    model, pad, eos = hub.models[0], hub.tgt_dict.pad(), hub.tgt_dict.eos()
    src = [hub.encode(line) for line in src_lines]
    tgt = [hub.tgt_dict.encode_line(hub.apply_bpe(hub.tokenize(line)), add_if_not_exist=False).long() for line in tgt_lines]
    src_tokens = data_utils.collate_tokens(src, pad, eos, left_pad=True)  # fairseq's default for sources
    prev = data_utils.collate_tokens(tgt, pad, eos, left_pad=False, move_eos_to_beginning=True)
    with torch.no_grad():
        net_output = model(src_tokens, torch.tensor([len(s) for s in src]), prev)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)  # (B, T, V)
    target = data_utils.collate_tokens(tgt, pad, eos, left_pad=False)
    picked = lprobs.gather(2, target.unsqueeze(2)).squeeze(2)
    return {
        "src_ids": [s.tolist() for s in src],
        "tgt_ids": [t.tolist() for t in tgt],
        "token_lprobs": [picked[i, : len(t)].tolist() for i, t in enumerate(tgt)],
        "first_distribution": lprobs[0, 0].tolist(),
    }


def beam_search(hub, spec: dict, src_lines: list[str]) -> list[dict]:
    """fairseq's SequenceGenerator through the hub: tokens, scores and detokenized text."""
    src = [hub.encode(line) for line in src_lines]
    hypos = hub.generate(src, beam=spec["beam"], lenpen=spec["lenpen"],
                         max_len_a=spec["max_len_a"], max_len_b=spec["max_len_b"], nbest=spec["beam"])
    out = []
    for line, ids, nbest in zip(src_lines, src, hypos):
        out.append({
            "src_bpe": hub.apply_bpe(hub.tokenize(line)),
            "src_ids": ids.tolist(),
            "hypos": [
                {"tokens": h["tokens"].tolist(), "score": float(h["score"]),
                 "positional_scores": h["positional_scores"].tolist(), "text": hub.decode(h["tokens"])}
                for h in nbest
            ],
        })
    return out


def legacy_variant(checkpoint: Path, out: Path) -> None:
    """Re-save a checkpoint as an old fairseq would have written it.

    `args` as an argparse.Namespace (no cfg), fused `in_proj_weight`, `layer_norms.N`,
    `decoder.embed_out` when unshared, and torch's pre-1.6 serialization.
    """
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    args = argparse.Namespace(**vars(state["cfg"]["model"]))
    args.source_lang, args.target_lang = state["cfg"]["task"]["source_lang"], state["cfg"]["task"]["target_lang"]
    args.task, args.data = "translation", state["cfg"]["task"]["data"]
    weights = {}
    for key, value in state["model"].items():
        parts = key.split(".")  # e.g. encoder.layers.0.self_attn.q_proj.weight
        if len(parts) == 6 and parts[4] in ("q_proj", "k_proj", "v_proj"):
            if parts[4] == "q_proj":
                prefix = ".".join(parts[:4])
                fused = [state["model"][f"{prefix}.{p}.{parts[5]}"] for p in ("q_proj", "k_proj", "v_proj")]
                weights[f"{prefix}.in_proj_{parts[5]}"] = torch.cat(fused, dim=0)
            continue
        norms = ["self_attn_layer_norm", "final_layer_norm"]
        if parts[0] == "decoder":
            norms = ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
        if len(parts) == 5 and parts[1] == "layers" and parts[3] in norms:
            key = ".".join(parts[:3] + ["layer_norms", str(norms.index(parts[3])), parts[4]])
        if key == "decoder.output_projection.weight" and not (
            args.share_all_embeddings or args.share_decoder_input_output_embed
        ):
            key = "decoder.embed_out"
        elif key == "decoder.output_projection.weight":
            continue
        weights[key] = value
    torch.save({"args": args, "model": weights, "optimizer_history": state["optimizer_history"],
                "extra_state": state["extra_state"], "last_optimizer_state": None},
               out, _use_new_zipfile_serialization=False)


# Fields of fairseq's TransformerConfig `encoder`/`decoder` groups (hydra-style configs nest them).
GROUP_FIELDS = ("embed_path", "embed_dim", "ffn_embed_dim", "layers", "attention_heads", "normalize_before",
                "learned_pos", "layerdrop", "layers_to_keep", "input_dim", "output_dim")


def dictconfig_variant(checkpoint: Path, out: Path) -> None:
    """Re-save a checkpoint with its cfg as an omegaconf DictConfig whose model nests encoder/decoder groups."""
    from omegaconf import OmegaConf

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    flat = {k: v for k, v in vars(state["cfg"]["model"]).items() if v is None or isinstance(v, (bool, int, float, str))}
    model = {"_name": flat.pop("_name"), "encoder": {}, "decoder": {}}
    for key, value in flat.items():
        side, _, field = key.partition("_")
        if side in ("encoder", "decoder") and field in GROUP_FIELDS:
            model[side][field] = value
        else:
            model[key] = value
    cfg = OmegaConf.create({"model": model, "task": {"_name": "translation", "source_lang": "de", "target_lang": "en"}})
    torch.save({"args": None, "cfg": cfg, "model": state["model"]}, out)


def probe_dictionary(lines: list[str], work: Path) -> list[str]:
    from fairseq.data import Dictionary

    path = work / "dict.probe.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return list(Dictionary.load(str(path)).symbols)


def log_time(stage: str, start: float) -> float:
    now = time.perf_counter()
    print(f"[fairseq_reference] {stage}: {now - start:.1f}s", file=sys.stderr)
    return now


def reference_for_variant(spec: dict, variant: dict, work: Path, codes: Path) -> dict:
    """Train one variant and record fairseq's teacher-forced log-probs and beams with it."""
    start = time.perf_counter()
    out = work / variant["name"]
    checkpoint = preprocess_and_train(spec, variant, work, out)
    start = log_time(f"{variant['name']}: preprocess and train", start)
    legacy = out / "checkpoints" / "legacy.pt"
    legacy_variant(checkpoint, legacy)
    dictconfig_variant(checkpoint, out / "checkpoints" / "dictconfig.pt")
    test, n = spec["test"], spec["score_pairs"]
    result = {"checkpoint": str(checkpoint), "legacy_checkpoint": str(legacy), "data_bin": str(out / "data-bin"),
              "dictconfig_checkpoint": str(out / "checkpoints" / "dictconfig.pt")}
    hub = load_hub(checkpoint, out / "data-bin", codes, spec)
    result["src_dict"], result["tgt_dict"] = list(hub.src_dict.symbols), list(hub.tgt_dict.symbols)
    result["teacher_forced"] = teacher_forced(hub, test["src"][:n], test["tgt"][:n])
    result["beam"] = beam_search(hub, spec, test["src"])
    legacy_hub = load_hub(legacy, out / "data-bin", codes, spec)
    result["legacy_teacher_forced"] = teacher_forced(legacy_hub, test["src"][:n], test["tgt"][:n])
    log_time(f"{variant['name']}: teacher forcing and beam search", start)
    return result


def variants_in_parallel(spec: dict, work: Path, codes: Path) -> dict:
    """reference_for_variant of every variant, each in a process of its own (one thread each:
    the variants share nothing but the BPE codes)."""
    with multiprocessing.get_context("fork").Pool(len(spec["variants"])) as pool:
        results = pool.starmap(reference_for_variant, [(spec, variant, work, codes) for variant in spec["variants"]])
    return {variant["name"]: result for variant, result in zip(spec["variants"], results)}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    work = Path(spec["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    torch.set_num_threads(1)
    start = time.perf_counter()
    codes = tokenize_and_bpe(spec, work)
    log_time("tokenize and learn BPE", start)
    with open(codes, encoding="utf-8") as f:
        bpe = apply_bpe.BPE(f)
    old_codes = work / "bpe_v01.codes"  # headerless codes: subword-nmt's version 0.1 rules
    old_codes.write_text(spec["bpe_v01_codes"], encoding="utf-8")
    with open(old_codes, encoding="utf-8") as f:
        old_bpe = apply_bpe.BPE(f)
    result = {
        "bpe_codes": str(codes),
        "bpe_probe": {line: bpe.process_line(line) for line in spec["bpe_probe"]},
        "bpe_v01_codes": str(old_codes),
        "bpe_v01_probe": {line: old_bpe.process_line(line) for line in spec["bpe_probe"]},
        "dict_probe": probe_dictionary(spec["dict_probe"], work),
        "variants": variants_in_parallel(spec, work, codes),
    }
    Path(sys.argv[2]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
