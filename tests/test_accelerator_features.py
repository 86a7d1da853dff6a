"""The features built on translate, on a GPU against the CPU: `--eval-bleu` during
training, `nmt generate`, guided decoding (whose batches take the eager search over
CUDA-graphed model steps), `--engine ctranslate2` and `nmt serve`.

As in tests/test_accelerator.py, every check runs once per device, and on a machine
without CUDA only the CPU rows run, which keeps the checks themselves honest:

    python3 -m pytest -q tests/test_accelerator_features.py
"""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from databin_utils import reversal_pairs, write_data_bin
from fault_utils import tiny_run_dir
from model_utils import ct2_installed

from test_accelerator import DEVICES, exact_float32, nmt, no_tf32_again  # noqa: F401 (exact_float32: autouse)
from test_eval_bleu import EVAL_SEARCH, SEARCH, TINY, corpus, read_log  # noqa: F401 (corpus: a fixture)
from test_translate import generated_sentences, one_thread, run_dir  # noqa: F401 (fixtures)

from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint
from nmt_cli.config import TrainConfig
from nmt_cli.data.pairs import load_data_bin
from nmt_cli.train.eval_bleu import ValidBleu

# test_translate's FAST flags but --device, which each check sets.
SHORT = ("--max-len-a", "1", "--max-len-b", "5", "--threads", "1", "--quiet")

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def translate(run_dir: Path, device: str, *flags: str, stdin: str) -> str:
    return nmt("translate", "--path", run_dir / "checkpoint_best.pt", *SHORT, "--device", device, *flags, stdin=stdin)


@pytest.mark.parametrize("device", DEVICES)
def test_eval_bleu_on_device_scores_the_cpus_translations(device: str, corpus: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    raw, data_bin = corpus
    run = tmp_path / "run"
    on_device = [device if previous == "--device" else flag for previous, flag in zip([""] + TINY, TINY)]
    nmt("train", data_bin, "--save-dir", run, *on_device, "--max-update", "100", "--validate-interval-updates", "100",
        "--validate-interval", "0", "--eval-bleu", *EVAL_SEARCH)
    # Training validated with TF32 products on a GPU (`nmt train` turns them on for fp32):
    # the same weights, settings and batches must give the logged score again.
    logged = read_log(run)[-1]
    assert logged["update"] == 100 and logged["eval_bleu_sentences"] == 24 and logged["bleu"] > 0
    state = load_checkpoint(run / "checkpoint_last.pt")
    model = model_from_checkpoint(state, run / "checkpoint_last.pt").eval()
    cfg = TrainConfig(data=str(data_bin), save_dir=str(run), eval_bleu=True, eval_bleu_beam=2)
    valid_bleu = ValidBleu(cfg, load_data_bin(data_bin), load_data_bin(data_bin).split("valid"),
                           model.cfg.max_source_positions, model.cfg.max_target_positions)
    rescored = valid_bleu.score(model.to(device), torch.device(device), nullcontext, print)
    assert (rescored.bleu, rescored.sentences) == (logged["bleu"], 24)

    # In full float32 the device's --eval-bleu hypotheses are the CPU's translate output.
    no_tf32_again()
    on_the_device = valid_bleu.translate(model, torch.device(device), nullcontext)
    translated = nmt("translate", "--path", run / "checkpoint_last.pt", *SEARCH, "--device", "cpu", "--quiet",
                     stdin=(raw / "valid.en").read_text(encoding="utf-8"))
    assert on_the_device == translated.splitlines()


@pytest.mark.parametrize("device", DEVICES)
def test_generate_on_device_prints_the_cpus_lines(device: str, tmp_path: Path) -> None:
    data_bin = write_data_bin(tmp_path / "bin", {"train": reversal_pairs(20, 0), "test": reversal_pairs(12, 3)})
    checkpoint = tiny_run_dir(data_bin, tmp_path / "run") / "checkpoint_best.pt"
    args = ("generate", data_bin, "--path", checkpoint, "--beam", "3", "--max-len-b", "8")

    def lines(output: str) -> list[str]:  # the per-sentence lines; the summary holds timings
        return [line for line in output.splitlines() if line[:2] in ("S-", "T-", "H-", "D-", "P-")]

    on_cpu = lines(nmt(*args, "--cpu"))
    assert len(on_cpu) == 12 * 5
    assert lines(nmt(*args, *(("--cpu",) if device == "cpu" else ()))) == on_cpu  # without --cpu: the GPU


@pytest.mark.parametrize("device", DEVICES)
def test_guided_decoding_on_device_equals_the_cpu(device: str, run_dir: Path, tmp_path: Path) -> None:
    sources = ["the dog runs", "", "a red ball over green grass", "green grass"]
    (tmp_path / "prefix.txt").write_text("the\n\n\ngrass\n", encoding="utf-8")
    prefixed = ("--prefix-file", str(tmp_path / "prefix.txt"))
    stdin = "".join(s + "\n" for s in sources)
    expected = translate(run_dir, "cpu", *prefixed, stdin=stdin)
    assert len(expected.splitlines()) == 4
    assert translate(run_dir, device, *prefixed, stdin=stdin) == expected
    constrained = "the dog runs\tgrass\nsix\n\na red ball\tdog\tgrass\n"
    expected = translate(run_dir, "cpu", "--constraints", "unordered", stdin=constrained)
    assert translate(run_dir, device, "--constraints", "unordered", stdin=constrained) == expected


@ct2_installed
@pytest.mark.parametrize("device", DEVICES)
def test_the_ctranslate2_engine_on_device_equals_the_cpu(device: str, run_dir: Path, tmp_path: Path) -> None:
    export = tmp_path / "ct2"
    nmt("export", "--format", "ctranslate2", run_dir, export)
    stdin = "".join(s + "\n" for s in generated_sentences(20, seed=21))
    args = ("translate", "--engine", "ctranslate2", "--path", export, "--beam", "4", *SHORT)
    expected = nmt(*args, "--device", "cpu", stdin=stdin)
    assert len(expected.splitlines()) == 20
    assert nmt(*args, "--device", device, stdin=stdin) == expected


@pytest.mark.skipif(importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("starlette") is None,
                    reason="needs pip install 'nmt-cli[serve]'")
@pytest.mark.parametrize("device", DEVICES)
def test_serve_on_device_answers_the_cpus_translations(device: str, run_dir: Path) -> None:
    from test_serve import Server

    texts = generated_sentences(16, seed=22) + [""]
    expected = translate(run_dir, "cpu", "--beam", "3", stdin="".join(t + "\n" for t in texts)).split("\n")[:-1]
    server = Server(run_dir, "--device", device, "--max-wait-ms", "0")
    try:
        status, _, body = server.request("POST", "/v1/translate", {"text": texts, "beam": 3})
        assert status == 200 and body["translations"] == expected, body
    finally:
        server.stop()
