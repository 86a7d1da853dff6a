"""`nmt export` (CTranslate2, fairseq) and `nmt translate --engine ctranslate2`.

A module fixture trains a tiny run directory for a few hundred Adam steps on a copy
task over generated sentences (sentencepiece BPE, Moses tokenization, shared
embeddings), so that its translations are not degenerate. The truths: nmt's own
engine (the reference), the checkpoint's own weights, and, where
NMT_FAIRSEQ_PYTHON names the reference environment, fairseq-generate itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from nmt_cli.checkpoints.format import load_checkpoint, save_checkpoint
from nmt_cli.cli import main
from nmt_cli.data.dictionary import Dictionary
from nmt_cli.models.registry import ARCHITECTURES, build_model
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.pipeline import TextPipeline
from fault_utils import REPO, SUBPROCESS_ENV
from model_utils import ct2_installed, torch_threads
from tests.test_translate import generated_sentences, train_copy_task

BEAM4 = ("--beam", "4", "--max-len-a", "1", "--max-len-b", "5", "--device", "cpu", "--threads", "1", "--quiet")


def nmt(*args: str, input: bytes | str = b""):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def make_run(root: Path, steps: int, seed: int = 0, **overrides) -> Path:
    """A run directory: meta.json, sentencepiece model, dictionaries, checkpoint_best.pt."""
    run = root / "run"
    run.mkdir()
    sentences = generated_sentences(400, seed=1)
    meta = {"format_version": 1, "source_lang": "en", "target_lang": "de", "joined_dictionary": True,
            "tokenizer": {"name": "moses", "normalize_punctuation": True},
            "bpe": {"type": "sentencepiece", "model": "bpe.model"}, "counts": {}}
    (run / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings

    tokenizer = Tokenizer(TokenizerSettings(name="moses", lang="en"))
    learn_bpe((tokenizer.tokenize(s) for s in sentences), run / "bpe.model", vocab_size=120, sample_size=0, seed=1)
    encoded = [TextPipeline.from_data_bin(run, "en").encode(s) for s in sentences]
    dictionary = Dictionary.build(Counter(p for pieces in encoded for p in pieces))
    for lang in ("en", "de"):
        dictionary.save(run / f"dict.{lang}.txt")
    torch.manual_seed(seed)
    base = ARCHITECTURES["transformer_tiny"]
    cfg = type(base)(**{**base.to_dict(), "dropout": 0.0, "max_source_positions": 24, "max_target_positions": 64,
                        "share_all_embeddings": True, **overrides})
    model = build_model(cfg, len(dictionary), len(dictionary))
    ids = [dictionary.encode(pieces) for pieces in encoded]
    train_copy_task(model, [ids[i : i + 32] for i in range(0, len(ids), 32)], steps=steps)
    state = {"format_version": 1, "model_config": cfg.to_dict(), "model": model.state_dict(),
             "source_lang": "en", "target_lang": "de", "src_dict": dictionary.symbols, "tgt_dict": dictionary.symbols,
             "num_updates": steps, "epoch": 1, "best_metric": None}
    save_checkpoint(state, run / "checkpoint_best.pt")
    return run


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models train and translate fastest on one thread (several only contend on a shared CPU)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_thread) -> Path:
    return make_run(tmp_path_factory.mktemp("export"), steps=200)


def copy_of_run(run_dir: Path, run: Path) -> Path:
    """The files of `run_dir` in a new directory `run`, to change without touching the module's run."""
    run.mkdir()
    for path in run_dir.iterdir():
        if path.is_file():
            (run / path.name).write_bytes(path.read_bytes())
    return run


def sentences_text(count: int = 200) -> str:
    return "".join(line + "\n" for line in generated_sentences(count, seed=7))


