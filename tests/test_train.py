"""`nmt train` end to end on a tiny generated reversal task (CPU, a few seconds each).

Behaviour is checked against independent truth: accumulation equals one big batch,
two DDP processes equal one process with accumulation, a run killed with SIGKILL and
resumed equals an uninterrupted run, and the model learns the task.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from databin_utils import reversal_data_bin, reversal_pairs, write_data_bin

from nmt_cli.checkpoints.format import load_checkpoint
from nmt_cli.cli import main
from nmt_cli.config import parse_betas
from nmt_cli.config import TrainConfig
from nmt_cli.data.pairs import collate, load_data_bin
from nmt_cli.errors import NmtError
from nmt_cli.models import size as size_module
from nmt_cli.models.registry import build_model, resolve_config
from nmt_cli.models.size import check_training_fits, parameter_counts, sinusoid_table_values
from nmt_cli.train import trainer as trainer_module
from nmt_cli.train.distributed import DistInfo
from nmt_cli.train.log import MetricsLog, parse_duration
from nmt_cli.train.master_weights import MasterWeights
from nmt_cli.train.saving import files_to_prune
from nmt_cli.train.step import build_engine, train_update
from nmt_cli.train.window import Window

REPO = Path(__file__).resolve().parents[1]
TINY = ["--arch", "transformer_tiny", "--max-tokens", "256", "--required-batch-size-multiple", "1",
        "--lr", "3e-3", "--warmup-updates", "20", "--log-interval", "5"]
# One thread: exact reproducibility between processes, and no oversubscription on small CI machines.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=240, valid=30)


def run_cli(args: list[str]):
    return CliRunner().invoke(main, ["train", *[str(a) for a in args]], catch_exceptions=False)


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def comparable(record: dict) -> dict:
    """A log record without the fields that depend on wall-clock time."""
    return {k: v for k, v in record.items() if k not in ("wall", "tokens_per_s")}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoint_last.pt")["model"]


# --- learning ---------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_model_learns_reversal(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-tokens", "512", "--dropout", "0",
                      "--max-update", "160", "--validate-interval", "5", "--save-interval", "0"])
    assert result.exit_code == 0, result.output
    valid = records(run, "valid")
    assert valid[0]["nll"] > 3.0  # about log2(24) bits before learning
    assert valid[-1]["nll"] < 1.8, valid
    assert valid[-1]["ppl"] == pytest.approx(2 ** valid[-1]["nll"])
    best = load_checkpoint(run / "checkpoint_best.pt")
    assert best["best_metric"] == pytest.approx(min(r["loss"] for r in valid))
    for name in ("meta.json", "dict.src.txt", "dict.tgt.txt", "config.json"):
        assert (run / name).is_file()
    assert json.loads((run / "config.json").read_text())["arch"] == "transformer_tiny"
    assert "stopped (max_update) after 160 updates" in result.stdout


# --- accumulation and DDP ----------------------------------------------------------------


def make_engine(data_bin: Path, update_freq: int, precision: str = "fp32", compiled: bool = False):
    # adam_eps 1e-6: with 1e-9, Adam turns rounding noise in gradients that are zero in
    # exact arithmetic (attention key biases) into full-size steps, which no tolerance absorbs.
    cfg = TrainConfig(data=str(data_bin), save_dir="unused", arch="transformer_tiny", update_freq=update_freq,
                      lr=1e-2, lr_scheduler="fixed", warmup_updates=0, label_smoothing=0.1, adam_eps=1e-6,
                      precision=precision, compile=compiled)
    model_cfg = resolve_config("transformer_tiny", {"dropout": 0.0})
    data = load_data_bin(data_bin)
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    return build_engine(cfg, model_cfg, len(data.src_dict), len(data.tgt_dict), dist), data.split("train")


@pytest.mark.slow  # importing torch's compiler takes several seconds
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_compiled_run_checkpoints_the_plain_models_weights(data_bin: Path) -> None:
    # Training calls a torch.compile wrapper (wrapping only: nothing is compiled until it
    # runs), whose state dict prefixes every key with "_orig_mod."; what checkpoints hold
    # (Trainer._checkpoint_state) is the engine's plain model.
    engine, _ = make_engine(data_bin, update_freq=1, compiled=True)
    assert all(key.startswith("_orig_mod.") for key in engine.runner.state_dict())
    data = load_data_bin(data_bin)
    plain = build_model(resolve_config("transformer_tiny", {}), len(data.src_dict), len(data.tgt_dict))
    assert list(engine.model.state_dict()) == list(plain.state_dict())


def test_accumulation_equals_one_big_batch(data_bin: Path) -> None:
    batch_a, batch_b = np.arange(0, 7), np.arange(7, 20)  # different lengths and paddings
    accumulated, split = make_engine(data_bin, update_freq=2)
    big, _ = make_engine(data_bin, update_freq=1)
    ntokens = int(split.tgt_sizes[:20].sum())
    grads = {}
    for name, engine in (("accumulated", accumulated), ("big", big)):
        step = engine.optimizer.step
        engine.optimizer.step = lambda step=step, name=name, engine=engine: (
            grads.setdefault(name, [p.grad.clone() for p in engine.model.parameters()]), step())
    for step in range(3):
        stats_acc = train_update(accumulated, split, [batch_a, batch_b], batch_a, ntokens, step)
        stats_big = train_update(big, split, [np.concatenate([batch_a, batch_b])], batch_a, ntokens, step)
        assert stats_acc.loss.item() == pytest.approx(stats_big.loss.item(), rel=1e-5)
        assert stats_acc.grad_norm.item() == pytest.approx(stats_big.grad_norm.item(), rel=1e-4)
    # The gradients of the first update agree; Adam then amplifies rounding noise a little.
    for (name, _), g, h in zip(accumulated.model.named_parameters(), grads["accumulated"], grads["big"]):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-8, msg=name)
    for (name, p), q in zip(accumulated.model.named_parameters(), big.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=3e-5, msg=name)
    # A share shorter than update_freq (end of an epoch) counts only its real batches.
    short, _ = make_engine(data_bin, update_freq=2)
    only_a, _ = make_engine(data_bin, update_freq=1)
    na = int(split.tgt_sizes[batch_a].sum())
    train_update(short, split, [batch_a], batch_b, na, 0)
    train_update(only_a, split, [batch_a], batch_b, na, 0)
    for p, q in zip(short.model.parameters(), only_a.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "pure-bf16"])  # pure-bf16 all-reduces float32 sums itself, without DDP
def test_two_processes_equal_one_with_update_freq_2(tmp_path: Path, data_bin: Path, precision: str) -> None:
    common = [*TINY, "--dropout", "0", "--max-update", "7", "--log-interval", "1", "--validate-interval", "0",
              "--save-interval", "0", "--device", "cpu", "--precision", precision,
              "--ema-decay", "0.5", "--ema-start-update", "2"]  # every rank keeps the EMA; rank 0 saves it
    ddp_run, single_run = tmp_path / "ddp", tmp_path / "single"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), "-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(ddp_run), *common]
    proc = subprocess.run(command, env=SUBPROCESS_ENV, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_cli([data_bin, "--save-dir", single_run, *common, "--update-freq", "2"]).exit_code == 0
    ddp_log, single_log = records(ddp_run, "train"), records(single_run, "train")
    assert len(ddp_log) == len(single_log) == 7
    # The checkpoint holds the plain model's weights, not DDP's "module."-prefixed ones.
    assert list(final_weights(ddp_run)) == list(final_weights(single_run))
    for a, b in zip(ddp_log, single_log):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for (name, p), q in zip(final_weights(ddp_run).items(), final_weights(single_run).values()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    ddp_ema, single_ema = (load_checkpoint(run / "checkpoint_last.pt")["ema"]["weights"] for run in (ddp_run, single_run))
    for name, p in ddp_ema.items():
        torch.testing.assert_close(p, single_ema[name], rtol=1e-4, atol=1e-6, msg=name)


# --- resume -----------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_and_resume_equals_uninterrupted(tmp_path: Path, data_bin: Path) -> None:
    # Dropout on: the resumed run must also draw the same dropout masks.
    args = [*TINY, "--dropout", "0.1", "--max-update", "40", "--save-interval-updates", "5",
            "--validate-interval-updates", "10", "--keep-interval-updates", "2"]
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(killed), *args]
    proc = subprocess.Popen(command, env=SUBPROCESS_ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        log = killed / "train_log.jsonl"
        if log.is_file() and any(r.get("update", 0) >= 17 for r in map(json.loads, log.read_text().splitlines())):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    interrupted_at = load_checkpoint(killed / "checkpoint_last.pt")["num_updates"]
    assert 15 <= interrupted_at < 40
    resumed = subprocess.run(command, env=SUBPROCESS_ENV, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {killed / 'checkpoint_last.pt'} at update {interrupted_at}" in resumed.stderr

    straight = tmp_path / "straight"
    assert run_cli([data_bin, "--save-dir", straight, *args]).exit_code == 0
    killed_log = (killed / "train_log.jsonl").read_text().splitlines()
    straight_log = (straight / "train_log.jsonl").read_text().splitlines()
    assert [comparable(json.loads(r)) for r in killed_log] == [comparable(json.loads(r)) for r in straight_log]
    for (name, p), q in zip(final_weights(killed).items(), final_weights(straight).values()):
        assert torch.equal(p, q), name
    # Retention: the newest two update checkpoints remain.
    assert sorted(p.name for p in killed.glob("checkpoint_*_*.pt")) == sorted(
        p.name for p in straight.glob("checkpoint_*_*.pt")) and len(list(straight.glob("checkpoint_*_*.pt"))) == 2
    # Re-running a finished run does nothing more.
    again = run_cli([data_bin, "--save-dir", straight, *args])
    assert again.exit_code == 0 and "after 40 updates" in again.stdout


def test_max_time_saves_and_stops(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-time", "0.001", "--max-update", "1000"])
    assert result.exit_code == 0
    assert "stopped (max_time) after 1 updates" in result.stdout
    assert load_checkpoint(run / "checkpoint_last.pt")["num_updates"] == 1


def test_eta_counts_down_to_the_nearest_limit(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "10000000", "--max-time", "2h",
                      "--max-epoch", "1"])
    assert result.exit_code == 0
    etas = re.findall(r"eta (\d+):(\d\d):(\d\d)", result.output)
    assert etas and all(int(h) * 3600 + int(m) * 60 + int(s) <= 7200 for h, m, s in etas)


def test_patience_stops_after_validations_without_improvement(tmp_path: Path, data_bin: Path, monkeypatch) -> None:
    flat = {"loss": 3.0, "nll": 2.9, "ppl": 2**2.9, "tokens": 100}
    monkeypatch.setattr(trainer_module, "evaluate", lambda engine, data, batches: dict(flat))
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--patience", "2", "--validate-interval-updates", "2",
                      "--max-update", "100"])
    assert result.exit_code == 0
    assert "stopped (patience) after 6 updates" in result.stdout
    assert len(records(run, "valid")) == 3


def test_changing_the_best_checkpoint_metric_on_resume_starts_the_best_over(tmp_path: Path, data_bin: Path,
                                                                           monkeypatch) -> None:
    # nll is below loss: a best nll compared with later losses would never be beaten.
    losses = iter([3.0, 2.9, 2.8, 2.7, 2.6, 2.5])
    monkeypatch.setattr(trainer_module, "evaluate",
                        lambda engine, data, batches: (lambda loss: {"loss": loss, "nll": loss - 1, "ppl": 2 ** (loss - 1),
                                                                     "tokens": 100})(next(losses)))
    run = tmp_path / "run"
    args = [data_bin, "--save-dir", run, *TINY, "--validate-interval-updates", "2"]
    assert run_cli([*args, "--max-update", "4", "--best-checkpoint-metric", "nll"]).exit_code == 0
    resumed = run_cli([*args, "--max-update", "8", "--best-checkpoint-metric", "loss", "--patience", "1"])
    assert resumed.exit_code == 0
    assert "--best-checkpoint-metric is now loss (was nll)" in resumed.stderr
    assert "stopped (max_update)" in resumed.stdout
    valid = records(run, "valid")
    first_after = next(i for i, r in enumerate(valid) if r["update"] > 4)
    assert [r["best"] for r in valid[:first_after]] == [r["nll"] for r in valid[:first_after]]
    assert [r["best"] for r in valid[first_after:]] == [r["loss"] for r in valid[first_after:]]  # each one better
    assert load_checkpoint(run / "checkpoint_best.pt")["num_updates"] == 8


def test_resuming_mid_epoch_with_other_batching_says_the_epoch_is_replanned(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    assert run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "1"]).exit_code == 0
    assert load_checkpoint(run / "checkpoint_last.pt")["iterator"]["batches_done"] == 1  # mid-epoch
    same = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "2"])
    assert same.exit_code == 0 and "planned anew" not in same.stderr
    other = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "3", "--seed", "7"])
    assert other.exit_code == 0
    assert "--seed 1 -> 7 since the checkpoint: the rest of epoch 1 is planned anew" in other.stderr
    assert "(give --seed 1 to keep the run's)" in other.stderr


def test_resuming_at_an_epoch_boundary_with_other_batching_says_so_and_how_to_keep_it(tmp_path: Path) -> None:
    """An older nmt capped --batch-size runs at 4096 tokens, and its checkpoints record that
    cap: resumed with the same flags by this nmt, which has no cap there, the epochs to come
    are batched otherwise, which is said with the flag that keeps the run's batches."""
    data = reversal_data_bin(tmp_path / "bin", train=2000, valid=8)
    tiny = ["--arch", "transformer_tiny", "--warmup-updates", "20", "--disable-validation", "--batch-size", "1000"]
    run = tmp_path / "run"
    assert run_cli([data, "--save-dir", run, *tiny, "--max-tokens", "4096", "--max-epoch", "1"]).exit_code == 0
    assert load_checkpoint(run / "checkpoint_last.pt")["iterator"]["batches_done"] == 0  # at the epoch's end
    shutil.copytree(run, tmp_path / "kept")
    resumed = run_cli([data, "--save-dir", run, *tiny, "--max-epoch", "2"])
    assert resumed.exit_code == 0
    assert ("--max-tokens 4096 -> None since the checkpoint: the epochs from here on are batched otherwise than the "
            "run's so far (give --max-tokens 4096 to keep the run's)") in resumed.stderr
    kept = run_cli([data, "--save-dir", tmp_path / "kept", *tiny, "--max-tokens", "4096", "--max-epoch", "2"])
    assert kept.exit_code == 0 and "since the checkpoint" not in kept.stderr


