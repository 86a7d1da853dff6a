"""The moving average of the weights (`nmt train --ema-decay`, `--use-ema` of translate and average).

Checked against a float64 average computed by hand from the weights each update left in
its checkpoint, against an uninterrupted run after SIGKILLs, and against the same
weights written by hand into a checkpoint's "model".
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from databin_utils import reversal_data_bin
from fault_utils import ForkServer, assert_one_error, model_equal, nmt
from torch import nn

from nmt_cli.checkpoints.format import load_checkpoint, save_checkpoint
from nmt_cli.checkpoints.names import updates_of
from nmt_cli.train.ema import Ema, EmaSettings

TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "5", "--device", "cpu", "--log-interval", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=60, valid=12)


def naive_ema(weights_by_update: list[dict[str, torch.Tensor]], decay: float, start: int, freq: int = 1,
              initial: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The definition, in float64: weights_by_update[n - 1] are the weights after update n."""
    ema = {k: v.double() for k, v in (initial or weights_by_update[0]).items()}
    for n, weights in enumerate(weights_by_update, start=1):
        for key, value in weights.items():
            if n <= start:
                ema[key] = value.double().clone()
            elif n % freq == 0:
                ema[key] = decay * ema[key] + (1 - decay) * value.double()
    return ema


# --- the average itself ----------------------------------------------------------------------


class TiedWithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=True)
        self.out.weight = self.embed.weight  # tied, as shared embeddings are
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))


@pytest.mark.parametrize("freq", [1, 3])
def test_ema_equals_a_float64_reference_with_start_update_and_update_freq(freq: int) -> None:
    torch.manual_seed(0)
    model = TiedWithBuffer()
    initial = {k: v.clone() for k, v in model.state_dict().items() if k != "count"}
    ema = Ema(model, EmaSettings(decay=0.7, start_update=2, update_freq=freq))
    history = []
    for n in range(1, 9):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param))
            model.count.fill_(n)
        ema.after_update(model, n)
        history.append({k: v.clone() for k, v in model.state_dict().items() if k != "count"})
    reference = naive_ema(history, 0.7, 2, freq, initial)
    for key, value in reference.items():
        assert ema.weights[key].dtype == torch.float32
        torch.testing.assert_close(ema.weights[key].double(), value, rtol=1e-6, atol=1e-6, msg=key)
    assert ema.weights["count"].item() == 8  # integer buffers are copied
    assert ema.weights["out.weight"] is ema.weights["embed.weight"]  # tied stays tied


def test_swapping_the_ema_in_and_out_restores_the_model_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = TiedWithBuffer()
    ema = Ema(model, EmaSettings(decay=0.5))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    ema.after_update(model, 1)
    working = TiedWithBuffer().to(torch.bfloat16)  # a pure-bf16 working copy takes it rounded
    for target in (model, working):
        before = {k: v.clone() for k, v in target.state_dict().items()}
        params = list(target.parameters())
        rng = torch.get_rng_state()
        with ema.weights_swapped_into(target):
            for key, value in target.state_dict().items():
                assert torch.equal(value, ema.weights[key].to(value.dtype)), key
        assert model_equal(target.state_dict(), before)
        assert all(a is b for a, b in zip(params, target.parameters()))  # the same tensors: the optimizer's
        assert torch.equal(torch.get_rng_state(), rng)


# --- training ----------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "pure-bf16"])
def test_trained_ema_equals_a_float64_reference_of_the_saved_weights(tmp_path: Path, data_bin: Path,
                                                                      precision: str) -> None:
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--dropout", "0", "--max-update", "6",
                  "--save-interval-updates", "1", "--validate-interval", "0", "--precision", precision,
                  "--ema-decay", "0.6", "--ema-start-update", "2"])
    assert result.exit_code == 0, result.output
    by_update = {updates_of(p.name): p for p in run.glob("checkpoint_*_*.pt")}
    states = [load_checkpoint(by_update[n]) for n in range(1, 7)]
    reference = naive_ema([s["model"] for s in states], 0.6, 2)
    final = states[-1]["ema"]
    assert (final["decay"], final["start_update"], final["update_freq"]) == (0.6, 2, 1)
    assert all(v.dtype == torch.float32 for v in final["weights"].values() if v.is_floating_point())
    for key, value in reference.items():
        torch.testing.assert_close(final["weights"][key].double(), value, rtol=1e-5, atol=1e-6, msg=key)
    # Up to start-update the EMA is the weights themselves.
    assert model_equal(states[1]["ema"]["weights"], states[1]["model"])
    assert not model_equal(final["weights"], states[-1]["model"])


