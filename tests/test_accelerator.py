"""The GPU code paths against the CPU, which the other test modules check against
independent truth (naive references, torch's own modules, fairseq).

Every check runs once per device. On a machine without CUDA only the CPU rows run,
which keeps the checks themselves honest; on a GPU machine the same checks compare
what runs only there (scaled_dot_product_attention's CUDA kernels, fused AdamW, the
search's pinned-memory host copies, bf16 and fp16 autocast, GradScaler, checkpoints
written from GPU tensors, decoding steps replayed as CUDA graphs) with the CPU, or with
a naive reference on the same device (pure-bf16 training):

    python3 -m pytest -q tests/test_accelerator.py
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from databin_utils import reversal_data_bin, reversal_pairs
from model_utils import EOS, SRC_V, TGT_V, padded_batch, tiny_model

from nmt_cli.cli import main
from nmt_cli.config import DecodeConfig, TrainConfig
from nmt_cli.data.dictionary import PAD_ID
from nmt_cli.data.pairs import collate, load_data_bin
from nmt_cli.decode import graphs
from nmt_cli.decode.fixed_search import FixedSearch
from nmt_cli.decode.search import generate
from nmt_cli.models.registry import resolve_config
from nmt_cli.train import loss as loss_module
from nmt_cli.train.distributed import DistInfo
from nmt_cli.train.step import build_engine, train_update

DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(autouse=True)
def exact_float32():
    """Full float32 matrix products on the GPU (TF32 would round inputs to 10 bits); the
    settings are restored after each test.

    Saved and restored by hand: torch exposes these flags as properties of its backend
    objects, which pytest's monkeypatch (9.2 and newer) deletes on undo instead of
    setting back."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def no_tf32_again() -> None:
    """Undo `nmt train`'s TF32 switch (build_engine turns it on for fp32 GPU training)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def source_batch(seed: int, lengths: list[int]) -> torch.Tensor:
    """Random right-padded sources, each ending in `</s>`."""
    tokens = padded_batch(seed, lengths, SRC_V)
    tokens[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = EOS
    return tokens


SRC = source_batch(1, [7, 4, 5, 2])
PREV = padded_batch(2, [6, 6, 6, 6], TGT_V, bos=EOS)


def teacher_forced_log_probs(model: torch.nn.Module, src: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """(B, T, V) in float64 on the CPU: the reference every device is held to."""
    reference = copy.deepcopy(model).cpu().double()
    with torch.no_grad():
        return torch.log_softmax(reference(src, prev), dim=-1)


def decode_all_steps(model, src: torch.Tensor, prev: torch.Tensor, beams: int) -> torch.Tensor:
    """Incremental decoding of `prev`, each sentence's row repeated for `beams` beams:
    (B * beams, T, V) float32 log-probs."""
    encoder_out, cache = model.encode(src), model.new_cache()
    rows = prev.repeat_interleave(beams, dim=0)
    # A graphed step returns the graph's own output memory, which the next replay overwrites.
    steps = [model.decode_step(rows[:, : t + 1], encoder_out, cache).clone() for t in range(rows.size(1))]
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("device", DEVICES)
def test_cached_decoding_on_device_matches_teacher_forcing(device: str) -> None:
    model = tiny_model(3, dtype=torch.float32, normalize_before=True).to(device)
    expected = teacher_forced_log_probs(model, SRC, PREV).repeat_interleave(4, dim=0)
    got = decode_all_steps(model, SRC.to(device), PREV.to(device), beams=4)
    assert got.dtype == torch.float32 and got.device.type == device
    torch.testing.assert_close(got.cpu().double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_decoding_stays_close_to_float32(device: str) -> None:
    model = tiny_model(4, dtype=torch.float32).to(device)
    expected = teacher_forced_log_probs(model, SRC, PREV)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = decode_all_steps(model, SRC.to(device), PREV.to(device), beams=1)
    assert got.dtype == torch.float32  # the search always gets float32 log-probs
    # bf16 keeps 8 significant bits: log-probs of this tiny model move by a few hundredths.
    error = (got.cpu().double() - expected).abs()
    assert 1e-4 < error.max() < 0.1 and error.mean() < 0.02  # rounded, so autocast did act, but close


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lagged_sync", [False, True])
def test_beam_search_on_device_equals_cpu(device: str, lagged_sync: bool) -> None:
    model = tiny_model(5, dtype=torch.float32, share_decoder_input_output_embed=True)
    src = source_batch(6, [9, 3, 12, 5, 7, 2])
    cfg = DecodeConfig(beam=3, nbest=3, lenpen=0.6, lenpen_style="gnmt", max_len_a=1.0, max_len_b=4)
    expected = generate(model, src, cfg, max_target_positions=1024, lagged_sync=False)
    got = generate(model.to(device), src.to(device), cfg, max_target_positions=1024, lagged_sync=lagged_sync)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
    for hyps, want in zip(got, expected):
        for h, w in zip(hyps, want):
            assert h.score == pytest.approx(w.score, abs=1e-5)
            np.testing.assert_allclose(h.positional_scores, w.positional_scores, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scope", ["model", "whole"])
def test_search_through_cuda_graphs_equals_plain_search(device: str, scope: str, monkeypatch) -> None:
    """On CUDA the fixed-shape steps (the model's, or model and search together) are
    captured and replayed; on the CPU they run eagerly. The outputs pass the cache's
    first capacity (32), so the steps are captured again; the second batch replays the
    first's graphs (model and search together)."""
    replays = []
    call = graphs.GraphedCall.__call__
    monkeypatch.setattr(graphs.GraphedCall, "__call__", lambda self: replays.append(self.graph is not None) or call(self))
    model = tiny_model(7, dtype=torch.float32, normalize_before=True).to(device)
    cfg = DecodeConfig(beam=4, nbest=4, max_len_b=40, min_len=34)
    failures: list[str] = []
    graphed = graphs.GraphedTransformer(model, use_graphs=device == "cuda", warn=failures.append)
    search = FixedSearch(graphed, cfg)
    # Two batches of one padded shape: the second reuses the first's buffers and graphs.
    for seed, lengths in ((8, [9, 3, 12, 5, 7, 2]), (9, [4, 11, 6, 6, 8, 3])):
        src = source_batch(seed, lengths).to(device)
        expected = generate(model, src, cfg, max_target_positions=1024)
        if scope == "whole":
            got = search.generate(src, max_target_positions=1024)
        else:
            got = generate(graphed, src, cfg, max_target_positions=1024)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
        for hyps, want in zip(got, expected):
            for h, w in zip(hyps, want):
                assert h.score == pytest.approx(w.score, abs=1e-5)
    assert not failures
    assert len(replays) >= 70 and any(replays) == (device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_steps_through_cuda_graphs_stay_close_to_float32(device: str) -> None:
    model = tiny_model(4, dtype=torch.float32).to(device)
    expected = teacher_forced_log_probs(model, SRC, PREV).repeat_interleave(2, dim=0)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = decode_all_steps(graphs.with_fixed_steps(model, use_graphs=device == "cuda"),
                               SRC.to(device), PREV.to(device), beams=2)
    assert got.dtype == torch.float32
    error = (got.cpu().double() - expected).abs()
    assert 1e-4 < error.max() < 0.1 and error.mean() < 0.02


# --- training ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory) -> Path:
    return reversal_data_bin(tmp_path_factory.mktemp("data") / "bin", train=160, valid=16)


def make_engine(data_bin: Path, device: str, precision: str = "fp32", update_freq: int = 1):
    cfg = TrainConfig(data=str(data_bin), save_dir="unused", arch="transformer_tiny", lr=1e-2, warmup_updates=0,
                      lr_scheduler="fixed", label_smoothing=0.1, precision=precision, update_freq=update_freq)
    model_cfg = resolve_config("transformer_tiny", {"dropout": 0.0})  # no dropout: no device RNG involved
    data = load_data_bin(data_bin)
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    engine = build_engine(cfg, model_cfg, len(data.src_dict), len(data.tgt_dict), dist)
    no_tf32_again()
    return engine, data.split("train")


def run_updates(engine, split, updates: int) -> list[float]:
    losses = []
    for step in range(updates):
        batch = np.arange(16 * step, 16 * step + 16)
        stats = train_update(engine, split, [batch], batch, int(split.tgt_sizes[batch].sum()), step)
        losses.append(stats.loss.item())
    return losses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_and_its_gradient_on_device_equal_cpu(device: str, dtype: torch.dtype) -> None:
    """On CUDA the loss runs as two compiled kernels (loss.fused_kernels); on the CPU, in chunks."""
    N, V = 300, 1000
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(N, V, generator=gen) * 4).to(dtype)
    target = torch.randint(2, V, (N,), generator=gen)
    target[::7] = 1  # pads
    results = []
    for where in (device, "cpu"):
        x = logits.to(where, copy=True).requires_grad_(True)
        loss, nll = loss_module.label_smoothed_nll_loss(x, target.to(where), 0.1, 1)
        (loss * 0.01).backward()
        assert x.grad.dtype == dtype
        results.append((loss.item(), nll.item(), x.grad.cpu().float()))
    assert (loss_module.fused_kernels(logits.to(device)) is not None) == (device == "cuda")
    assert loss_module.fused_kernels(logits.to(device), loss_module.LossKernels.CHUNKED) is None
    assert not loss_module._compile_failed
    (loss, nll, grad), (want_loss, want_nll, want_grad) = results
    assert loss == pytest.approx(want_loss, rel=1e-6) and nll == pytest.approx(want_nll, rel=1e-6)
    # The same float32 arithmetic in another order; bf16 rounds the result once.
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-7}
    torch.testing.assert_close(grad, want_grad, **tolerance)