def test_a_fixed_schedule_an_older_nmt_ran_without_warm_up_is_not_warmed_up_on_resume(tmp_path: Path,
                                                                                      data_bin: Path) -> None:
    """An older nmt's --lr-scheduler fixed ignored --warmup-updates: its checkpoints'
    scheduler entry holds no warmup_updates, and their last rate is the constant --lr.
    Resumed within the warm-up this nmt would apply, the rate would drop mid-run, so it is
    refused with the flag that keeps it. One of this schedule (its last rate a warm-up's)
    written before the entry existed resumes."""
    from nmt_cli.checkpoints.format import save_checkpoint

    run = tmp_path / "run"
    fixed = [*TINY, "--lr-scheduler", "fixed", "--warmup-updates", "30"]
    assert run_cli([data_bin, "--save-dir", run, *fixed, "--max-update", "2"]).exit_code == 0
    state = load_checkpoint(run / "checkpoint_last.pt")
    assert state["scheduler"] == {"name": "fixed", "num_updates": 2, "warmup_updates": 30}
    assert run_cli([data_bin, "--save-dir", run, *fixed, "--max-update", "3"]).exit_code == 0  # this nmt's own
    unmarked = load_checkpoint(run / "checkpoint_last.pt")
    unmarked["scheduler"] = {"name": "fixed", "num_updates": unmarked["num_updates"]}
    assert unmarked["optimizer"]["param_groups"][0]["lr"] == pytest.approx(3e-3 * 3 / 30)
    save_checkpoint(unmarked, run / "checkpoint_last.pt")
    assert run_cli([data_bin, "--save-dir", run, *fixed, "--max-update", "4"]).exit_code == 0
    older = load_checkpoint(run / "checkpoint_last.pt")
    older["scheduler"] = {"name": "fixed", "num_updates": older["num_updates"]}
    for group in older["optimizer"]["param_groups"]:
        group["lr"] = 3e-3  # the constant rate it trained at
    save_checkpoint(older, run / "checkpoint_last.pt")
    refused = run_cli([data_bin, "--save-dir", run, *fixed, "--max-update", "5"])
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "whose --lr-scheduler fixed kept the constant --lr without warm-up" in refused.stderr
    assert "give --warmup-updates 0 to go on as the run began" in refused.stderr
    constant = run_cli([data_bin, "--save-dir", run, *TINY, "--lr-scheduler", "fixed", "--warmup-updates", "0",
                        "--max-update", "5", "--log-interval", "1"])
    assert constant.exit_code == 0, constant.stderr
    assert [r["lr"] for r in records(run, "train") if r["update"] == 5] == [pytest.approx(3e-3)]


