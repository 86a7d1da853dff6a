"""Checkpoints: round trip, atomic writes, and one clear error for every kind of bad file."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from model_utils import count_parameters

import nmt_cli.checkpoints.format as checkpoint_module
from nmt_cli.checkpoints.format import (
    FORMAT_VERSION,
    all_finite,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    save_file,
    write_failure_reason,
)
from nmt_cli.cli import main
from nmt_cli.errors import NmtError
from nmt_cli.models.registry import ARCHITECTURES, build_model, resolve_config
from nmt_cli.staging import replace_atomically
from nmt_cli.train.saving import PENDING_SAVE, write_checkpoints

SRC_DICT = ["<s>", "<pad>", "</s>", "<unk>"] + [f"s{i}" for i in range(20)]
TGT_DICT = ["<s>", "<pad>", "</s>", "<unk>"] + [f"t{i}" for i in range(28)]


def make_state(model_overrides: dict | None = None, seed: int = 0, **extra) -> dict:
    torch.manual_seed(seed)
    cfg = resolve_config("transformer_tiny", model_overrides or {})
    model = build_model(cfg, len(SRC_DICT), len(TGT_DICT))
    return {
        "format_version": FORMAT_VERSION,
        "model_config": cfg.to_dict(),
        "model": model.state_dict(),
        "source_lang": "en",
        "target_lang": "de",
        "src_dict": SRC_DICT,
        "tgt_dict": TGT_DICT,
        "num_updates": 123,
        "epoch": 2,
        **extra,
    }


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[5, 6, 7, 2], [8, 2, 1, 1]])
    prev = torch.tensor([[2, 9, 10], [2, 11, 1]])
    return src, prev


def assert_one_line(error: NmtError, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("overrides", [{"normalize_before": True}, {"learned_pos": True}])
def test_save_load_round_trip_gives_identical_outputs(tmp_path: Path, overrides: dict) -> None:
    torch.manual_seed(1)
    cfg = resolve_config("transformer_tiny", overrides)
    model = build_model(cfg, len(SRC_DICT), len(TGT_DICT)).eval()
    state = {**make_state(), "model_config": cfg.to_dict(), "model": model.state_dict()}
    path = tmp_path / "run" / "checkpoint_last.pt"
    save_checkpoint(state, path)
    loaded = load_checkpoint(path)
    assert loaded["num_updates"] == 123 and loaded["src_dict"] == SRC_DICT
    restored = model_from_checkpoint(loaded).eval()
    src, prev = sample_batch()
    with torch.no_grad():
        assert torch.equal(restored(src, prev), model(src, prev))
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint_last.pt"]  # no temporary files left


def test_a_model_built_for_loading_skips_random_init_and_leaves_it_working() -> None:
    cfg = resolve_config("transformer_tiny", {"learned_pos": True})
    torch.manual_seed(3)
    before = build_model(cfg, len(SRC_DICT), len(TGT_DICT)).state_dict()
    rng = torch.get_rng_state()
    build_model(cfg, len(SRC_DICT), len(TGT_DICT), initialise=False)
    assert torch.equal(torch.get_rng_state(), rng)  # no random numbers drawn
    torch.manual_seed(3)
    after = build_model(cfg, len(SRC_DICT), len(TGT_DICT)).state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_shared_embeddings_stay_tied_after_loading(tmp_path: Path) -> None:
    path = tmp_path / "shared.pt"
    torch.manual_seed(0)
    cfg = resolve_config("transformer_tiny", {"share_all_embeddings": True})
    model = build_model(cfg, len(TGT_DICT), len(TGT_DICT))
    state = make_state() | {"src_dict": TGT_DICT, "model_config": cfg.to_dict()}
    state["model"] = model.state_dict()
    save_checkpoint(state, path)
    restored = model_from_checkpoint(load_checkpoint(path))
    weight = restored.encoder.embed_tokens.weight
    assert weight is restored.decoder.output_projection.weight
    assert torch.equal(weight, model.encoder.embed_tokens.weight)
    assert count_parameters(restored) == count_parameters(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_all_finite_finds_nan_and_inf_and_survives_a_sum_that_overflows(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max / 2
    assert all_finite(torch.randn(64, 32).to(dtype))
    assert all_finite(torch.full((8,), big, dtype=dtype))  # finite entries whose sum is not
    assert all_finite(torch.tensor([big, -big, big], dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        weights = torch.randn(64, 32).to(dtype)
        weights[17, 5] = bad
        assert not all_finite(weights)
        assert not all_finite(torch.tensor([big, big, bad], dtype=dtype))


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    state = make_state()
    state["model"] = make_state({"encoder_embed_dim": 16, "decoder_embed_dim": 16})["model"]
    with pytest.raises(NmtError) as info:
        model_from_checkpoint(state, source="ckpt.pt")
    assert_one_line(info.value, "ckpt.pt", "not those of the architecture", "another shape")

    state["model"] = make_state({"normalize_before": True})["model"]  # adds final LayerNorms
    with pytest.raises(NmtError) as info:
        model_from_checkpoint(state)
    assert_one_line(info.value, "unexpected", "layer_norm")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"this is not a checkpoint\n", "not a PyTorch checkpoint file"),
        (b"", "truncated or corrupt"),
        (bytes(range(256)), "not a PyTorch checkpoint file"),
    ],
)
def test_non_checkpoint_files_are_refused(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(NmtError) as info:
        load_checkpoint(path)
    assert_one_line(info.value, fragment, str(path))


def test_truncated_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(make_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NmtError) as info:
        load_checkpoint(path)
    assert_one_line(info.value, "truncated or corrupt", str(path))


def test_missing_file_and_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(NmtError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(NmtError, match="is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)


class CreatesFileWhenUnpickled:
    """A pickle payload that would create a file if unpickling ran its code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("container", ["torch-zip", "raw-pickle"])
