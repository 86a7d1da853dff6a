"""`nmt score` against independent truth: the `sacrebleu` command line, Perl, hand-counted n-grams.

Hypotheses are references perturbed deterministically (dropped, swapped, replaced
words), on the first lines of newstest2014 German when the shared data is present,
else on generated sentences.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt_cli.cli import main
from nmt_cli.errors import NmtError
from nmt_cli.scoring import tokenized
from nmt_cli.scoring.inputs import looks_like_jsonl

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NUM_LINES = 200  # enough for stable statistics, small enough for TER on two cores


def generated_references(num_lines: int) -> list[str]:
    """German-looking sentences with punctuation, hyphenated compounds and non-ASCII letters."""
    rng = random.Random(7)
    words = ["der", "die", "das", "Haus", "über", "Straße", "schön", "E-Mail", "Euro-Zone", "geht", "nach",
             "Berlin", "Präsident", "sagte", "nicht", "mehr", "„Ja“", "heute", "3,5", "Prozent", "US-Regierung"]
    lines = []
    for _ in range(num_lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 25)))
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ","]))
    return lines


def reference_lines() -> list[str]:
    path = SHARED_DATA / "wmt14_en_de" / "test.de"
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            return [next(f).rstrip("\n") for _ in range(NUM_LINES)]
    return generated_references(NUM_LINES)


def perturb(lines: list[str], seed: int, rate: float) -> list[str]:
    """Drop, swap and replace words with probability `rate` each, deterministically."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        words = [w for w in words if rng.random() >= rate] or words[:1]
        for i in range(len(words) - 1):
            if rng.random() < rate:
                words[i], words[i + 1] = words[i + 1], words[i]
        words = ["Xyz" if rng.random() < rate else w for w in words]
        out.append(" ".join(words))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """ref, a second reference, two systems' outputs and a near-copy of system A."""
    root = tmp_path_factory.mktemp("score")
    refs = reference_lines()
    files = {
        "ref": refs,
        "ref2": perturb(refs, seed=11, rate=0.1),
        "sys_a": perturb(refs, seed=1, rate=0.1),
        "sys_b": perturb(refs, seed=2, rate=0.2),
    }
    files["sys_a_copy"] = list(files["sys_a"])
    files["sys_a_near"] = files["sys_a"][:-1] + [files["sys_b"][-1]]
    paths = {}
    for name, lines in files.items():
        paths[name] = root / f"{name}.txt"
        paths[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def sacrebleu_cli(*args: object, env: dict[str, str] | None = None) -> str:
    """stdout of the real `sacrebleu` command line."""
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *map(str, args)], capture_output=True, text=True, env=full_env, check=True
    )
    return result.stdout


def nmt_score(*args: object, input: str | None = None):
    return CliRunner().invoke(main, ["score", *map(str, args)], input=input)


def ok_output(*args: object, input: str | None = None) -> str:
    result = nmt_score(*args, input=input)
    assert result.exit_code == 0, result.output
    return result.stdout


def single_error_line(result) -> str:
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- sacreBLEU metrics: equal to the sacrebleu CLI, digit for digit ----------------------------


@pytest.mark.parametrize("system", ["sys_a", "sys_b"])
def test_bleu_chrf_ter_text_equals_sacrebleu_cli(corpus, system):
    ours = ok_output("--ref", corpus["ref"], "--hyp", corpus[system], "--metrics", "bleu,chrf,ter")
    theirs = sacrebleu_cli(corpus["ref"], "-i", corpus[system], "-m", "bleu", "chrf", "ter", "-f", "text")
    assert ours == theirs
    assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in ours


def test_two_systems_get_different_scores(corpus):
    a = ok_output("--ref", corpus["ref"], "--hyp", corpus["sys_a"])
    b = ok_output("--ref", corpus["ref"], "--hyp", corpus["sys_b"])
    assert float(a.split(" = ")[1].split()[0]) > float(b.split(" = ")[1].split()[0])