def test_new_adam_settings_on_resume_are_the_ones_used(tmp_path: Path, data_bin: Path) -> None:
    """As a new --lr does: the loaded optimizer state keeps its moments, not its settings."""
    run = tmp_path / "run"
    assert run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "1"]).exit_code == 0
    group = load_checkpoint(run / "checkpoint_last.pt")["optimizer"]["param_groups"][0]
    assert (tuple(group["betas"]), group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    resumed = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "2", "--adam-betas", "(0.8, 0.9)",
                       "--adam-eps", "1e-6", "--weight-decay", "0.01"])
    assert resumed.exit_code == 0
    state = load_checkpoint(run / "checkpoint_last.pt")
    assert state["num_updates"] == 2
    for group in state["optimizer"]["param_groups"]:
        assert (tuple(group["betas"]), group["eps"], group["weight_decay"]) == ((0.8, 0.9), 1e-6, 0.01)
    assert tuple(state["train_config"]["adam_betas"]) == (0.8, 0.9)


def test_batch_size_alone_has_no_token_cap_as_in_fairseq(tmp_path: Path) -> None:
    """--max-tokens is 4096 only when --batch-size is not given either; the cap in use is
    what checkpoints record, so a run of the default resumes as it was saved."""
    data = reversal_data_bin(tmp_path / "bin", train=2000, valid=8)  # pairs of 4 to 9 tokens
    tiny = ["--arch", "transformer_tiny", "--warmup-updates", "20", "--disable-validation"]
    by_sentences = tmp_path / "by_sentences"
    result = run_cli([data, "--save-dir", by_sentences, *tiny, "--batch-size", "1000", "--max-update", "1"])
    assert result.exit_code == 0
    assert "train: 2000 pairs in 2 batches" in result.stderr  # 4096 tokens would cap them near 450 pairs
    assert load_checkpoint(by_sentences / "checkpoint_last.pt")["train_config"]["max_tokens"] is None
    by_default = tmp_path / "by_default"
    result = run_cli([data, "--save-dir", by_default, *tiny, "--max-update", "1"])
    assert result.exit_code == 0 and "train: 2000 pairs in 4 batches" in result.stderr
    state = load_checkpoint(by_default / "checkpoint_last.pt")
    assert state["train_config"]["max_tokens"] == 4096 and state["iterator"]["batches_done"] == 1
    resumed = run_cli([data, "--save-dir", by_default, *tiny, "--max-update", "2"])
    assert resumed.exit_code == 0 and "planned anew" not in resumed.stderr


