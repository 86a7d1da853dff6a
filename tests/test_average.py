"""`nmt average`: element-wise means, checkpoint selection, refusals, and real models that still run."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from nmt_cli.checkpoints import average as average_module
from nmt_cli.checkpoints.average import average_checkpoints, last_n_checkpoints
from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint, save_checkpoint
from nmt_cli.cli import main
from nmt_cli.config import AverageConfig
from nmt_cli.errors import NmtError
from nmt_cli.models.registry import build_model, resolve_config

SYMBOLS = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(12)]
SMALL_CONFIG = resolve_config("transformer_tiny", {}).to_dict()


def small_state(seed: int) -> dict[str, torch.Tensor]:
    """A made-up state dict with float32, float16, integer and bool entries."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(4, 3, generator=gen),
        "layer.bias": torch.randn(3, generator=gen),
        "half.weight": torch.randn(5, generator=gen).half(),
        "steps": torch.tensor(seed),
        "mask": torch.rand(3, generator=gen) > 0.5,
    }


def checkpoint(model: dict[str, torch.Tensor], num_updates: int = 100, **changes) -> dict:
    """A training checkpoint in the documented format."""
    state = {
        "format_version": 1,
        "model_config": dict(SMALL_CONFIG),
        "model": model,
        "source_lang": "en",
        "target_lang": "de",
        "src_dict": list(SYMBOLS),
        "tgt_dict": list(SYMBOLS),
        "train_config": {"lr": 0.0007},
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.0007}]},
        "scheduler": {"last_step": num_updates},
        "scaler": {"scale": 1024.0},
        "num_updates": num_updates,
        "epoch": 1,
        "iterator": {"epoch": 1, "batches_done": 3},
        "rng": {"torch": torch.get_rng_state()},
        "best_metric": 4.5,
    }
    state.update(changes)
    return state


def write(tmp_path: Path, name: str, state: dict) -> Path:
    path = tmp_path / name
    save_checkpoint(state, path)
    return path


def test_two_checkpoints_average_to_the_elementwise_mean(tmp_path):
    a, b = small_state(1), small_state(2)
    paths = [write(tmp_path, "a.pt", checkpoint(a, 100)), write(tmp_path, "b.pt", checkpoint(b, 200))]
    avg = average_checkpoints(paths)
    for key in ("layer.weight", "layer.bias", "half.weight"):
        expected = ((a[key].double() + b[key].double()) / 2).to(a[key].dtype)
        assert avg["model"][key].dtype == a[key].dtype
        assert torch.equal(avg["model"][key], expected)
    # Integer and bool buffers come from the last checkpoint.
    assert torch.equal(avg["model"]["steps"], b["steps"]) and torch.equal(avg["model"]["mask"], b["mask"])
    assert avg["num_updates"] == 200
    assert avg["averaged_checkpoints"] == [str(p) for p in paths]
    # Model config, languages and dictionaries kept; training state dropped.
    assert avg["model_config"] == SMALL_CONFIG and avg["src_dict"] == SYMBOLS and avg["target_lang"] == "de"
    for key in ("optimizer", "scheduler", "scaler", "rng", "iterator", "train_config", "best_metric"):
        assert key not in avg


def test_mean_is_accumulated_in_float64():
    # 1 + 2^-24 is not a float32 value: a float32 running sum of [1, 2^-24, 2^-24] would lose
    # both small terms (sum 1.0 -> mean 0.333333343); float64 keeps them.
    values = [1.0, 2.0**-24, 2.0**-24]
    expected = torch.tensor([sum(values) / 3], dtype=torch.float64).float()
    float32_sum = torch.zeros(1)
    for v in values:
        float32_sum += torch.tensor([v])
    assert not torch.equal(float32_sum / 3, expected)  # the case really needs float64


def test_float64_accumulation_in_average(tmp_path):
    values = [1.0, 2.0**-24, 2.0**-24]
    paths = [write(tmp_path, f"c{i}.pt", checkpoint({"w": torch.tensor([v])}, i)) for i, v in enumerate(values)]
    avg = average_checkpoints(paths)
    assert torch.equal(avg["model"]["w"], torch.tensor([sum(values) / 3], dtype=torch.float64).float())


