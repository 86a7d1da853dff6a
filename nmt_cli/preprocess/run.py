"""`nmt preprocess`: raw parallel text -> a self-describing data-bin/ directory.

Stages, each streamed line by line through files (never a whole corpus in memory):
1. normalize + tokenize every split; clean the training pairs (`preprocess/clean.py`);
2. learn BPE on the tokenized training text (or reuse a model, or skip: `--bpe none`);
3. segment every split into pieces, counting training pieces;
4. build (or load) the dictionaries;
5. binarize every split to `{split}.{src}-{tgt}.{lang}.bin/.idx`.
Everything is written into a hidden sibling of `--destdir` that is renamed into
place at the end (`staging.py`).
"""

from __future__ import annotations

import datetime
import itertools
import json
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from nmt_cli import __version__
from nmt_cli.config import PreprocessConfig
from nmt_cli.data.dictionary import SPECIALS, Dictionary
from nmt_cli.data.meta import META_FORMAT_VERSION, read_meta
from nmt_cli.errors import NmtError
from nmt_cli.machine import usable_cpus
from nmt_cli.preprocess.clean import CleanSettings
from nmt_cli.preprocess.progress import StageReporter
from nmt_cli.preprocess.references import keep_references
from nmt_cli.preprocess.segmented import resolve_segmentation
from nmt_cli.preprocess.stages import JobRunner, TokenizeResult
from nmt_cli.preprocess.workers import binarize_file, segment_file, tokenize_parallel
from nmt_cli.run_lock import directory_lock
from nmt_cli.staging import build_then_publish, check_destination, failure_line, fingerprint, refuse_inputs_inside
from nmt_cli.text.bpe import BpeModel, learn_bpe
from nmt_cli.text.reader import count_lines, read_lines
from nmt_cli.text.tokenizer import TokenizerSettings

# Bumped when the same inputs and settings come to give another data-bin, so that a rerun
# over one an older nmt made does not take it for up to date (2: a text token spelt
# </s>, <pad> or <s> is <unk>, no longer the special's id).
PREPROCESS_REVISION = 2
# How learn_bpe's errors name the sizes.
BPE_FLAGS = {"size_flag": "--bpe-size", "sample_flag": "--bpe-sample"}


@dataclass(frozen=True)
class Split:
    name: str  # train, valid, valid1, test, test1, ...
    prefix: Path  # files are {prefix}.{lang}
    clean: bool  # only training pairs are ever dropped


@dataclass(frozen=True)
class PreprocessResult:
    meta: dict
    seconds: float
    up_to_date: bool  # the destination already held this dataset; nothing was done


def plan_splits(cfg: PreprocessConfig) -> list[Split]:
    splits = [Split("train", cfg.trainpref, clean=True)]
    for kind, prefixes in (("valid", cfg.validpref), ("test", cfg.testpref)):
        splits += [Split(f"{kind}{i if i else ''}", prefix, clean=False) for i, prefix in enumerate(prefixes)]
    return splits


def input_path(prefix: Path, lang: str) -> Path:
    return Path(f"{prefix}.{lang}")


def count_pairs(cfg: PreprocessConfig, splits: list[Split]) -> dict[str, int]:
    """Check every input exists, is non-empty and that both sides have equal line counts."""
    counts = {}
    for split in splits:
        src, tgt = input_path(split.prefix, cfg.source_lang), input_path(split.prefix, cfg.target_lang)
        src_lines, tgt_lines = count_lines(src), count_lines(tgt)
        if src_lines != tgt_lines:
            raise NmtError(f"line counts differ: {src} has {src_lines} lines, {tgt} has {tgt_lines}")
        counts[split.name] = src_lines
    for path in (cfg.srcdict, cfg.tgtdict, cfg.bpe_model):
        if path is not None and not path.is_file():
            raise NmtError(f"file not found: {path}")
    if cfg.bpe_model is not None:
        BpeModel(cfg.bpe_model)  # a bad model is named as given, not as its copy in the staging directory
    return counts


def text_inputs(cfg: PreprocessConfig, splits: list[Split]) -> list[Path]:
    return [input_path(s.prefix, lang) for s in splits for lang in (cfg.source_lang, cfg.target_lang)]