def test_malicious_pickle_is_refused_and_does_not_run(tmp_path: Path, container: str) -> None:
    marker = tmp_path / "pwned"
    payload = {"format_version": FORMAT_VERSION, "model": CreatesFileWhenUnpickled(marker)}
    path = tmp_path / "evil.pt"
    if container == "torch-zip":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    # The payload does run under a plain unpickler (the test is meaningful) ...
    if container == "raw-pickle":
        pickle.loads(path.read_bytes())
        assert marker.exists()
        marker.unlink()
    # ... but not when loading a checkpoint.
    with pytest.raises(NmtError) as info:
        load_checkpoint(path)
    assert_one_line(info.value, "not a readable nmt checkpoint", str(path), "could run code")
    assert not marker.exists()


@pytest.mark.parametrize("module, name", [("argparse", "Namespace"), ("omegaconf.dictconfig", "DictConfig")])
def test_a_fairseq_checkpoint_is_named_with_the_command_converting_it(tmp_path: Path, monkeypatch, module: str,
                                                                      name: str) -> None:
    """fairseq's checkpoints hold their arguments (argparse.Namespace, fairseq < 0.10) or an
    omegaconf configuration (later) beside the weights."""
    import sys
    import types

    if module not in sys.modules:  # omegaconf need not be installed: a stand-in the pickle names alike
        monkeypatch.setitem(sys.modules, "omegaconf", types.ModuleType("omegaconf"))
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
        monkeypatch.setattr(sys.modules[module], name, type(name, (dict,), {"__module__": module}), raising=False)
    config = getattr(sys.modules[module], name)()
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"args" if module == "argparse" else "cfg": config, "model": {"w": torch.zeros(1)}}, path)
    with pytest.raises(NmtError) as info:
        load_checkpoint(path)
    assert_one_line(info.value, f"not a readable nmt checkpoint: {path} (it looks like a fairseq checkpoint: "
                                f"convert it with `nmt import-fairseq {path} --dict-dir DIR --out RUN`")


VALID_PARTS = {"format_version": FORMAT_VERSION, "model_config": ARCHITECTURES["transformer_tiny"].to_dict(),
               "model": {}, "src_dict": ["<s>"], "tgt_dict": ["<s>"]}


@pytest.mark.parametrize(
    "state, fragment",
    [
        ({"model": {}}, "no format_version"),
        ([1, 2, 3], "no format_version"),
        ({"format_version": 99, "model": {}}, "format_version 99"),
        ({"format_version": FORMAT_VERSION, "model": {}}, "lacks 'model_config'"),
        ({**VALID_PARTS, "src_dict": None}, "'src_dict' is not a list of symbols"),
        ({**VALID_PARTS, "tgt_dict": ["a", 3]}, "'tgt_dict' is not a list of symbols"),
        ({**VALID_PARTS, "model": [1]}, "'model' is not a dict of weights"),
    ],
)
def test_wrong_format_version_or_content_is_refused(tmp_path: Path, state: object, fragment: str) -> None:
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    with pytest.raises(NmtError) as info:
        load_checkpoint(path)
    assert_one_line(info.value, fragment, str(path))


@pytest.mark.parametrize("failure", ["fsync", "write"])
def test_failed_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    path = tmp_path / "checkpoint_last.pt"
    save_checkpoint(make_state(), path)
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def partial_write_then_disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial")
        disk_full()

    if failure == "fsync":
        monkeypatch.setattr(checkpoint_module.os, "fsync", disk_full)
    else:
        monkeypatch.setattr(checkpoint_module.torch, "save", partial_write_then_disk_full)
    with pytest.raises(NmtError) as info:
        save_checkpoint(make_state(seed=5, num_updates=999), path)
    monkeypatch.undo()
    assert_one_line(info.value, "cannot write checkpoint", str(path), "No space left on device")
    assert path.read_bytes() == before
    assert load_checkpoint(path)["num_updates"] == 123
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_last.pt"]