def test_averaging_one_checkpoint_is_the_identity(tmp_path):
    a = small_state(3)
    avg = average_checkpoints([write(tmp_path, "a.pt", checkpoint(a))])
    assert avg["model"].keys() == a.keys()
    for key, tensor in a.items():
        assert torch.equal(avg["model"][key], tensor) and avg["model"][key].dtype == tensor.dtype


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_config": {**SMALL_CONFIG, "encoder_layers": 3}}, "different architectures (encoder_layers"),
        ({"tgt_dict": SYMBOLS[:-1] + ["other"]}, "different dictionaries (tgt_dict)"),
        ({"target_lang": "fr"}, "different languages"),
        ({"model": {**small_state(2), "layer.bias": torch.zeros(4)}}, "different parameters (layer.bias"),
    ],
)
def test_incompatible_checkpoints_are_refused(tmp_path, changes, message):
    a = write(tmp_path, "a.pt", checkpoint(small_state(1)))
    b = write(tmp_path, "b.pt", {**checkpoint(small_state(2)), **changes})
    with pytest.raises(NmtError) as error:
        average_checkpoints([a, b])
    assert message in str(error.value) and str(a) in str(error.value) and str(b) in str(error.value)


def test_a_checkpoint_of_an_older_nmt_averages_with_a_newer_ones(tmp_path):
    """An older nmt wrote no fields added since: the model reads them as their defaults, so
    the architectures are the same."""
    added_since = ("activation_fn", "sinusoids", "output_bias", "start_embedding")
    older = checkpoint(small_state(1), model_config={k: v for k, v in SMALL_CONFIG.items() if k not in added_since})
    avg = average_checkpoints([write(tmp_path, "a.pt", older), write(tmp_path, "b.pt", checkpoint(small_state(2)))])
    mean = (small_state(1)["layer.weight"] + small_state(2)["layer.weight"]) / 2
    assert torch.allclose(avg["model"]["layer.weight"], mean, rtol=0, atol=1e-7)


def test_dropout_may_differ(tmp_path):
    a = write(tmp_path, "a.pt", checkpoint(small_state(1)))
    b = write(tmp_path, "b.pt", checkpoint(small_state(2), model_config={**SMALL_CONFIG, "dropout": 0.3}))
    assert average_checkpoints([a, b])["model_config"]["dropout"] == 0.3


def test_checkpoints_are_loaded_one_at_a_time(tmp_path, monkeypatch):
    paths = [write(tmp_path, f"c{i}.pt", checkpoint(small_state(i), i)) for i in range(4)]
    alive: list[weakref.ref] = []
    most_alive = 0

    def tracking_load(path):
        nonlocal most_alive
        most_alive = max(most_alive, sum(ref() is not None for ref in alive))
        state = load_checkpoint(path)
        alive.append(weakref.ref(state["model"]["layer.weight"]))
        return state

    monkeypatch.setattr(average_module, "load_checkpoint", tracking_load)
    average_checkpoints(paths)
    # While one file is read, at most the previous one is still referenced.
    assert most_alive <= 1