def dataset_fingerprint(cfg: PreprocessConfig, splits: list[Split]) -> str:
    """Identifies a dataset: the settings that shape the output, and the input files."""
    ignored = {"workers", "force", "destdir"}
    if cfg.bpe == "none" or cfg.bpe_model is not None:  # no BPE is learned
        ignored |= {"bpe_size", "bpe_sample", "bpe_seed"}
    if cfg.srcdict is not None:
        ignored |= {"thresholdsrc", "nwordssrc"}
    if cfg.tgtdict is not None or cfg.joined_dictionary:  # joined: the source side's settings build it
        ignored |= {"thresholdtgt", "nwordstgt"}
    settings = {k: str(v) for k, v in asdict(cfg).items() if k not in ignored}
    settings["preprocess_revision"] = str(PREPROCESS_REVISION)
    files = text_inputs(cfg, splits) + [p for p in (cfg.srcdict, cfg.tgtdict, cfg.bpe_model) if p is not None]
    return fingerprint(settings, files)


def preprocess(cfg: PreprocessConfig, reporter: StageReporter) -> PreprocessResult:
    if cfg.workers > usable_cpus():  # the output is the same for any number of workers
        reporter.log(f"--workers {cfg.workers}: using the {usable_cpus()} usable CPU(s)")
        cfg = replace(cfg, workers=usable_cpus())
    cfg, segmented_marker = resolve_segmentation(cfg)
    if segmented_marker is not None:
        reporter.log(f"the training text is already segmented ({segmented_marker.strip()!r} pieces): "
                     "taken as it is (no normalization, tokenization or BPE)")
    splits = plan_splits(cfg)
    given_files = [p for p in (cfg.srcdict, cfg.tgtdict, cfg.bpe_model) if p is not None]
    refuse_inputs_inside(text_inputs(cfg, splits) + given_files, cfg.destdir, "--destdir")
    with directory_lock(cfg.destdir, "--destdir"):  # one writer: another preprocess would replace this one's output
        return _preprocess_locked(cfg, splits, reporter, segmented_marker)


def _preprocess_locked(cfg: PreprocessConfig, splits: list[Split], reporter: StageReporter,
                       segmented_marker: str | None = None) -> PreprocessResult:
    line_counts = count_pairs(cfg, splits)
    print_id = dataset_fingerprint(cfg, splits)
    if check_destination(cfg.destdir, "--destdir", print_id, cfg.force,
                         others="a different dataset (or one that an older nmt preprocessed otherwise, or other files)"):
        return PreprocessResult(read_meta(cfg.destdir), reporter.elapsed(), up_to_date=True)

    def write(staging: Path) -> dict:
        meta = build_data_bin(cfg, splits, line_counts, staging, reporter)
        if segmented_marker is not None:  # translate removes these from its text output
            meta["segmented_input"] = segmented_marker
        meta["fingerprint"] = print_id
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return meta

    def describe(error: OSError) -> str:
        return failure_line(f"preprocessing into --destdir {cfg.destdir}", error)

    meta = build_then_publish(cfg.destdir, write, describe)
    return PreprocessResult(meta, reporter.elapsed(), up_to_date=False)


