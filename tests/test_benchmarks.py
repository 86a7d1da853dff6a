"""The benchmark scripts, nmt's side alone, at tiny sizes on the CPU.

They measure nothing here; they must run from their README commands and print what
they claim: one line per system, and ratios that are the quotients of those lines'
figures. (The peers are installed by the benchmarks themselves and are not run here.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"([\d,]+(?:\.\d+)?)"


def run_benchmark(script: str, *args: str) -> list[str]:
    """stdout lines of benchmarks/`script` run with `args` on one CPU thread; it must succeed."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{script} failed:\n{result.stderr[-3000:]}"
    return result.stdout.splitlines()


def figure(text: str) -> float:
    return float(text.replace(",", ""))


def line_starting(lines: list[str], prefix: str) -> str:
    """The one line that starts with `prefix` (a system's name then two spaces: its result line)."""
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, f"expected one line starting {prefix!r} in:\n" + "\n".join(lines)
    return found[0]


def decode_rates(line: str) -> tuple[int, float, float]:
    """A decode_throughput.py system line -> (sentences, sentences/s, target tokens/s)."""
    match = re.search(rf"(\d+) sentences in +{NUMBER} s: +{NUMBER} sentences/s +{NUMBER} target tokens/s", line)
    assert match, line
    return int(match[1]), figure(match[3]), figure(match[4])


def printed_ratio(line: str) -> float:
    match = re.search(rf": {NUMBER}x", line)
    assert match, line
    return figure(match[1])


DECODE_TINY = ("--arch", "transformer_tiny", "--vocab", "100", "--sentences", "12", "--batch-size", "8",
               "--skip-peer", "--threads", "1")


def test_decode_throughput_counts_the_forced_tokens_of_each_search() -> None:
    lines = run_benchmark("decode_throughput.py", *DECODE_TINY, "--tgt-len", "4")
    for name in ("nmt beam4", "nmt greedy"):
        sentences, per_s, tokens_per_s = decode_rates(line_starting(lines, name + "  "))
        assert sentences == 12
        # Every output is forced to 4 tokens and </s>.
        assert tokens_per_s == pytest.approx(5 * per_s, rel=0.01, abs=1)
    assert "skipped (--skip-peer)" in line_starting(lines, "hf beam4")


def test_decode_throughput_fixed_shape_steps_on_varied_lengths() -> None:
    lines = run_benchmark("decode_throughput.py", *DECODE_TINY, "--tgt-len-from-source", "--cuda-graphs")
    _, eager, _ = decode_rates(line_starting(lines, "nmt beam4  "))
    for name in ("graphed model", "--cuda-graphs"):
        sentences, per_s, _ = decode_rates(line_starting(lines, f"nmt beam4 {name}  "))
        assert sentences == 12
        ratio = printed_ratio(line_starting(lines, f"ratio nmt {name} / nmt beam4"))
        assert ratio == pytest.approx(per_s / eager, abs=0.011 + 0.01 * ratio)


def test_train_throughput_ratio_is_the_quotient_of_its_lines() -> None:
    lines = run_benchmark("train_throughput.py", "--arch", "transformer_tiny", "--device", "cpu", "--batch-size", "8",
                          "--seq-len", "8", "--vocab", "100", "--steps", "2", "--warmup", "1", "--systems", "nmt,torch")
    rates = {}
    for name in ("nmt", "torch.nn.Transformer"):
        match = re.match(rf"{re.escape(name)} +{NUMBER} target tok/s", line_starting(lines, name + "  "))
        assert match, lines
        rates[name] = figure(match[1])
    ratio = printed_ratio(line_starting(lines, "ratio nmt / best peer (torch.nn.Transformer)"))
    assert ratio == pytest.approx(rates["nmt"] / rates["torch.nn.Transformer"], abs=0.006)
    assert line_starting(lines, "ratio nmt / hardware limit")


def test_attention_kernels_time_torch_choice_with_and_without_masks() -> None:
    lines = run_benchmark("attention_kernels.py", "--device", "cpu", "--batch-size", "8", "--steps", "2",
                          "--warmup", "1", "--heads", "4")
    timed = [line for line in lines if re.search(r" [\d.]+ us per call ", line)]
    assert any(line.startswith("no mask   flash") for line in timed), lines
    match = re.search(rf"{NUMBER} ms with key masks, {NUMBER} ms without on unpadded batches: {NUMBER}x",
                      line_starting(lines, "per update"))
    assert match, lines
    assert figure(match[3]) == pytest.approx(figure(match[1]) / figure(match[2]), abs=0.01 + 0.01 * figure(match[3]))


