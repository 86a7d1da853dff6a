"""What both imports share: one writer of --out, from its check to its publication.

A second import into the same --out that starts while the first is converting its
weights (after the first found --out empty, before it published) must be refused in one
line, never let the first replace its output unasked; one that starts after the first
has ended sees the first's run and asks for --force. The second import runs as a
process of its own, as a user's second command would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from fault_utils import REPO, SUBPROCESS_ENV
from nmt_cli.cli import main
from nmt_cli.interop.fairseq import importer as fairseq_importer
from nmt_cli.interop.marian import importer as marian_importer
from tests.test_fairseq_import import write_fake_fairseq
from tests.test_marian import hand_written_model


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def check_one_writer(monkeypatch, module, step: str, first: list[str], second: list[str], out: Path,
                     truth: Path) -> None:
    """Run the import `first` into `out`, starting the import `second` into `out` while the
    first is inside `module.step`; `truth` is where `first` was run alone into a fresh --out."""
    real_step, meanwhile = getattr(module, step), {}

    def step_while_another_import_starts(*args, **kwargs):
        if not meanwhile:
            meanwhile["result"] = subprocess.run([sys.executable, "-m", "nmt_cli", *second], cwd=REPO,
                                                 env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(module, step, step_while_another_import_starts)
    result = CliRunner().invoke(main, first)
    monkeypatch.undo()
    refused = meanwhile["result"]
    assert result.exit_code == 0, result.output
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "in use by another nmt process" in refused.stderr and str(out) in refused.stderr
    assert files_of(out) == files_of(truth)  # the first's run, whole
    after = CliRunner().invoke(main, second)
    assert after.exit_code == 1 and "--force" in after.output and files_of(out) == files_of(truth)
    again = CliRunner().invoke(main, first)
    assert again.exit_code == 0 and "nothing written" in again.output and files_of(out) == files_of(truth)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no lock or staging left


def test_a_second_fairseq_import_into_an_out_being_written_is_refused(tmp_path, monkeypatch):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    other, _, _ = write_fake_fairseq(tmp_path, name="other.pt")
    args = ["--dict-dir", str(dict_dir), "--out"]
    (tmp_path / "runs").mkdir()
    out, truth = tmp_path / "runs" / "out", tmp_path / "truth"
    assert CliRunner().invoke(main, ["import-fairseq", str(checkpoint), *args, str(truth)]).exit_code == 0
    check_one_writer(monkeypatch, fairseq_importer, "convert_state_dict", ["import-fairseq", str(checkpoint), *args,
                     str(out)], ["import-fairseq", str(other), *args, str(out)], out, truth)


def test_a_second_marian_import_into_an_out_being_written_is_refused(tmp_path, monkeypatch):
    model = hand_written_model(tmp_path / "model")
    other = hand_written_model(tmp_path / "other", activation_function="gelu")
    (tmp_path / "runs").mkdir()
    out, truth = tmp_path / "runs" / "out", tmp_path / "truth"
    assert CliRunner().invoke(main, ["import-marian", str(model), "--out", str(truth)]).exit_code == 0
    check_one_writer(monkeypatch, marian_importer, "convert_weights", ["import-marian", str(model), "--out", str(out)],
                     ["import-marian", str(other), "--out", str(out)], out, truth)


def check_replaced_while_read(monkeypatch, module, step: str, replaced: Path, replacement: Path,
                              command: list[str], out: Path) -> None:
    """Run the import `command`, `replaced` being renamed over by `replacement` (a training
    run's atomic save) just after `module.step` has read it: the import must refuse, else
    its --out would record the new file's fingerprint over the old file's weights and a
    rerun would find it up to date."""
    real_step = getattr(module, step)

    def step_then_replaced(*args, **kwargs):
        result = real_step(*args, **kwargs)
        if replacement.exists():
            replacement.replace(replaced)
        return result

    monkeypatch.setattr(module, step, step_then_replaced)
    result = CliRunner().invoke(main, command)
    monkeypatch.undo()
    assert result.exit_code == 1 and not out.exists(), result.output
    assert result.output == (f"error: {replaced} changed while it was read (a run saving it?); run this again once "
                             "nothing writes it\n")
    assert CliRunner().invoke(main, command).exit_code == 0  # once nothing writes it


def test_a_fairseq_checkpoint_replaced_while_it_is_read_is_refused(tmp_path, monkeypatch):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    newer, _, _ = write_fake_fairseq(tmp_path, name="newer.pt")
    out = tmp_path / "out"
    check_replaced_while_read(monkeypatch, fairseq_importer, "load_fairseq_checkpoint", checkpoint, newer,
                              ["import-fairseq", str(checkpoint), "--dict-dir", str(dict_dir), "--out", str(out)], out)


def test_marian_weights_replaced_while_they_are_read_are_refused(tmp_path, monkeypatch):
    model = hand_written_model(tmp_path / "model")
    newer = hand_written_model(tmp_path / "newer")
    [weights] = marian_importer.weight_files(model)
    out = tmp_path / "out"
    check_replaced_while_read(monkeypatch, marian_importer, "read_model_weights", weights, newer / weights.name,
                              ["import-marian", str(model), "--out", str(out)], out)