# --- choosing the last N checkpoints of a run directory ---------------------------------------------


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    names = ["checkpoint_1_100.pt", "checkpoint_2_250.pt", "checkpoint_3_1000.pt", "checkpoint_3_1000.pt.tmp",
             "checkpoint1.pt", "checkpoint2.pt", "checkpoint10.pt", "checkpoint_last.pt", "checkpoint_best.pt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_last_n_by_update_count(run_dir):
    # Numeric order: 1000 updates come after 250, though "1000" < "250" as text.
    assert [p.name for p in last_n_checkpoints(run_dir, 2, update_based=True)] == [
        "checkpoint_2_250.pt", "checkpoint_3_1000.pt"]
    assert [p.name for p in last_n_checkpoints(run_dir, 2, update_based=True, upper_bound=250)] == [
        "checkpoint_1_100.pt", "checkpoint_2_250.pt"]


def test_last_n_by_epoch(run_dir):
    assert [p.name for p in last_n_checkpoints(run_dir, 2, update_based=False)] == ["checkpoint2.pt", "checkpoint10.pt"]
    assert [p.name for p in last_n_checkpoints(run_dir, 2, update_based=False, upper_bound=9)] == [
        "checkpoint1.pt", "checkpoint2.pt"]
    with pytest.raises(NmtError, match="found 2 checkpoint"):
        last_n_checkpoints(run_dir, 3, update_based=False, upper_bound=9)


def test_too_few_checkpoints(run_dir):
    with pytest.raises(NmtError, match=r"found 3 checkpoint_\{EPOCH\}_\{UPDATES\}.pt files, need 4"):
        last_n_checkpoints(run_dir, 4, update_based=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"inputs": ("run",), "num_update_checkpoints": 2, "num_epoch_checkpoints": 2}, "not both"),
        ({"inputs": ("a", "b"), "num_update_checkpoints": 2}, "exactly one run directory"),
        ({"inputs": ("a.pt",), "checkpoint_upper_bound": 5}, "--checkpoint-upper-bound needs"),
        ({"inputs": ("run",), "num_epoch_checkpoints": 0}, "--num-epoch-checkpoints must be >= 1"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(NmtError, match=message):
        AverageConfig(output="out.pt", **kwargs)


# --- real Transformer checkpoints through the command line ---------------------------------------------


def tiny_checkpoint(seed: int, num_updates: int, **overrides) -> dict:
    torch.manual_seed(seed)
    cfg = resolve_config("transformer_tiny", overrides)
    model = build_model(cfg, len(SYMBOLS), len(SYMBOLS))
    return checkpoint(model.state_dict(), num_updates, model_config=cfg.to_dict())


def forward(model: torch.nn.Module) -> torch.Tensor:
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
    prev = torch.tensor([[2, 5, 6], [2, 7, 1]])
    with torch.no_grad():
        return model.eval()(src, prev)


def test_cli_averages_a_run_directory_of_real_models(tmp_path):
    run = tmp_path / "run"
    states = {u: tiny_checkpoint(seed=u, num_updates=u) for u in (10, 20, 30)}
    for u, state in states.items():
        save_checkpoint(state, run / f"checkpoint_1_{u}.pt")
    output = tmp_path / "avg.pt"
    result = CliRunner().invoke(main, ["average", "--inputs", str(run), "--num-update-checkpoints", "2",
                                       "--output", str(output)])
    assert result.exit_code == 0, result.output
    assert "checkpoint_1_20.pt" in result.stderr and "checkpoint_1_30.pt" in result.stderr
    averaged = load_checkpoint(output)
    assert averaged["num_updates"] == 30
    model = model_from_checkpoint(averaged)
    # The same as averaging the two state dicts by hand.
    by_hand = {k: (states[20]["model"][k].double() + states[30]["model"][k].double()).div(2).float()
               for k in states[30]["model"]}
    reference = build_model(resolve_config("transformer_tiny", {}), len(SYMBOLS), len(SYMBOLS))
    reference.load_state_dict(by_hand)
    logits = forward(model)
    assert logits.shape == (2, 3, len(SYMBOLS)) and torch.isfinite(logits).all()
    assert torch.equal(logits, forward(reference))


def test_cli_explicit_files_and_tied_embeddings(tmp_path):
    paths = []
    for seed in (1, 2):
        paths.append(tmp_path / f"c{seed}.pt")
        save_checkpoint(tiny_checkpoint(seed, seed, share_all_embeddings=True), paths[-1])
    output = tmp_path / "avg.pt"
    result = CliRunner().invoke(main, ["average", "--inputs", str(paths[0]), str(paths[1]), "-o", str(output)])
    assert result.exit_code == 0, result.output
    averaged = load_checkpoint(output)
    weights = averaged["model"]
    tied = [k for k in weights if k.endswith("embed_tokens.weight") or k.endswith("output_projection.weight")]
    assert len({weights[k].data_ptr() for k in tied}) == 1  # still one tensor, as in the inputs
    assert averaged["averaged_checkpoints"] == [str(p) for p in paths]
    assert torch.isfinite(forward(model_from_checkpoint(averaged))).all()


def test_cli_refuses_mixed_architectures_with_one_error_line(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    save_checkpoint(tiny_checkpoint(1, 1), a)
    save_checkpoint(tiny_checkpoint(2, 2, decoder_layers=1), b)
    result = CliRunner().invoke(main, ["average", "--inputs", str(a), str(b), "--output", str(tmp_path / "x.pt")])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot average") and "decoder_layers" in lines[0]
    assert not (tmp_path / "x.pt").exists()


def test_output_may_not_overwrite_an_input(tmp_path):
    run = tmp_path / "run"
    for u in (10, 20):
        save_checkpoint(checkpoint(small_state(u), u), run / f"checkpoint_1_{u}.pt")
    before = (run / "checkpoint_1_20.pt").read_bytes()
    for args in (["--inputs", str(run), "--num-update-checkpoints", "2"],
                 ["--inputs", str(run / "checkpoint_1_10.pt"), str(run / "checkpoint_1_20.pt")]):
        result = CliRunner().invoke(main, ["average", *args, "--output", str(tmp_path / "run" / ".." / "run" /
                                                                          "checkpoint_1_20.pt")])
        assert result.exit_code == 1 and "is one of the checkpoints to average" in result.stderr
    assert (run / "checkpoint_1_20.pt").read_bytes() == before


def test_cli_missing_and_bad_files(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    for path in (tmp_path / "missing.pt", bad):
        result = CliRunner().invoke(main, ["average", "--inputs", str(path), "--output", str(tmp_path / "x.pt")])
        assert result.exit_code == 1 and str(path) in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    good = write(tmp_path, "good.pt", checkpoint(small_state(1)))
    weights = small_state(2)
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name].view(-1)[0] = float("inf")
    bad = write(tmp_path, "bad.pt", checkpoint(weights))
    with pytest.raises(NmtError, match=f"{bad}: weight {name} holds NaN or infinite values"):
        average_checkpoints([good, bad])


def test_the_refusal_gives_the_values_in_the_order_of_the_files_it_names(tmp_path):
    a = write(tmp_path, "a.pt", checkpoint(small_state(1)))
    b = write(tmp_path, "b.pt", checkpoint(small_state(2), model_config={**SMALL_CONFIG, "encoder_layers": 3}))
    encoder_layers = SMALL_CONFIG["encoder_layers"]
    with pytest.raises(NmtError) as error:
        average_checkpoints([a, b])
    assert str(error.value) == (f"cannot average {a} with {b}: different architectures "
                                f"(encoder_layers: {encoder_layers!r} vs 3)")


@pytest.mark.parametrize("damage, problem", [("a weight missing", "1 missing"),
                                            ("another width in model_config", "of another shape")])
def test_checkpoints_whose_weights_are_not_their_architectures_are_refused(tmp_path, damage, problem):
    """Alike, they agreed with each other, and the average was written: `info` and `translate` then refused it."""
    paths = []
    for seed in (1, 2):
        state = tiny_checkpoint(seed, seed)
        if damage == "a weight missing":
            del state["model"]["decoder.layers.0.self_attn_layer_norm.bias"]
        else:
            state["model_config"]["encoder_embed_dim"] *= 2
        paths.append(write(tmp_path, f"c{seed}.pt", state))
    output = tmp_path / "avg.pt"
    result = CliRunner().invoke(main, ["average", "--inputs", *map(str, paths), "--output", str(output)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"error: {paths[-1]}: the weights are not those of the architecture in its "
                                    "model_config: ") and problem in result.stderr, result.stderr
    assert not output.exists()