def test_multi_reference_equals_sacrebleu_cli(corpus):
    ours = ok_output("--ref", corpus["ref"], "--ref", corpus["ref2"], "--hyp", corpus["sys_b"], "-m", "bleu,chrf")
    theirs = sacrebleu_cli(corpus["ref"], corpus["ref2"], "-i", corpus["sys_b"], "-m", "bleu", "chrf", "-f", "text")
    assert ours == theirs
    assert "nrefs:2" in ours


def test_tokenize_lowercase_width_equal_sacrebleu_cli(corpus):
    ours = ok_output("-r", corpus["ref"], "-i", corpus["sys_b"], "--tokenize", "intl", "--lowercase", "--width", "3")
    theirs = sacrebleu_cli(corpus["ref"], "-i", corpus["sys_b"], "--tokenize", "intl", "-lc", "-w", "3", "-f", "text")
    assert ours == theirs
    assert "case:lc" in ours and "tok:intl" in ours


def test_hypotheses_from_stdin(corpus):
    ours = ok_output("--ref", corpus["ref"], input=corpus["sys_a"].read_text(encoding="utf-8"))
    assert ours == sacrebleu_cli(corpus["ref"], "-i", corpus["sys_a"], "-f", "text")


def test_json_equals_sacrebleu_cli_json(corpus):
    ours = json.loads(ok_output("-r", corpus["ref"], "-i", corpus["sys_a"], "-m", "bleu,chrf", "--json"))
    theirs = json.loads(sacrebleu_cli(corpus["ref"], "-i", corpus["sys_a"], "-m", "bleu", "chrf", "-f", "json"))
    assert ours == theirs
    assert [r["name"] for r in ours] == ["BLEU", "chrF2"]


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_sentence_level_equals_sacrebleu_cli(corpus, metric):
    ours = ok_output("-r", corpus["ref"], "-i", corpus["sys_b"], "--sentence-level", "-m", metric)
    theirs = sacrebleu_cli(corpus["ref"], "-i", corpus["sys_b"], "--sentence-level", "-m", metric)
    assert ours == theirs
    assert len(ours.splitlines()) == NUM_LINES


def test_sentence_level_json_one_object_per_line(corpus):
    ours = ok_output("-r", corpus["ref"], "-i", corpus["sys_b"], "-sl", "-m", "bleu,chrf", "--json").splitlines()
    bleu = sacrebleu_cli(corpus["ref"], "-i", corpus["sys_b"], "-sl", "-m", "bleu", "-b").split()
    chrf = sacrebleu_cli(corpus["ref"], "-i", corpus["sys_b"], "-sl", "-m", "chrf", "-b").split()
    records = [json.loads(line) for line in ours]
    assert [r["line"] for r in records] == list(range(1, NUM_LINES + 1))
    assert [r["BLEU"] for r in records] == [float(x) for x in bleu]
    assert [r["chrF2"] for r in records] == [float(x) for x in chrf]


# --- JSON lines from `nmt translate` ---------------------------------------------------------------


@pytest.mark.parametrize("field", ["hyp", "text"])
def test_jsonl_hypotheses_score_like_plain_text(corpus, tmp_path, field):
    lines = corpus["sys_a"].read_text(encoding="utf-8").splitlines()
    jsonl = tmp_path / "hyp.jsonl"
    records = [{"line": i, field: line, "score": -1.5} for i, line in enumerate(lines, start=1)]
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    plain = ok_output("-r", corpus["ref"], "-i", corpus["sys_a"])
    assert ok_output("-r", corpus["ref"], "-i", jsonl) == plain  # auto-detected
    assert ok_output("-r", corpus["ref"], "-i", jsonl, "--hyp-format", "jsonl") == plain
    # Read as text, the JSON syntax itself is scored: a different number.
    assert ok_output("-r", corpus["ref"], "-i", jsonl, "--hyp-format", "text") != plain


def test_jsonl_detection():
    assert looks_like_jsonl('{"hyp": "Hallo Welt", "id": 0}')
    assert looks_like_jsonl('{"text": "Hallo"}')
    assert not looks_like_jsonl('{"score": 1}')
    assert not looks_like_jsonl("{Klammer} am Satzanfang")
    assert not looks_like_jsonl("Hallo Welt")