def test_a_model_whose_training_cannot_fit_in_memory_is_refused_before_it_is_built(
        tmp_path: Path, data_bin: Path, monkeypatch) -> None:
    """Training holds 4 float32 copies of the weights (weights, gradients, Adam's moments):
    memory for 3 of them passes the check of build_model, and would be exhausted."""
    model_cfg = resolve_config("transformer_tiny", {})
    data = load_data_bin(data_bin)
    weights = 4 * parameter_counts(model_cfg, len(data.src_dict), len(data.tgt_dict))["total"]
    rest = 4 * sinusoid_table_values(model_cfg) + 10_000 * (model_cfg.encoder_layers + model_cfg.decoder_layers)
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 3 * weights + rest)
    monkeypatch.setattr(trainer_module, "build_engine", lambda *args: pytest.fail("the model was built"))
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "1", "--cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: training this model needs at least 0.0 GB, more than "
                                                     "this machine's 0.0 GB of memory (0.0 GB for its "), errors
    assert errors[0].endswith("; lower --encoder-layers, --decoder-layers, --encoder-embed-dim, --decoder-embed-dim, "
                              "--encoder-ffn-embed-dim or --decoder-ffn-embed-dim")
    assert not list(run.glob("*.pt"))
    # What pure-bf16 (a bf16 copy and its gradients) and an EMA (a float32 copy) add.
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 4 * weights + rest)
    cpu = torch.device("cpu")
    check_training_fits(model_cfg, len(data.src_dict), len(data.tgt_dict), cpu)
    for extra in ({"pure_bf16": True}, {"ema": True}):
        with pytest.raises(NmtError, match="training this model needs at least"):
            check_training_fits(model_cfg, len(data.src_dict), len(data.tgt_dict), cpu, **extra)
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 6 * weights + rest)
    check_training_fits(model_cfg, len(data.src_dict), len(data.tgt_dict), cpu, pure_bf16=True, ema=True)


def test_a_big_models_training_names_what_needs_the_memory(monkeypatch) -> None:
    monkeypatch.setattr(size_module, "physical_memory_bytes", lambda: 10 * 10**9)
    model_cfg = resolve_config("transformer_tiny", {"encoder_layers": 100000})
    parameters = parameter_counts(model_cfg, 100, 100)["total"]
    size_module.check_model_fits(model_cfg, 100, 100)  # its weights alone (3.4 GB) fit
    with pytest.raises(NmtError) as refused:
        check_training_fits(model_cfg, 100, 100, torch.device("cpu"), pure_bf16=True)
    assert str(refused.value) == (
        "training this model needs at least 18.1 GB, more than this machine's 10.0 GB of memory "
        f"(13.7 GB for its {parameters:,} parameters' float32 weights, gradients and Adam's two moments, "
        "3.4 GB for the bf16 working copy and its gradients (--precision pure-bf16), 1.0 GB for its position "
        "tables and torch modules); lower --encoder-layers, --decoder-layers, --encoder-embed-dim, "
        "--decoder-embed-dim, --encoder-ffn-embed-dim or --decoder-ffn-embed-dim")