@pytest.mark.parametrize("device", DEVICES)
def test_training_updates_on_device_equal_cpu(device: str, data_bin: Path) -> None:
    on_device, split = make_engine(data_bin, device)
    on_cpu, _ = make_engine(data_bin, "cpu")
    assert on_device.optimizer.defaults["fused"] and on_cpu.optimizer.defaults["fused"]
    losses = run_updates(on_device, split, 3)
    expected = run_updates(on_cpu, split, 3)
    assert losses == pytest.approx(expected, rel=1e-5)
    for (name, p), q in zip(on_device.model.named_parameters(), on_cpu.model.parameters()):
        p, q = without_key_bias(name, p.detach().cpu()), without_key_bias(name, q.detach())
        torch.testing.assert_close(p, q, rtol=1e-4, atol=3e-5, msg=name)


def without_key_bias(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The parameter without the key projection's bias. Softmax ignores what a key bias adds
    (the same for every key of a query), so its true gradient is zero; Adam scales the
    round-off left there up to steps of lr, whose signs differ between devices."""
    if name.endswith("in_proj.bias"):  # [q; k; v]
        third = tensor.numel() // 3
        return torch.cat([tensor[:third], tensor[2 * third:]])
    if name.endswith("kv_proj.bias"):  # [k; v]
        return tensor[tensor.numel() // 2:]
    return tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "pure-bf16"])
def test_mixed_precision_training_follows_float32(device: str, precision: str, data_bin: Path) -> None:
    mixed, split = make_engine(data_bin, device, precision)
    exact, _ = make_engine(data_bin, device)
    assert (mixed.scaler is not None) == (precision == "fp16")
    losses, expected = run_updates(mixed, split, 6), run_updates(exact, split, 6)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    # Autocast rounds the matrix products' inputs (pure-bf16: all activations); the loss
    # itself stays float32.
    assert losses == pytest.approx(expected, rel=0.05)
    assert all(torch.isfinite(p).all() for p in mixed.model.parameters())


def reference_pure_bf16_updates(model: torch.nn.Module, split, updates: list[list[np.ndarray]], cfg: TrainConfig):
    """Naive pure-bf16 training: a bf16 copy of `model` runs forward and backward, each
    batch's gradients are summed in float32 tensors of their own, AdamW (the same fused
    kernel, same settings) steps a float32 copy, which is rounded back into the bf16 one.
    Returns the float32 weights and each update's summed loss."""
    master = copy.deepcopy(model)
    working = copy.deepcopy(master).to(torch.bfloat16).train()
    device = next(master.parameters()).device
    optimizer = torch.optim.AdamW(master.parameters(), lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay, fused=True)
    losses = []
    for batches in updates:
        ntokens = int(sum(split.tgt_sizes[b].sum() for b in batches))
        sums = [torch.zeros_like(p) for p in master.parameters()]
        loss_sum = 0.0
        for indices in batches:
            batch = collate(split, indices).to(device)
            working.zero_grad(set_to_none=True)
            logits = working(batch.src_tokens, batch.prev_output_tokens)
            loss, _ = loss_module.label_smoothed_nll_loss(logits, batch.target, cfg.label_smoothing, PAD_ID)
            (loss * (1.0 / ntokens)).backward()
            for total, p in zip(sums, working.parameters()):
                total += p.grad.float()
            loss_sum += loss.item()
        for p, total in zip(master.parameters(), sums):
            p.grad = total
        optimizer.step()
        with torch.no_grad():
            for w, m in zip(working.parameters(), master.parameters()):
                w.copy_(m)
        losses.append(loss_sum)
    return master, losses