def jsonl(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


# --- CTranslate2 --------------------------------------------------------------------------


@ct2_installed
def test_ctranslate2_export_translates_as_nmt_in_float32_beam_4(run_dir, tmp_path):
    exported = nmt("export", "--format", "ctranslate2", str(run_dir), str(tmp_path / "ct2"))
    assert exported.exit_code == 0, exported.output
    assert {"model.bin", "config.json", "meta.json", "bpe.model", "dict.en.txt", "dict.de.txt", "nmt_export.json"} <= {
        p.name for p in (tmp_path / "ct2").iterdir()}
    text = sentences_text(200)
    ours = jsonl(nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, "--output-format", "jsonl", input=text))
    theirs = jsonl(nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "ct2"), *BEAM4,
                       "--output-format", "jsonl", input=text))
    assert [r["line"] for r in theirs] == list(range(1, 201))
    same = sum(a["ids"] == b["ids"] for a, b in zip(ours, theirs))
    assert same >= 198, f"{same} of 200 outputs identical"
    assert len({a["hyp"] for a in ours}) > 50  # the model says different things for different inputs
    for a, b in zip(ours, theirs):
        if a["ids"] == b["ids"]:  # the same tokens: the same log-probabilities and score
            assert b["positional_scores"] == pytest.approx(a["positional_scores"], abs=1e-4)
            assert b["score"] == pytest.approx(a["score"], abs=1e-4)
    # Plain CTranslate2 on the same directory, given the BPE pieces, says the same.
    import ctranslate2

    pipeline = TextPipeline.from_data_bin(run_dir, "en")
    plain = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1).translate_batch(
        [pipeline.encode(line) for line in text.splitlines()[:50]], beam_size=4, max_decoding_length=30)
    bpe = nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "ct2"), *BEAM4[:2], "--max-len-a", "0",
              "--max-len-b", "30", "--device", "cpu", "--quiet", "--output-format", "bpe", input="\n".join(text.splitlines()[:50]))
    assert bpe.output.splitlines() == [" ".join(r.hypotheses[0]) for r in plain]


@ct2_installed
@pytest.mark.parametrize("variant", [
    {"normalize_before": True, "learned_pos": True, "share_all_embeddings": False, "scale_embedding": False},
    {"share_all_embeddings": False, "share_decoder_input_output_embed": True},
])
def test_pre_norm_learned_positions_and_untied_embeddings_export_exactly(tmp_path, variant):
    run = make_run(tmp_path, steps=60, seed=3, **variant)
    exported = nmt("export", "--format", "ctranslate2", str(run / "checkpoint_best.pt"), str(tmp_path / "ct2"))
    assert exported.exit_code == 0, exported.output
    text = sentences_text(40)
    ours = jsonl(nmt("translate", "--path", str(run / "checkpoint_best.pt"), *BEAM4, "--output-format", "jsonl", input=text))
    theirs = jsonl(nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "ct2"), *BEAM4,
                       "--output-format", "jsonl", input=text))
    assert sum(a["ids"] == b["ids"] for a, b in zip(ours, theirs)) >= 39
    for a, b in zip(ours, theirs):
        if a["ids"] == b["ids"]:
            assert b["positional_scores"] == pytest.approx(a["positional_scores"], abs=1e-4)


@ct2_installed
def test_int8_export_nbest_and_sampling(run_dir, tmp_path):
    assert nmt("export", "--format", "ctranslate2", str(run_dir), str(tmp_path / "f32")).exit_code == 0
    assert nmt("export", "--format", "ctranslate2", "--quantization", "int8", str(run_dir), str(tmp_path / "i8")).exit_code == 0
    assert (tmp_path / "i8" / "model.bin").stat().st_size < 0.6 * (tmp_path / "f32" / "model.bin").stat().st_size
    text = sentences_text(60)
    reference = nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, input=text).stdout.splitlines()
    int8 = nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "i8"), "--precision", "int8", *BEAM4,
               input=text).stdout.splitlines()
    assert len(int8) == 60 and sum(a == b for a, b in zip(reference, int8)) >= 50
    ours = jsonl(nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, "--nbest", "3",
                     "--output-format", "jsonl", input=text))
    theirs = jsonl(nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "f32"), *BEAM4, "--nbest", "3",
                       "--output-format", "jsonl", input=text))
    assert all(len(r["nbest"]) == 3 and r["nbest"][0]["ids"] == r["ids"] for r in theirs)
    assert sum(a["ids"] == b["ids"] for a, b in zip(ours, theirs)) >= 59
    sample = ("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "f32"), "--sampling", "--beam", "1",
              "--sampling-topk", "5", "--seed", "3", "--device", "cpu", "--quiet")
    first, second = nmt(*sample, input=text), nmt(*sample, input=text)
    assert first.exit_code == 0 and len(first.stdout.splitlines()) == 60 and first.stdout == second.stdout


