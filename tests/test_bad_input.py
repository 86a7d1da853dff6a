"""The bad-input battery: every command, fed broken, odd or hostile input, from one table.

Each case builds its input in a fresh directory and names the exit status and the
fragments that the single `error: ...` line must hold (the file, and the line where
it applies). No case may end in a traceback. Inputs that are odd but valid (CRLF,
BOMs, huge lines, combining characters, mixed scripts, NUL bytes in text to
translate) have a documented repair instead, checked below the table: `translate`,
`apply-bpe` and `score` keep exactly one output line per input line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from databin_utils import reversal_data_bin
from fault_utils import assert_clean_exit, assert_one_error, tiny_checkpoint_state, tiny_run_dir

from nmt_cli.checkpoints.format import load_checkpoint
from nmt_cli.cli import main
from nmt_cli.data.dictionary import SPECIALS, Dictionary
from nmt_cli.errors import NmtError
from nmt_cli.files import refuse_overwriting_inputs

TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--device", "cpu", "--max-update", "1"]
LONG_LINE = "w1" * 50_000  # 10^5 characters, no spaces
COMBINING = "e\u0301te\u0301 w1 n\u0303 a\u0308\u0308\u0308"  # decomposed accents, stacked diacritics
MIXED = "w1 привет 世界 שלום مرحبا w2 καλημέρα 🙂"


@dataclass(frozen=True)
class Case:
    command: str
    name: str
    build: Callable[["Workspace"], list]  # writes the inputs, returns the command's arguments
    fragments: tuple[str, ...]  # all must appear in the one error line
    stdin: bytes = b""


class Workspace:
    """A fresh directory with a tiny data-bin and a run directory to break copies of."""

    def __init__(self, root: Path, data_bin: Path, run: Path) -> None:
        self.root, self.data_bin, self.run = root, data_bin, run
        self.checkpoint = run / "checkpoint_best.pt"

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.root / name
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        return path

    def data_bin_copy(self) -> Path:
        copy = self.root / "bin"
        shutil.copytree(self.data_bin, copy)
        return copy

    def run_copy(self) -> Path:
        copy = self.root / "run"
        shutil.copytree(self.run, copy)
        return copy

    def checkpoint_with(self, name: str, **changes) -> Path:
        state = load_checkpoint(self.checkpoint)
        state.update(changes)
        path = self.root / name
        torch.save(state, path)
        return path

    def bpe_model(self) -> Path:
        text = self.file("bpe-train.txt", "".join(f"w{i} w{i + 1} w{i + 2}\n" for i in range(14)))
        assert nmt(["learn-bpe", "--input", text, "--vocab-size", "20", "--model-prefix", self.root / "bpe"]).exit_code == 0
        return self.root / "bpe.model"


def nmt(args: list, stdin: bytes | str = b""):
    result = CliRunner().invoke(main, [str(a) for a in args], input=stdin)
    assert_clean_exit(result)
    return result


# --- builders ---------------------------------------------------------------------------------


def raw_corpus(ws: Workspace, train_en: list[str] | None = None) -> Path:
    lines = [f"w{i % 16} w{(i * 3) % 16} w{(i * 5) % 16}" for i in range(60)]
    ws.file("train.en", "".join(l + "\n" for l in (train_en or lines)))
    ws.file("train.de", "".join(l[::-1] + "\n" for l in lines))
    return ws.root / "train"


def preprocess(ws: Workspace, *extra) -> list:
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", raw_corpus(ws), "--destdir", ws.root / "out",
            "--joined-dictionary", "--bpe-size", "30", *extra]


def valid_with_nul(ws: Workspace) -> Path:
    ws.file("valid.en", "w1\nw2 \x00 w3\n")
    ws.file("valid.de", "w1\nw2\n")
    return ws.root / "valid"


def truncate(path: Path, keep: int) -> Path:
    path.write_bytes(path.read_bytes()[:keep])
    return path


def train(ws: Workspace, data_bin: Path, *extra) -> list:
    return ["train", data_bin, "--save-dir", ws.root / "save", *TINY, *extra]


def shrunken_dictionary(ws: Workspace) -> Path:
    """A data-bin whose source dictionary lacks symbols the binarized data uses."""
    copy = ws.data_bin_copy()
    Dictionary([f"w{i}" for i in range(3)]).save(copy / "dict.src.txt")
    return copy


def with_files_of(ws: Workspace, moves: dict[str, str]) -> Path:
    """A copy of the data-bin, its meta.json counting tokens as `nmt preprocess` does,
    in which file `a` then holds what file `moves[a]` held."""
    from nmt_cli.data.indexed import IndexedDataset

    copy = ws.data_bin_copy()
    meta = json.loads((copy / "meta.json").read_text())
    for split, entry in meta["counts"].items():
        entry["tokens"] = {lang: int(IndexedDataset(copy / f"{split}.src-tgt.{lang}").offsets[-1])
                           for lang in ("src", "tgt")}
    (copy / "meta.json").write_text(json.dumps(meta))
    contents = {name: (copy / other).read_bytes() for name, other in moves.items()}
    for name, content in contents.items():
        (copy / name).write_bytes(content)
    return copy


def meta_with(ws: Workspace, content: bytes) -> Path:
    copy = ws.data_bin_copy()
    (copy / "meta.json").write_bytes(content)
    return copy


def meta_of_format(ws: Workspace, version: int) -> Path:
    """A copy of the data-bin whose meta.json says another layout (a newer nmt's)."""
    copy = ws.data_bin_copy()
    meta = json.loads((copy / "meta.json").read_text(encoding="utf-8"))
    (copy / "meta.json").write_text(json.dumps({**meta, "format_version": version}), encoding="utf-8")
    return copy


def run_with_bpe_model(ws: Workspace, content: bytes) -> Path:
    """A copy of the run whose meta.json names a sentencepiece model holding `content`."""
    run = ws.run_copy()
    meta = json.loads((run / "meta.json").read_text(encoding="utf-8"))
    (run / "meta.json").write_text(json.dumps({**meta, "bpe": {"type": "sentencepiece", "model": "bpe.model"}}),
                                   encoding="utf-8")
    (run / "bpe.model").write_bytes(content)
    return run


def resume_from(ws: Workspace, state_changes: dict) -> list:
    """`nmt train` on a save dir whose checkpoint_last.pt is the tiny model, changed."""
    save = ws.root / "save"
    save.mkdir()
    state = tiny_checkpoint_state(ws.data_bin)
    state.update(state_changes)
    torch.save(state, save / "checkpoint_last.pt")
    return ["train", ws.data_bin, "--save-dir", save, *TINY, "--dropout", "0"]


def wider_weights(ws: Workspace) -> dict:
    return tiny_checkpoint_state(ws.data_bin, overrides={"encoder_ffn_embed_dim": 128})["model"]


def separate_dictionaries(ws: Workspace) -> Path:
    """A data-bin whose target dictionary has the source's size but other symbols."""
    copy = ws.data_bin_copy()
    source = Dictionary.load(copy / "dict.src.txt")
    Dictionary([f"x{symbol}" for symbol in source.symbols[len(SPECIALS):]]).save(copy / "dict.tgt.txt")
    return copy


def huge_checkpoint(ws: Workspace) -> Path:
    """The tiny checkpoint, its model_config claiming 10^8 encoder layers."""
    config = load_checkpoint(ws.checkpoint)["model_config"]
    return ws.checkpoint_with("huge.pt", model_config={**config, "encoder_layers": 10**8})


def fifo(ws: Workspace, name: str) -> Path:
    os.mkfifo(ws.root / name)
    return ws.root / name


def link_loop(ws: Workspace, name: str) -> Path:
    (ws.root / name).symlink_to(name)
    return ws.root / name


def translate(ws: Workspace, path: Path, *extra) -> list:
    return ["translate", "--path", path, "--device", "cpu", "--beam", "1", "--max-len-b", "3", *extra]


def plot(ws: Workspace, log: bytes) -> list:
    run = ws.root / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_bytes(log)
    return ["plot", run, "-o", ws.root / "curves.png"]


def score(ws: Workspace, ref: bytes, hyp: bytes) -> list:
    return ["score", "--ref", ws.file("ref.txt", ref), "--hyp", ws.file("hyp.txt", hyp)]


CASES = [
    # export
    Case("export", "missing checkpoint", lambda ws: ["export", ws.root / "nope.pt", ws.root / "out", "--format", "fairseq"],
         ("checkpoint not found", "nope.pt")),
    Case("export", "a directory without checkpoints", lambda ws: [
        "export", (ws.root / "empty").mkdir() or ws.root / "empty", ws.root / "out", "--format", "fairseq"],
         ("without checkpoint_best.pt or checkpoint_last.pt",)),
    Case("export", "not a checkpoint", lambda ws: [
        "export", ws.file("x.pt", b"not a checkpoint"), ws.root / "out", "--format", "ctranslate2"],
         ("not a readable nmt checkpoint", "x.pt")),
    Case("export", "a damaged BPE model beside the checkpoint", lambda ws: [
        "export", run_with_bpe_model(ws, b"\xff\xfe"), ws.root / "out", "--format", "fairseq"],
         ("not a sentencepiece model", "bpe.model")),
    # preprocess
    Case("preprocess", "srcdict with a bad line", lambda ws: preprocess(
        ws, "--bpe", "none", "--srcdict", ws.file("d.txt", "w1 5\nno-count-here\n")), ("bad dictionary line", "d.txt:2")),
    Case("preprocess", "srcdict not UTF-8", lambda ws: preprocess(ws, "--bpe", "none", "--srcdict", ws.file("d.txt", b"w1 5\n\xff 3\n")),
         ("not valid UTF-8", "d.txt")),
    Case("preprocess", "input is a directory", lambda ws: ["preprocess", "-s", "en", "-t", "de", "--trainpref",
         (ws.root / "dir").mkdir() or ws.root / "dir" / "x", "--destdir", ws.root / "out"], ("x.en",)),
    Case("preprocess", "a target-side limit that a joined dictionary would ignore", lambda ws: preprocess(
        ws, "--nwordssrc", "100", "--nwordstgt", "200"), ("--nwordstgt 200 would be ignored",)),
    Case("preprocess", "NUL bytes in a valid-split line", lambda ws: preprocess(ws, "--validpref", valid_with_nul(ws)),
         ("NUL byte", "valid.en:2")),
    # binarize
    Case("binarize", "invalid UTF-8", lambda ws: ["binarize", "--dict", ws.data_bin / "dict.src.txt", "--input",
         ws.file("in.txt", b"w1 w2\nw3 \xc3\x28\n"), "--output-prefix", ws.root / "o"], ("invalid UTF-8", "in.txt:2")),
    Case("binarize", "NUL byte", lambda ws: ["binarize", "--dict", ws.data_bin / "dict.src.txt", "--input",
         ws.file("in.txt", "w1\nw2\nw3\x00\n"), "--output-prefix", ws.root / "o"], ("NUL byte", "in.txt:3")),
    Case("binarize", "empty input", lambda ws: ["binarize", "--dict", ws.data_bin / "dict.src.txt", "--input",
         ws.file("in.txt", b""), "--output-prefix", ws.root / "o"], ("empty file", "in.txt")),
    Case("binarize", "dictionary with a bad line", lambda ws: ["binarize", "--dict", ws.file("d.txt", "w1 1\nw2 x\n"),
         "--input", ws.file("in.txt", "w1\n"), "--output-prefix", ws.root / "o"], ("bad dictionary line", "d.txt:2")),
    Case("binarize", "a checkpoint as dictionary", lambda ws: ["binarize", "--dict", ws.checkpoint,
         "--input", ws.file("in.txt", "w1\n"), "--output-prefix", ws.root / "o"], ("checkpoint_best.pt",)),
    # learn-bpe
    Case("learn-bpe", "invalid UTF-8", lambda ws: ["learn-bpe", "--input", ws.file("in.txt", b"w1 w2\nw3 \xff\n"),
         "--vocab-size", "10", "--model-prefix", ws.root / "m"], ("invalid UTF-8", "in.txt:2")),
    Case("learn-bpe", "--seed -1", lambda ws: ["learn-bpe", "--input", ws.file("in.txt", "w1 w2\n"), "--vocab-size", "10",
         "--model-prefix", ws.root / "m", "--seed", "-1"], ("--seed must be between 0 and",)),
    # apply-bpe
    Case("apply-bpe", "text file as model", lambda ws: ["apply-bpe", "--model", ws.file("m.model", "not a model\n"),
         "--input", ws.file("in.txt", "w1\n")], ("not a sentencepiece model", "m.model")),
    Case("apply-bpe", "invalid UTF-8 file", lambda ws: ["apply-bpe", "--model", ws.bpe_model(), "--input",
         ws.file("in.txt", b"w1\n\xe9t\xe9\n")], ("invalid UTF-8", "in.txt:2")),
    Case("apply-bpe", "invalid UTF-8 on stdin", lambda ws: ["apply-bpe", "--model", ws.bpe_model()],
         ("invalid UTF-8", "<stdin>:3"), stdin=b"w1\nw2\n\xff\n"),
    Case("apply-bpe", "NUL byte", lambda ws: ["apply-bpe", "--model", ws.bpe_model(), "--input",
         ws.file("in.txt", "w1\x00\n")], ("NUL byte", "in.txt:1")),
    Case("apply-bpe", "output is the input file", lambda ws: ["apply-bpe", "--model", ws.bpe_model(), "--input",
         ws.file("in.txt", "w1\n"), "--output", ws.root / "in.txt"], ("is the input", "in.txt")),
    # A line of more than 2^20 characters (its pieces would cost some 45 times that) is refused, not cut.
    Case("apply-bpe", "a line of more than 2^20 characters", lambda ws: ["apply-bpe", "--model", ws.bpe_model(),
         "--input", ws.file("in.txt", "w1\n" + "w2 " * 350_000 + "\n")],
         ("line of 1050000 characters, more than apply-bpe takes (1048576", "in.txt:2")),
    Case("apply-bpe", "full disk", lambda ws: ["apply-bpe", "--model", ws.bpe_model(), "--output", "/dev/full"],
         ("cannot write /dev/full", "No space left on device"), stdin=b"w1 w2\n" * 5000),
    # train
    Case("train", "--save-dir inside a file", lambda ws: ["train", ws.data_bin, "--save-dir", ws.file("f", "") / "save", *TINY],
         ("--save-dir", "f/save: a part of its path is a file")),
    Case("train", "truncated .bin", lambda ws: train(ws, (lambda d: truncate(d / "train.src-tgt.src.bin", 100) and d)(
        ws.data_bin_copy())), ("truncated or corrupt", "train.src-tgt.src.bin")),
    Case("train", "truncated .idx", lambda ws: train(ws, (lambda d: truncate(d / "valid.src-tgt.tgt.idx", 40) and d)(
        ws.data_bin_copy())), ("truncated or corrupt", "valid.src-tgt.tgt.idx")),
    Case("train", "text file as .idx", lambda ws: train(ws, (lambda d: (d / "train.src-tgt.tgt.idx").write_text(
        "hello\n") and d)(ws.data_bin_copy())), ("bad header", "train.src-tgt.tgt.idx")),
    Case("train", "train split replaced by valid", lambda ws: train(ws, with_files_of(ws, {
        f"train.src-tgt.{lang}.{ext}": f"valid.src-tgt.{lang}.{ext}" for lang in ("src", "tgt")
        for ext in ("bin", "idx")})), ("train.src-tgt.src.bin/.idx hold", "meta.json counted")),
    Case("train", "ids beyond the dictionary", lambda ws: train(ws, shrunken_dictionary(ws)),
         ("beyond the source dictionary", "train.src-tgt.src.bin")),
    Case("train", "meta.json not JSON", lambda ws: train(ws, meta_with(ws, b"{'python': True}")),
         ("meta.json: not JSON", ": column 2")),
    Case("train", "meta.json not UTF-8", lambda ws: train(ws, meta_with(ws, b'{"source_lang": "\xff"}')),
         ("meta.json: invalid UTF-8 (byte 17)",)),
    Case("train", "meta.json a list", lambda ws: train(ws, meta_with(ws, b"[1, 2]")), ("JSON object", "meta.json")),
    Case("train", "meta.json of another format", lambda ws: train(ws, meta_of_format(ws, 2)),
         ("meta.json has format_version 2; this version of nmt reads format_version 1",)),
    Case("train", "dictionary not UTF-8", lambda ws: train(ws, (lambda d: (d / "dict.tgt.txt").write_bytes(
        b"w1 1\n\xfe\xff 2\n") and d)(ws.data_bin_copy())), ("not valid UTF-8", "dict.tgt.txt")),
    Case("train", "resume: weights of another architecture", lambda ws: resume_from(ws, {"model": wider_weights(ws)}),
         ("checkpoint_last.pt", "not those of the architecture")),
    Case("train", "resume: model_config with unknown fields", lambda ws: resume_from(
        ws, {"model_config": {"encoder_layers": 2, "use_magic": True}}), ("checkpoint_last.pt", "use_magic")),
    Case("train", "finetune from a text file", lambda ws: train(ws, ws.data_bin, "--finetune-from",
         ws.file("notes.pt", "some notes\n")), ("not a readable nmt checkpoint", "notes.pt")),
    Case("train", "--lr nan", lambda ws: train(ws, ws.data_bin, "--lr", "nan"), ("--lr must be a finite number",)),
    Case("train", "--adam-eps nan", lambda ws: train(ws, ws.data_bin, "--adam-eps", "nan"), ("--adam-eps",)),
    Case("train", "--max-time nan", lambda ws: train(ws, ws.data_bin, "--max-time", "nan"), ("--max-time",)),
    Case("train", "--seed -1", lambda ws: train(ws, ws.data_bin, "--seed", "-1"), ("--seed must be between 0 and",)),
    Case("train", "--seed 2**64", lambda ws: train(ws, ws.data_bin, "--seed", str(2**64)), ("--seed must be between 0 and",)),
    Case("train", "--max-target-positions -1", lambda ws: train(ws, ws.data_bin, "--max-target-positions", "-1"),
         ("--max-target-positions must be >= 1",)),
    Case("train", "--share-all-embeddings on separate dictionaries", lambda ws: train(
        ws, separate_dictionaries(ws), "--share-all-embeddings"), ("--share-all-embeddings needs one joined dictionary",)),
    Case("train", "a model too big for memory", lambda ws: train(ws, ws.data_bin, "--encoder-ffn-embed-dim", "10000000000"),
         ("parameters: its float32 weights alone need",)),
    Case("train", "10^8 layers", lambda ws: train(ws, ws.data_bin, "--encoder-layers", "100000000"),
         ("parameters: its float32 weights alone need",)),
    Case("train", "a dimension whose size overflows torch", lambda ws: train(
        ws, ws.data_bin, "--encoder-embed-dim", "99999999999998"), ("parameters: its float32 weights alone need",)),
    Case("train", "sinusoids for 10^12 positions", lambda ws: train(ws, ws.data_bin, "--max-source-positions", str(10**12)),
         ("sinusoidal position tables", "--max-source-positions 1000000000000")),
    Case("train", "--eval-bleu-detok-args a JSON list", lambda ws: train(ws, ws.data_bin, "--eval-bleu",
         "--eval-bleu-detok-args", "[1]"), ("--eval-bleu-detok-args must be a JSON object",)),
    # translate
    Case("translate", "-o inside a file", lambda ws: translate(ws, ws.checkpoint, "-o", ws.file("f", "") / "out"),
         ("cannot write", "f/out: Not a directory"), stdin=b"w1\n"),
    Case("translate", "text file as checkpoint", lambda ws: translate(ws, ws.file("notes.txt", "hello\n")),
         ("not a readable nmt checkpoint", "notes.txt"), stdin=b"w1\n"),
    Case("translate", "truncated checkpoint", lambda ws: translate(ws, truncate(ws.run_copy() / "checkpoint_best.pt", 3000)),
         ("truncated or corrupt", "checkpoint_best.pt"), stdin=b"w1\n"),
    Case("translate", "weights of another architecture", lambda ws: translate(
        ws, ws.checkpoint_with("other.pt", model=wider_weights(ws)), "--data-bin", ws.run),
         ("other.pt", "not those of the architecture"), stdin=b"w1\n"),
    Case("translate", "model_config with unknown fields", lambda ws: translate(
        ws, ws.checkpoint_with("odd.pt", model_config={"layers": 2}), "--data-bin", ws.run), ("odd.pt", "layers"),
         stdin=b"w1\n"),
    Case("translate", "model_config of a model too big for memory", lambda ws: translate(
        ws, huge_checkpoint(ws), "--data-bin", ws.run), ("huge.pt", "parameters: its float32 weights alone need"),
         stdin=b"w1\n"),
    Case("translate", "stored dictionary without specials", lambda ws: translate(
        ws, ws.checkpoint_with("nospecials.pt", src_dict=[f"w{i}" for i in range(24)]), "--data-bin", ws.run),
         ("nospecials.pt",), stdin=b"w1\n"),
    Case("translate", "input is a directory", lambda ws: translate(ws, ws.checkpoint, "-i", ws.root),
         ("cannot read",)),
    Case("translate", "data-bin meta.json corrupt", lambda ws: translate(ws, ws.checkpoint, "--data-bin",
         meta_with(ws, b"\x00\x01")), ("meta.json",), stdin=b"w1\n"),
    Case("translate", "data-bin dictionary with a bad line", lambda ws: translate(ws, ws.checkpoint, "--data-bin",
         (lambda d: (d / "dict.src.txt").write_text("w1 1\nw2\n") and d)(ws.data_bin_copy())),
         ("bad dictionary line", "dict.src.txt:2"), stdin=b"w1\n"),
    Case("translate", "CUDA graphs on the CPU", lambda ws: translate(ws, ws.checkpoint, "--cuda-graphs"),
         ("--cuda-graphs needs --device cuda",), stdin=b"w1\n"),
    Case("translate", "ids of another dictionary", lambda ws: translate(ws, ws.checkpoint, "--input-format", "ids"),
         ("<stdin>:2", "outside the source dictionary"), stdin=b"4 5\n4 100000000000000000000\n"),
    Case("translate", "output is the input file", lambda ws: translate(ws, ws.checkpoint, "-i", ws.file("in.txt", "w1\n"),
         "-o", ws.root / "." / "in.txt"), ("is the input", "in.txt")),
    Case("translate", "output is a link to the input file", lambda ws: translate(
        ws, ws.checkpoint, "-i", ws.file("in.txt", "w1\n"), "-o", (ws.root / "out.txt").symlink_to("in.txt") or ws.root / "out.txt"),
         ("is the input", "in.txt")),
    Case("translate", "full disk", lambda ws: translate(ws, ws.checkpoint, "-o", "/dev/full"),
         ("cannot write /dev/full", "No space left on device"), stdin=b"w1\n" * 3000),
    Case("translate", "--max-len-a nan", lambda ws: translate(ws, ws.checkpoint, "--max-len-a", "nan"),
         ("--max-len-a must be a finite number",), stdin=b"w1\n"),
    Case("translate", "--unk-penalty -inf", lambda ws: translate(ws, ws.checkpoint, "--unk-penalty", "-inf"),
         ("--unk-penalty must be a finite number",), stdin=b"w1\n"),
    Case("translate", "--threads 0", lambda ws: translate(ws, ws.checkpoint, "--threads", "0"),
         ("--threads must be >= 1 (got 0)",), stdin=b"w1\n"),
    Case("translate", "--use-ema with --engine ctranslate2", lambda ws: translate(
        ws, ws.checkpoint, "--engine", "ctranslate2", "--use-ema"), ("--use-ema needs --engine nmt",), stdin=b"w1\n"),
    Case("translate", "a checkpoint name too long for the file system", lambda ws: translate(ws, "x" * 300 + ".pt"),
         ("File name too long",), stdin=b"w1\n"),
    # generate
    Case("generate", "a split the data-bin lacks", lambda ws: ["generate", ws.data_bin, "--path", ws.checkpoint, "--cpu",
         "--gen-subset", "test"], ("no 'test' split", "test.src-tgt.src.bin/.idx not found")),
    Case("generate", "a truncated fairseq index", lambda ws: ["generate", (lambda d: (d / "valid.src-tgt.src.idx").write_bytes(
        b"MMIDIDX\x00\x00\x01\x00") and d)(ws.data_bin_copy()), "--path", ws.checkpoint, "--cpu", "--gen-subset", "valid"],
         ("fairseq index file is truncated", "valid.src-tgt.src.idx")),
    Case("generate", "soft alignments of scored references", lambda ws: ["generate", ws.data_bin, "--path",
         ws.checkpoint, "--cpu", "--gen-subset", "valid", "--score-reference", "--print-alignment", "soft"],
         ("--print-alignment soft with --score-reference",)),
    # score
    Case("score", "NUL bytes in the hypotheses", lambda ws: score(ws, b"a b\nc d\n", b"a b\nc \x00 d\n"),
         ("hyp.txt:2",)),
    # sacreBLEU's n-grams of a 2^20-character line would cost gigabytes: refused, not cut.
    Case("score", "a hypothesis of more than 2^20 characters", lambda ws: score(ws, b"a b\nc d\n",
         b"a b\n" + b"c " * 600_000 + b"\n"), ("line of 1199999 characters, more than score takes (1048576", "hyp.txt:2")),
    Case("score", "invalid UTF-8 in the reference", lambda ws: score(ws, b"a b\n\xc0\xaf\n", b"a b\nc d\n"),
         ("invalid UTF-8", "ref.txt:2")),
    Case("score", "a --tokenize that needs packages not installed", lambda ws: score(ws, b"a\n", b"a\n") + [
        "--tokenize", "ko-mecab"], ("--tokenize ko-mecab is not available",)),
    Case("score", "reference is a directory", lambda ws: ["score", "--ref", ws.root, "--hyp", ws.file("h.txt", "a\n")],
         ("not a regular file",)),
    # average
    Case("average", "truncated checkpoint", lambda ws: ["average", "--inputs", ws.checkpoint, truncate(
        ws.run_copy() / "checkpoint_best.pt", 2000), "--output", ws.root / "avg.pt"], ("truncated or corrupt", "run/checkpoint_best.pt")),
    Case("average", "weights of another architecture", lambda ws: ["average", "--inputs", ws.checkpoint,
         ws.checkpoint_with("other.pt", model=wider_weights(ws)), "--output", ws.root / "avg.pt"], ("other.pt",)),
    Case("average", "a checkpoint that is a plain list", lambda ws: ["average", "--inputs", (lambda p: torch.save(
        [1, 2], p) or p)(ws.root / "list.pt"), "--output", ws.root / "avg.pt"], ("no format_version", "list.pt")),
    Case("average", "the same checkpoint twice", lambda ws: ["average", "--inputs", ws.checkpoint, ws.run / "." /
         "checkpoint_best.pt", "--output", ws.root / "avg.pt"], ("more than once", "checkpoint_best.pt")),
    Case("average", "output is not a regular file", lambda ws: ["average", "--inputs", ws.checkpoint, ws.checkpoint_with("b.pt"),
         "--output", fifo(ws, "fifo.pt")], ("fifo.pt", "not a regular file")),
    Case("average", "output under a file", lambda ws: ["average", "--inputs", ws.checkpoint, ws.checkpoint_with("b.pt"),
         "--output", ws.file("afile", "x\n") / "avg.pt"], ("afile/avg.pt", "a part of its directory is a file")),
    Case("average", "a loop of links as input", lambda ws: ["average", "--inputs", link_loop(ws, "loop.pt"), ws.checkpoint,
         "--output", ws.root / "avg.pt"], ("loop.pt",)),
    # plot
    Case("plot", "invalid UTF-8 in a log line", lambda ws: plot(ws, b'{"type": "train", "update": 1, "loss": 2.0}\n{"type": "\xc0"}\n'),
         ("invalid UTF-8", "train_log.jsonl:2")),
    Case("plot", "a log cut in the middle of a line", lambda ws: plot(ws, b'{"type": "train", "update": 1, "loss": 2.0}\n{"type": "tr'),
         ("train_log.jsonl:2", "not JSON")),
    Case("plot", "a run directory without a log", lambda ws: ["plot", ws.data_bin, "-o", ws.root / "c.png"],
         ("no training log", "bin/train_log.jsonl")),
    Case("plot", "an infinite loss", lambda ws: plot(ws, b'{"type": "valid", "update": 3, "loss": Infinity}\n'),
         ("train_log.jsonl:1", "'loss' is inf")),
    Case("plot", "losses whose range leaves float64's", lambda ws: plot(
        ws, b'{"type": "train", "update": 1, "loss": -1e308}\n{"type": "train", "update": 2, "loss": 1e308}\n'),
         ("train_log.jsonl:1", "beyond float32's range")),
    # info
    Case("info", "truncated checkpoint", lambda ws: ["info", "--path", truncate(ws.run_copy() / "checkpoint_best.pt", 500)],
         ("truncated or corrupt", "checkpoint_best.pt")),
    Case("info", "directory as checkpoint", lambda ws: ["info", "--path", ws.run], ("is a directory, not a checkpoint",)),
    Case("info", "model_config with unknown fields", lambda ws: ["info", "--path", ws.checkpoint_with(
        "odd.pt", model_config={"heads": 3})], ("odd.pt", "heads")),
    Case("info", "model_config with a value of the wrong type", lambda ws: ["info", "--path", ws.checkpoint_with(
        "odd.pt", model_config={**load_checkpoint(ws.checkpoint)["model_config"], "encoder_layers": "two"})],
         ("odd.pt", "encoder_layers")),
    Case("info", "a dimension of 161 digits", lambda ws: ["info", "--arch", "transformer_tiny", "--encoder-embed-dim",
         str(10**160)], ("--encoder-embed-dim must be below 2^63 (got 161 digits)",)),
    Case("info", "a dimension too small for sinusoids", lambda ws: ["info", "--arch", "transformer_tiny",
         "--decoder-embed-dim", "2"], ("--decoder-embed-dim 2 is too small for sinusoidal positions",)),
    Case("info", "model_config of a model too big for memory", lambda ws: ["info", "--path", huge_checkpoint(ws)],
         ("huge.pt", "parameters: its float32 weights alone need")),
    # serve (each refused before it listens)
    Case("serve", "a non-loopback host without a key", lambda ws: ["serve", "--path", ws.run, "--host", "0.0.0.0"],
         ("--host 0.0.0.0 is not a loopback address", "--api-key")),
    Case("serve", "truncated checkpoint", lambda ws: ["serve", "--path", truncate(ws.run_copy() / "checkpoint_best.pt", 3000)],
         ("truncated or corrupt", "checkpoint_best.pt")),
    Case("serve", "a directory without checkpoints", lambda ws: ["serve", "--path", ws.root],
         ("without checkpoint_best.pt or checkpoint_last.pt",)),
    Case("serve", "--threads -1", lambda ws: ["serve", "--path", ws.run, "--threads", "-1"],
         ("--threads must be >= 1 (got -1)",)),
    Case("serve", "an empty key file", lambda ws: ["serve", "--path", ws.run, "--api-key-file", ws.file("key.txt", "\n")],
         ("--api-key-file", "key.txt", "the first line is empty")),
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("shared")
    data_bin = reversal_data_bin(root / "bin", train=40, valid=8)
    return data_bin, tiny_run_dir(data_bin, root / "run")


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("case", CASES, ids=[f"{c.command}: {c.name}" for c in CASES])
def test_bad_input_gets_one_error_line(case: Case, shared, tmp_path):
    ws = Workspace(tmp_path, *shared)
    args = case.build(ws)
    assert args[0] == case.command
    result = nmt(args, case.stdin)
    assert_one_error(result.exit_code, result.stderr, *case.fragments)


def test_a_model_of_10_8_layers_is_refused_at_once(shared, tmp_path):
    """The size is counted from the config: nothing is built, and nothing waits for it."""
    ws = Workspace(tmp_path, *shared)
    for args in (train(ws, ws.data_bin, "--encoder-layers", "100000000"), ["info", "--path", huge_checkpoint(ws)]):
        start = time.monotonic()
        result = nmt(args)
        assert time.monotonic() - start < 2
        assert_one_error(result.exit_code, result.stderr, "parameters: its float32 weights alone need")


def test_every_command_is_in_the_battery():
    assert {c.command for c in CASES} == {"preprocess", "binarize", "learn-bpe", "apply-bpe", "train", "translate",
                                          "generate", "score", "average", "info", "plot", "export", "serve"}


# --- documented repairs: odd but valid input -----------------------------------------------------

ODD_LINES = {
    "10^5 characters": LONG_LINE,
    "10^5 characters of words": ("w1 " * 33_334)[:100_000],
    "combining characters": COMBINING,
    "NFC and NFD of one word": unicodedata.normalize("NFC", COMBINING) + " " + COMBINING,
    "mixed scripts": MIXED,
    "NUL byte": "w1 \x00 w2",
    "lone carriage return": "w1\rw2",
    "unicode line separators": "w1\u2028w2\u2029w3\x85w4",
    "only spaces": "   ",
    "empty": "",
}


def odd_input(crlf: bool, bom: bool) -> bytes:
    newline = "\r\n" if crlf else "\n"
    text = "".join(line + newline for line in ODD_LINES.values())
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


@pytest.mark.parametrize("crlf, bom", [(False, False), (True, True)])
def test_translate_keeps_one_output_line_per_input_line(shared, crlf, bom):
    data_bin, run = shared
    result = nmt(["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu", "--beam", "2", "--max-len-b",
                  "3", "--buffer-size", "3", "--quiet"], odd_input(crlf, bom))
    assert result.exit_code == 0, result.output
    outputs = result.stdout.split("\n")
    assert outputs[-1] == "" and len(outputs) - 1 == len(ODD_LINES), outputs
    empty_at = list(ODD_LINES).index("empty")
    assert outputs[empty_at] == "" and all("\r" not in line for line in outputs)
    # The 33k-word line is cut to the model's positions, with a warning naming it.
    assert "truncated" in result.stderr and "<stdin>:2" in result.stderr, result.stderr


def test_translate_crlf_and_bom_give_the_same_output_as_plain_lf(shared):
    data_bin, run = shared
    args = ["translate", "--path", run / "checkpoint_best.pt", "--device", "cpu", "--beam", "2", "--max-len-b", "3",
            "--quiet"]
    assert nmt(args, odd_input(False, False)).stdout == nmt(args, odd_input(True, True)).stdout


def test_apply_bpe_keeps_one_output_line_per_input_line(tmp_path, shared):
    ws = Workspace(tmp_path, *shared)
    model = ws.bpe_model()
    lines = [line for name, line in ODD_LINES.items() if name != "NUL byte"]  # NUL is refused above
    result = nmt(["apply-bpe", "--model", model], "".join(l + "\r\n" for l in lines).encode())
    assert result.exit_code == 0, result.output
    out = result.stdout.split("\n")
    assert len(out) - 1 == len(lines) and out[lines.index("")] == ""
    decoded = nmt(["apply-bpe", "--model", model, "--decode"], result.stdout)
    assert decoded.stdout.split("\n")[0] == LONG_LINE  # BPE round-trips the 10^5-character line


def test_apply_bpe_round_trip_keeps_tabs_and_no_break_spaces(tmp_path, shared):
    """A tab or a no-break space is a piece of its own: undoing BPE must not take it for a separator."""
    ws = Workspace(tmp_path, *shared)
    model = ws.bpe_model()
    lines = ["w1\tw2 w3", "w4\u00a0w5", "w6 \u3000 w7", ""]
    pieces = nmt(["apply-bpe", "--model", model], "".join(l + "\n" for l in lines))
    assert pieces.exit_code == 0, pieces.output
    decoded = nmt(["apply-bpe", "--model", model, "--decode"], pieces.stdout)
    assert decoded.exit_code == 0 and decoded.stdout.split("\n")[:-1] == lines


def test_score_ignores_crlf_and_bom_and_takes_huge_lines(tmp_path):
    ref = ["the cat sat", LONG_LINE, MIXED, COMBINING]
    hyp = ["the cat sat down", LONG_LINE, MIXED, COMBINING]
    plain = ["score", "--ref", tmp_path / "ref.txt", "--hyp", tmp_path / "hyp.txt", "--metrics", "bleu,chrf"]
    (tmp_path / "ref.txt").write_text("".join(l + "\n" for l in ref), encoding="utf-8")
    (tmp_path / "hyp.txt").write_text("".join(l + "\n" for l in hyp), encoding="utf-8")
    lf = nmt(plain)
    (tmp_path / "ref.txt").write_bytes(b"\xef\xbb\xbf" + "".join(l + "\r\n" for l in ref).encode("utf-8"))
    (tmp_path / "hyp.txt").write_bytes("".join(l + "\r\n" for l in hyp).encode("utf-8"))
    crlf = nmt(plain)
    assert lf.exit_code == crlf.exit_code == 0, lf.output + crlf.output
    assert lf.stdout == crlf.stdout


def test_preprocess_takes_huge_lines_mixed_scripts_and_combining_characters(tmp_path, shared):
    ws = Workspace(tmp_path, *shared)
    lines = [f"w{i % 16} w{(i * 3) % 16} w{(i * 5) % 16}" for i in range(60)]
    lines[2], lines[3], lines[4], lines[5] = ODD_LINES["10^5 characters of words"], LONG_LINE, MIXED, COMBINING
    args = ["preprocess", "-s", "en", "-t", "de", "--trainpref", raw_corpus(ws, lines), "--destdir", tmp_path / "out",
            "--joined-dictionary", "--bpe-size", "60"]
    result = nmt(args)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    # Cleaning counts words: the 33k-word line is dropped as too long; the one-word
    # 10^5-character line is kept (training skips pairs beyond the model's positions).
    assert meta["counts"]["train"]["sentences"] == 60 - 1
    assert "kept 59 of 60 pairs" in result.stdout


def test_output_may_not_be_the_file_on_standard_input(tmp_path, monkeypatch):
    """`nmt translate -o in.txt < in.txt` would empty in.txt before reading it."""
    source = tmp_path / "in.txt"
    source.write_text("w1\n")
    with open(source, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(NmtError, match=r"in.txt is the input \(standard input\)"):
            refuse_overwriting_inputs(source, [("--input", "-")])
        refuse_overwriting_inputs(tmp_path / "out.txt", [("--input", "-")])  # a new file is fine
        (tmp_path / "other.txt").write_text("")
        refuse_overwriting_inputs(tmp_path / "other.txt", [("--input", "-")])  # and so is another file
    refuse_overwriting_inputs("/dev/null", [("--input", "/dev/null")])  # not a regular file: nothing to destroy
    assert source.read_text() == "w1\n"