@pytest.mark.parametrize("device", DEVICES)
def test_pure_bf16_updates_equal_a_naive_reference(device: str, data_bin: Path) -> None:
    engine, split = make_engine(data_bin, device, "pure-bf16", update_freq=2)
    assert {p.dtype for p in engine.working_model.parameters()} == {torch.bfloat16}
    # Batches of different lengths and paddings, two per update (accumulated in float32).
    updates = [[np.arange(0, 7), np.arange(7, 20)], [np.arange(20, 36), np.arange(36, 40)], [np.arange(40, 52)] * 2]
    master, expected = reference_pure_bf16_updates(engine.model, split, updates, engine.cfg)
    losses = []
    for step, batches in enumerate(updates):
        ntokens = int(sum(split.tgt_sizes[b].sum() for b in batches))
        losses.append(train_update(engine, split, batches, batches[0], ntokens, step).loss.item())
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    # On the CPU the same kernels on the same inputs; a GPU's attention backward may sum
    # in another order from one run to the next.
    assert losses == pytest.approx(expected, rel=1e-6 if device == "cpu" else 1e-3)
    for (name, p), q in zip(engine.model.named_parameters(), master.parameters()):
        if device == "cpu":
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(without_key_bias(name, p), without_key_bias(name, q), rtol=1e-3, atol=1e-4, msg=name)
    for p, q in zip(engine.working_model.parameters(), engine.model.parameters()):
        assert torch.equal(p, q.to(torch.bfloat16))  # the working copy is the master, rounded


