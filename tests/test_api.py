"""The Python API (`nmt_cli.load`): the same translations as `nmt translate`, one per input, in order."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from model_utils import ct2_installed

import nmt_cli
from nmt_cli.cli import main
from nmt_cli.errors import NmtError
from test_translate import FAST, generated_sentences, nmt, one_thread, run_dir  # noqa: F401 (fixtures)

OPTIONS = {"beam": 3, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 5}
FLAGS = ["--beam", "3", "--lenpen", "0.6", *FAST]


@pytest.fixture(scope="module")
def model(run_dir):
    return nmt_cli.load(run_dir, threads=1)  # a run directory: its checkpoint_best.pt


def cli_lines(run_dir, texts: list[str], *flags: str) -> list[str]:
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *flags, input="".join(t + "\n" for t in texts))
    assert result.exit_code == 0, result.output
    return result.stdout.split("\n")[:-1]


def test_api_equals_the_cli_on_the_same_input_and_options(model, run_dir):
    texts = generated_sentences(30, seed=7) + ["", "   "]
    expected = cli_lines(run_dir, texts, *FLAGS)
    assert len(expected) == len(texts)
    assert model.translate(texts, **OPTIONS) == expected
    # The options are per call: the default settings (beam 5) give the CLI's default output.
    assert model.translate(texts, max_len_a=1.0, max_len_b=5) == cli_lines(run_dir, texts, *FAST)
    assert expected[-2:] == ["", ""] and any(expected[:-2])


def test_nbest_and_scores_equal_the_cli_jsonl(model, run_dir):
    texts = generated_sentences(6, seed=8)
    records = [json.loads(line) for line in cli_lines(run_dir, texts, *FLAGS, "--nbest", "3", "--output-format", "jsonl")]
    results = model.translate_scored(texts, nbest=3, **OPTIONS)
    for record, result in zip(records, results, strict=True):
        assert [h.text for h in result.hypotheses] == [h["hyp"] for h in record["nbest"]]
        assert [h.score for h in result.hypotheses] == pytest.approx([h["score"] for h in record["nbest"]], abs=1e-6)
        assert result.text == record["hyp"] and result.score == pytest.approx(record["score"], abs=1e-6)
    assert model.translate_scored([""])[0].hypotheses == () and model.translate_scored([""])[0].text == ""


def test_threads_sharing_a_model_each_get_their_own_translations(model):
    texts = generated_sentences(24, seed=9)
    alone = [model.translate([t], **OPTIONS)[0] for t in texts]
    got: dict[int, list[str]] = {}

    def client(k: int) -> None:
        got[k] = model.translate(texts[k::4], **OPTIONS)

    workers = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for k in range(4):
        assert got[k] == alone[k::4]


def test_sampling_with_a_seed_gives_what_nmt_translate_gives_at_every_call(model, run_dir):
    """Each call samples from --seed's start, as a run of `nmt translate` does, whatever the
    calls before it sampled."""
    texts = generated_sentences(6, seed=19)
    expected = cli_lines(run_dir, texts, *FAST, "--sampling", "--beam", "1", "--seed", "7")
    calls = [model.translate(texts, sampling=True, beam=1, seed=7, max_len_a=1.0, max_len_b=5) for _ in range(3)]
    assert calls == [expected] * 3


def test_bad_input_is_a_clear_error(model, run_dir, tmp_path):
    with pytest.raises(TypeError, match="not a single string"):
        model.translate("a sentence")
    with pytest.raises(TypeError, match="item 2 is int"):
        model.translate(["a", 3])
    with pytest.raises(ValueError, match="item 1 has a line break"):
        model.translate(["two\nlines"])
    with pytest.raises(ValueError, match="item 1 is not valid Unicode"):
        model.translate(["a \ud800"])
    with pytest.raises(TypeError, match="unknown decoding option"):
        model.translate(["a"], beam_size=2)
    with pytest.raises(NmtError, match="--nbest must be between 1 and --beam"):
        model.translate(["a"], beam=2, nbest=3)
    with pytest.raises(NmtError, match="--min-len 64 exceeds the model's longest output, 63 tokens"):
        model.translate(["a"], min_len=64, max_len_b=100)
    # Options of the wrong type are refused by name, not left to fail inside torch (or, for
    # a switch, taken as on): the CLI's click converts them, the API's caller does not.
    for options, message in (({"beam": 2.5}, "--beam must be an integer (got float 2.5)"),
                             ({"beam": True}, "--beam must be an integer (got bool True)"),
                             ({"sampling": "no"}, "--sampling must be True or False (got str 'no')"),
                             ({"lenpen_style": None}, "--lenpen-style must be a string (got NoneType None)"),
                             ({"temperature": "1"}, "--temperature must be a number (got str '1')")):
        with pytest.raises(NmtError, match=re.escape(message)):
            model.translate(["a"], **options)
    assert model.translate(["a"], lenpen=1, max_len_a=1, max_len_b=5) == model.translate(
        ["a"], lenpen=1.0, max_len_a=1.0, max_len_b=5)  # an int is a number
    with pytest.raises(NmtError, match=re.escape("--max-tokens must be an integer or None (got float 10.5)")):
        nmt_cli.load(run_dir, max_tokens=10.5)
    with pytest.raises(TypeError, match="path must be a str or a Path"):
        nmt_cli.load(None)
    with pytest.raises(NmtError, match="without checkpoint_best.pt or checkpoint_last.pt"):
        nmt_cli.load(tmp_path)
    with pytest.raises(NmtError, match="not found"):
        nmt_cli.load(tmp_path / "missing.pt")


@ct2_installed
def test_the_ctranslate2_engine_takes_per_call_settings_and_refuses_what_it_cannot_do(run_dir, tmp_path):
    export = tmp_path / "ct2"
    exported = CliRunner().invoke(main, ["export", "--format", "ctranslate2", str(run_dir), str(export)])
    assert exported.exit_code == 0, exported.output
    texts = generated_sentences(8, seed=18)
    model = nmt_cli.load(export, engine="ctranslate2", threads=1)
    flags = ("--engine", "ctranslate2", "--path", str(export), "--beam", "3", "--nbest", "2", "--lenpen", "0.6", *FAST)
    result = nmt(*flags, "--output-format", "jsonl", input="".join(t + "\n" for t in texts))
    assert result.exit_code == 0, result.output
    expected = [[h["hyp"] for h in json.loads(line)["nbest"]] for line in result.stdout.splitlines()]
    got = model.translate_scored(texts, beam=3, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=5)
    assert [[h.text for h in r.hypotheses] for r in got] == expected
    with pytest.raises(NmtError, match="--unk-penalty needs --engine nmt"):
        model.translate(texts, unk_penalty=1.0)


def test_import_nmt_cli_does_not_import_torch():
    code = "import sys, nmt_cli; assert callable(nmt_cli.Model) and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