@pytest.mark.parametrize("flags", [["--fp16"], ["--precision", "fp16"], ["--precision", "fp16", "--device", "cpu"]])
def test_fp16_training_on_a_cpu_is_refused(tmp_path: Path, data_bin: Path, monkeypatch, flags: list[str]) -> None:
    """fp16 autocast runs many times slower than fp32 on a CPU; translate refuses it too."""
    monkeypatch.setattr(trainer_module.distributed, "default_device", lambda cuda="cuda": "cpu")  # no GPU
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "1", *flags])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: --precision fp16 needs --device cuda (this training runs on the CPU: "
                      "use --precision bf16 or fp32 there)"]
    assert not run.exists() or not list(run.glob("*.pt"))


def test_an_update_is_validated_once_even_at_the_end_of_an_epoch(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--validate-interval-updates", "1", "--max-epoch", "2"])
    assert result.exit_code == 0
    assert "in epoch 2;" in result.stdout  # the last epoch done, not the next one
    updates = [r["update"] for r in records(run, "valid")]
    assert updates == list(range(1, load_checkpoint(run / "checkpoint_last.pt")["num_updates"] + 1))


@pytest.mark.parametrize("precision", ["fp32", "pure-bf16"])
def test_out_of_memory_update_is_skipped(tmp_path: Path, data_bin: Path, monkeypatch, precision: str) -> None:
    real_update = trainer_module.train_update

    def run_with_oom_in_update_2(run: Path, after_a_backward_pass: bool) -> list[torch.Tensor]:
        calls, weights_at_oom = [], []

        def flaky_update(engine, split, shares, *rest):
            calls.append(1)
            if len(calls) == 2:
                weights_at_oom.extend(p.detach().clone() for p in engine.model.parameters())
                if after_a_backward_pass:  # its gradients must not reach the next update
                    batch = collate(split, shares[0])
                    engine.runner(batch.src_tokens, batch.prev_output_tokens, batch.target)[0].backward()
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return real_update(engine, split, shares, *rest)

        monkeypatch.setattr(trainer_module, "train_update", flaky_update)
        result = CliRunner().invoke(main, ["train", str(data_bin), "--save-dir", str(run), *TINY, "--max-update", "4",
                                           "--precision", precision])
        assert result.exit_code == 0, result.output
        assert "out of GPU memory in update 2; skipped" in result.stderr
        assert len(calls) == 5 and load_checkpoint(run / "checkpoint_last.pt")["num_updates"] == 4
        return weights_at_oom

    weights_at_oom = run_with_oom_in_update_2(tmp_path / "run", after_a_backward_pass=True)
    run_with_oom_in_update_2(tmp_path / "clean", after_a_backward_pass=False)
    final, clean = final_weights(tmp_path / "run"), final_weights(tmp_path / "clean")
    for (name, p), q, before in zip(final.items(), clean.values(), weights_at_oom):
        assert torch.equal(p, q), name
        assert not torch.equal(p, before), name  # the updates after the skipped one still train

    monkeypatch.setattr(trainer_module, "train_update", lambda *args: (_ for _ in ()).throw(torch.OutOfMemoryError()))
    result = CliRunner().invoke(main, ["train", str(data_bin), "--save-dir", str(tmp_path / "run2"), *TINY])
    assert result.exit_code == 1 and "error: out of GPU memory 5 updates in a row" in result.stderr


def test_fp16_overflow_skips_the_step_and_is_counted(data_bin: Path) -> None:
    engine, split = make_engine(data_bin, update_freq=1, precision="fp16")
    # A loss scale so large that the scaled gradients overflow: the scaler must skip the step.
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)
    before = [p.detach().clone() for p in engine.model.parameters()]
    batch = np.arange(0, 8)
    stats = train_update(engine, split, [batch], batch, int(split.tgt_sizes[batch].sum()), 0)
    assert not torch.isfinite(stats.grad_norm)
    assert all(torch.equal(p, q) for p, q in zip(engine.model.parameters(), before))
    assert engine.scaler.get_scale() == 2.0**119
    window = Window.start(torch.device("cpu"))
    window.add(stats, 10, 1, fp16=True)
    stats = train_update(engine, split, [batch], batch, int(split.tgt_sizes[batch].sum()), 1)
    window.add(stats, 10, 2, fp16=True)
    totals = window.totals(engine.dist)
    assert totals.overflows == 2 and totals.grad_norm == 0.0  # both skipped: no finite norm to average
    # Overflows are not errors in fp16.
    window.raise_if_not_finite(fp16=True, dist=engine.dist, last_checkpoint=Path("checkpoint_last.pt"))


def test_bf16_training_runs_on_cpu(tmp_path: Path, data_bin: Path) -> None:
    result = run_cli([data_bin, "--save-dir", tmp_path / "run", *TINY, "--precision", "bf16", "--max-update", "5"])
    assert result.exit_code == 0, result.output
    assert all(np.isfinite(r["loss"]) for r in records(tmp_path / "run", "train"))