def test_info_describes_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint_best.pt"
    state = make_state()
    save_checkpoint(state, path)
    result = CliRunner().invoke(main, ["info", "--path", str(path), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    model = model_from_checkpoint(state)
    assert info["parameters"]["total"] == count_parameters(model)
    assert info["architecture"] == "transformer_tiny"
    assert (info["num_updates"], info["source_lang"], info["src_vocab_size"]) == (123, "en", len(SRC_DICT))

    text = CliRunner().invoke(main, ["info", "--path", str(path)])
    assert text.exit_code == 0 and "num_updates" in text.output and f"{count_parameters(model):,}" in text.output


def test_info_reports_a_bad_checkpoint_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    result = CliRunner().invoke(main, ["info", "--path", str(path)])
    assert result.exit_code == 1
    assert result.output.startswith("error: not a readable nmt checkpoint") and str(path) in result.output
    assert len(result.output.strip().splitlines()) == 1

    mismatched = make_state()
    mismatched["model"] = make_state({"decoder_layers": 1})["model"]
    bad = tmp_path / "mismatched.pt"
    save_checkpoint(mismatched, bad)
    result = CliRunner().invoke(main, ["info", "--path", str(bad)])
    assert result.exit_code == 1 and "not those of the architecture" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_run_directory_files_are_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that dies half-way (a full disk, a kill) leaves the previous file, and no
    temporary file, behind."""
    target = tmp_path / "meta.json"
    target.write_text('{"old": true}\n')
    source = tmp_path / "source.json"
    source.write_text('{"new": true, "padding": "' + "x" * 1000 + '"}\n')

    def dies_half_way(src: Path, dst: Path) -> None:
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        replace_atomically(target, lambda tmp: dies_half_way(source, tmp))
    assert target.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "source.json"]
    replace_atomically(target, lambda tmp: shutil.copyfile(source, tmp))
    assert target.read_text() == source.read_text()


def test_replaced_files_reach_the_disk_before_and_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine crash must find the old file or the whole new one: the new file's data
    are synced before the rename, and the directory (the rename) before returning."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else fd))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr("nmt_cli.staging.os.fsync", fsync)
    monkeypatch.setattr("nmt_cli.staging.os.replace", replace)
    # The first name is serialised, the others (the one a resumed run reads) are copies.
    write_checkpoints(make_state(), tmp_path, ["checkpoint_1_5.pt", "checkpoint_last.pt"])
    finals = [str(tmp_path / "checkpoint_1_5.pt"), str(tmp_path / "checkpoint_last.pt")]
    replaced = [name for kind, name in events if kind == "replace"]
    # Both files, and the journal naming them, are in place before either takes its name;
    # the file a resumed run reads comes last.
    assert replaced[-2:] == finals and replaced.index(str(tmp_path / PENDING_SAVE)) < len(replaced) - 2
    assert events.index(("replace", finals[1])) < max(i for i, (kind, _) in enumerate(events) if kind == "fsync")
    if os.path.exists("/proc/self/fd"):
        before = [name for kind, name in events[: events.index(("replace", finals[0]))] if kind == "fsync"]
        assert str(tmp_path / f".checkpoint_1_5.pt.{os.getpid()}.tmp") in before
        assert str(tmp_path / f".checkpoint_last.pt.{os.getpid()}.tmp") in before
        assert events[-1] == ("fsync", str(tmp_path))  # the renames reach the disk before returning


def test_torch_write_failures_say_why(tmp_path: Path) -> None:
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # `ulimit -f 100`: a full disk, for files
    try:
        with pytest.raises(OSError) as failure:
            save_file({"weights": torch.zeros(100_000)}, tmp_path / "big.pt")
        with pytest.raises(RuntimeError) as from_torch:
            with open(tmp_path / "again.pt", "wb") as f:
                torch.save({"weights": torch.zeros(100_000)}, f)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(failure.value) == "File too large"
    assert write_failure_reason(from_torch.value) == "File too large"  # not "unexpected pos 704 vs 598"


def previous_save(run: Path) -> None:
    """A run directory as a save at update 2 leaves it: checkpoint_1_2.pt and checkpoint_last.pt."""
    for name in ("checkpoint_1_2.pt", "checkpoint_last.pt"):
        write_checkpoints({**make_state(), "num_updates": 2}, run, [name])


@pytest.mark.parametrize("interrupt_at", [PENDING_SAVE, "checkpoint_1_3.pt"])
def test_a_save_interrupted_once_its_journal_is_in_place_is_finished(tmp_path, monkeypatch, interrupt_at):
    """Ctrl-C just after the journal or one of its renames: the save goes on to its end (deleting
    what retention dooms), where its files were deleted and the journal then deleted checkpoint_1_2.pt."""
    previous_save(tmp_path)
    real_replace, interrupted = os.replace, []

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        if Path(dst).name == interrupt_at and not interrupted:
            interrupted.append(dst)
            raise KeyboardInterrupt

    monkeypatch.setattr("nmt_cli.staging.os.replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoints({**make_state(), "num_updates": 3}, tmp_path, ["checkpoint_1_3.pt", "checkpoint_last.pt"],
                          doomed=["checkpoint_1_2.pt"])
    assert interrupted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_3.pt", "checkpoint_last.pt"]
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["num_updates"] == 3
