"""The features built on translate, on a GPU against the CPU: `nmt generate`, guided
decoding (whose batches take the eager search over CUDA-graphed model steps),
`--engine ctranslate2` and `nmt serve`.

As in tests/test_accelerator.py, every check runs once per device, and on a machine
without CUDA only the CPU rows run, which keeps the checks themselves honest:

    python3 -m pytest -q tests/test_accelerator_features.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from databin_utils import reversal_pairs, write_data_bin
from fault_utils import tiny_run_dir
from model_utils import ct2_installed

from test_accelerator import DEVICES, exact_float32, nmt  # noqa: F401 (exact_float32: an autouse fixture)
from test_translate import generated_sentences, one_thread, run_dir  # noqa: F401 (fixtures)

# test_translate's FAST flags but --device, which each check sets.
SHORT = ("--max-len-a", "1", "--max-len-b", "5", "--threads", "1", "--quiet")

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def translate(run_dir: Path, device: str, *flags: str, stdin: str) -> str:
    return nmt("translate", "--path", run_dir / "checkpoint_best.pt", *SHORT, "--device", device, *flags, stdin=stdin)


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