def test_pure_bf16_checkpoints_hold_float32_weights_and_resume_exactly(tmp_path: Path, data_bin: Path) -> None:
    common = [*TINY, "--dropout", "0.1", "--log-interval", "1", "--validate-interval", "0"]
    args = [*common, "--precision", "pure-bf16"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli([data_bin, "--save-dir", straight, *args, "--max-update", "6"]).exit_code == 0
    assert run_cli([data_bin, "--save-dir", resumed, *args, "--max-update", "3"]).exit_code == 0
    result = run_cli([data_bin, "--save-dir", resumed, *args, "--max-update", "6"])
    assert result.exit_code == 0 and "at update 3" in result.stderr
    assert [comparable(r) for r in records(resumed, "train")] == [comparable(r) for r in records(straight, "train")]
    weights = final_weights(straight)
    assert {w.dtype for w in weights.values()} == {torch.float32}  # the master weights, not their bf16 rounding
    for (name, p), q in zip(weights.items(), final_weights(resumed).values()):
        assert torch.equal(p, q), name
    # The checkpoint is the same as under autocast (float32 weights and Adam state): a run
    # may go on in another precision.
    result = run_cli([data_bin, "--save-dir", straight, *common, "--precision", "bf16", "--max-update", "7"])
    assert result.exit_code == 0 and "at update 6" in result.stderr


def test_master_weights_keep_tied_parameters_tied() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight
    master = MasterWeights(model)
    assert len(master.master_params) == len(master.working_params) == 2  # the tied matrix and the bias
    assert master.working[1].weight is master.working[0].weight
    assert master.master_grads.numel() == 10 * 4 + 10
    tokens = torch.tensor([1, 2, 3])
    for first in (True, False):  # the second pass adds to the first: twice the gradient
        master.working(tokens).float().square().sum().backward()
        master.collect_gradients(first=first)
    expected = copy.deepcopy(model).to(torch.bfloat16)
    expected(tokens).float().square().sum().backward()
    for p, q in zip(model.parameters(), expected.parameters()):
        assert torch.equal(p.grad, 2 * q.grad.float())
    assert not master.working_grads.any()


@pytest.mark.parametrize("warmup, expected", [
    ([], [3e-3, 3e-3, 3e-3]),  # fixed warms up only where --warmup-updates is given, as fairseq's
    (["--warmup-updates", "2"], [1.5e-3, 3e-3, 3e-3]),
    (["--warmup-updates", "4000"], [3e-3 / 4000, 6e-3 / 4000, 9e-3 / 4000]),  # nmt's default value, given
])
def test_fixed_schedule_warms_up_only_over_warmup_updates_given(tmp_path: Path, data_bin: Path, warmup: list[str],
                                                               expected: list[float]) -> None:
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens", "256",
                      "--lr-scheduler", "fixed", "--lr", "3e-3", *warmup, "--log-interval", "1", "--max-update", "3",
                      "--disable-validation"])
    assert result.exit_code == 0, result.output
    assert [r["lr"] for r in records(run, "train")] == pytest.approx(expected, rel=1e-12)
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["warmup_updates"] == (int(warmup[1]) if warmup else 0)


def test_finetune_from_and_reset_optimizer(tmp_path: Path, data_bin: Path) -> None:
    first = tmp_path / "first"
    assert run_cli([data_bin, "--save-dir", first, *TINY, "--max-update", "3"]).exit_code == 0
    tuned = tmp_path / "tuned"
    # A vanishing learning rate: one update leaves the fine-tuned weights where they started.
    result = run_cli([data_bin, "--save-dir", tuned, *TINY, "--max-update", "1", "--lr-scheduler", "fixed",
                      "--lr", "1e-20", "--finetune-from", first / "checkpoint_last.pt"])
    assert result.exit_code == 0 and "fine-tuning from the weights of" in result.stderr
    state = load_checkpoint(tuned / "checkpoint_last.pt")
    assert state["num_updates"] == 1
    for (name, p), q in zip(state["model"].items(), final_weights(first).values()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=name)
    # --reset-optimizer keeps weights and progress, drops the Adam moments.
    result = run_cli([data_bin, "--save-dir", first, *TINY, "--max-update", "4", "--reset-optimizer"])
    assert result.exit_code == 0 and "--reset-optimizer: fresh optimizer state" in result.stderr
    resumed = load_checkpoint(first / "checkpoint_last.pt")
    assert resumed["num_updates"] == 4
    assert all(int(s["step"]) == 1 for s in resumed["optimizer"]["state"].values())


# --- bad input --------------------------------------------------------------------------


def assert_one_error(result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and fragment in lines[-1], result.stderr
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in result.stderr


def test_bad_data_bin(tmp_path: Path, data_bin: Path) -> None:
    no_valid = write_data_bin(tmp_path / "novalid", {"train": reversal_pairs(20, 0)})
    assert_one_error(run_cli([no_valid, "--save-dir", tmp_path / "r1", *TINY]), "no 'valid' split")
    assert_one_error(run_cli([data_bin, "-s", "fr", "--save-dir", tmp_path / "r2", *TINY]), "no language 'fr'")
    assert_one_error(run_cli([tmp_path / "absent", "--save-dir", tmp_path / "r3", *TINY]), "not found")


def test_resume_refuses_other_data_or_architecture(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    assert run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "2"]).exit_code == 0
    other_dict = write_data_bin(tmp_path / "other", {"train": reversal_pairs(20, 0), "valid": reversal_pairs(5, 1)})
    (other_dict / "dict.tgt.txt").write_text("zz 5\n" + (other_dict / "dict.tgt.txt").read_text())
    assert_one_error(run_cli([other_dict, "--save-dir", run, *TINY, "--max-update", "4"]), "another tgt dictionary")
    other_pair = write_data_bin(tmp_path / "pair", {"train": reversal_pairs(20, 0), "valid": reversal_pairs(5, 1)},
                                src="en", tgt="de")
    assert_one_error(run_cli([other_pair, "--save-dir", run, *TINY, "--max-update", "4"]), "trained on src-tgt")
    assert_one_error(run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "4", "--encoder-layers", "3"]),
                     "encoder_layers=2 (flags: 3)")


def test_corrupt_checkpoint_is_an_error_not_a_restart(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    assert_one_error(run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "2"]), "checkpoint_last.pt")
    assert (run / "checkpoint_last.pt").read_bytes() == b"not a checkpoint"