def test_jsonl_bad_record_names_file_and_line(corpus, tmp_path):
    jsonl = tmp_path / "hyp.jsonl"
    jsonl.write_text('{"hyp": "a"}\n{"hyp": "b"}\nnot json\n', encoding="utf-8")
    ref = tmp_path / "ref.txt"
    ref.write_text("a\nb\nc\n", encoding="utf-8")
    line = single_error_line(nmt_score("-r", ref, "-i", jsonl))
    assert f"{jsonl}:3" in line
    jsonl.write_text('{"hyp": "a"}\n{"hyp": "b"}\n{"src": "c"}\n', encoding="utf-8")
    line = single_error_line(nmt_score("-r", ref, "-i", jsonl))
    assert f"{jsonl}:3" in line and "hyp" in line
    # `nmt translate` numbers its records: a lost or reordered one is an error, not a misaligned score.
    jsonl.write_text('{"line": 1, "hyp": "a"}\n{"line": 3, "hyp": "c"}\n{"line": 2, "hyp": "b"}\n', encoding="utf-8")
    line = single_error_line(nmt_score("-r", ref, "-i", jsonl))
    assert f"{jsonl}:2" in line and "out of order" in line


# --- paired bootstrap resampling -----------------------------------------------------------------


PAIRED_P = re.compile(r"\(p = ([0-9.]+)\)")


@pytest.mark.parametrize("seed", [7])
def test_paired_bootstrap_equals_sacrebleu_cli(corpus, seed):
    ours = json.loads(
        ok_output("-r", corpus["ref"], "-i", corpus["sys_a"], "--compare", corpus["sys_b"], "-m", "bleu,chrf",
                  "--seed", seed, "--paired-bs-n", 200, "--json")
    )
    table = sacrebleu_cli(corpus["ref"], "-i", corpus["sys_a"], corpus["sys_b"], "-m", "bleu", "chrf",
                          "--paired-bs", "--paired-bs-n", 200, "-f", "text", "-q", env={"SACREBLEU_SEED": str(seed)})
    their_p = [float(p) for p in PAIRED_P.findall(table)]
    assert [round(r["system"]["p_value"], 4) for r in ours] == their_p
    for r in ours:
        assert 0 < r["system"]["p_value"] <= 1
        assert f"seed:{seed}" in r["signature"] and "bs:200" in r["signature"]
        # Each system's score and bootstrap mean/CI as sacreBLEU prints them in its table.
        for s in (r["baseline"], r["system"]):
            assert f"{s['score']:.1f} ({s['mean']:.1f} ± {s['ci']:.1f})" in table


def test_paired_bootstrap_text_report(corpus):
    out = ok_output("-r", corpus["ref"], "-i", corpus["sys_a"], "--compare", corpus["sys_b"], "--paired-bs-n", 200)
    lines = out.splitlines()
    assert lines[0].startswith("BLEU|nrefs:1|bs:200|seed:12345|")
    assert lines[1].lstrip().startswith(f"baseline {corpus['sys_a']}: ")
    assert lines[2].lstrip().startswith(f"system   {corpus['sys_b']}: ")
    # sys_b has twice the perturbation rate: clearly different.
    assert "p-value = " in lines[2] and "(significant at p < 0.05)" in lines[2]


def test_identical_and_nearly_identical_systems_are_not_significant(corpus):
    same = json.loads(ok_output("-r", corpus["ref"], "-i", corpus["sys_a"], "--compare", corpus["sys_a_copy"],
                                "--paired-bs-n", 200, "--json"))
    assert same[0]["system"]["p_value"] == 1.0
    assert same[0]["system"]["score"] == same[0]["baseline"]["score"]
    near = json.loads(ok_output("-r", corpus["ref"], "-i", corpus["sys_a"], "--compare", corpus["sys_a_near"],
                                "--paired-bs-n", 200, "--json"))
    assert 0.05 < near[0]["system"]["p_value"] <= 1


# --- tokenized BLEU (multi-bleu.perl) with compound splitting --------------------------------------