def test_encoder_padding_times_both_ways_at_each_share_of_pads() -> None:
    lines = run_benchmark("encoder_padding.py", "--arch", "transformer_tiny", "--vocab", "50", "--batch-size", "4",
                          "--length", "6", "--pad-shares", "0,0.25", "--repeats", "2")
    for share in ("0%", "25%"):
        packed = figure(re.search(rf" {NUMBER} ms", line_starting(lines, f"nmt token rows, {share} pads  "))[1])
        padded = figure(re.search(rf" {NUMBER} ms", line_starting(lines, f"padded, {share} pads  "))[1])
        ratio = printed_ratio(line_starting(lines, f"ratio nmt / best peer (padded), {share} pads"))
        # The times are printed to 0.01 ms and the ratio to 0.01: on a fast CPU this tiny
        # model's times are well under 1 ms, and their rounding moves their ratio by more than 1%.
        rounding = 0.005 + 1.05 * ratio * (0.005 / padded + 0.005 / packed)
        assert ratio == pytest.approx(padded / packed, abs=rounding + 0.001)


def test_loss_speed_prints_a_ratio_per_precision() -> None:
    lines = run_benchmark("loss_speed.py", "--rows", "64", "--vocab", "100", "--repeats", "1", "--threads", "1")
    for precision in ("fp32", "bf16"):
        assert printed_ratio(line_starting(lines, f"ratio nmt / best peer (torch F.cross_entropy), {precision} ms")) > 0


def test_preprocess_speed_on_a_small_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "data" / "multi30k"
    corpus.mkdir(parents=True)
    words = {"en": "a man in a red shirt rides his bike down the street".split(),
             "de": "ein mann in einem roten hemd fährt mit dem fahrrad die straße".split()}
    for lang, vocab in words.items():
        lines = [" ".join(vocab[(i + j) % len(vocab)] for j in range(3 + i % 7)) + " ." for i in range(150)]
        (corpus / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = run_benchmark("preprocess_speed.py", "--lines", "300", "--workers", "1,2", "--bpe-size", "40",
                          "--systems", "nmt", "--data-dir", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work"))
    assert line_starting(lines, "# 300 Multi30k En-De train pairs")
    for workers in ("1 worker", "2 workers"):
        match = re.match(rf"nmt \({workers}\) +{NUMBER} lines/s", line_starting(lines, f"nmt ({workers})"))
        assert match and figure(match[1]) > 0, lines
    # The binarized corpus is there, one entry per pair.
    assert any((tmp_path / "work").rglob("*.bin")), sorted(p.name for p in (tmp_path / "work").rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", [(), ("--direct",)])
def test_corpus_scale_plans_what_train_plans_and_projects_its_own_growth(tmp_path: Path, mode: tuple) -> None:
    lines = run_benchmark("corpus_scale.py", "--pairs", "1500", "--base-pairs", "500", "--updates", "1",
                          "--bpe-size", "300", "--work-dir", str(tmp_path), *mode)
    for pairs in ("500", "1,500"):
        plan = re.search(r"\(([\d,]+) batches in", line_starting(lines, f"{pairs:>11} batch plan"))
        # Text mode: cleaning may drop a few generated pairs before training sees them.
        train = re.search(r"\([\d,]+ pairs in ([\d,]+) batches", line_starting(lines, f"{pairs:>11} train start-up"))
        assert plan and train and plan[1] == train[1], lines  # the benchmark's plan is nmt train's
        if not mode:
            assert re.search(r"peak RSS +\d+ MiB", line_starting(lines, f"{pairs:>11} preprocess")), lines
    growth = [line for line in lines if "bytes/pair ->" in line]
    assert len(growth) == 4, lines
    for line in growth:
        match = re.search(r"(-?[\d.]+) bytes/pair -> +(-?[\d.]+) GiB at 36M pairs", line)
        # Both figures are rounded: bytes/pair to 0.05 (0.0017 GiB at 36M pairs), GiB to 0.005.
        rounding = 0.05 * 36e6 / 2**30 + 0.005
        assert match and float(match[2]) == pytest.approx(float(match[1]) * 36e6 / 2**30, abs=rounding), line