@ct2_installed
def test_engine_keeps_the_line_guarantees(run_dir, tmp_path):
    ckpt = str(tmp_path / "ct2")
    assert nmt("export", "--format", "ctranslate2", str(run_dir), ckpt).exit_code == 0
    long_line = " ".join(["the dog runs over green grass"] * 20)  # beyond the 24 source positions
    lines = ["the dog", "", "   ", long_line, "red ball!", ""]
    ours = nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, input="\n".join(lines) + "\n")
    theirs = nmt("translate", "--engine", "ctranslate2", "--path", ckpt, *BEAM4, input="\n".join(lines) + "\n")
    assert theirs.exit_code == 0
    out = theirs.stdout.split("\n")
    assert len(out) == len(lines) + 1 and out[1] == out[2] == out[5] == "" and out[0] and out[3] and out[4]
    # The long line's output runs to the length limit, where nmt forces </s> and CTranslate2 stops.
    assert [line for i, line in enumerate(out) if i != 3] == [line for i, line in enumerate(ours.stdout.split("\n")) if i != 3]
    assert "truncated to the model's maximum of 24" in theirs.stderr
    bad = b"the dog\nred ball\n\xff\xfe broken\ngreen grass\n"
    strict = nmt("translate", "--engine", "ctranslate2", "--path", ckpt, *BEAM4, "--buffer-size", "2", input=bad)
    reference = nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, "--buffer-size", "2", input=bad)
    assert strict.exit_code == 1 and strict.stdout == reference.stdout and len(strict.stdout.splitlines()) == 2
    assert strict.stderr.strip().splitlines()[-1] == reference.stderr.strip().splitlines()[-1]
    assert "<stdin>:3" in strict.stderr
    replaced = nmt("translate", "--engine", "ctranslate2", "--path", ckpt, *BEAM4, "--errors", "replace", input=bad)
    assert replaced.exit_code == 0 and len(replaced.stdout.splitlines()) == 4


@ct2_installed
def test_automatic_export_is_cached_beside_the_checkpoint_and_remade_when_it_changes(run_dir, tmp_path):
    run = copy_of_run(run_dir, tmp_path / "run")
    ckpt = run / "checkpoint_best.pt"
    args = ("translate", "--engine", "ctranslate2", "--path", str(ckpt), *BEAM4[:-1])
    first = nmt(*args, input="the dog\nred ball\n")
    assert first.exit_code == 0 and "exporting" in first.stderr
    cache = run / "checkpoint_best.ctranslate2"
    model_time = (cache / "model.bin").stat().st_mtime_ns
    again = nmt(*args, input="the dog\nred ball\n")
    assert again.stdout == first.stdout and "exporting" not in again.stderr
    assert (cache / "model.bin").stat().st_mtime_ns == model_time  # reused
    reference = nmt("translate", "--path", str(ckpt), *BEAM4, input="the dog\nred ball\n")
    assert first.stdout == reference.stdout
    # Another model under the same name, its modification time put back: the contents decide.
    state = load_checkpoint(ckpt)
    stat = ckpt.stat()
    state["model"] = {k: v * 0.5 if k.endswith("fc2.weight") else v for k, v in state["model"].items()}
    save_checkpoint(state, ckpt)
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = nmt(*args, input="the dog\nred ball\n")
    assert changed.exit_code == 0 and "exporting" in changed.stderr
    assert changed.stdout == nmt("translate", "--path", str(ckpt), *BEAM4, input="the dog\nred ball\n").stdout
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no staging left behind