def test_compound_split_matches_perl_one_liner_semantics():
    # Non-overlapping matches, left to right: in `a-b-c` only the first hyphen is split.
    assert tokenized.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert tokenized.compound_split("state-of-the-art") == "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art"
    assert tokenized.compound_split("- x y- -z ü-ö") == "- x y- -z ü ##AT##-##AT## ö"


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_compound_split_equals_perl_on_real_text(corpus):
    lines = tokenized.moses_tokenize(corpus["ref"].read_text(encoding="utf-8").splitlines(), "de")
    assert sum("##AT##" in tokenized.compound_split(line) for line in lines) > 0  # the test splits something
    perl = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"})
    assert perl.stdout.splitlines() == [tokenized.compound_split(line) for line in lines]


# Two sentences, counted by hand (after compound splitting):
#   hyp1 "the well ##AT##-##AT## known cat sat"       (6 tokens)
#   ref1 "the well ##AT##-##AT## known cat sat down"  (7 tokens): every hyp n-gram matches:
#        1-grams 6/6, 2-grams 5/5, 3-grams 4/4, 4-grams 3/3
#   hyp2 "a x ##AT##-##AT## y b" (5 tokens), ref2 "a x y b" (4 tokens):
#        1-grams a x y b = 4/5; 2-grams "a x", "y b" = 2/4; 3-grams 0/3; 4-grams 0/2
#   -> 10/11, 7/9, 4/7, 3/5; hyp_len 11, ref_len 7 + 4 = 11, BP = 1
HAND_HYPS = ["the well-known cat sat", "a x-y b"]
HAND_REFS = ["the well-known cat sat down", "a x y b"]


def test_tokenized_bleu_with_compound_split_hand_counted(tmp_path):
    stats = tokenized.multi_bleu(
        [tokenized.compound_split(h) for h in HAND_HYPS], [[tokenized.compound_split(r) for r in HAND_REFS]]
    )
    assert stats.correct == (10, 7, 4, 3) and stats.total == (11, 9, 7, 5)
    assert (stats.hyp_len, stats.ref_len) == (11, 11)
    expected = 100 * (10 / 11 * 7 / 9 * 4 / 7 * 3 / 5) ** 0.25
    assert stats.score == pytest.approx(expected, abs=1e-12)
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(HAND_HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(HAND_REFS) + "\n", encoding="utf-8")
    out = ok_output("-r", ref, "-i", hyp, "--tokenized-bleu", "--already-tokenized", "--compound-split")
    assert out.splitlines()[-1].endswith(
        f"= {expected:.2f}, 90.9/77.8/57.1/60.0 (BP=1.000, ratio=1.000, hyp_len=11, ref_len=11)"
    )
    assert "compound-split:yes" in out.splitlines()[-1]


def test_tokenized_bleu_without_compound_split_hand_counted():
    # hyp2 "a x-y b" has no matching 2-gram in "a x y b": 2-grams 4+0 of 3+2, so BLEU is 0 (no smoothing).
    stats = tokenized.multi_bleu(HAND_HYPS, [HAND_REFS])
    assert stats.correct == (6, 3, 2, 1) and stats.total == (7, 5, 3, 1)
    assert (stats.hyp_len, stats.ref_len) == (7, 9)
    assert stats.brevity_penalty == pytest.approx(math.exp(1 - 9 / 7))
    assert stats.score > 0
    assert tokenized.multi_bleu(["a x-y b"], [["a x y b"]]).score == 0.0


def test_tokenized_bleu_is_case_sensitive_and_picks_the_shorter_closest_reference():
    # multi-bleu.perl without -lc: "The" does not match "the".
    assert tokenized.multi_bleu(["The cat"], [["the cat"]]).correct[0] == 1
    # Hypothesis of 3 tokens, references of 2 and 4: equally close, the shorter one counts.
    assert tokenized.multi_bleu(["a b c"], [["a b"], ["a b c d"]]).ref_len == 2