def build_data_bin(
    cfg: PreprocessConfig, splits: list[Split], line_counts: dict[str, int], out: Path, reporter: StageReporter
) -> dict:
    """Run every stage into directory `out`; return the contents of meta.json."""
    work = out / "work"
    work.mkdir()
    langs = {"src": cfg.source_lang, "tgt": cfg.target_lang}
    clean = CleanSettings(cfg.min_len, cfg.max_len, cfg.max_ratio)
    with JobRunner(cfg.workers) as runner:
        tokenized, kept = {}, {}
        for split in splits:
            paths = {side: work / f"{split.name}.tok.{lang}" for side, lang in langs.items()}
            result = tokenize_parallel(
                input_path(split.prefix, cfg.source_lang),
                input_path(split.prefix, cfg.target_lang),
                line_counts[split.name],
                (paths["src"], paths["tgt"]),
                (tokenizer_settings(cfg, cfg.source_lang), tokenizer_settings(cfg, cfg.target_lang)),
                clean if split.clean else None,
                runner,
                reporter,
                f"tokenize {split.name}",
            )
            tokenized[split.name], kept[split.name] = paths, result.pairs_kept
            if split.clean:
                cleaning = result
        if cleaning.pairs_kept == 0:
            raise NmtError(f"no training pairs left after cleaning {cfg.trainpref}.{{{cfg.source_lang},{cfg.target_lang}}}")

        bpe_meta, models = prepare_bpe(cfg, tokenized["train"], out, reporter)
        segmented, train_counts = {}, {}
        for split in splits:
            for side, lang in langs.items():
                dest = work / f"{split.name}.bpe.{lang}"
                piece_counts = segment_file(
                    tokenized[split.name][side], kept[split.name], models[side], dest, split.name == "train",
                    runner, reporter, f"segment {split.name}.{lang}",
                )
                tokenized[split.name][side].unlink()  # intermediate files can be large: keep disk use down
                segmented[(split.name, side)] = dest
                if split.name == "train":
                    train_counts[side] = piece_counts

        dict_paths = make_dictionaries(cfg, train_counts, out)
        counts: dict[str, dict] = {}
        for split in splits:
            entry = counts[split.name] = {"sentences": kept[split.name], "tokens": {}, "unk": {}}
            for side, lang in langs.items():
                stats = binarize_file(
                    segmented[(split.name, side)], kept[split.name], dict_paths[side],
                    out / f"{split.name}.{cfg.source_lang}-{cfg.target_lang}.{lang}",
                    runner, reporter, f"binarize {split.name}.{lang}",
                )
                entry["tokens"][lang], entry["unk"][lang] = stats.tokens, stats.unk
                segmented[(split.name, side)].unlink()
    shutil.rmtree(work)
    meta = make_meta(cfg, splits, bpe_meta, dict_paths, counts, cleaning)
    # The raw references of the valid and test splits, for scoring their translations (--eval-bleu).
    meta["references"] = keep_references({s.name: input_path(s.prefix, cfg.target_lang) for s in splits if not s.clean},
                                         cfg.source_lang, cfg.target_lang, out)
    return meta


def tokenizer_settings(cfg: PreprocessConfig, lang: str) -> TokenizerSettings:
    return TokenizerSettings(cfg.tokenizer, lang, cfg.normalize_punctuation, cfg.aggressive_dash_splits)


def prepare_bpe(
    cfg: PreprocessConfig, train_tok: dict[str, Path], out: Path, reporter: StageReporter
) -> tuple[dict | None, dict[str, Path | None]]:
    """Learn (or copy) the BPE model(s) into `out`; return their meta.json entry and paths per side."""
    if cfg.bpe == "none":
        return None, {"src": None, "tgt": None}
    if cfg.bpe_model is not None:
        shutil.copyfile(cfg.bpe_model, out / "bpe.model")
        return {"type": "sentencepiece", "model": "bpe.model"}, {"src": out / "bpe.model", "tgt": out / "bpe.model"}
    if not cfg.separate_bpe:
        reporter.log(f"learning joint BPE ({cfg.bpe_size} pieces, sample of at most {cfg.bpe_sample} sentences)")
        sentences = itertools.chain(read_lines(train_tok["src"]), read_lines(train_tok["tgt"]))
        model = out / "bpe.model"
        learn_bpe(sentences, model, cfg.bpe_size, cfg.bpe_sample, cfg.bpe_seed, **BPE_FLAGS,
                  text=f"the joint {cfg.source_lang}-{cfg.target_lang} training text")
        return {"type": "sentencepiece", "model": model.name}, {"src": model, "tgt": model}
    models = {}
    for side, lang in (("src", cfg.source_lang), ("tgt", cfg.target_lang)):
        reporter.log(f"learning BPE for {lang} ({cfg.bpe_size} pieces)")
        models[side] = out / f"bpe.{lang}.model"
        learn_bpe(read_lines(train_tok[side]), models[side], cfg.bpe_size, cfg.bpe_sample, cfg.bpe_seed, **BPE_FLAGS,
                  text=f"the {lang} training text")
    return {"type": "sentencepiece", "model_src": models["src"].name, "model_tgt": models["tgt"].name}, models