@ct2_installed
def test_the_automatic_export_is_remade_after_a_checkpoint_saved_over_it_while_it_was_made(run_dir, tmp_path,
                                                                                           monkeypatch):
    run = copy_of_run(run_dir, tmp_path / "run")
    ckpt = run / "checkpoint_best.pt"
    args = ("translate", "--engine", "ctranslate2", "--path", str(ckpt), *BEAM4[:-1])
    first_checkpoint = nmt("translate", "--path", str(ckpt), *BEAM4, input="the dog\nred ball\n").stdout
    newer = halved_checkpoint(ckpt, tmp_path / "newer.pt")
    saved_over_after_its_load(monkeypatch, ckpt, newer)
    raced = nmt(*args, input="the dog\nred ball\n")
    monkeypatch.undo()
    assert raced.exit_code == 0 and not newer.exists()
    assert raced.stdout == first_checkpoint  # the weights it loaded
    again = nmt(*args, input="the dog\nred ball\n")
    assert again.exit_code == 0 and "exporting" in again.stderr  # the cache was of the first checkpoint
    assert again.stdout == nmt("translate", "--path", str(ckpt), *BEAM4, input="the dog\nred ball\n").stdout
    assert again.stdout != first_checkpoint


@ct2_installed
def test_engine_refuses_by_name_what_ctranslate2_cannot_do(run_dir, tmp_path):
    ckpt = str(run_dir / "checkpoint_best.pt")
    for flags, named in ((("--lenpen-style", "gnmt", "--lenpen", "0.6"), "--lenpen-style gnmt"),
                         (("--unk-penalty", "1"), "--unk-penalty"),
                         (("--sampling", "--beam", "4"), "--beam 1"),
                         (("--workers", "2"), "--workers"),
                         (("--constraints", "ordered"), "--constraints needs --engine nmt"),
                         (("--print-alignment",), "--print-alignment needs --engine nmt"),
                         (("--score-reference",), "--score-reference needs --engine nmt")):
        result = nmt("translate", "--engine", "ctranslate2", "--path", ckpt, "--device", "cpu", *flags, input="the dog\n")
        assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1 and named in result.stderr
    ensemble = nmt("translate", "--engine", "ctranslate2", "--path", f"{ckpt}:{ckpt}", "--device", "cpu", input="x\n")
    assert ensemble.exit_code == 1 and "ensemble" in ensemble.stderr
    not_export = tmp_path / "empty"
    not_export.mkdir()
    result = nmt("translate", "--engine", "ctranslate2", "--path", str(not_export), "--device", "cpu", input="x\n")
    assert result.exit_code == 1 and result.stderr.startswith("error:")


@ct2_installed
def test_engine_checks_fairseqs_text_flags_as_nmt_does_and_refuses_use_ema(run_dir, tmp_path):
    exported = tmp_path / "ct2"
    assert nmt("export", "--format", "ctranslate2", str(run_dir), str(exported)).exit_code == 0
    codes = tmp_path / "codes.txt"
    codes.write_text("w o\n")
    ckpt = str(run_dir / "checkpoint_best.pt")
    plain = nmt("translate", "--path", ckpt, *BEAM4, input="the dog\n")
    for path in (str(exported), ckpt):
        def translate(*flags: str, engine: str = "ctranslate2"):
            return nmt("translate", "--engine", engine, "--path", path if engine == "ctranslate2" else ckpt, *BEAM4,
                       *flags, input="the dog\n")

        for flags in (("-s", "fr"), ("-t", "fr")):  # the very line of nmt's engine
            ours, theirs = translate(*flags), translate(*flags, engine="nmt")
            assert ours.exit_code == theirs.exit_code == 1 and ours.stderr == theirs.stderr, (flags, ours.stderr)
        for flags, named in ((("--tokenizer", "none"), "--tokenizer none: "), (("--bpe", "subword_nmt"), "--bpe subword_nmt: "),
                             (("--bpe-codes", str(codes)), f"--bpe-codes {codes}: not the BPE codes"),
                             (("--use-ema",), "--use-ema needs --engine nmt")):
            result = translate(*flags)
            assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, (flags, result.stderr)
            assert result.stderr.startswith("error: ") and named in result.stderr, (flags, result.stderr)
        agreeing = translate("-s", "en", "-t", "de", "--tokenizer", "moses", "--bpe", "sentencepiece")
        assert agreeing.exit_code == 0 and agreeing.stdout == plain.stdout


def what_stands_at(path: Path) -> list:
    """The entries at and under `path`: a link's target, a file's bytes, a directory's name."""
    if path.is_symlink():
        return [(path.name, os.readlink(path))]
    entries = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    return [(str(p), p.read_bytes() if p.is_file() else None) for p in entries]


