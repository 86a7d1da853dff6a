"""`nmt preprocess`, `learn-bpe`, `apply-bpe` and `binarize` through the command line."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coprocess import answers_line_by_line
from nmt_cli.cli import main
from nmt_cli.config import PreprocessConfig
from nmt_cli.data.dictionary import Dictionary
from nmt_cli.data.indexed import IndexedDataset
from nmt_cli.errors import NmtError
from nmt_cli.text.bpe import BpeModel

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def sentences(n: int, seed: int) -> list[str]:
    vocab_rng, rng = random.Random(7), random.Random(seed)
    words = ["".join(vocab_rng.choice("aeioubdfgklmnprst") for _ in range(vocab_rng.randint(2, 7))) for _ in range(60)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 10))).capitalize() + "." for _ in range(n)]


def write(path: Path, lines: list[str], newline: str = "\n", bom: bool = False) -> Path:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "".join(l + newline for l in lines).encode("utf-8"))
    return path


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    for split, n, seed in (("train", 300, 1), ("valid", 20, 2), ("test", 20, 3)):
        write(tmp_path / f"{split}.en", sentences(n, seed))
        write(tmp_path / f"{split}.de", [s[::-1].capitalize() for s in sentences(n, seed)])
    return tmp_path


def nmt(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def preprocess_args(root: Path, destdir: str = "data-bin", *extra: str, bpe_size: str | None = "150") -> list[str]:
    return ["preprocess", "-s", "en", "-t", "de", "--trainpref", root / "train", "--validpref", root / "valid",
            "--testpref", root / "test", "--destdir", root / destdir, "--joined-dictionary",
            *(["--bpe-size", bpe_size] if bpe_size else []), *extra]


def assert_one_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_every_command_and_option_has_help() -> None:
    import click

    for name in ("preprocess", "learn-bpe", "apply-bpe", "binarize"):
        result = nmt(name, "--help")
        assert result.exit_code == 0 and "Usage:" in result.output
        command = main.get_command(click.Context(main), name)
        assert command.help and command.help.strip()
        for param in command.params:
            assert isinstance(param, click.Option) and param.help, (name, param.name)


def test_end_to_end_with_two_test_sets(raw: Path) -> None:
    write(raw / "extra.en", sentences(5, 9))
    write(raw / "extra.de", sentences(5, 9))
    args = preprocess_args(raw)
    args[args.index("--testpref") + 1] = f"{raw / 'test'},{raw / 'extra'}"
    result = nmt(*args)
    assert result.exit_code == 0, result.output
    assert "train: 300 sentences" in result.stdout and "time:" in result.stdout
    data_bin = raw / "data-bin"
    meta = json.loads((data_bin / "meta.json").read_text())
    assert set(meta["counts"]) == {"train", "valid", "test", "test1"}
    assert len(IndexedDataset(data_bin / "test1.en-de.de")) == 5
    again = nmt(*args)
    assert again.exit_code == 0 and "already up to date" in again.stdout


def test_a_split_whose_files_are_another_sides_is_refused_by_its_counts(raw: Path) -> None:
    """Swapped languages are sound files of their own: only meta.json's counts tell."""
    from nmt_cli.data.pairs import load_data_bin

    assert nmt(*preprocess_args(raw)).exit_code == 0
    data_bin = raw / "data-bin"
    assert len(load_data_bin(data_bin).split("train")) == 300
    for ext in ("bin", "idx"):
        en, de = (data_bin / f"train.en-de.{lang}.{ext}" for lang in ("en", "de"))
        en_bytes = en.read_bytes()
        en.write_bytes(de.read_bytes())
        de.write_bytes(en_bytes)
    with pytest.raises(NmtError, match=r"train.en-de.en.bin/.idx hold 300 sentences and \d+ tokens, but .*meta.json "
                                       r"counted 300 and \d+ for train's en side"):
        load_data_bin(data_bin).split("train")