def make_dictionaries(cfg: PreprocessConfig, train_counts: dict[str, Counter], out: Path) -> dict[str, Path]:
    """Build (fairseq's thresholds and sizes) or load the dictionaries; write `dict.{lang}.txt`."""
    if cfg.joined_dictionary:
        joined = (
            Dictionary.load(cfg.srcdict)
            if cfg.srcdict is not None
            else build_dictionary(train_counts["src"] + train_counts["tgt"], cfg.thresholdsrc, cfg.nwordssrc,
                                  "--thresholdsrc", "joined")
        )
        dictionaries = {"src": joined, "tgt": joined}
    else:
        dictionaries = {
            "src": Dictionary.load(cfg.srcdict) if cfg.srcdict else build_dictionary(
                train_counts["src"], cfg.thresholdsrc, cfg.nwordssrc, "--thresholdsrc", cfg.source_lang),
            "tgt": Dictionary.load(cfg.tgtdict) if cfg.tgtdict else build_dictionary(
                train_counts["tgt"], cfg.thresholdtgt, cfg.nwordstgt, "--thresholdtgt", cfg.target_lang),
        }
    paths = {}
    for side, lang in (("src", cfg.source_lang), ("tgt", cfg.target_lang)):
        paths[side] = out / f"dict.{lang}.txt"
        dictionaries[side].save(paths[side])
    return paths


def build_dictionary(counts: Counter, threshold: int, nwords: int, flag: str, side: str) -> Dictionary:
    """Dictionary.build, or NmtError when the threshold drops every word: all text would
    become <unk> (a threshold suited to a larger corpus, say)."""
    dictionary = Dictionary.build(counts, threshold, nwords)
    most = max((c for word, c in counts.items() if word not in SPECIALS), default=0)
    if most and most < threshold:
        raise NmtError(f"{flag} {threshold} drops every word of the {side} dictionary: the most frequent "
                       f"is seen {most} times in the training data")
    return dictionary


def make_meta(
    cfg: PreprocessConfig,
    splits: list[Split],
    bpe_meta: dict | None,
    dict_paths: dict[str, Path],
    counts: dict[str, dict],
    cleaning: TokenizeResult,
) -> dict:
    return {
        "format_version": META_FORMAT_VERSION,
        "source_lang": cfg.source_lang,
        "target_lang": cfg.target_lang,
        "joined_dictionary": cfg.joined_dictionary,
        "tokenizer": tokenizer_settings(cfg, cfg.source_lang).to_meta(),
        "bpe": bpe_meta,
        "dictionary_size": {
            cfg.source_lang: len(Dictionary.load(dict_paths["src"])),
            cfg.target_lang: len(Dictionary.load(dict_paths["tgt"])),
        },
        "inputs": {split.name: str(split.prefix) for split in splits},
        "counts": counts,
        "cleaning": {
            "min_len": cfg.min_len,
            "max_len": cfg.max_len,
            "max_ratio": cfg.max_ratio,
            "pairs_read": cleaning.pairs_read,
            "pairs_kept": cleaning.pairs_kept,
            "dropped": cleaning.dropped,
        },
        "versions": {"nmt": __version__, "preprocessing": PREPROCESS_REVISION,
                     "sentencepiece": _version("sentencepiece"), "sacremoses": _version("sacremoses")},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def summary_lines(result: PreprocessResult) -> list[str]:
    """A short human-readable report of a data-bin/ (for stdout)."""
    meta = result.meta
    langs = (meta["source_lang"], meta["target_lang"])
    lines = []
    if result.up_to_date:
        lines.append("already up to date (same inputs and settings); nothing to do")
    for split, entry in meta["counts"].items():
        per_lang = []
        for lang in langs:
            tokens, unk = entry["tokens"][lang], entry["unk"][lang]
            per_lang.append(f"{lang}: {tokens} tokens, {100 * unk / max(tokens, 1):.2f}% <unk>")
        lines.append(f"{split}: {entry['sentences']} sentences; " + "; ".join(per_lang))
    cleaning = meta["cleaning"]
    dropped = ", ".join(f"{n} {reason}" for reason, n in cleaning["dropped"].items() if n) or "none"
    lines.append(f"train cleaning: kept {cleaning['pairs_kept']} of {cleaning['pairs_read']} pairs; dropped: {dropped}")
    lines.append("dictionary: " + ", ".join(f"{lang} {n} symbols" for lang, n in meta["dictionary_size"].items()))
    if meta.get("segmented_input"):
        lines.append(f"input already segmented ({meta['segmented_input'].strip()!r} pieces): taken as it is, "
                     "without normalization, tokenization or BPE")
    lines.append(f"time: {result.seconds:.1f}s")
    return lines