@ct2_installed
def test_automatic_export_replaces_only_its_own_cache(run_dir, tmp_path):
    run = copy_of_run(run_dir, tmp_path / "run")
    ckpt, cache = run / "checkpoint_best.pt", run / "checkpoint_best.ctranslate2"
    args = ("translate", "--engine", "ctranslate2", "--path", str(ckpt), *BEAM4)

    def users_directory():
        cache.mkdir()
        (cache / "notes.txt").write_text("mine\n")

    def quantized_export():  # an export of one's own there: another setting than the cache's
        assert nmt("export", "--format", "ctranslate2", "--quantization", "int8", str(ckpt), str(cache)).exit_code == 0

    def damaged_record():
        users_directory()
        (cache / "nmt_export.json").write_text("not JSON\n")

    makers = (users_directory, quantized_export, damaged_record, lambda: cache.write_text("mine\n"),
              lambda: cache.symlink_to(tmp_path / "elsewhere"))
    for make in makers:
        make()
        before = what_stands_at(cache)
        result = nmt(*args, input="the dog\n")
        assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"error: {cache} ") and "move it" in result.stderr and result.stdout == ""
        assert what_stands_at(cache) == before  # untouched
        assert not [p for p in run.iterdir() if p.name.startswith(".")]  # nothing left behind
        if cache.is_dir() and not cache.is_symlink():
            shutil.rmtree(cache)
        else:
            cache.unlink()
    cache.mkdir()  # an empty directory holds nothing to lose
    made = nmt(*args, input="the dog\n")
    assert made.exit_code == 0 and made.stdout == nmt("translate", "--path", str(ckpt), *BEAM4, input="the dog\n").stdout
    assert (cache / "nmt_export.json").is_file() and not [p for p in run.iterdir() if p.name.startswith(".")]