def test_unwritable_save_dir(tmp_path: Path, data_bin: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_error(run_cli([data_bin, "--save-dir", blocker / "run", *TINY]), "cannot write to --save-dir")


def test_nan_loss_names_the_update(tmp_path: Path, data_bin: Path) -> None:
    result = run_cli([data_bin, "--save-dir", tmp_path / "run", *TINY, "--lr-scheduler", "fixed", "--lr", "1e30",
                      "--max-update", "30"])
    assert_one_error(result, "loss became NaN/inf at update")


def test_bad_flags() -> None:
    assert_one_error(run_cli(["x", "--save-dir", "y", "--adam-betas", "0.9"]), "--adam-betas")
    assert_one_error(run_cli(["x", "--save-dir", "y", "--max-time", "5 parsecs"]), "--max-time")
    assert_one_error(run_cli(["x", "--save-dir", "y", "--update-freq", "0"]), "--update-freq must be >= 1")


# --- small pure helpers --------------------------------------------------------------------


def test_parsers_and_retention() -> None:
    assert parse_betas("(0.9, 0.98)") == parse_betas("0.9 0.98") == (0.9, 0.98)
    assert parse_duration("15m") == 900 and parse_duration("2h") == 7200 and parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90.0
    with pytest.raises(NmtError):
        parse_duration("2 hours")
    names = ["checkpoint1.pt", "checkpoint10.pt", "checkpoint2.pt", "checkpoint_1_5.pt", "checkpoint_2_15.pt",
             "checkpoint_2_10.pt", "checkpoint_last.pt", "checkpoint_best.pt"]
    assert sorted(files_to_prune(names, keep_last_epochs=2, keep_interval_updates=1)) == [
        "checkpoint1.pt", "checkpoint_1_5.pt", "checkpoint_2_10.pt"]
    assert files_to_prune(names, -1, -1) == []


def test_metrics_log_resumes_at_the_checkpoints_record(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    path.write_text("".join(f'{{"update": {i}}}\n' for i in range(5)) + '{"upd')  # killed mid-append
    log = MetricsLog(path, enabled=True, keep_records=3)
    assert path.read_text().splitlines() == ['{"update": 0}', '{"update": 1}', '{"update": 2}']
    assert log.missing_records == 0
    assert MetricsLog(path, enabled=True, keep_records=4).missing_records == 1
    assert path.read_text().count("\n") == 3


@pytest.mark.parametrize("last, kept", [('{"update": 2}', 3), ('{"update": 2, "lo', 2), (b'{"update": 2, "\xc3', 2)])
def test_an_unended_last_record_is_ended_or_left_out_before_appending(tmp_path: Path, last, kept) -> None:
    """A crash or a full disk may cut the last write short of its line feed. Appending to
    that line would join the next record onto it: the log would be unreadable from there."""
    path = tmp_path / "train_log.jsonl"
    whole = "".join(f'{{"update": {i}}}\n' for i in range(2)).encode()
    path.write_bytes(whole + (last if isinstance(last, bytes) else last.encode()))
    log = MetricsLog(path, enabled=True, keep_records=5)
    assert log.missing_records == 5 - kept
    log.write({"update": 5})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["update"] for r in records] == [*range(kept), 5]


def test_metrics_log_killed_while_cutting_keeps_every_record(tmp_path: Path, monkeypatch) -> None:
    # A kill between opening the file for writing and writing it once emptied the log.
    path = tmp_path / "train_log.jsonl"
    text = "".join(f'{{"update": {i}}}\n' for i in range(5))
    path.write_text(text)

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("nmt_cli.staging.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        MetricsLog(path, enabled=True, keep_records=3)
    assert path.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["train_log.jsonl"]


def test_a_run_removes_what_killed_runs_left_in_its_save_dir(tmp_path: Path, data_bin: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dead = 4194305  # above Linux's largest pid: no such process
    # A numbered checkpoint this run never writes, a log cut and a write probe that were killed.
    leftovers = [f".checkpoint_1_700.pt.{dead}.tmp", f".train_log.jsonl.{dead}.tmp", f".write-test.0a1b2c3d.{dead}.tmp"]
    kept = [f".checkpoint_1_700.pt.{os.getpid()}.tmp",  # a live process's: not ours to remove
            f".notes.{dead}", f"notes.{dead}.tmp", ".notes.tmp"]  # not our temporary files
    for name in leftovers + kept:
        (run / name).write_text("partial")
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "1"])
    assert result.exit_code == 0, result.output
    hidden = sorted(p.name for p in run.iterdir() if p.name.startswith(".") or p.name.startswith("notes"))
    assert hidden == sorted(kept)


def test_help_documents_every_option() -> None:
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0
    for flag in ("--max-tokens", "--update-freq", "--lr-scheduler", "--label-smoothing", "--precision",
                 "--save-interval-updates", "--max-time", "--patience", "--finetune-from", "--dropout", "torchrun"):
        assert flag in result.output


@pytest.mark.parametrize("changes, message", [
    ({"disable_validation": True, "patience": 2},
     "--patience follows the validations, and --disable-validation turns them off; drop one"),
    ({"disable_validation": True, "keep_best_checkpoints": 2},
     "--keep-best-checkpoints follows the validations, and --disable-validation turns them off; drop one"),
    ({"tensorboard_logdir": ""}, "--tensorboard-logdir is empty"),
    ({"disable_validation": True, "validate_interval_updates": 2},
     "--validate-interval-updates sets the validations, and --disable-validation turns them off; drop one"),
    ({"disable_validation": True, "best_checkpoint_metric": "nll"}, "--best-checkpoint-metric sets the validations"),
    ({"disable_validation": True, "valid_subset": "test"}, "--valid-subset sets the validations"),
    ({"eval_bleu_beam": 4}, "--eval-bleu-beam is a setting of --eval-bleu: add --eval-bleu, or drop it"),
    ({"eval_bleu_chrf": True}, "--eval-bleu-chrf is a setting of --eval-bleu"),
    ({"eval_bleu_args": '{"beam": 4}'}, "--eval-bleu-args is a setting of --eval-bleu"),
    ({"eval_tokenized_bleu": True}, "--eval-tokenized-bleu is a setting of --eval-bleu"),
    ({"eval_bleu_subset_lines": 5}, "--eval-bleu-subset-lines is a setting of --eval-bleu"),
    ({"eval_bleu_print_samples": True}, "--eval-bleu-print-samples is a setting of --eval-bleu"),
    ({"lr_scheduler": "noam", "warmup_init_lr": 1e-2}, "--warmup-init-lr is inverse_sqrt's; --lr-scheduler noam"),
    ({"lr_scheduler": "fixed", "warmup_init_lr": 1e-2, "warmup_updates": 3}, "--warmup-init-lr is inverse_sqrt's"),
])
def test_options_that_could_never_act_are_refused(data_bin: Path, changes: dict, message: str) -> None:
    """Each trained to the end with exit status 0, and the option did nothing."""
    with pytest.raises(NmtError, match=re.escape(message)):
        TrainConfig(data=str(data_bin), save_dir="unused", arch="transformer_tiny", **changes)


def test_each_save_interval_updates_checkpoint_is_validated_as_in_fairseq(tmp_path: Path, data_bin: Path) -> None:
    """fairseq validates at every mid-epoch save: its checkpoint_best.pt, --patience and
    --keep-best-checkpoints see them. Only the epoch's end and --validate-interval-updates were."""
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, *TINY, "--max-update", "7", "--save-interval-updates", "3",
                      "--validate-interval", "0", "--cpu"])
    assert result.exit_code == 0, result.output
    assert [r["update"] for r in records(run, "valid")] == [3, 6, 7]  # 7: the last update
    assert sorted(p.name for p in run.glob("checkpoint_*_*.pt")) == ["checkpoint_1_3.pt", "checkpoint_1_6.pt"]


