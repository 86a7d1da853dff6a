"""Unit tests of the text stages: reading, tokenization, cleaning, BPE, TextPipeline."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from nmt_cli.errors import NmtError
from nmt_cli.preprocess.clean import EMPTY, RATIO, TOO_LONG, TOO_SHORT, CleanSettings, drop_reason
from nmt_cli.text import reader
from nmt_cli.text.bpe import BpeModel, learn_bpe
from nmt_cli.text.pipeline import TextPipeline
from nmt_cli.text.reader import Chunk, count_lines, line_chunks, line_start_offsets, read_lines, read_stream
from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings, _MosesTokenizer, required_text


def random_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnoprstuvwyz") for _ in range(rng.randint(1, 9))) for _ in range(80)]
    lines = []
    for _ in range(n):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(2, 14)))
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ""]))
    return lines


# --- reader -------------------------------------------------------------------------------


def test_reader_strips_crlf_and_bom_and_keeps_unicode_separators(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    # U+2028, U+0085 and \x0c are line breaks for str.splitlines() but not here.
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo \xe2\x80\xa8 still two\r\nthree\xc2\x85x\x0cy\n\nlast")
    assert list(read_lines(path)) == ["one", "two \u2028 still two", "three\x85x\x0cy", "", "last"]
    assert count_lines(path) == 5


def test_reader_errors_name_file_and_line(tmp_path: Path) -> None:
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(NmtError, match=rf"invalid UTF-8 at {bad_utf8}:3 \(byte 8"):
        list(read_lines(bad_utf8))
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"a\nb\x00c\n")
    with pytest.raises(NmtError, match=rf"NUL byte .* at {nul}:2"):
        list(read_lines(nul))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(NmtError, match="empty file"):
        count_lines(empty)
    with pytest.raises(NmtError, match="file not found"):
        count_lines(tmp_path / "missing.txt")


def test_read_stream_matches_read_lines(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbfx y\r\n\nz"
    path = tmp_path / "s.txt"
    path.write_bytes(data)
    with open(path, "rb") as stream:
        assert list(read_stream(stream, "<stdin>")) == list(read_lines(path)) == ["x y", "", "z"]


@pytest.mark.parametrize("final_newline", [True, False])
def test_line_chunks_cover_the_file_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, final_newline: bool) -> None:
    monkeypatch.setattr(reader, "_BLOCK", 7)  # force line starts to straddle read blocks
    lines = [f"line {i} " + "x" * (i % 5) for i in range(23)]
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    assert count_lines(path) == 23
    # Naive truth: offsets from the lengths of the lines.
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    starts[-1] = path.stat().st_size
    assert line_start_offsets(path, list(range(24))) == starts
    for k in (1, 2, 3, 5, 23, 40):
        chunks = line_chunks(path, 23, k)
        assert sum(c.num_lines for c in chunks) == 23
        read_back = [line for chunk in chunks for line in read_lines(path, chunk)]
        assert read_back == lines
        assert [c.first_line for c in chunks] == [1 + sum(c.num_lines for c in chunks[:i]) for i in range(len(chunks))]


def test_errors_in_a_chunk_report_the_real_line_number(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_bytes(b"a\nb\nc\nd\xfe\ne\n")
    chunks = line_chunks(path, 5, 2)
    assert chunks[1] == Chunk(start=4, end=path.stat().st_size, first_line=3, num_lines=3)
    with pytest.raises(NmtError, match=r"d.txt:4"):
        list(read_lines(path, chunks[1]))


def test_block_reading_equals_reading_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Random bytes dense in newlines, CRs, BOMs, NULs and broken UTF-8, read in blocks of a few
    # bytes (lines straddle blocks) and in chunks; the reference splits on b"\n" and decodes
    # one line at a time. Both the lines yielded and the first error must agree.
    def collect(lines: Iterator[str]) -> list[object]:
        out: list[object] = []
        try:
            out.extend(lines)
        except NmtError as error:
            out.append(str(error))
        return out

    def line_by_line(data: bytes, chunk: Chunk) -> Iterator[str]:
        raw = data[chunk.start : chunk.end]
        if chunk.start == 0 and raw.startswith(reader.BOM):
            raw = raw[len(reader.BOM) :]
        raw_lines = raw.split(b"\n")
        if raw.endswith(b"\n"):
            raw_lines.pop()
        for i, raw_line in enumerate(raw_lines):
            yield reader.decode_line(raw_line, path, chunk.first_line + i)

    atoms = [b"a", b"bc", b" ", b"\n", b"\n", b"\r", b"\r\n", reader.BOM, "\u00fc\u20ac".encode(), b"\xc3", b"\x00", b"\xff"]
    weights = [5, 5, 3, 4, 4, 1, 2, 1, 2, 0.1, 0.05, 0.05]
    rng = random.Random(5)
    path = tmp_path / "r.txt"
    for _ in range(500):
        data = rng.choice([b"", reader.BOM]) + b"".join(rng.choices(atoms, weights, k=rng.randint(1, 40)))
        path.write_bytes(data)
        monkeypatch.setattr(reader, "_LINES_BLOCK", rng.choice([1, 2, 3, 5, 8, 1 << 20]))
        num_lines = count_lines(path)
        for k in (1, 2, 5):
            for chunk in line_chunks(path, num_lines, k):
                assert collect(read_lines(path, chunk)) == collect(line_by_line(data, chunk)), (data, chunk)


# --- tokenizer ----------------------------------------------------------------------------


def test_control_characters_become_spaces_when_normalizing() -> None:
    import unicodedata

    controls = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]
    tokenizer = Tokenizer(TokenizerSettings("moses", "en"))
    for control in controls:
        assert tokenizer.tokenize(f"ab{control}cd") == "ab cd", repr(control)


def test_moses_tokenizer_known_output() -> None:
    tokenizer = Tokenizer(TokenizerSettings("moses", "en"))
    # Hand-checked against Moses tokenizer.perl -no-escape.
    assert tokenizer.tokenize('He said: "It\'s 3.5 & fine, isn\'t it?"') == 'He said : " It \'s 3.5 & fine , isn \'t it ? "'
    assert tokenizer.tokenize("  A-B   test\tx ") == "A-B test x"
    assert tokenizer.tokenize(" \t ") == ""
    aggressive = Tokenizer(TokenizerSettings("moses", "en", aggressive_dash_splits=True))
    assert aggressive.tokenize("A-B") == "A @-@ B"


@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_normalization_equals_sacremoses(lang: str) -> None:
    from sacremoses import MosesPunctNormalizer

    reference = MosesPunctNormalizer(lang=lang)
    tokenizer = Tokenizer(TokenizerSettings("moses", lang))
    samples = ["„Ja“, sagte er – 1.000,5 € « oui » ...", "  It’s  ``quoted''  (1 ,5 %) ", "a\u00a0:\u00a0b ; «x»"]
    for line in samples + random_sentences(30):
        assert tokenizer.normalize(line) == reference.normalize(line)


@pytest.mark.parametrize("lang", ["en", "de", "fr", "cs"])
def test_normalization_prefilter_equals_applying_every_rule(lang: str) -> None:
    # Lines made of the rules' own texts (what each must contain, what each writes) and sample
    # matches, so that every reachable rule changes many lines; the reference applies every rule
    # unconditionally, as sacremoses does.
    from sacremoses import MosesPunctNormalizer

    reference = MosesPunctNormalizer(lang=lang)
    rules = [(re.compile(pattern), replacement) for pattern, replacement in reference.substitutions]
    pieces = {required_text(pattern, replacement) for pattern, replacement in rules} | {r for _, r in rules}
    pieces |= set("".join(pattern + replacement for pattern, replacement in reference.substitutions))
    pieces |= set("aZ09 .,\"'\u00a0\t<%") | {"1\u00a02", "a‘b", "x’y", '.."', "5 %"}
    pieces = sorted(pieces)
    tokenizer = Tokenizer(TokenizerSettings("moses", lang))
    rng = random.Random(lang)
    for _ in range(3000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        controls_to_spaces = re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", line)
        assert tokenizer.normalize(line) == reference.normalize(controls_to_spaces), repr(line)


@pytest.mark.parametrize("lang, aggressive", [("en", False), ("de", False), ("fr", True)])
def test_tokenize_equals_stock_sacremoses(lang: str, aggressive: bool) -> None:
    # Words ending in "." anywhere (nonbreaking prefixes, numeric-only ones, initials, dot runs),
    # followed by lowercase, uppercase or digits: every branch of the nonbreaking-prefix step;
    # commas, apostrophes and hyphens, which the prefiltered sacremoses rules need; and every
    # kind of whitespace between them. The references are sacremoses' own classes.
    # (Few lines: sacremoses spends ~1 ms on each word ending in "." that is not last.)
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, moses = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    prefixes = sorted(moses.NONBREAKING_PREFIXES)[::7] + sorted(moses.NUMERIC_ONLY_PREFIXES)
    words = [p + "." for p in prefixes] + ["dog.", "Dog.", "a.b.", "U.S.", "x..", "...", ".", "5", "12.", "\u00fc", "Ab", "cd"]
    words += [",", "a,", "5,300", "1,", ",x", "'", "'s", "it's", "l'eau", "5's", "x'", "dog.'", "A-B", "-", "5-6"]
    spaces = ["", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u2028", "\x85"]
    options = {"escape": False, "aggressive_dash_splits": aggressive, "return_str": True}
    fast_moses = _MosesTokenizer(lang)
    tokenizer = Tokenizer(TokenizerSettings("moses", lang, aggressive_dash_splits=aggressive))
    rng = random.Random(lang)
    for _ in range(1000):
        line = "".join(rng.choice(spaces) + rng.choice(words) for _ in range(rng.randint(1, 6))) + rng.choice(["", ".", " .", "!"])
        assert fast_moses.tokenize(line, **options) == moses.tokenize(line, **options), repr(line)
        stock = moses.tokenize(normalizer.normalize(re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", line)), **options)
        assert tokenizer.tokenize(line) == " ".join(stock.split()), repr(line)


def test_printable_text_has_no_whitespace_but_spaces() -> None:
    # What lets the tokenizer skip collapsing whitespace (`\s+` -> " ") in printable text.
    every_character = "".join(map(chr, range(0x110000)))
    whitespace = re.findall(r"\s", every_character)
    assert len(whitespace) > 20 and [c for c in whitespace if c.isprintable()] == [" "]


def test_required_text_of_rules() -> None:
    def required(pattern: str, replacement: str) -> str:
        return required_text(re.compile(pattern), replacement)

    assert required(r"\) ([.!:?;,])", r")\g<1>") == ") "
    assert required(r"(\d) %", r"\g<1>%") == " %"
    assert required(r"([^a-z])[,]", r"\1 , ") == ","  # a one-character class is a plain character
    assert required(" +", " ") == "  "  # one space is replaced by itself
    assert required(" +", "_") == ""
    assert required("a|b", "c") == ""  # nothing every match contains: always applied
    assert required("(?i)x", "y") == ""


def test_punctuation_normalization_can_be_switched_off() -> None:
    on = Tokenizer(TokenizerSettings("moses", "de", normalize_punctuation=True))
    off = Tokenizer(TokenizerSettings("moses", "de", normalize_punctuation=False))
    assert on.tokenize("„Ja“") == '" Ja "'
    assert off.tokenize("„Ja“") == "„ Ja “"


def test_none_tokenizer_only_canonicalizes_whitespace() -> None:
    tokenizer = Tokenizer(TokenizerSettings("none", "en", normalize_punctuation=False))
    assert tokenizer.tokenize("  a,b \t c. ") == "a,b c."
    assert tokenizer.detokenize(["a,b", "c."]) == "a,b c."


def test_moses_detokenize_inverts_tokenize_on_plain_text() -> None:
    tokenizer = Tokenizer(TokenizerSettings("moses", "en"))
    for line in random_sentences(200) + ["Hello, world!", "It's (really) \"quoted\" here."]:
        assert tokenizer.detokenize(tokenizer.tokenize(line).split()) == line


def test_tokenizer_settings_validate_and_round_trip_through_meta() -> None:
    with pytest.raises(NmtError, match="unknown tokenizer"):
        TokenizerSettings("spacy", "en")
    settings = TokenizerSettings("moses", "fr", normalize_punctuation=False, aggressive_dash_splits=True)
    assert TokenizerSettings.from_meta(settings.to_meta(), "fr") == settings


# --- cleaning -----------------------------------------------------------------------------


def test_drop_reason_follows_clean_corpus_n() -> None:
    settings = CleanSettings(min_len=1, max_len=10, max_ratio=3.0)
    assert drop_reason(0, 5, settings) == EMPTY
    assert drop_reason(4, 0, settings) == EMPTY
    assert drop_reason(11, 10, settings) == TOO_LONG
    assert drop_reason(10, 10, settings) is None
    assert drop_reason(3, 9, settings) is None  # ratio exactly 3 is kept, as in Moses (>)
    assert drop_reason(3, 10, settings) == RATIO
    assert drop_reason(10, 3, settings) == RATIO
    assert drop_reason(1, 2, CleanSettings(min_len=2)) == TOO_SHORT
    # clean-corpus-n keeps a pair when each side's length is >= min and <= max: both bounds are kept.
    assert drop_reason(2, 5, CleanSettings(min_len=2)) is None
    assert drop_reason(5, 2, CleanSettings(min_len=2)) is None
    assert drop_reason(1, 1, CleanSettings(min_len=1, max_len=1)) is None
    assert drop_reason(3, 3, CleanSettings(min_len=3, max_len=3)) is None
    assert drop_reason(2, 3, CleanSettings(min_len=3, max_len=3)) == TOO_SHORT
    assert drop_reason(4, 3, CleanSettings(min_len=3, max_len=3)) == TOO_LONG
    with pytest.raises(NmtError):
        CleanSettings(max_ratio=0.5)


# --- BPE ----------------------------------------------------------------------------------


def test_bpe_round_trips_tokenized_lines_and_is_deterministic(tmp_path: Path) -> None:
    tokenizer = Tokenizer(TokenizerSettings("moses", "en"))
    lines = [tokenizer.tokenize(line) for line in random_sentences(400)]
    learn_bpe(iter(lines), tmp_path / "a.model", vocab_size=150, sample_size=300, seed=3)
    learn_bpe(iter(lines), tmp_path / "b.model", vocab_size=150, sample_size=300, seed=3)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    bpe = BpeModel(tmp_path / "a.model")
    assert bpe.size() == 150
    assert bpe.encode_lines(lines + [""]) == [bpe.encode(line) for line in lines + [""]]
    unseen = "Zebra qüx , unseen wörds ."
    for line in lines + [unseen, ""]:
        pieces = bpe.encode(line)
        assert bpe.decode(pieces) == line
        assert all(" " not in piece for piece in pieces)
    assert bpe.encode("ab ab")[0].startswith("\u2581")


def test_bpe_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(NmtError, match="too large for this training text"):
        learn_bpe(iter(["a b c"] * 5), tmp_path / "m.model", vocab_size=5000, sample_size=0, seed=1)
    with pytest.raises(NmtError, match="BPE model not found"):
        BpeModel(tmp_path / "nope.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(NmtError, match="not a sentencepiece model"):
        BpeModel(junk)


def test_learn_bpe_reraises_the_error_of_its_input(tmp_path: Path) -> None:
    # sentencepiece wraps an exception of the sentence iterator in its own, traceback included.
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"good line\n" * 5 + b"bad \xff\xfe bytes here\n")
    with pytest.raises(NmtError) as caught:
        learn_bpe(read_lines(bad), tmp_path / "m.model", vocab_size=20, sample_size=0, seed=1)
    assert str(caught.value) == f"invalid UTF-8 at {bad}:6 (byte 5 of the line)"

    def interrupted() -> Iterator[str]:
        yield "a b c"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        learn_bpe(interrupted(), tmp_path / "m.model", vocab_size=20, sample_size=0, seed=1)
    with pytest.raises(NmtError, match="no text to learn BPE from"):
        learn_bpe(iter(["", ""]), tmp_path / "m.model", vocab_size=20, sample_size=0, seed=1)
    assert not (tmp_path / "m.model").exists()


def pieces_of(model: Path) -> set[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    return {sp.id_to_piece(i) for i in range(sp.get_piece_size())}


def test_bpe_learns_from_lines_longer_than_sentencepieces_default(tmp_path: Path) -> None:
    # sentencepiece skips lines over 4192 bytes unless told otherwise; "ß" and "ö" occur only in long ones.
    long_line = " ".join(["größe"] * 1000)
    assert len(long_line.encode()) > 4192
    learn_bpe(iter(["a b c ab"] * 50 + [long_line] * 2), tmp_path / "mixed.model", vocab_size=20, sample_size=0, seed=1)
    assert {"ß", "ö", "▁größe"} <= pieces_of(tmp_path / "mixed.model")
    learn_bpe(iter([long_line] * 2), tmp_path / "long.model", vocab_size=12, sample_size=0, seed=1)  # not "no text"
    assert {"ß", "ö"} <= pieces_of(tmp_path / "long.model")


def test_a_line_longer_than_sentencepiece_takes_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its limit (1 GiB) made small: sentencepiece would skip the line without a word.
    monkeypatch.setattr("nmt_cli.text.bpe.MAX_SENTENCE_BYTES", 100)
    with pytest.raises(NmtError) as caught:
        learn_bpe(iter(["a b"] * 20 + ["ü" * 60]), tmp_path / "m.model", vocab_size=8, sample_size=0, seed=1)
    assert str(caught.value) == ("a line of this training text has 120 bytes, more than sentencepiece learns from "
                                 "(100); split or drop it")
    assert not (tmp_path / "m.model").exists()
    learn_bpe(iter(["a b"] * 20 + ["ü" * 50]), tmp_path / "m.model", vocab_size=8, sample_size=0, seed=1)  # 100 bytes


def test_bpe_sizes_no_text_can_take_are_named_by_their_flags(tmp_path: Path) -> None:
    lines = ["ab ba", "abc"] * 10
    # The least that works: a piece per character (a, b, c and ▁) and <unk>, <s>, </s>.
    learn_bpe(iter(lines), tmp_path / "m.model", vocab_size=7, sample_size=0, seed=1)
    assert len(pieces_of(tmp_path / "m.model")) == 7
    with pytest.raises(NmtError) as caught:
        learn_bpe(iter(lines), tmp_path / "m.model", vocab_size=6, sample_size=0, seed=1, size_flag="--bpe-size",
                  text="the de training text")
    assert str(caught.value) == ("--bpe-size 6 is too small for the de training text: it needs at least 7, a piece "
                                 "for each of its 4 distinct characters (▁, which starts each word, included) and 3 "
                                 "for <unk>, <s>, </s>")
    for size in (4, 2, 0):  # fewer than any text needs
        with pytest.raises(NmtError, match=f"^--vocab-size {size} is too small: BPE needs at least 5 pieces"):
            learn_bpe(iter(lines), tmp_path / "m.model", vocab_size=size, sample_size=0, seed=1)
    for sample in (-1, 1, 100):
        with pytest.raises(NmtError, match=f"^--bpe-sample must be 0 \\(all sentences\\) or at least 101 .*got {sample}"):
            learn_bpe(iter(lines), tmp_path / "m.model", 7, sample, 1, sample_flag="--bpe-sample")
    learn_bpe(iter(lines), tmp_path / "m.model", vocab_size=7, sample_size=101, seed=1)
    with pytest.raises(NmtError, match="^no text to learn BPE from: every line of this training text is empty or blank$"):
        learn_bpe(iter(["  ", "▁ ▁"]), tmp_path / "m.model", vocab_size=20, sample_size=0, seed=1)


# --- TextPipeline -------------------------------------------------------------------------


def test_text_pipeline_from_data_bin(tmp_path: Path) -> None:
    tokenizer = Tokenizer(TokenizerSettings("moses", "en"))
    learn_bpe((tokenizer.tokenize(s) for s in random_sentences(300)), tmp_path / "bpe.model", 120, 0, 1)
    meta = {
        "source_lang": "en",
        "target_lang": "de",
        "tokenizer": {"name": "moses", "normalize_punctuation": True, "aggressive_dash_splits": False},
        "bpe": {"type": "sentencepiece", "model": "bpe.model"},
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    pipeline = TextPipeline.from_data_bin(tmp_path, "en")
    for line in random_sentences(50, seed=9):
        pieces = pipeline.encode(line)
        assert "".join(pieces).replace("\u2581", " ").strip() == tokenizer.tokenize(line)
        assert pipeline.decode(pieces) == line
    with pytest.raises(NmtError, match="language 'fr' is not in"):
        TextPipeline.from_data_bin(tmp_path, "fr")
    with pytest.raises(NmtError, match="no meta.json"):
        TextPipeline.from_data_bin(tmp_path / "missing", "en")


def test_text_pipeline_without_tokenizer_or_bpe(tmp_path: Path) -> None:
    meta = {"source_lang": "en", "target_lang": "de", "tokenizer": {"name": "none", "normalize_punctuation": False}, "bpe": None}
    (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    pipeline = TextPipeline.from_data_bin(tmp_path, "de")
    assert pipeline.encode(" das@@ ist  gut ") == ["das@@", "ist", "gut"]
    assert pipeline.decode(["das@@", "ist", "gut"]) == "das@@ ist gut"


def test_text_pipeline_with_subword_nmt_codes_and_escaping(tmp_path: Path) -> None:
    (tmp_path / "bpe.codes").write_text("#version: 0.2\nl o\nlo w</w>\n", encoding="utf-8")
    meta = {
        "source_lang": "en",
        "target_lang": "de",
        "tokenizer": {"name": "moses", "normalize_punctuation": False, "aggressive_dash_splits": True, "escape": True},
        "bpe": {"type": "subword_nmt", "codes": "bpe.codes", "separator": "@@"},
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    pipeline = TextPipeline.from_data_bin(tmp_path, "en")
    # "low": l o w</w> -> lo w</w> -> low</w>; "lower": only (l, o) applies.
    assert pipeline.encode("low lower") == ["low", "lo@@", "w@@", "e@@", "r"]
    # Moses splits "&" off and escapes it to "&amp;"; no codes merge its characters.
    assert pipeline.encode("a&b") == ["a", "&@@", "a@@", "m@@", "p@@", ";", "b"]
    assert pipeline.decode(pipeline.encode('low lower, "a" & b.')) == 'low lower, "a" & b.'


def test_the_subword_nmt_cache_stays_bounded_and_segments_as_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream of distinct words (names, numbers) fills the word cache up to its bound, no
    further, and every word is segmented as apply_merges alone segments it."""
    from nmt_cli.text import subword_nmt
    from nmt_cli.text.subword_nmt import SubwordNmtBpe, apply_merges

    monkeypatch.setattr(subword_nmt, "CACHED_WORDS", 50)
    bpe = SubwordNmtBpe.from_text("#version: 0.2\nl o\nlo w</w>\n1 2\n", "bpe.codes")
    words = [f"low{n}" for n in range(400)] + ["lower", "low", "12", "low"] * 30
    largest = 0
    for word in words:
        assert bpe.segment_word(word) == apply_merges(word, bpe.merge_ranks, bpe.version)
        largest = max(largest, len(bpe._cache))
    assert largest == 50
    assert bpe.encode("low lower 121") == ["low", "lo@@", "w@@", "e@@", "r", "12@@", "1"]