def test_missing_ctranslate2_is_one_line_naming_the_extra(run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    exported = nmt("export", "--format", "ctranslate2", str(run_dir), str(tmp_path / "ct2"))
    translated = nmt("translate", "--engine", "ctranslate2", "--path", str(tmp_path / "ct2x"), "--device", "cpu",
                     input="the dog\n")
    for result in (exported, translated):
        assert result.exit_code == 1
        assert result.stderr.strip().splitlines() == [result.stderr.strip()]
        assert "pip install 'nmt-cli[ctranslate2]'" in result.stderr
    assert not (tmp_path / "ct2").exists()


def test_export_refuses_a_directory_holding_other_files_and_skips_the_same_export(run_dir, tmp_path):
    out = tmp_path / "fs"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    refused = nmt("export", "--format", "fairseq", str(run_dir), str(out))
    assert refused.exit_code == 1 and "--force" in refused.stderr and (out / "notes.txt").exists()
    assert nmt("export", "--format", "fairseq", str(run_dir), str(out), "--force").exit_code == 0
    again = nmt("export", "--format", "fairseq", str(run_dir), str(out))
    assert again.exit_code == 0 and "nothing written" in again.stderr
    quantized = nmt("export", "--format", "fairseq", "--quantization", "int8", str(run_dir), str(tmp_path / "q"))
    assert quantized.exit_code == 1 and "--quantization needs --format ctranslate2" in quantized.stderr


def saved_over_after_its_load(monkeypatch, checkpoint: Path, newer: Path) -> None:
    """Training's atomic save of `newer` over `checkpoint`, done the moment a reader of
    `checkpoint` has loaded it (and before anything else of that reader runs)."""
    real_load = torch.load

    def load_then_save_over(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        if newer.exists():
            os.replace(newer, checkpoint)
        return loaded

    monkeypatch.setattr(torch, "load", load_then_save_over)


def halved_checkpoint(checkpoint: Path, out: Path) -> Path:
    """`checkpoint` with other weights (fc2 halved), saved at `out`."""
    state = load_checkpoint(checkpoint)
    state["model"] = {k: v * 0.5 if k.endswith("fc2.weight") else v for k, v in state["model"].items()}
    save_checkpoint(state, out)
    return out


def test_an_export_records_the_fingerprint_of_the_checkpoint_whose_weights_it_holds(run_dir, tmp_path, monkeypatch):
    run = copy_of_run(run_dir, tmp_path / "run")
    ckpt = run / "checkpoint_best.pt"
    newer = halved_checkpoint(ckpt, tmp_path / "newer.pt")
    saved_over_after_its_load(monkeypatch, ckpt, newer)
    raced = nmt("export", "--format", "fairseq", str(ckpt), str(tmp_path / "raced"))
    monkeypatch.undo()
    assert raced.exit_code == 0 and not newer.exists()  # saved over while the export ran
    # The truth: the same first checkpoint, exported where nothing replaces it.
    calm = nmt("export", "--format", "fairseq", str(run_dir / "checkpoint_best.pt"), str(tmp_path / "calm"))
    assert calm.exit_code == 0
    for name in ("checkpoint.pt", "nmt_export.fingerprint"):
        assert (tmp_path / "raced" / name).read_bytes() == (tmp_path / "calm" / name).read_bytes(), name
    # The checkpoint now at the path is another: never taken for the export already there.
    again = nmt("export", "--format", "fairseq", str(ckpt), str(tmp_path / "raced"))
    assert again.exit_code == 1 and "--force" in again.stderr


def test_a_second_export_into_the_out_another_is_building_is_refused_and_never_replaces_it(run_dir, tmp_path,
                                                                                          monkeypatch):
    other = copy_of_run(run_dir, tmp_path / "other")
    halved_checkpoint(other / "checkpoint_best.pt", other / "checkpoint_best.pt")
    out = tmp_path / "out"
    from nmt_cli.interop.fairseq import export as fairseq_export

    real_write, started_meanwhile = fairseq_export.write_fairseq_model, {}

    def write_while_another_export_starts(source, directory):
        if not started_meanwhile:  # another process, as a user's second command would be
            started_meanwhile["result"] = subprocess.run(
                [sys.executable, "-m", "nmt_cli", "export", "--format", "fairseq", str(other), str(out)],
                cwd=REPO, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
        real_write(source, directory)

    monkeypatch.setattr(fairseq_export, "write_fairseq_model", write_while_another_export_starts)
    first = nmt("export", "--format", "fairseq", str(run_dir), str(out))
    monkeypatch.undo()
    second = started_meanwhile["result"]
    assert first.exit_code == 0, first.output
    assert second.returncode == 1 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "in use by another nmt process" in second.stderr and str(out) in second.stderr
    assert nmt("export", "--format", "fairseq", str(run_dir), str(tmp_path / "truth")).exit_code == 0
    exported = what_stands_at(out)
    assert [(Path(p).name, data) for p, data in exported[1:]] == [
        (Path(p).name, data) for p, data in what_stands_at(tmp_path / "truth")[1:]]  # the first's export, whole
    # Started after the first ended, the other export sees the first's and asks for --force.
    after = nmt("export", "--format", "fairseq", str(other), str(out))
    assert after.exit_code == 1 and "--force" in after.stderr and what_stands_at(out) == exported
    same = nmt("export", "--format", "fairseq", str(run_dir), str(out))
    assert same.exit_code == 0 and "nothing written" in same.stderr and what_stands_at(out) == exported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out", "truth"]  # no lock or staging left


# --- fairseq ------------------------------------------------------------------------------


def test_fairseq_export_then_import_is_the_identity_on_weights(run_dir, tmp_path):
    assert nmt("export", "--format", "fairseq", str(run_dir), str(tmp_path / "fs")).exit_code == 0
    imported = CliRunner().invoke(main, ["import-fairseq", str(tmp_path / "fs" / "checkpoint.pt"), "--dict-dir",
                                         str(tmp_path / "fs"), "--out", str(tmp_path / "back")], catch_exceptions=False)
    assert imported.exit_code == 0, imported.output
    original, back = load_checkpoint(run_dir / "checkpoint_best.pt"), load_checkpoint(tmp_path / "back" / "checkpoint.pt")
    assert back["model"].keys() == original["model"].keys()
    for key, value in original["model"].items():
        assert torch.equal(back["model"][key], value), key
    assert back["model_config"] == original["model_config"]
    assert back["src_dict"] == original["src_dict"] and back["tgt_dict"] == original["tgt_dict"]
    assert back["num_updates"] == original["num_updates"]


def test_fairseq_interactive_on_the_export_gives_nmts_hypotheses(run_dir, fairseq_python, tmp_path):
    out = tmp_path / "fs"
    assert nmt("export", "--format", "fairseq", str(run_dir), str(out)).exit_code == 0
    text = sentences_text(200)
    pipeline = TextPipeline.from_data_bin(run_dir, "en")
    (tmp_path / "src.bpe").write_text("".join(" ".join(pipeline.encode(line)) + "\n" for line in text.splitlines()),
                                      encoding="utf-8")
    ours = jsonl(nmt("translate", "--path", str(run_dir / "checkpoint_best.pt"), *BEAM4, "--output-format", "jsonl",
                     input=text))
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # fairseq 0.12 with torch >= 2.6
    fairseq = subprocess.run(
        [str(fairseq_python), "-m", "fairseq_cli.interactive", str(out), "--path", str(out / "checkpoint.pt"),
         "-s", "en", "-t", "de", "--beam", "4", "--max-len-a", "1", "--max-len-b", "5", "--input", str(tmp_path / "src.bpe"),
         "--batch-size", "64", "--buffer-size", "1000", "--cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert fairseq.returncode == 0, fairseq.stderr[-2000:]
    hypotheses = {}
    for line in fairseq.stdout.splitlines():
        if line.startswith("H-"):
            number, score, pieces = line.split("\t")
            hypotheses[int(number[2:])] = (float(score), pieces)
    assert len(hypotheses) == 200
    same = sum(" ".join(r["tokens"][:-1]) == hypotheses[i][1] for i, r in enumerate(ours))
    assert same >= 198, f"{same} of 200"
    for i, r in enumerate(ours):
        if " ".join(r["tokens"][:-1]) == hypotheses[i][1]:  # fairseq prints scores in base 2
            assert hypotheses[i][0] == pytest.approx(r["score"] / 0.6931471805599453, abs=1e-3)


@ct2_installed
def test_ctranslate2_engine_with_a_maximum_output_length_of_0_gives_what_nmt_gives(run_dir, tmp_path):
    """Empty outputs (</s> alone, with its score), where CTranslate2 itself refuses a maximum of 0."""
    text = "the dog runs\n\na red ball\n"
    flags = ("--max-len-a", "0", "--max-len-b", "0", "--min-len", "0", "--device", "cpu", "--threads", "1", "--quiet")
    path = str(run_dir / "checkpoint_best.pt")
    for fmt in ("text", "jsonl"):
        ours = nmt("translate", "--path", path, *flags, "--output-format", fmt, input=text)
        theirs = nmt("translate", "--engine", "ctranslate2", "--path", path, *flags, "--output-format", fmt, input=text)
        assert theirs.exit_code == 0, theirs.output
        if fmt == "text":
            assert theirs.output == ours.output == "\n\n\n"
            continue
        for a, b in zip(jsonl(ours), jsonl(theirs), strict=True):
            assert (b["ids"], b["hyp"]) == (a["ids"], a["hyp"])
            assert b["positional_scores"] == pytest.approx(a["positional_scores"], abs=1e-4)
            assert (b["score"] is None) == (a["score"] is None)
            assert b["score"] is None or b["score"] == pytest.approx(a["score"], abs=1e-4)


def test_an_out_that_is_a_link_is_exported_into_its_target(run_dir, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "stale.txt").write_text("old\n")
    (tmp_path / "out").symlink_to("real")
    result = nmt("export", "--format", "fairseq", str(run_dir), str(tmp_path / "out"), "--force")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out").is_symlink() and (tmp_path / "real" / "checkpoint.pt").is_file()
    assert not (tmp_path / "real" / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "real"]


def test_a_full_disk_during_a_fairseq_export_is_one_line(run_dir, tmp_path):
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, hard))  # `ulimit -f 50`: smaller than the checkpoint
    try:
        result = CliRunner().invoke(main, ["export", "--format", "fairseq", str(run_dir), str(tmp_path / "fs")])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert result.exit_code == 1 and not isinstance(result.exception, Exception), result.exception  # no traceback
    assert result.stderr.strip() == f"error: writing {tmp_path / 'fs'} failed: File too large", result.stderr
    assert list(tmp_path.iterdir()) == []
