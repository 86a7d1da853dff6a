"""The preprocessing pipeline as a library: outputs, cleaning, round trips, determinism, destdir safety."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nmt_cli.config import PreprocessConfig
from nmt_cli.data.dictionary import EOS_ID, UNK_ID, Dictionary
from nmt_cli.data import indexed
from nmt_cli.data.indexed import IndexedDataset, IndexedDatasetBuilder
from nmt_cli.errors import NmtError
from nmt_cli.preprocess.run import preprocess
from nmt_cli.preprocess import workers
from nmt_cli.text.bpe import BpeModel
from nmt_cli.text.pipeline import TextPipeline
from nmt_cli.preprocess.progress import StageReporter
from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """A synthetic parallel corpus: the target spells each source word backwards."""
    vocab_rng, rng = random.Random(12345), random.Random(seed)
    words = ["".join(vocab_rng.choice("abcdefghiklmnoprstuvwz") for _ in range(vocab_rng.randint(1, 8))) for _ in range(120)]
    pairs = []
    for _ in range(n):
        sentence = [rng.choice(words) for _ in range(rng.randint(2, 12))]
        end = rng.choice([".", "?", "!", ""])
        src = " ".join(sentence).capitalize() + end
        tgt = " ".join(w[::-1] for w in sentence).capitalize() + end
        pairs.append((src, tgt))
    return pairs


def write_split(prefix: Path, pairs: list[tuple[str, str]], src: str = "en", tgt: str = "de") -> None:
    Path(f"{prefix}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    Path(f"{prefix}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def run(cfg: PreprocessConfig):
    return preprocess(cfg, StageReporter(enabled=False))


def config(tmp_path: Path, **overrides) -> PreprocessConfig:
    base = dict(
        source_lang="en", target_lang="de", trainpref=tmp_path / "train", validpref=(tmp_path / "valid",),
        testpref=(tmp_path / "test",), destdir=tmp_path / "data-bin", joined_dictionary=True, bpe_size=200,
    )
    base.update(overrides)
    return PreprocessConfig(**base)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_split(tmp_path / "train", make_pairs(400, seed=1))
    write_split(tmp_path / "valid", make_pairs(30, seed=2))
    write_split(tmp_path / "test", make_pairs(30, seed=3))
    return tmp_path


def read_split(data_bin: Path, split: str, lang: str, dictionary: Dictionary) -> list[list[str]]:
    dataset = IndexedDataset(data_bin / f"{split}.en-de.{lang}")
    return [dictionary.decode(dataset[i]) for i in range(len(dataset))]


def test_outputs_and_round_trip_on_generated_text(corpus: Path) -> None:
    result = run(config(corpus))
    data_bin = corpus / "data-bin"
    meta = json.loads((data_bin / "meta.json").read_text())
    assert meta == result.meta and meta["format_version"] == 1 and meta["bpe"] == {"type": "sentencepiece", "model": "bpe.model"}
    assert (data_bin / "dict.en.txt").read_bytes() == (data_bin / "dict.de.txt").read_bytes()
    assert not any(p.name.startswith(".") for p in corpus.iterdir()), "staging directory left behind"
    dictionary = Dictionary.load(data_bin / "dict.en.txt")
    assert len(dictionary) % 8 == 0
    for lang, side in (("en", 0), ("de", 1)):
        pipeline = TextPipeline.from_data_bin(data_bin, lang)
        for split, seed in (("train", 1), ("test", 3)):
            raw = [pair[side] for pair in make_pairs(400 if split == "train" else 30, seed=seed)]
            dataset = IndexedDataset(data_bin / f"{split}.en-de.{lang}")
            assert len(dataset) == len(raw) == meta["counts"][split]["sentences"]
            assert meta["counts"][split]["tokens"][lang] == int(dataset.sizes.sum())
            for i, line in enumerate(raw):
                ids = dataset[i]
                assert ids[-1] == EOS_ID and UNK_ID not in ids.tolist()
                assert pipeline.decode(dictionary.decode(ids)) == line
                assert dictionary.encode(pipeline.encode(line)) == ids.tolist()


def test_dictionary_counts_are_the_training_piece_counts(corpus: Path) -> None:
    run(config(corpus, joined_dictionary=False))
    data_bin = corpus / "data-bin"
    for lang in ("en", "de"):
        dictionary = Dictionary.load(data_bin / f"dict.{lang}.txt")
        pieces = read_split(data_bin, "train", lang, dictionary)
        truth = Counter(piece for sentence in pieces for piece in sentence)
        listed = {s: c for s, c in zip(dictionary.symbols[4:], dictionary.counts[4:]) if not s.startswith("madeupword")}
        assert listed == dict(truth)
    assert (data_bin / "dict.en.txt").read_bytes() != (data_bin / "dict.de.txt").read_bytes()


def test_cleaning_drops_only_training_pairs_and_counts_reasons(tmp_path: Path) -> None:
    pairs = make_pairs(50)
    bad = [("", "Nicht leer ."), ("   ", "\t"), ("One two three four five six seven eight nine ten eleven twelve .", "Kurz ."),
           (" ".join(["w"] * 40), " ".join(["v"] * 40))]
    write_split(tmp_path / "train", pairs[:10] + bad + pairs[10:])
    write_split(tmp_path / "valid", pairs[:5] + bad[:2])
    write_split(tmp_path / "test", bad)
    meta = run(config(tmp_path, max_len=30, max_ratio=5.0, bpe_size=100)).meta
    assert meta["cleaning"]["pairs_read"] == 54 and meta["cleaning"]["pairs_kept"] == 50
    assert meta["cleaning"]["dropped"] == {"empty": 2, "too_short": 0, "too_long": 1, "ratio": 1}
    assert meta["counts"]["valid"]["sentences"] == 7 and meta["counts"]["test"]["sentences"] == 4
    dictionary = Dictionary.load(tmp_path / "data-bin" / "dict.de.txt")
    valid_de = read_split(tmp_path / "data-bin", "valid", "de", dictionary)
    assert valid_de[6] == []  # the whitespace-only line stays, as an empty sentence
    train_en = read_split(tmp_path / "data-bin", "train", "en", dictionary)
    assert len(train_en) == 50


def test_output_is_identical_for_any_number_of_workers(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "LINES_PER_CHUNK", 70)  # several chunks per split even with one worker
    run(config(corpus, destdir=corpus / "one", workers=1))
    run(config(corpus, destdir=corpus / "two", workers=2))
    names = sorted(p.name for p in (corpus / "one").iterdir())
    assert names == sorted(p.name for p in (corpus / "two").iterdir())
    for name in names:
        one, two = (corpus / "one" / name).read_bytes(), (corpus / "two" / name).read_bytes()
        if name == "meta.json":
            one, two = (json.loads(x) for x in (one, two))
            del one["created"], two["created"]
        assert one == two, name


def test_destdir_is_replaced_only_with_force(corpus: Path) -> None:
    cfg = config(corpus)
    first = run(cfg)
    assert not first.up_to_date
    assert run(cfg).up_to_date
    changed = dataclasses.replace(cfg, bpe_size=150)
    with pytest.raises(NmtError, match="already holds a different dataset"):
        run(changed)
    assert json.loads((corpus / "data-bin" / "meta.json").read_text())["fingerprint"] == first.meta["fingerprint"]
    replaced = run(dataclasses.replace(changed, force=True))
    assert replaced.meta["fingerprint"] != first.meta["fingerprint"]
    assert BpeModel(corpus / "data-bin" / "bpe.model").size() == 150
    assert sorted(p.name for p in corpus.iterdir() if p.name.startswith(".")) == []


def test_a_data_bin_an_older_preprocessing_made_is_not_up_to_date(corpus: Path, monkeypatch) -> None:
    """The same inputs and settings, preprocessed by an nmt whose output was another
    (a lower revision): a rerun must not take it for up to date, but ask for --force."""
    from nmt_cli.preprocess import run as run_module

    cfg = config(corpus)
    monkeypatch.setattr(run_module, "PREPROCESS_REVISION", run_module.PREPROCESS_REVISION - 1)
    older = run(cfg)
    monkeypatch.undo()
    with pytest.raises(NmtError, match="or one that an older nmt preprocessed otherwise.*pass --force"):
        run(cfg)
    remade = run(dataclasses.replace(cfg, force=True))
    assert remade.meta["fingerprint"] != older.meta["fingerprint"]
    assert remade.meta["versions"]["preprocessing"] == run_module.PREPROCESS_REVISION
    assert run(cfg).up_to_date


@pytest.mark.parametrize("meta", [b"[]", b'{"fingerprint": 7}', b"\xff", b"{"])
def test_destdir_with_a_foreign_meta_json_is_refused(corpus: Path, meta: bytes) -> None:
    (corpus / "data-bin").mkdir()
    (corpus / "data-bin" / "meta.json").write_bytes(meta)
    with pytest.raises(NmtError, match="already holds a different dataset"):
        run(config(corpus))
    assert (corpus / "data-bin" / "meta.json").read_bytes() == meta


def test_an_up_to_date_destdir_whose_meta_json_has_a_bad_field_is_one_error(corpus: Path) -> None:
    cfg = config(corpus)
    run(cfg)
    path = corpus / "data-bin" / "meta.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "source_lang": ["en"]}), encoding="utf-8")
    with pytest.raises(NmtError, match=r"meta\.json: field source_lang is \["):
        run(cfg)


def test_failed_run_leaves_no_destdir(corpus: Path) -> None:
    Path(f"{corpus / 'test'}.de").write_bytes(b"ok\n" * 29 + b"\xc3\x28\n")
    with pytest.raises(NmtError, match=r"test\.de:30"):
        run(config(corpus))
    assert not (corpus / "data-bin").exists()
    assert [p.name for p in corpus.iterdir() if p.name.startswith(".")] == []


def test_reuse_dictionary_and_bpe_model(corpus: Path) -> None:
    run(config(corpus))
    first = corpus / "data-bin"
    cfg = config(corpus, destdir=corpus / "again", srcdict=first / "dict.en.txt", bpe_model=first / "bpe.model")
    run(cfg)
    again = corpus / "again"
    for name in ("dict.en.txt", "dict.de.txt", "bpe.model", "test.en-de.de.bin", "test.en-de.en.idx"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    with pytest.raises(NmtError, match="--bpe-model"):
        config(corpus, srcdict=first / "dict.en.txt", bpe="sentencepiece")
    with pytest.raises(NmtError, match="--bpe-model"):  # --bpe auto on raw text learns BPE: the same refusal
        run(config(corpus, destdir=corpus / "third", srcdict=first / "dict.en.txt"))


def test_options_that_cannot_change_the_output_leave_it_up_to_date(corpus: Path) -> None:
    run(config(corpus))
    first = corpus / "data-bin"
    cfg = config(corpus, destdir=corpus / "again", srcdict=first / "dict.en.txt", bpe_model=first / "bpe.model")
    assert not run(cfg).up_to_date
    # A given model and dictionary make the learning options moot: the output cannot differ.
    moot = dataclasses.replace(cfg, bpe_size=150, bpe_sample=500, bpe_seed=7, nwordssrc=20, thresholdsrc=3)
    assert run(moot).up_to_date
    with pytest.raises(NmtError, match="already holds a different dataset"):
        run(dataclasses.replace(cfg, max_len=20))


def test_separate_bpe_and_plain_tokens(corpus: Path) -> None:
    meta = run(config(corpus, joined_dictionary=False, separate_bpe=True)).meta
    assert meta["bpe"] == {"type": "sentencepiece", "model_src": "bpe.en.model", "model_tgt": "bpe.de.model"}
    de = TextPipeline.from_data_bin(corpus / "data-bin", "de")
    assert de.bpe is not None and de.bpe.path.name == "bpe.de.model"

    plain = config(corpus, destdir=corpus / "plain", tokenizer="none", normalize_punctuation=False, bpe="none",
                   nwordssrc=20, thresholdsrc=0)
    meta = run(plain).meta
    assert meta["bpe"] is None and meta["tokenizer"]["name"] == "none"
    dictionary = Dictionary.load(corpus / "plain" / "dict.en.txt")
    assert len(dictionary) == 24  # 16 symbols + 4 specials, padded to a multiple of 8
    words = Counter(w for s, t in make_pairs(400, seed=1) for w in (s + " " + t).split())
    assert dictionary.symbols[4:20] == [w for w, _ in sorted(words.items(), key=lambda wc: (-wc[1], wc[0]))][:16]


def test_special_symbols_in_the_text_are_unk_and_no_dictionary_entries(corpus: Path) -> None:
    # Already segmented text (taken as it is) holding the specials' spellings: as their ids, a </s>
    # would end the sentence early, a <pad> be masked out as padding.
    write_split(corpus / "seg", [("▁a </s> ▁b", "▁c <pad> ▁d <s>"), ("▁a <unk> ▁b", "▁c ▁d")] * 20)
    cfg = config(corpus, trainpref=corpus / "seg", validpref=(), testpref=(), destdir=corpus / "seg-bin",
                 joined_dictionary=False)
    meta = run(cfg).meta
    assert meta["segmented_input"] == "▁" and meta["counts"]["train"]["unk"] == {"en": 40, "de": 40}
    for lang, words, lines in (("en", ["▁a", "▁b"], [["▁a", 3, "▁b"], ["▁a", 3, "▁b"]]),
                               ("de", ["▁c", "▁d"], [["▁c", 3, "▁d", 3], ["▁c", "▁d"]])):
        # fairseq-preprocess counts them into its specials, which dict.txt does not list: nor does nmt.
        listed = [line.split()[0] for line in (corpus / "seg-bin" / f"dict.{lang}.txt").read_text().splitlines()]
        assert [w for w in listed if not w.startswith("madeupword")] == words
        dictionary = Dictionary.load(corpus / "seg-bin" / f"dict.{lang}.txt")
        truth = [[dictionary.index[t] if isinstance(t, str) else t for t in line] + [EOS_ID] for line in lines]
        dataset = IndexedDataset(corpus / "seg-bin" / f"train.en-de.{lang}")
        assert [dataset[i].tolist() for i in range(len(dataset))] == truth * 20
    assert Dictionary(["x"]).encode(["<s>", "<pad>", "</s>", "<unk>", "x", "y"]) == [UNK_ID] * 4 + [4, UNK_ID, EOS_ID]


@pytest.mark.parametrize("offsets_chunk", [indexed.OFFSETS_CHUNK, 3])  # 3: offsets written out mid-way, often
def test_offsets_survive_builder_merge(tmp_path: Path, monkeypatch, offsets_chunk: int) -> None:
    monkeypatch.setattr(indexed, "OFFSETS_CHUNK", offsets_chunk)
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 70000, size=rng.integers(0, 9)).tolist() for _ in range(50)]
    for part, chunk in enumerate((sentences[:20], sentences[20:])):
        builder = IndexedDatasetBuilder(tmp_path / f"p{part}", 70001)
        for ids in chunk:
            builder.add(ids)
        builder.finalize()
    merged = IndexedDatasetBuilder(tmp_path / "all", 70001)
    merged.merge(tmp_path / "p0")
    merged.add(sentences[0])
    merged.merge(tmp_path / "p1")
    merged.finalize()
    dataset = IndexedDataset(tmp_path / "all")
    expected = sentences[:20] + sentences[:1] + sentences[20:]
    assert [dataset[i].tolist() for i in range(len(dataset))] == expected
    # The .idx as docs/FORMATS.md lays it out: header with the count, then n + 1 offsets.
    raw = (tmp_path / "all.idx").read_bytes()
    magic, code, count = indexed.HEADER.unpack(raw[: indexed.HEADER.size])
    assert (magic, code, count) == (indexed.MAGIC, 2, len(expected))
    offsets = np.frombuffer(raw[indexed.HEADER.size :], dtype="<i8")
    assert offsets.tolist() == [0, *np.cumsum([len(ids) for ids in expected]).tolist()]


def test_an_unfinished_builder_leaves_no_readable_corpus(tmp_path: Path) -> None:
    builder = IndexedDatasetBuilder(tmp_path / "cut", 100)
    for _ in range(3 * indexed.OFFSETS_CHUNK):  # its offsets are partly on disk already
        builder.add([5, 6, 7])
    del builder  # never finalized, as in a killed run: its files are closed with what they hold
    with pytest.raises(NmtError, match="truncated or corrupt"):
        IndexedDataset(tmp_path / "cut")


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="shared multi30k data not present")
def test_round_trip_on_multi30k(tmp_path: Path) -> None:
    lines = {lang: (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:1500] for lang in ("en", "de")}
    write_split(tmp_path / "train", list(zip(lines["en"], lines["de"])))
    # The same lines as a (never cleaned) test set: every line maps to sentence i, no <unk>.
    write_split(tmp_path / "test", list(zip(lines["en"], lines["de"])))
    run(config(tmp_path, validpref=(), bpe_size=1000))
    data_bin = tmp_path / "data-bin"
    dictionary = Dictionary.load(data_bin / "dict.en.txt")
    for lang in ("en", "de"):
        tokenizer = Tokenizer(TokenizerSettings("moses", lang))
        pipeline = TextPipeline.from_data_bin(data_bin, lang)
        pieces = read_split(data_bin, "test", lang, dictionary)
        exact = 0
        for line, sentence in zip(lines[lang], pieces, strict=True):
            assert "<unk>" not in sentence
            tokenized = pipeline.bpe.decode(sentence)
            assert tokenized == tokenizer.tokenize(line)  # BPE undoes exactly
            exact += pipeline.decode(sentence) == " ".join(tokenizer.normalize(line).split())
        # Moses detokenization is not a perfect inverse (e.g. quotes); it nearly always is here.
        assert exact / len(pieces) > 0.97, exact


def test_leftovers_of_dead_runs_are_removed(corpus: Path) -> None:
    dead = corpus / ".data-bin.partial-4194305"  # above Linux's largest pid: no such process
    alive = corpus / f".data-bin.partial-{os.getppid()}"  # a running process: maybe another preprocess
    for leftover in (dead, alive):
        leftover.mkdir()
        (leftover / "train.en-de.en.bin").write_bytes(b"partial")
    run(config(corpus))
    assert not dead.exists() and alive.exists()


def test_a_data_bin_a_killed_run_left_renamed_aside_is_back_and_kept(corpus: Path) -> None:
    """Killed between --force's two renames, a run leaves the old data-bin as .data-bin.old-PID
    and no data-bin: the next run puts it back, and replaces it only when told to."""
    replaced = corpus / ".data-bin.old-4194305"
    replaced.mkdir()
    (replaced / "mine.txt").write_text("the old data-bin\n")
    with pytest.raises(NmtError, match="already holds a different dataset"):
        run(config(corpus))
    assert not replaced.exists() and (corpus / "data-bin" / "mine.txt").read_text() == "the old data-bin\n"
    run(config(corpus, force=True))
    assert not (corpus / "data-bin" / "mine.txt").exists() and (corpus / "data-bin" / "meta.json").is_file()


@pytest.mark.parametrize("joined", [True, False])
def test_a_threshold_that_drops_every_word_is_refused(corpus: Path, joined: bool) -> None:
    flags = {"thresholdsrc": 10**6} if joined else {"thresholdtgt": 10**6}
    side = "joined" if joined else "de"
    flag = "--thresholdsrc" if joined else "--thresholdtgt"
    with pytest.raises(NmtError, match=rf"^{flag} 1000000 drops every word of the {side} dictionary: the most "
                                       r"frequent is seen \d+ times in the training data$"):
        run(config(corpus, joined_dictionary=joined, **flags))
    assert not (corpus / "data-bin").exists()


def test_a_side_too_long_for_any_tokenization_is_dropped_before_tokenizing(tmp_path: Path, monkeypatch) -> None:
    """With --max-len 30 a side of more than 1000 x 30 characters is too long without being
    tokenized (which costs many times its size); the reasons keep their order: a pair with an
    empty other side is empty, a huge side of whitespace alone is empty."""
    from nmt_cli.preprocess.clean import CHARS_PER_TOKEN

    received = []
    tokenize = Tokenizer.tokenize
    monkeypatch.setattr(Tokenizer, "tokenize", lambda self, line: received.append(len(line)) or tokenize(self, line))
    pairs = make_pairs(50)
    huge = "Ein sehr langer Satz " * 10_000  # 210,000 characters
    bad = [(huge, "Kurz ."), ("Short .", huge), (huge, huge), (huge, "   "), (" " * 200_000, "Nicht leer ."),
           (" ".join(["w"] * 40), " ".join(["v"] * 40))]  # too long once tokenized, as before
    write_split(tmp_path / "train", pairs[:10] + bad + pairs[10:])
    write_split(tmp_path / "valid", pairs[:5])
    write_split(tmp_path / "test", pairs[:5])
    meta = run(config(tmp_path, max_len=30, bpe_size=100, workers=1)).meta
    assert meta["cleaning"]["dropped"] == {"empty": 2, "too_short": 0, "too_long": 4, "ratio": 0}
    assert meta["cleaning"]["pairs_kept"] == 50
    assert max(n for n in received if n != 200_000) <= CHARS_PER_TOKEN * 30  # whitespace alone is tokenized