def ema_args(max_update: int) -> list:
    return [*TINY, "--dropout", "0.1", "--max-update", str(max_update), "--save-interval-updates", "2",
            "--validate-interval-updates", "4", "--keep-interval-updates", "2", "--ema-decay", "0.8",
            "--ema-start-update", "3", "--ema-validate"]


def valid_losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "train_log.jsonl").read_text().splitlines())
            if r["type"] == "valid"]


@pytest.mark.slow
def test_sigkill_and_resume_with_ema_equals_an_uninterrupted_run(tmp_path: Path, data_bin: Path) -> None:
    server = ForkServer()
    try:
        straight, killed, plain = tmp_path / "straight", tmp_path / "killed", tmp_path / "plain"
        args = ema_args(16)
        full = server.run(["train", data_bin, "--save-dir", straight, *args], tmp_path / "straight.log")
        assert full.status == 0, (tmp_path / "straight.log").read_text()[-3000:]
        rng = random.Random(7)
        kills = 0
        for attempt in range(12):
            log = tmp_path / f"attempt{attempt}.log"
            result = server.run(["train", data_bin, "--save-dir", killed, *args], log,
                                kill_after=rng.uniform(0.2, max(full.seconds, 0.5)))
            assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
            if not result.killed:
                assert result.status == 0, log.read_text()[-3000:]
                break
            kills += 1
        else:
            final = server.run(["train", data_bin, "--save-dir", killed, *args], tmp_path / "final.log")
            assert final.status == 0, (tmp_path / "final.log").read_text()[-3000:]
        # At least one restart resumed past --ema-start-update, where the EMA is not the weights.
        resumed = [int(m) for log in tmp_path.glob("attempt*.log")
                   for m in re.findall(r"resumed from \S+ at update (\d+)", log.read_text())]
        assert kills >= 1 and max(resumed, default=0) > 3, resumed
        # Validating with the EMA swapped in leaves training alone: the weights are those of
        # the same run without --ema-validate, while its valid losses are the EMA's.
        no_swap = [a for a in args if a != "--ema-validate"]
        assert server.run(["train", data_bin, "--save-dir", plain, *no_swap], tmp_path / "plain.log").status == 0
    finally:
        server.close()
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        a, b = load_checkpoint(killed / name), load_checkpoint(straight / name)
        assert model_equal(a["model"], b["model"]), name
        assert model_equal(a["ema"]["weights"], b["ema"]["weights"]), name
    assert valid_losses(killed) == valid_losses(straight)
    assert model_equal(load_checkpoint(plain / "checkpoint_last.pt")["model"],
                       load_checkpoint(straight / "checkpoint_last.pt")["model"])
    assert valid_losses(plain) != valid_losses(straight)


# --- translate and average ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory, data_bin: Path) -> Path:
    run = tmp_path_factory.mktemp("ema") / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "8", "--save-interval-updates", "4",
                  "--validate-interval", "0", "--ema-decay", "0.5"])
    assert result.exit_code == 0, result.output
    return run


def translate_jsonl(checkpoint: Path, source: str, *extra: str) -> list[dict]:
    result = nmt(["translate", "--path", checkpoint, "--input-format", "bpe", "--output-format", "jsonl",
                  "--beam", "2", "--device", "cpu", *extra], input=source)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_translate_use_ema_equals_a_checkpoint_holding_the_ema_as_its_model(ema_run: Path, data_bin: Path) -> None:
    state = load_checkpoint(ema_run / "checkpoint_last.pt")
    by_hand = ema_run / "ema_as_model.pt"
    save_checkpoint({**{k: v for k, v in state.items() if k != "ema"}, "model": state["ema"]["weights"]}, by_hand)
    symbols = list(state["src_dict"][4:10])  # pieces of the source dictionary (after the specials)
    source = "".join(" ".join(symbols[i:] + symbols[:i]) + "\n" for i in range(4))
    with_ema = translate_jsonl(ema_run / "checkpoint_last.pt", source, "--use-ema")
    assert len(with_ema) == 4
    assert with_ema == translate_jsonl(by_hand, source)
    assert with_ema != translate_jsonl(ema_run / "checkpoint_last.pt", source)