def test_moses_tokenization_then_compound_split(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("Die well-known Katze, sagte er.\n", encoding="utf-8")
    ref.write_text("Die well-known Katze sagte er.\n", encoding="utf-8")
    assert tokenized.moses_tokenize(["Die well-known Katze, sagte er."], "de") == ["Die well-known Katze , sagte er ."]
    out = ok_output("-r", ref, "-i", hyp, "--tokenized-bleu", "--target-lang", "de", "--compound-split")
    # hyp: Die well ##AT##-##AT## known Katze , sagte er .  (9 tokens); ref: the same without "," (8)
    # 1-grams 8/9; 2-grams 6/8 ("Katze ," and ", sagte" miss); 3-grams 4/7; 4-grams 2/6
    expected = 100 * (8 / 9 * 6 / 8 * 4 / 7 * 2 / 6) ** 0.25
    assert f"tok:moses-de|compound-split:yes|smooth:none = {expected:.2f}, 88.9/75.0/57.1/33.3 " in out


def test_tokenized_bleu_equals_sacrebleu_without_tokenizer_on_real_text(corpus):
    """multi-bleu.perl counts == sacreBLEU's counts with tokenize=none, no smoothing, two references."""
    from sacrebleu.metrics import BLEU

    def lines(name):
        return tokenized.moses_tokenize(corpus[name].read_text(encoding="utf-8").splitlines(), "de")

    hyps, refs = lines("sys_b"), [lines("ref"), lines("ref2")]
    ours = tokenized.multi_bleu(hyps, refs)
    theirs = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, refs)
    assert list(ours.correct) == theirs.counts and list(ours.total) == theirs.totals
    assert (ours.hyp_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)


def test_tokenized_bleu_json(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(HAND_HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(HAND_REFS) + "\n", encoding="utf-8")
    results = json.loads(ok_output("-r", ref, "-i", hyp, "--tokenized-bleu", "--already-tokenized",
                                   "--compound-split", "--json"))
    assert [r["name"] for r in results] == ["BLEU", "tokenized-BLEU"]
    assert results[1]["counts"] == [10, 7, 4, 3] and results[1]["totals"] == [11, 9, 7, 5]


# --- bad input: one error line naming the file ------------------------------------------------------


def test_mismatched_line_counts(corpus, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("ein Satz\nzwei Sätze\n", encoding="utf-8")
    line = single_error_line(nmt_score("--ref", corpus["ref"], "--hyp", short))
    assert str(short) in line and str(corpus["ref"]) in line
    assert f"{NUM_LINES}" in line and " 2" in line


def test_empty_file(corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert str(empty) in single_error_line(nmt_score("--ref", corpus["ref"], "--hyp", empty))
    assert str(empty) in single_error_line(nmt_score("--ref", empty, "--hyp", corpus["sys_a"]))


def test_invalid_utf8_names_file_and_line(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    hyp.write_bytes(b"eins\nzwei\ndr\xe9i\n")
    line = single_error_line(nmt_score("--ref", ref, "--hyp", hyp))
    assert f"{hyp}:3" in line and "UTF-8" in line


def test_missing_file(corpus, tmp_path):
    missing = tmp_path / "missing.txt"
    assert str(missing) in single_error_line(nmt_score("--ref", corpus["ref"], "--hyp", missing))
    assert str(missing) in single_error_line(nmt_score("--ref", corpus["ref"], "--hyp", corpus["sys_a"],
                                                       "--compare", missing))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--compound-split"], "--tokenized-bleu"),
        (["--tokenized-bleu"], "--target-lang"),
        (["-m", "bleu,meteor"], "--metrics"),
        (["--sentence-level", "--tokenized-bleu", "--already-tokenized"], "--sentence-level"),
        (["--seed", "0", "--compare", "other.txt"], "--seed"),
    ],
)
def test_bad_option_combinations(corpus, args, message):
    line = single_error_line(nmt_score("--ref", corpus["ref"], "--hyp", corpus["sys_a"], *args))
    assert message in line


def test_library_error_type():
    from nmt_cli.config import ScoreConfig

    with pytest.raises(NmtError):
        ScoreConfig(refs=())