def test_an_updates_loss_and_gradient_are_normalised_by_its_target_tokens(tmp_path: Path, monkeypatch) -> None:
    """One update of `nmt train` on pairs whose sources are much shorter than their targets:
    the logged loss (bits per token) and gradient norm are the naive label-smoothed sum over
    the target tokens (each sentence run alone, unpadded) divided by the hand-counted target
    tokens (words + </s>), not by the source's."""
    rng = np.random.default_rng(3)
    pairs = [([f"w{i}" for i in rng.integers(0, 16, n)], [f"w{i}" for i in rng.integers(0, 16, m)])
             for n, m in [(2, 6), (1, 5), (3, 7), (2, 4), (1, 6)]]
    target_tokens = sum(len(tgt) + 1 for _, tgt in pairs)  # 28 + 5 </s>
    assert target_tokens == 33 and sum(len(src) + 1 for src, _ in pairs) == 14
    data_bin = write_data_bin(tmp_path / "bin", {"train": pairs})
    eps = 0.1
    initial = {}
    real_update = trainer_module.train_update

    def recording_update(engine, *args):
        initial.setdefault("weights", copy.deepcopy(engine.model.state_dict()))
        return real_update(engine, *args)

    monkeypatch.setattr(trainer_module, "train_update", recording_update)
    run = tmp_path / "run"
    result = run_cli([data_bin, "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens", "4096",
                      "--required-batch-size-multiple", "1", "--dropout", "0", "--label-smoothing", eps,
                      "--max-update", "1", "--log-interval", "1", "--disable-validation", "--clip-norm", "0"])
    assert result.exit_code == 0, result.output
    [record] = records(run, "train")

    data = load_data_bin(data_bin)
    model = build_model(resolve_config("transformer_tiny", {"dropout": 0.0}), len(data.src_dict), len(data.tgt_dict))
    model.load_state_dict(initial["weights"])
    model.train()
    total = torch.zeros(())
    for src, tgt in pairs:  # fairseq's label_smoothed_nll_loss, token by token
        src_ids = torch.tensor([data.src_dict.encode(src)])  # </s> appended
        tgt_ids = data.tgt_dict.encode(tgt)
        prev = torch.tensor([[tgt_ids[-1]] + tgt_ids[:-1]])  # </s> first, as fairseq
        lprobs = torch.log_softmax(model(src_ids, prev).float(), dim=-1)[0]  # (T, V)
        V = lprobs.size(-1)
        for t, token in enumerate(tgt_ids):
            nll, smooth = -lprobs[t, token], -lprobs[t].sum()
            total = total + (1 - eps - eps / (V - 1)) * nll + eps / (V - 1) * smooth
    (total / target_tokens).backward()
    grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    assert record["loss"] == pytest.approx(total.item() / target_tokens / np.log(2), rel=1e-5)
    assert record["gnorm"] == pytest.approx(grad_norm.item(), rel=1e-4)


def test_each_update_and_each_rank_draws_its_own_dropout_masks(data_bin: Path) -> None:
    """Engines with the same initial weights run one update on the same batch: its loss
    depends only on the dropout masks, which must be the same for the same (seed, update,
    rank) -- a resumed run redraws them -- and differ between consecutive updates and between
    ranks (else every update, or every rank, would drop the same units)."""
    batch = np.arange(0, 6)

    def first_loss(num_updates: int, rank: int) -> float:
        cfg = TrainConfig(data=str(data_bin), save_dir="unused", arch="transformer_tiny", lr=1e-3,
                          lr_scheduler="fixed", warmup_updates=0, label_smoothing=0.1)
        model_cfg = resolve_config("transformer_tiny", {"dropout": 0.3})
        data = load_data_bin(data_bin)
        dist = DistInfo(rank=rank, world_size=1, local_rank=0, device=torch.device("cpu"))
        engine = build_engine(cfg, model_cfg, len(data.src_dict), len(data.tgt_dict), dist)
        split = data.split("train")
        return train_update(engine, split, [batch], batch, int(split.tgt_sizes[batch].sum()), num_updates).loss.item()

    update_0, update_1, rank_1 = first_loss(0, 0), first_loss(1, 0), first_loss(0, 1)
    assert first_loss(0, 0) == update_0 and first_loss(1, 0) == update_1
    assert len({update_0, update_1, rank_1, first_loss(2, 0), first_loss(1, 1)}) == 5