def test_crlf_and_bom_give_the_same_data_as_plain_lf(raw: Path, tmp_path: Path) -> None:
    dos = tmp_path / "dos"
    dos.mkdir()
    for name in ("train", "valid", "test"):
        for lang in ("en", "de"):
            lines = (raw / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()
            write(dos / f"{name}.{lang}", lines, newline="\r\n", bom=True)
    assert nmt(*preprocess_args(raw)).exit_code == 0
    assert nmt(*preprocess_args(dos)).exit_code == 0
    for name in ("dict.en.txt", "bpe.model", "train.en-de.en.bin", "train.en-de.de.idx", "test.en-de.de.bin"):
        assert (raw / "data-bin" / name).read_bytes() == (dos / "data-bin" / name).read_bytes(), name


def test_mismatched_line_counts(raw: Path) -> None:
    write(raw / "valid.de", sentences(19, 2))
    assert_one_error(nmt(*preprocess_args(raw)), "line counts differ", "valid.en has 20 lines", "valid.de has 19")


def test_missing_and_empty_files(raw: Path) -> None:
    (raw / "test.de").unlink()
    assert_one_error(nmt(*preprocess_args(raw)), "file not found", "test.de")
    (raw / "test.de").write_bytes(b"")
    (raw / "test.en").write_bytes(b"")
    assert_one_error(nmt(*preprocess_args(raw)), "empty file", "test.en")


def test_invalid_utf8_and_nul_bytes_name_the_line(raw: Path) -> None:
    lines = sentences(300, 1)
    data = "".join(l + "\n" for l in lines).encode("utf-8")
    (raw / "train.en").write_bytes(data.replace(lines[122].encode(), b"bad \xe9 latin-1", 1))
    assert_one_error(nmt(*preprocess_args(raw)), "invalid UTF-8", "train.en:123")
    (raw / "train.en").write_bytes(data.replace(lines[7].encode(), b"nul \x00 here", 1))
    assert_one_error(nmt(*preprocess_args(raw, "data-bin", "--workers", "2")), "NUL byte", "train.en:8")
    assert not (raw / "data-bin").exists()


def test_destdir_with_a_different_dataset(raw: Path) -> None:
    other = raw / "data-bin"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert_one_error(nmt(*preprocess_args(raw)), "already holds a different dataset", "--force")
    assert (other / "notes.txt").read_text() == "keep me"
    assert nmt(*preprocess_args(raw, "data-bin", "--force")).exit_code == 0
    assert not (other / "notes.txt").exists() and (other / "meta.json").is_file()


def test_whitespace_only_lines(raw: Path) -> None:
    train_en = sentences(300, 1)
    train_en[10] = "  \t "
    write(raw / "train.en", train_en)
    valid_de = [s[::-1].capitalize() for s in sentences(20, 2)]
    valid_de[3] = "   "
    write(raw / "valid.de", valid_de)
    result = nmt(*preprocess_args(raw))
    assert result.exit_code == 0, result.output
    assert "kept 299 of 300 pairs; dropped: 1 empty" in result.stdout
    valid = IndexedDataset(raw / "data-bin" / "valid.en-de.de")
    assert len(valid) == 20 and valid[3].tolist() == [2]


def test_bad_option_values_are_one_error_line(raw: Path) -> None:
    assert_one_error(nmt(*preprocess_args(raw, "data-bin", "--workers", "0")), "--workers")
    assert_one_error(nmt(*preprocess_args(raw, "data-bin", "--bpe-size", "100000")), "too large")


@pytest.mark.parametrize("flag", ["--nwordssrc", "--nwordstgt"])
def test_a_word_limit_that_keeps_no_word_is_refused(raw: Path, flag: str) -> None:
    # As in fairseq the limit counts the 4 specials: 1 to 4 would map all text to <unk>.
    for value in ("1", "4"):
        assert_one_error(nmt(*preprocess_args(raw, "data-bin", flag, value)),
                         f"error: {flag} {value} keeps no word: it counts the 4 special symbols (<s> <pad> </s> <unk>), "
                         "so it must be > 4 (or 0 or -1: all words)")
    assert not (raw / "data-bin").exists()
    for value in (5, 0, -1):  # one word, or all of them
        PreprocessConfig("en", "de", raw / "train", nwordssrc=value, nwordstgt=value)
    help_text = " ".join(nmt("preprocess", "--help").output.split())
    assert help_text.count("specials included") == 2 and help_text.count("(0 or -1: all)") == 2


def test_workers_that_cannot_start_are_one_line_that_blames_no_file(raw: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only /dev/shm: the pool's semaphores cannot be made (--workers 1 needs none)."""
    from nmt_cli.preprocess import stages

    def no_semaphores(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(stages, "ProcessPoolExecutor", no_semaphores)
    result = nmt(*preprocess_args(raw), "--workers", "2")
    assert_one_error(result, "cannot start the --workers processes: Read-only file system", "/dev/shm", "--workers 1")
    assert "--destdir" not in result.stderr
    assert nmt(*preprocess_args(raw), "--workers", "1").exit_code == 0


def test_learn_apply_bpe_and_binarize_commands(tmp_path: Path) -> None:
    text = write(tmp_path / "tok.txt", sentences(200, 4))
    result = nmt("learn-bpe", "--input", text, "--vocab-size", 120, "--model-prefix", tmp_path / "m")
    assert result.exit_code == 0 and "(120 pieces)" in result.stdout, result.output
    lines = sentences(10, 5) + ["", "Zzyzx unseen ."]
    runner = CliRunner()
    encoded = runner.invoke(main, ["apply-bpe", "--model", str(tmp_path / "m.model")], input="\n".join(lines) + "\n")
    assert encoded.exit_code == 0
    assert len(encoded.stdout.splitlines()) == len(lines) and encoded.stdout.splitlines()[10] == ""
    decoded = runner.invoke(main, ["apply-bpe", "--model", str(tmp_path / "m.model"), "--decode"], input=encoded.stdout)
    assert decoded.stdout.splitlines() == lines

    segmented = write(tmp_path / "seg.txt", encoded.stdout.splitlines())
    dictionary = Dictionary(["\u2581" + w for w in "Zzyzx unseen".split()])
    dictionary.save(tmp_path / "dict.txt")
    result = nmt("binarize", "--dict", tmp_path / "dict.txt", "--input", segmented, "--output-prefix", tmp_path / "out" / "t")
    assert result.exit_code == 0, result.output
    dataset = IndexedDataset(tmp_path / "out" / "t")
    pieces = [l.split() for l in encoded.stdout.splitlines()]
    truth = [dictionary.encode(p) for p in pieces]
    assert [dataset[i].tolist() for i in range(len(dataset))] == truth
    tokens = sum(len(t) for t in truth)
    unk = sum(t.count(3) for t in truth)
    assert f"{len(lines)} sentences, {tokens} tokens, {100 * unk / tokens:.2f}% <unk>" in result.stdout

    assert_one_error(nmt("apply-bpe", "--model", tmp_path / "nope.model"), "BPE model not found")
    assert_one_error(nmt("binarize", "--dict", tmp_path / "dict.txt", "--input", tmp_path / "nope", "--output-prefix", tmp_path / "x"),
                     "file not found")
    bad = runner.invoke(main, ["apply-bpe", "--model", str(tmp_path / "m.model")], input=b"ok\n\xff\n")
    assert_one_error(bad, "<stdin>:2")
    # A program that writes a line and waits for its pieces gets them (stdout a pipe, not a terminal).
    assert answers_line_by_line(["apply-bpe", "--model", str(tmp_path / "m.model")], lines[:3]) == encoded.stdout.splitlines()[:3]


def binarize_workspace(root: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """dict.txt, and out/ holding a finished binarize of good.txt (out/x) and a file of the
    user's; returns (dictionary, out/, the bytes of out/'s files)."""
    Dictionary(["ok", "fine"]).save(root / "dict.txt")
    write(root / "good.txt", ["ok fine", "fine"])
    (root / "out").mkdir()
    (root / "out" / "keep.txt").write_text("mine\n")
    result = nmt("binarize", "--dict", root / "dict.txt", "--input", root / "good.txt", "--output-prefix", root / "out" / "x")
    assert result.exit_code == 0, result.output
    return root / "dict.txt", root / "out", {p.name: p.read_bytes() for p in (root / "out").iterdir()}


@pytest.mark.parametrize("workers", [1, 2])
def test_failed_binarize_leaves_no_partial_files(tmp_path: Path, workers: int) -> None:
    # With 2 workers each line is a chunk: part0 is finished when part1 meets the bad line.
    dictionary, out, before = binarize_workspace(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nbad \xff\n")
    for prefix in ("x", "y"):  # over a finished output, and a new one
        result = nmt("binarize", "--dict", dictionary, "--input", bad, "--output-prefix", out / prefix, "--workers", workers)
        assert_one_error(result, f"invalid UTF-8 at {bad}:2")
        # The earlier output is intact and nothing else is left: no out/.y.partial-PID.part0.bin
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_interrupted_binarize_leaves_no_partial_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dictionary, out, before = binarize_workspace(tmp_path)
    encode, lines_done = Dictionary.encode, []

    def encode_then_interrupt(self, tokens, append_eos=True):  # Ctrl-C on the third line
        if len(lines_done) == 2:
            raise KeyboardInterrupt
        lines_done.append(tokens)
        return encode(self, tokens, append_eos)

    monkeypatch.setattr(Dictionary, "encode", encode_then_interrupt)
    text = write(tmp_path / "text.txt", ["ok"] * 5)
    result = nmt("binarize", "--dict", dictionary, "--input", text, "--output-prefix", out / "y")
    assert result.exit_code == 130 and result.stderr == "interrupted\n", result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_binarize_interrupted_while_it_publishes_leaves_the_new_pair_whole(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C just after the new .bin replaced the old one (whose .idx is gone by then)."""
    import nmt_cli.preprocess.binarize as binarize_module

    dictionary, out, _ = binarize_workspace(tmp_path)
    replace, interrupted = os.replace, []

    def replace_then_interrupt(source, target):
        replace(source, target)
        if str(target).endswith(".bin") and not interrupted:
            interrupted.append(target)
            raise KeyboardInterrupt

    monkeypatch.setattr(binarize_module.os, "replace", replace_then_interrupt)
    text = write(tmp_path / "text.txt", ["fine ok ok", "ok"])
    result = nmt("binarize", "--dict", dictionary, "--input", text, "--output-prefix", out / "x")
    assert result.exit_code == 130 and result.stderr == "interrupted\n" and interrupted, result.output
    dataset = IndexedDataset(out / "x")
    assert [dataset[i].tolist() for i in range(len(dataset))] == [Dictionary.load(dictionary).encode(line.split())
                                                                  for line in ("fine ok ok", "ok")]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "x.bin", "x.idx"]


def test_binarize_writes_under_hidden_names_until_it_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run killed half-way would leave: only hidden files, none that lists beside the outputs.
    (One worker: the patched encode runs in this process; the chunks of several are named after
    the same hidden prefix.)"""
    dictionary, out, before = binarize_workspace(tmp_path)
    encode, seen = Dictionary.encode, set()

    def encode_and_look(self, tokens, append_eos=True):
        seen.update(p.name for p in out.iterdir() if p.name not in before)
        return encode(self, tokens, append_eos)

    monkeypatch.setattr(Dictionary, "encode", encode_and_look)
    text = write(tmp_path / "text.txt", ["ok"] * 5)
    result = nmt("binarize", "--dict", dictionary, "--input", text, "--output-prefix", out / "y")
    assert result.exit_code == 0, result.output
    assert seen and all(name.startswith(f".y.partial-{os.getpid()}") for name in seen), seen
    assert {p.name for p in out.iterdir()} == set(before) | {"y.bin", "y.idx"}


def test_binarize_removes_the_files_of_killed_runs_only(tmp_path: Path) -> None:
    dictionary, out, before = binarize_workspace(tmp_path)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(finished.stdout), os.getppid()  # a process that has exited, and one that runs
    killed = [f".x.partial-{dead}.bin", f".x.partial-{dead}.part1.idx"]
    running = [f".x.partial-{alive}.bin", f".y.partial-{dead}.bin"]  # another run's, another prefix's
    for name in killed + running:
        (out / name).write_bytes(b"partial")
    result = nmt("binarize", "--dict", dictionary, "--input", tmp_path / "good.txt", "--output-prefix", out / "x")
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == set(before) | set(running)


@pytest.mark.parametrize("prefix", ["", "out/", "out/.", "out/..", "."])
def test_output_prefix_that_names_no_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    # '' wrote a hidden `.model` (learn-bpe) or failed with a traceback (binarize); `out/`
    # wrote `out.bin` beside the directory out, as Path drops the trailing slash.
    monkeypatch.chdir(tmp_path)
    dictionary, out, before = binarize_workspace(tmp_path)
    text = write(tmp_path / "text.txt", sentences(50, 4))
    files = sorted(tmp_path.rglob("*"))
    assert_one_error(nmt("binarize", "--dict", dictionary, "--input", text, "--output-prefix", prefix),
                     f"--output-prefix must name a file, e.g. DIR/NAME for DIR/NAME.bin and DIR/NAME.idx (got {prefix!r})")
    assert_one_error(nmt("learn-bpe", "--input", text, "--vocab-size", 40, "--model-prefix", prefix),
                     f"--model-prefix must name a file, e.g. DIR/NAME for DIR/NAME.model (got {prefix!r})")
    assert sorted(tmp_path.rglob("*")) == files


@pytest.mark.parametrize("bad_line", [b"bad \xff\xfe bytes here", b"nul \x00 here"])
def test_learn_bpe_bad_input_is_our_one_error_line(raw: Path, bad_line: bytes) -> None:
    # The error is raised inside the iterator sentencepiece consumes; sentencepiece must not wrap it.
    bad = raw / "bad.en"
    bad.write_bytes("".join(l + "\n" for l in sentences(50, 1)).encode() + bad_line + b"\n")
    result = nmt("learn-bpe", "--input", bad, "--vocab-size", 100, "--model-prefix", raw / "out" / "m")
    assert_one_error(result, f"{bad}:51")
    assert "sentencepiece" not in result.stderr and not (raw / "out" / "m.model").exists()
    from_stdin = CliRunner().invoke(main, ["learn-bpe", "--input", "-", "--vocab-size", "100", "--model-prefix",
                                           str(raw / "out" / "m")], input=bad.read_bytes())
    assert_one_error(from_stdin, "<stdin>:51")
    (raw / "train.en").write_bytes(bad.read_bytes() + (raw / "train.en").read_bytes().split(b"\n", 51)[51])
    assert_one_error(nmt(*preprocess_args(raw)), "train.en:51")


def test_learn_bpe_options_and_stdin(tmp_path: Path) -> None:
    text = write(tmp_path / "tok.txt", sentences(200, 4))
    prefix = tmp_path / "m"
    assert_one_error(nmt("learn-bpe", "--input", text, "--vocab-size", 120, "--model-prefix", prefix, "--sample", -1),
                     "--sample must be 0 (all sentences) or at least 101 (sentencepiece's smallest sample; got -1)")
    runner = CliRunner()
    args = ["learn-bpe", "--vocab-size", "120", "--model-prefix", str(prefix)]
    assert_one_error(runner.invoke(main, [*args, "--input", "-", "--input", "-"], input=b""), "only once")
    assert_one_error(runner.invoke(main, [*args, "--input", "-"], input=b"\n\n"), "no text to learn BPE from")
    result = runner.invoke(main, [*args, "--input", "-"], input=text.read_bytes())
    assert result.exit_code == 0 and "(120 pieces)" in result.stdout, result.output
    from_stdin = (tmp_path / "m.model").read_bytes()
    assert nmt(*args, "--input", text).exit_code == 0
    assert (tmp_path / "m.model").read_bytes() == from_stdin


def test_bpe_learning_options_without_bpe_learning_are_warned_about(raw: Path) -> None:
    learned = nmt(*preprocess_args(raw, "learned"))
    assert learned.exit_code == 0 and "warning" not in learned.stderr, learned.output
    reused = nmt(*preprocess_args(raw, "reused", "--bpe-model", raw / "learned" / "bpe.model"))
    assert reused.exit_code == 0, reused.output
    assert [l for l in reused.stderr.splitlines() if "warning" in l] == [
        "warning: --bpe-size is ignored: --bpe-model gives the BPE model"]
    unsegmented = nmt(*preprocess_args(raw, "unsegmented", "--bpe", "none", "--bpe-seed", "3"))
    assert unsegmented.exit_code == 0, unsegmented.output
    assert [l for l in unsegmented.stderr.splitlines() if "warning" in l] == [
        "warning: --bpe-size is ignored: --bpe none learns no BPE",
        "warning: --bpe-seed is ignored: --bpe none learns no BPE"]


def test_bad_bpe_model_is_named_as_given(raw: Path) -> None:
    junk = write(raw / "afile", ["not a model"])
    result = nmt(*preprocess_args(raw, "data-bin", "--bpe-model", junk, bpe_size=None))
    assert_one_error(result, f"not a sentencepiece model: {junk}")
    assert ".partial" not in result.stderr and not (raw / "data-bin").exists()


@pytest.mark.parametrize("force", [False, True])
def test_inputs_inside_destdir_are_refused(raw: Path, force: bool) -> None:
    # The finished output replaces --destdir as a whole: inputs inside it would be deleted.
    extra = ["--force"] if force else []
    for destdir in (".", "sub"):
        (raw / "sub").mkdir(exist_ok=True)
        for name in ("valid.en", "valid.de"):
            (raw / "sub" / name).write_bytes((raw / name).read_bytes())
        args = preprocess_args(raw, destdir, *extra)
        args[args.index("--validpref") + 1] = raw / "sub" / "valid"
        result = nmt(*args)
        assert_one_error(result, "is inside --destdir", f"--destdir {raw / destdir},")
        assert (raw / "sub" / "valid.en").is_file() and (raw / "train.en").is_file()
    (raw / "elsewhere").mkdir()
    (raw / "elsewhere" / "valid.en").symlink_to(raw / "sub" / "valid.en")
    (raw / "elsewhere" / "valid.de").symlink_to(raw / "sub" / "valid.de")
    args = preprocess_args(raw, "sub", *extra)
    args[args.index("--validpref") + 1] = raw / "elsewhere" / "valid"
    assert_one_error(nmt(*args), "elsewhere/valid.en is inside --destdir")
    assert (raw / "sub" / "valid.en").is_file()


@pytest.mark.parametrize("flag,value,item", [("--validpref", "{v},,{v}", 2), ("--testpref", "{v},", 2), ("--testpref", "", 1)])
def test_empty_prefix_in_a_list_is_refused(raw: Path, flag: str, value: str, item: int) -> None:
    args = preprocess_args(raw)
    args[args.index(flag) + 1] = value.format(v=raw / "valid")
    assert_one_error(nmt(*args), flag, "empty prefix", f"item {item}")
    assert not (raw / "data-bin").exists()


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="shared multi30k data not present")
def test_multi30k_subset_end_to_end(tmp_path: Path) -> None:
    for split, n in (("train", 2000), ("valid", 300), ("test", 300)):
        for lang in ("en", "de"):
            lines = (MULTI30K / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            write(tmp_path / f"{split}.{lang}", lines)
    result = nmt(*preprocess_args(tmp_path, "data-bin", "--workers", "2", bpe_size="1000"))
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "data-bin" / "meta.json").read_text())
    assert meta["counts"]["test"]["sentences"] == 300
    assert meta["cleaning"]["pairs_kept"] + sum(meta["cleaning"]["dropped"].values()) == 2000
    for lang in ("en", "de"):
        unk_rate = meta["counts"]["test"]["unk"][lang] / meta["counts"]["test"]["tokens"][lang]
        assert unk_rate < 0.01, (lang, unk_rate)


# --- BPE learning limits -------------------------------------------------------------------

LONG_LINE = " ".join(["größe"] * 1000)  # over sentencepiece's default 4192 bytes; the only "ö" and "ß"


def test_learn_bpe_and_preprocess_learn_from_long_lines(raw: Path, tmp_path: Path) -> None:
    text = write(tmp_path / "long.txt", [LONG_LINE, LONG_LINE])
    result = nmt("learn-bpe", "--input", text, "--vocab-size", 12, "--model-prefix", tmp_path / "m")
    assert result.exit_code == 0 and "(12 pieces)" in result.stdout, result.output
    for lang in ("en", "de"):
        lines = (raw / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        write(raw / f"train.{lang}", lines[:5] + [LONG_LINE] + lines[5:])
    result = nmt(*preprocess_args(raw, "data-bin", "--max-len", "100000"))
    assert result.exit_code == 0, result.output
    bpe = BpeModel(raw / "data-bin" / "bpe.model")
    assert bpe.decode(bpe.encode("größe maße")) == "größe maße"  # its characters are pieces, not <unk>


def needed_pieces(*paths: Path) -> int:
    """The least BPE size for the text of `paths`: a piece per character, ▁ included, and <unk>, <s>, </s>."""
    characters = set("".join(path.read_text(encoding="utf-8") for path in paths)) - {" ", "\n"}
    return len(characters) + 1 + 3


def test_bpe_sizes_that_cannot_work_name_the_flag_and_the_limit(raw: Path, tmp_path: Path) -> None:
    text = write(tmp_path / "tok.txt", sentences(200, 4))
    needed = needed_pieces(text)
    learn = ("learn-bpe", "--input", text, "--model-prefix", tmp_path / "m")
    assert_one_error(nmt(*learn, "--vocab-size", needed - 1),
                     f"error: --vocab-size {needed - 1} is too small for the --input text: it needs at least {needed}, "
                     f"a piece for each of its {needed - 3} distinct characters (▁, which starts each word, included) "
                     "and 3 for <unk>, <s>, </s>")
    assert nmt(*learn, "--vocab-size", needed).exit_code == 0
    assert_one_error(nmt(*learn, "--vocab-size", 2), "error: --vocab-size 2 is too small: BPE needs at least 5 pieces")
    assert_one_error(nmt(*learn, "--vocab-size", 100, "--sample", 50),
                     "error: --sample must be 0 (all sentences) or at least 101 (sentencepiece's smallest sample; got 50)")

    train = [raw / "train.en", raw / "train.de"]
    joint = needed_pieces(*train)
    assert_one_error(nmt(*preprocess_args(raw, bpe_size=str(joint - 1))),
                     f"error: --bpe-size {joint - 1} is too small for the joint en-de training text: it needs at least {joint},")
    (raw / "train.de").write_text((raw / "train.de").read_text(encoding="utf-8") + "Maße äöü ÄÖÜ éèêàçñ ŁŃŚŹŻ.\n",
                                  encoding="utf-8")
    (raw / "train.en").write_text((raw / "train.en").read_text(encoding="utf-8") + "Mase.\n", encoding="utf-8")
    en, de = needed_pieces(raw / "train.en"), needed_pieces(raw / "train.de")
    assert de > en  # a model of en's least size fits en, not de
    assert_one_error(nmt(*preprocess_args(raw, "data-bin", "--separate-bpe", bpe_size=str(en))),
                     f"error: --bpe-size {en} is too small for the de training text: it needs at least {de},")
    for extra, message in ((("--bpe-sample", "100"), "error: --bpe-sample must be 0 (all sentences) or at least 101"),
                           (("--bpe-size", "4"), "error: --bpe-size 4 is too small: BPE needs at least 5 pieces")):
        assert_one_error(nmt(*preprocess_args(raw, "data-bin", *extra)), message)
    assert not (raw / "data-bin").exists() and not [p for p in raw.iterdir() if p.name.startswith(".")]


# --- destinations spelt relatively ------------------------------------------------------------


def hidden_entries(*directories: Path) -> list[Path]:
    return [p for d in directories for p in d.iterdir() if p.name.startswith(".")]


def test_destdir_may_be_the_current_directory_or_another_spelling_of_it(raw: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = raw / "here"
    here.mkdir()
    monkeypatch.chdir(here)

    def run(destdir: str, *extra: str):
        args = preprocess_args(raw, "data-bin", *extra)
        args[args.index("--destdir") + 1] = destdir
        return nmt(*args)

    result = run(".")
    assert result.exit_code == 0, result.output
    assert (here / "meta.json").is_file() and not hidden_entries(raw, here)
    assert Path("meta.json").is_file()  # this process stands in the new directory, not in the deleted old one
    assert "already up to date" in run(".").stdout
    for destdir, size in (("./", "140"), ("../here", "130")):
        result = run(destdir, "--force", "--bpe-size", size)
        assert result.exit_code == 0, (destdir, result.output)
        assert BpeModel(here / "bpe.model").size() == int(size)
        assert not hidden_entries(raw, here)
    (here / "sub").mkdir()
    monkeypatch.chdir(raw)
    result = run("here/sub/..", "--force", "--bpe-size", "120")
    assert result.exit_code == 0, result.output
    assert BpeModel(here / "bpe.model").size() == 120 and not (here / "sub").exists() and not hidden_entries(raw, here)


def test_every_published_output_may_be_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # export, import-fairseq, import-marian and preprocess all publish through build_then_publish.
    from nmt_cli.staging import build_then_publish

    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for number, dest in enumerate((".", "sub/..", "../here", "./")):
        (tmp_path / "here" / "sub").mkdir()

        def write(staging: Path) -> str:
            (staging / "out.txt").write_text(f"{number}\n")
            return "written"

        assert build_then_publish(Path(dest), write, str) == "written", dest
        assert sorted(p.name for p in (tmp_path / "here").iterdir()) == ["out.txt"], dest
        assert Path("out.txt").read_text() == f"{number}\n" and not hidden_entries(tmp_path), dest


def test_a_deleted_current_directory_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # as a shell is left after another process replaced its directory
    text = write(tmp_path / "tok.txt", sentences(200, 4))
    assert_one_error(nmt("learn-bpe", "--input", text, "--vocab-size", 60, "--model-prefix", tmp_path / "m"),
                     "error: the current directory no longer exists", "cd into it again")


def test_binarize_takes_special_symbols_of_the_text_as_unk(tmp_path: Path) -> None:
    text = write(tmp_path / "s.txt", ["▁the ▁tag </s> ▁ends <pad> ▁here <s>"])
    write(tmp_path / "d.txt", ["▁the 1", "▁here 1"])
    result = nmt("binarize", "--dict", tmp_path / "d.txt", "--input", text, "--output-prefix", tmp_path / "s")
    assert result.exit_code == 0, result.output
    assert IndexedDataset(tmp_path / "s")[0].tolist() == [4, 3, 3, 3, 3, 5, 3, 2]  # one </s>, at the end
    assert "1 sentences, 8 tokens, 62.50% <unk>" in result.stdout