# --- the commands ------------------------------------------------------------------------


def nmt(*args, stdin: str | None = None) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args], input=stdin, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "CUDA graph capture failed" not in result.stderr, result.stderr  # translate would go on without
    return result.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_a_run_trained_on_device_translates_the_same_on_cpu(device: str, data_bin: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    nmt("train", data_bin, "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens", "256",
        "--required-batch-size-multiple", "1", "--lr", "3e-3", "--warmup-updates", "10", "--max-update", "30",
        "--dropout", "0", "--device", device)
    no_tf32_again()  # the device must decode in full float32, as the CPU does
    source = "".join(" ".join(src) + "\n" for src, _ in reversal_pairs(12, seed=9))
    translate = ["translate", "--path", run / "checkpoint_last.pt", "--beam", "2", "--max-len-b", "10", "--quiet"]
    on_cpu = nmt(*translate, "--device", "cpu", stdin=source)
    assert len(on_cpu.splitlines()) == 12
    assert nmt(*translate, "--device", device, stdin=source) == on_cpu  # on cuda: through CUDA graphs
    in_bf16 = nmt(*translate, "--device", device, "--precision", "bf16", stdin=source)
    assert len(in_bf16.splitlines()) == 12  # one line per input line, whatever the precision
    if device == "cuda":
        assert nmt(*translate, "--device", device, "--no-cuda-graphs", stdin=source) == on_cpu
        eager_bf16 = nmt(*translate, "--device", device, "--precision", "bf16", "--no-cuda-graphs", stdin=source)
        assert len(eager_bf16.splitlines()) == 12