def test_average_use_ema_averages_the_ema_weights(ema_run: Path, tmp_path: Path) -> None:
    paths = sorted(ema_run.glob("checkpoint_*_*.pt"), key=lambda p: updates_of(p.name))  # updates 4 and 8
    assert len(paths) == 2
    emas = [load_checkpoint(p)["ema"]["weights"] for p in paths]
    out = tmp_path / "avg.pt"
    assert nmt(["average", "--inputs", *paths, "--output", out, "--use-ema"]).exit_code == 0
    averaged = load_checkpoint(out)
    assert "ema" not in averaged and "optimizer" not in averaged
    for key, value in averaged["model"].items():
        expected = ((emas[0][key].double() + emas[1][key].double()) / 2).to(value.dtype)
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-7, msg=key)
    single = tmp_path / "ema.pt"
    assert nmt(["average", "--inputs", paths[1], "--output", single, "--use-ema"]).exit_code == 0
    assert model_equal(load_checkpoint(single)["model"], emas[1])


def test_a_checkpoint_without_ema_is_one_error_line_naming_it(ema_run: Path, tmp_path: Path) -> None:
    state = load_checkpoint(ema_run / "checkpoint_last.pt")
    plain = tmp_path / "plain.pt"
    save_checkpoint({k: v for k, v in state.items() if k != "ema"}, plain)
    result = nmt(["translate", "--path", plain, "--input-format", "bpe", "--device", "cpu", "--use-ema"], input="a\n")
    assert_one_error(result.exit_code, result.stderr, str(plain), "no EMA weights")
    result = nmt(["average", "--inputs", plain, "--output", tmp_path / "out.pt", "--use-ema"])
    assert_one_error(result.exit_code, result.stderr, str(plain), "no EMA weights")


@pytest.mark.parametrize("flags, fragment", [
    (["--ema-validate"], "--ema-validate needs --ema-decay"),
    (["--ema-start-update", "5"], "--ema-start-update needs --ema-decay"),
    (["--ema-decay", "1.0"], "--ema-decay must be in (0, 1)"),
    (["--store-ema", "--ema-update-freq", "0"], "--ema-update-freq must be >= 1"),
])
def test_bad_ema_flags_are_one_error_line(tmp_path: Path, data_bin: Path, flags: list[str], fragment: str) -> None:
    result = nmt(["train", data_bin, "--save-dir", tmp_path / "run", *TINY, *flags])
    assert_one_error(result.exit_code, result.stderr, fragment)


def test_resuming_a_checkpoint_without_ema_starts_it_from_the_weights(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    args = [*TINY, "--dropout", "0", "--save-interval-updates", "1", "--validate-interval", "0"]
    assert nmt(["train", data_bin, "--save-dir", run, *args, "--max-update", "3"]).exit_code == 0
    result = nmt(["train", data_bin, "--save-dir", run, *args, "--max-update", "5", "--ema-decay", "0.5"])
    assert result.exit_code == 0, result.output
    assert "holds no EMA weights: the EMA starts from its weights at update 3" in result.stderr
    by_update = {updates_of(p.name): load_checkpoint(p) for p in run.glob("checkpoint_*_*.pt")}
    assert "ema" not in by_update[3]
    reference = naive_ema([by_update[4]["model"], by_update[5]["model"]], 0.5, 0, initial=by_update[3]["model"])
    for key, value in reference.items():
        torch.testing.assert_close(by_update[5]["ema"]["weights"][key].double(), value, rtol=1e-5, atol=1e-6, msg=key)
    # And the other way round: a run without --ema-decay says that it drops the checkpoint's EMA.
    result = nmt(["train", data_bin, "--save-dir", run, *args, "--max-update", "6"])
    assert result.exit_code == 0 and "holds EMA weights but this run keeps none" in result.stderr
    assert "ema" not in load_checkpoint(run / "checkpoint_last.pt")


def test_store_ema_alone_takes_fairseqs_decay_and_ema_decay_implies_it() -> None:
    from nmt_cli.config import TrainConfig

    assert TrainConfig(data="bin", save_dir="run").ema_decay_in_use is None
    assert TrainConfig(data="bin", save_dir="run", store_ema=True).ema_decay_in_use == 0.9999
    assert TrainConfig(data="bin", save_dir="run", ema_decay=0.99).ema_decay_in_use == 0.99
    assert TrainConfig(data="bin", save_dir="run", store_ema=True, ema_decay=0.5).ema_decay_in_use == 0.5
