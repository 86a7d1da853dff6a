"""The shell recipes: their plans, settings, failure handling, data path and evaluation text.

The end-to-end runs use the recipes' reduced modes: the quickstart on the shared Multi30k
data (skipped where it is absent), the WMT14 recipes with SMOKE=1 on archives that they
generate themselves, as from a fresh clone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
BLEU_LINE = re.compile(r"^BLEU\|nrefs:1\|.* = \d+\.\d+ ", re.MULTILINE)
TOKENIZED_BLEU_LINE = re.compile(r"^tokenized-BLEU\|.* = \d+\.\d+", re.MULTILINE)


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


plan = load_module("wmt14_plan", ROOT / "recipes" / "wmt14_plan.py")
smoke_data = load_module("wmt14_smoke_data", ROOT / "recipes" / "wmt14_smoke_data.py")


def recipe_env(env: dict[str, str]) -> dict[str, str]:
    # The interpreter's own bin first: nmt, torchrun and python3 of the environment under test.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "WORKERS": "2", **env}


def run_recipe(script: str, env: dict[str, str], ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", str(ROOT / "recipes" / script)], env=recipe_env(env),
                            capture_output=True, text=True, timeout=1200)
    if ok:
        assert result.returncode == 0, f"{script} failed:\n{result.stderr[-3000:]}"
    else:
        assert result.returncode != 0, f"{script} should have failed:\n{result.stderr[-3000:]}"
    return result


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def resolve(**env: str):
    return plan.resolve({"ROOT": str(ROOT), **env})


# ---- the paper's settings, the batch, the plan ------------------------------------------

def test_paper_settings_per_pair_and_arch():
    # Vaswani et al. (2017) and fairseq's scaling-NMT recipe, written out independently.
    expected = {  # lr, dropout, updates, checkpoints averaged
        ("en-de", "transformer_base"): (7e-4, 0.1, 100_000, 5),
        ("en-de", "transformer_big"): (5e-4, 0.3, 300_000, 20),
        ("en-fr", "transformer_base"): (7e-4, 0.1, 100_000, 5),
        ("en-fr", "transformer_big"): (5e-4, 0.1, 300_000, 20),
    }
    for (pair, arch), (lr, dropout, updates, average) in expected.items():
        r = resolve(PAIR=pair, ARCH=arch, GPUS="8")
        s = r.settings
        assert (s.lr, s.dropout, s.max_update, s.average) == (lr, dropout, updates, average)
        assert (s.warmup_updates, s.label_smoothing, s.beam, s.lenpen, s.max_len_a, s.max_len_b) == (4000, 0.1, 4, 0.6, 1, 50)
        command = plan.train_command(r)
        for flag, value in (("--lr", f"{lr:g}"), ("--dropout", f"{dropout:g}"), ("--max-update", str(updates)),
                            ("--keep-interval-updates", str(average))):
            assert command[command.index(flag) + 1] == value
    assert plan.PAPER_BLEU[("en-fr", "transformer_base")] == 38.1


def test_settings_are_overridable_and_the_plan_says_so():
    r = resolve(PAIR="en-de", ARCH="transformer_big", GPUS="8", LR="3e-4", AVERAGE="10")
    assert (r.settings.lr, r.settings.average) == (3e-4, 10)
    text = plan.plan_text(r, dry_run=False)
    assert re.search(r"^  lr +0\.0003 +\[LR\] +\(override; paper 0\.0005\)$", text, re.MULTILINE), text
    assert re.search(r"^  dropout +0\.3 +\[DROPOUT\]$", text, re.MULTILINE), text


@pytest.mark.parametrize("env,message", [
    ({"PAIR": "en-es"}, "PAIR='en-es'"),
    ({"PAIR": "en-de", "ARCH": "transformer_huge"}, "ARCH='transformer_huge'"),
    ({"PAIR": "en-de", "LR": "fast"}, "LR='fast' is not a number"),
    ({"PAIR": "en-de", "TRAIN_FLAGS": '--foo "bar'}, "TRAIN_FLAGS='--foo \"bar' cannot be split into flags"),
    ({"PAIR": "en-de", "NNODES": "2"}, "MASTER_ADDR"),
    ({"PAIR": "en-de", "NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "a"}, "NODE_RANK"),
    ({"PAIR": "en-de", "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP port"),
    ({"PAIR": "en-de", "BPE_SIZE": "0"}, "BPE_SIZE must be >= 5"),
    ({"PAIR": "en-de", "PRECISION": "bf61"}, "PRECISION='bf61': choose one of"),
    ({"PAIR": "en-de", "KEEP_LAST_EPOCHS": "0"}, "KEEP_LAST_EPOCHS must be a positive count"),
    ({"PAIR": "en-de", "WORKERS": "0"}, "WORKERS must be >= 1"),
])
def test_bad_settings_give_one_error_line(env, message):
    result = run_recipe("wmt14.sh", {"DRY_RUN": "1", "GPUS": "1", **env}, ok=False)
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_plans_copies_of_nmt_limits_are_nmts():
    from nmt_cli.config import TRAIN_PRECISIONS
    from nmt_cli.text.bpe import MIN_VOCAB_SIZE

    assert plan.TRAIN_PRECISIONS == TRAIN_PRECISIONS
    assert plan.MIN_BPE_SIZE == MIN_VOCAB_SIZE


@pytest.mark.parametrize("processes", range(1, 29))
@pytest.mark.parametrize("cap", [None, 2048, 8192])
def test_batch_is_the_papers_for_any_world_size(processes, cap):
    batch = plan.plan_batch(plan.PAPER_BATCH, processes, cap, None)
    assert batch.processes == processes
    assert abs(batch.tokens_per_update - plan.PAPER_BATCH) <= 0.10 * plan.PAPER_BATCH
    assert batch.max_tokens <= (cap or plan.DEFAULT_MAX_TOKENS) or batch.update_freq == 1
    assert batch.max_tokens >= plan.MIN_MAX_TOKENS
    # The fewest accumulation steps the cap allows: one fewer would overfill a process's batch.
    if batch.update_freq > 1:
        assert plan.PAPER_BATCH / (processes * (batch.update_freq - 1)) > (cap or plan.DEFAULT_MAX_TOKENS)


def test_a_world_too_large_for_the_papers_batch_is_flagged():
    r = resolve(PAIR="en-de", GPUS="8", NNODES="8", MASTER_ADDR="node0")  # 64 processes
    assert not r.batch.within_tolerance and r.batch.max_tokens == plan.MIN_MAX_TOKENS
    assert "NOT within 10%" in plan.plan_text(r, dry_run=True) and "WARNING" in plan.plan_text(r, dry_run=True)


def plan_line(text: str, start: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(start)]
    assert lines, f"no line starting with {start!r} in:\n{text}"
    return lines[0]


@pytest.mark.parametrize("gpus,nnodes,max_tokens,update_freq", [
    ("1", "1", 3584, 8), ("3", "1", 3185, 3), ("8", "1", 3584, 1), ("16", "1", 1792, 1), ("8", "2", 1792, 1),
])
def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, gpus, nnodes, max_tokens, update_freq):
    work = tmp_path / "work"
    env = {"DRY_RUN": "1", "GPUS": gpus, "NNODES": nnodes, "MASTER_ADDR": "10.0.0.1", "WORK": str(work)}
    result = run_recipe("wmt14_en_de.sh", env)
    text = result.stderr
    processes = int(gpus) * int(nnodes)
    tokens = plan_line(text, "tokens per update:")
    assert f"{processes} x {max_tokens} (--max-tokens) x {update_freq} (--update-freq)" in tokens
    assert "within 10%" in tokens and "NOT" not in tokens
    assert re.search(r"expected time \(training\): [\d.]+-[\d.]+ h on", text)
    assert re.search(r"expected disk: [\d.]+ GB = .* checkpoints [\d.]+ GB", text)
    train = plan_line(text, "  3 train")
    assert f"--max-tokens {max_tokens} --update-freq {update_freq}" in train
    if processes > 1:
        assert f"torchrun --nproc-per-node {gpus}" in train
    if int(nnodes) > 1:
        assert "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500" in train
        assert "shared" in plan_line(text, "multi-node:")
    for stage in ("1 data      python3", "2 prepare   nmt preprocess", "4 average   nmt average",
                  "5 translate nmt translate", "6 score     nmt score"):
        assert f"\n  {stage}" in text
    assert not work.exists() and result.stdout == ""


def test_en_fr_names_the_paper_figure_of_the_arch_it_trains():
    shell = plan.shell_assignments(resolve(PAIR="en-fr", GPUS="8"))
    assert "PAPER_BLEU=38.1" in shell and "ARCH=transformer_base" in shell
    assert "PAPER_BLEU=41.8" in plan.shell_assignments(resolve(PAIR="en-fr", ARCH="transformer_big", GPUS="8"))


def test_estimates_rest_on_the_benchmark_figures():
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    row = re.search(r"^\| GPU training, transformer_base / big, [^|]*\|[^|]*\| H200 \|[^|]*\| ([\d,]+) / ([\d,]+) ",
                    readme, re.MULTILINE)
    assert row, "benchmarks/README.md's latest figures have no GPU training row for nmt"
    base, big = (int(x.replace(",", "")) for x in row.groups())
    assert plan.H200_TARGET_TOKENS_PER_S == {"transformer_base": base, "transformer_big": big}
    one_base = plan.time_estimate(resolve(PAIR="en-de", GPUS="1"))
    one_big = plan.time_estimate(resolve(PAIR="en-de", ARCH="transformer_big", GPUS="1"))
    assert 1 <= one_base.hours_low < one_base.hours_high <= 3
    assert one_big.hours_low / one_base.hours_low == pytest.approx(3 * base / big)
    assert (one_base.paper_p100_hours, one_big.paper_p100_hours) == (pytest.approx(11.1, abs=0.1), pytest.approx(83.3, abs=0.1))
    eight = plan.time_estimate(resolve(PAIR="en-de", GPUS="8"))
    assert eight.hours_low == pytest.approx(one_base.hours_low / 8)


@pytest.mark.parametrize("script,pair", [("wmt14_en_de.sh", "en-de"), ("wmt14_en_fr.sh", "en-fr")])
def test_headers_state_what_the_plan_computes(script, pair):
    header = (ROOT / "recipes" / script).read_text(encoding="utf-8")
    for arch, label in (("transformer_base", "base"), ("transformer_big", "big ")):
        one = plan.time_estimate(resolve(PAIR=pair, ARCH=arch, GPUS="1"))
        eight = plan.time_estimate(resolve(PAIR=pair, ARCH=arch, GPUS="8"))
        updates = plan.PAPER[(pair, arch)].max_update // 1000
        assert (f"{label} ({updates}k updates): {one.hours_low:.1f}-{one.hours_high:.1f} h on one H200" in header
                and f"{eight.hours_low:.1f}-{eight.hours_high:.1f} h on 8" in header), (arch, one, eight)
        disk = plan.disk_estimate(resolve(PAIR=pair, ARCH=arch, GPUS="8"))
        assert f"{label.strip()} ~{disk.total / 1e9:.0f} GB" in header, (arch, disk.total)
    assert "V100" not in header


@pytest.mark.parametrize("arch", ["transformer_base", "transformer_big", "transformer_tiny"])
def test_parameter_count_of_the_disk_estimate_is_nmts(arch):
    import dataclasses

    from nmt_cli.models.registry import ARCHITECTURES
    from nmt_cli.models.size import parameter_counts

    cfg = dataclasses.replace(ARCHITECTURES[arch], share_all_embeddings=True)
    assert plan.parameters(arch, 32004) == parameter_counts(cfg, 32004, 32004)["total"]


def test_disk_estimate_counts_checkpoints_with_their_optimizer_state():
    base = plan.disk_estimate(resolve(PAIR="en-de", GPUS="8"))
    big = plan.disk_estimate(resolve(PAIR="en-de", ARCH="transformer_big", GPUS="8"))
    assert base.checkpoint == 12 * plan.parameters("transformer_base", 32004)
    assert (base.checkpoints_kept, big.checkpoints_kept) == (5 + 1 + 2, 20 + 1 + 2)
    every_epoch = plan.disk_estimate(resolve(PAIR="en-de", ARCH="transformer_big", GPUS="8", KEEP_LAST_EPOCHS="-1"))
    # 300k updates of 28,672 x 0.70 target tokens over 4.5M pairs of ~30 pieces: 45 epochs, a checkpoint each.
    assert every_epoch.epoch_checkpoints == 45 and every_epoch.checkpoints > 150e9


# ---- the data path, on generated archives laid out like WMT's ----------------------------

def generated_archives(tmp_path: Path, pair: str) -> Path:
    archives = tmp_path / "archives"
    smoke_data.write(pair, archives, 300)
    return archives


def data_only_env(tmp_path: Path, archives: Path, **extra: str) -> dict[str, str]:
    return {"WORK": str(tmp_path / "work"), "GPUS": "0", "WMT14_DIR": str(archives),
            "WMT14_MANIFEST": str(archives / "corpora.tsv"), **extra}


def test_truncated_archive_stops_the_recipe_at_its_checksum(tmp_path):
    archives = generated_archives(tmp_path, "en-de")
    europarl = archives / "europarl-v7.tgz"
    europarl.write_bytes(europarl.read_bytes()[:-100])
    result = run_recipe("wmt14_en_de.sh", data_only_env(tmp_path, archives), ok=False)
    assert "checksum mismatch" in result.stderr and "error: stage data failed" in result.stderr
    work = tmp_path / "work"
    assert not (work / ".done.data").exists() and not (work / "raw" / "train.en").exists()
    assert "== prepare" not in result.stderr


def test_damaged_archive_stops_the_recipe_at_its_extraction(tmp_path):
    archives = generated_archives(tmp_path, "en-de")
    europarl = archives / "europarl-v7.tgz"
    europarl.write_bytes(europarl.read_bytes()[: europarl.stat().st_size // 2])
    # A manifest that vouches for the damaged file: extraction itself must catch it.
    manifest = archives / "corpora.tsv"
    data = europarl.read_bytes()
    rows = [row.split("\t") for row in manifest.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        if row[0] == "wmt14/europarl-v7.tgz":
            row[2], row[3] = hashlib.sha256(data).hexdigest(), str(len(data))
    manifest.write_text("\n".join("\t".join(row) for row in rows) + "\n", encoding="utf-8")
    result = run_recipe("wmt14_en_de.sh", data_only_env(tmp_path, archives), ok=False)
    assert "error: cannot extract" in result.stderr and "error: stage data failed" in result.stderr
    work = tmp_path / "work"
    assert not (work / ".done.data").exists() and not (work / "orig" / "europarl-v7.tgz.extracted").exists()
    assert (work / ".failed.data").exists() and "== prepare" not in result.stderr


def test_failing_stage_names_itself_and_leaves_no_marker(tmp_path):
    archives = generated_archives(tmp_path, "en-de")
    # More BPE pieces than the generated text has: nmt preprocess refuses.
    result = run_recipe("wmt14_en_de.sh", data_only_env(tmp_path, archives, BPE_SIZE="100000"), ok=False)
    work = tmp_path / "work"
    assert "error: stage prepare failed" in result.stderr
    assert (work / ".done.data").exists() and not (work / ".done.prepare").exists()
    assert "Cannot open" not in result.stderr  # no archive glob that matches nothing
    for lang in ("en", "de"):  # the data stage's output: whole corpora, test from the SGM files
        assert len((work / "raw" / f"train.{lang}").read_text(encoding="utf-8").splitlines()) == 300
    reference = smoke_data.corpus(12, 100, "en", "de")[1]
    assert (work / "raw" / "test.de").read_text(encoding="utf-8").splitlines() == reference


def reference_lines(lang: str) -> list[str]:
    """newstest2014's reference where the shared data has it, else generated lines."""
    path = SHARED_DATA / ("wmt14_en_de" if lang == "de" else "wmt14_en_fr") / f"test.{lang}"
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()
    return smoke_data.corpus(3, 3003, "en", lang)[1]


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_sgm_extraction_gives_the_reference_unmodified(tmp_path, lang):
    lines = reference_lines(lang)
    sgm = tmp_path / f"newstest2014-{lang}en-ref.{lang}.sgm"
    sgm.write_text(smoke_data.sgm(lines, "newstest2014", lang, "ref"), encoding="utf-8")
    extracted = subprocess.run(["bash", "-c", f'source "{ROOT}/recipes/wmt14_data.sh"; extract_sgm "$1"', "-", str(sgm)],
                               capture_output=True, check=True)
    assert extracted.stdout == ("\n".join(lines) + "\n").encode("utf-8")


# ---- multi-node: the other nodes wait for node rank 0 ----------------------------------

def test_other_node_refuses_a_work_directory_it_does_not_share(tmp_path):
    env = {"WORK": str(tmp_path / "work"), "GPUS": "0", "NNODES": "2", "NODE_RANK": "1",
           "MASTER_ADDR": "127.0.0.1", "SHARED_WORK_TIMEOUT": "0"}
    result = run_recipe("wmt14_en_de.sh", env, ok=False)
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "shares" in errors[0] and ".node0" in errors[0]


def test_other_node_stops_when_node_rank_0_fails(tmp_path):
    archives = generated_archives(tmp_path, "en-de")
    (archives / "dev.tgz").write_bytes(b"not an archive")
    nodes = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "WAIT_POLL": "1"}
    run_recipe("wmt14_en_de.sh", data_only_env(tmp_path, archives, NODE_RANK="0", **nodes), ok=False)
    result = run_recipe("wmt14_en_de.sh", data_only_env(tmp_path, archives, NODE_RANK="1", **nodes), ok=False)
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "stage data failed on node rank 0" in errors[0]


# ---- lossless evaluation text ------------------------------------------------------------

@pytest.mark.parametrize("lang", ["de", "fr"])
def test_evaluation_text_survives_preprocessing_and_postprocessing(tmp_path, lang):
    """The reference through the recipe's own `nmt preprocess` command, then through what
    translate does to its output (dictionary, BPE decoding, detokenization), against the
    untouched reference: sacreBLEU >= 99.5."""
    from nmt_cli.data.pairs import load_data_bin
    from nmt_cli.text.pipeline import TextPipeline

    references = reference_lines(lang)
    raw = tmp_path / "raw"
    raw.mkdir()
    # The source side does not matter here: the reference stands in on both sides.
    # Training text with the test set's characters, as a 4.5M-pair corpus has them all.
    for split, lines in (("train", references), ("valid", references[:100]), ("test", references)):
        for side in ("en", lang):
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = resolve(PAIR=f"en-{lang}", GPUS="1", WORK=str(tmp_path), BPE_SIZE="1000", WORKERS="1")
    command = plan.preprocess_command(r)
    subprocess.run([str(Path(sys.executable).parent / "nmt"), *command[1:]], check=True, capture_output=True)

    data = load_data_bin(r.paths.data_bin)
    test = data.split("test")
    pipeline = TextPipeline.from_data_bin(r.paths.data_bin, lang)
    restored = [pipeline.decode(data.tgt_dict.decode(test.tgt[i])) for i in range(len(test))]
    assert len(restored) == len(references)
    bleu = sacrebleu.corpus_bleu(restored, [references])
    assert bleu.score >= 99.5, f"{lang}: sacreBLEU {bleu.score:.2f}"


# ---- end to end ----------------------------------------------------------------------------

@pytest.mark.slow
def test_quickstart_reduced(tmp_path):
    if not (SHARED_DATA / "multi30k").is_dir():
        pytest.skip("shared data not present: multi30k")
    env = {
        "WORK": str(tmp_path / "quickstart"),
        "DATA_DIR": str(SHARED_DATA / "multi30k"),
        "ARCH": "transformer_tiny",
        "BPE_SIZE": "2000",
        "MAX_UPDATE": "30",
        "AVERAGE": "2",
        "SAVE_INTERVAL_UPDATES": "10",
        # A model of 30 updates seldom ends a sentence: a short greedy search keeps translating quick.
        "BEAM": "1", "MAX_LEN_A": "0", "MAX_LEN_B": "10",
    }
    first = run_recipe("quickstart.sh", env)
    assert BLEU_LINE.search(first.stdout), first.stdout
    assert "== train" in first.stderr
    hyp = tmp_path / "quickstart" / "test.hyp.de"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 1000
    curves = tmp_path / "quickstart" / "curves.png"  # drawn with the plot extra, else its command is printed
    assert (f"curves:       {curves}" in first.stderr and curves.stat().st_size > 0) \
        or f"nmt plot {tmp_path / 'quickstart' / 'run'} -o {curves}" in first.stderr

    second = run_recipe("quickstart.sh", env)
    assert BLEU_LINE.search(second.stdout)
    for stage in ("== preprocess", "== train", "== average", "== translate"):
        assert stage not in second.stderr

    # A budget too short for one update checkpoint: the last checkpoint is the model.
    short = tmp_path / "short"
    for name in ("raw", "data-bin"):  # the same corpus, preprocessed once
        shutil.copytree(tmp_path / "quickstart" / name, short / name)
    third = run_recipe("quickstart.sh", {**env, "WORK": str(short), "MAX_UPDATE": "3", "SAVE_INTERVAL_UPDATES": "1000"})
    assert "no update checkpoint yet" in third.stderr
    assert BLEU_LINE.search(third.stdout), third.stdout
    assert len((short / "test.hyp.de").read_text(encoding="utf-8").splitlines()) == 1000


@pytest.mark.slow
def test_wmt14_en_de_smoke_from_a_fresh_clone(tmp_path):
    """SMOKE=1 with nothing but the repository: generated archives through the real data
    path; re-runs skip, redo or refuse stages by their settings."""
    work = tmp_path / "wmt14"
    env = {"SMOKE": "1", "WORK": str(work), "SHARED_DATA": str(tmp_path / "absent")}
    first = run_recipe("wmt14_en_de.sh", env)
    assert BLEU_LINE.search(first.stdout), first.stdout
    assert TOKENIZED_BLEU_LINE.search(first.stdout) and "compound-split:yes" in first.stdout
    assert "Cannot open" not in first.stderr
    hypotheses = work / "run_transformer_tiny" / "newstest2014.en-de.de"
    assert len(hypotheses.read_text(encoding="utf-8").splitlines()) == 100
    # The disk estimate's bytes per parameter: Adam's two float32 moments beside the weights.
    import torch

    state = torch.load(work / "run_transformer_tiny" / "checkpoint_last.pt", weights_only=True)
    parameters = plan.parameters("transformer_tiny", len(state["src_dict"]))
    moments = [t for s in state["optimizer"]["state"].values() for name, t in s.items() if name != "step"]
    optimizer_bytes = plan.CHECKPOINT_BYTES_PER_PARAMETER - plan.AVERAGED_BYTES_PER_PARAMETER
    assert sum(t.numel() * t.element_size() for t in moments) == optimizer_bytes * parameters
    averaged = torch.load(work / "run_transformer_tiny" / "checkpoint_avg2.pt", weights_only=True)
    assert sum(t.numel() * t.element_size() for t in averaged["model"].values()) >= 4 * parameters
    assert "optimizer" not in averaged

    second = run_recipe("wmt14_en_de.sh", env)
    assert BLEU_LINE.search(second.stdout)
    for stage in ("data", "prepare", "train", "average", "translate"):
        assert f"{stage}: done with these settings, skipped" in second.stderr

    refused = run_recipe("wmt14_en_de.sh", {**env, "LR": "1e-3"}, ok=False)
    errors = error_lines(refused.stderr)
    assert len(errors) == 1 and "stage train" in errors[0] and "--lr 0.002 -> --lr 0.001" in errors[0]

    redone = run_recipe("wmt14_en_de.sh", {**env, "BEAM": "2"})
    assert "translate: the settings changed (--beam 4 -> --beam 2), redoing it" in redone.stderr
    assert "average: done with these settings, skipped" in redone.stderr and BLEU_LINE.search(redone.stdout)


@pytest.mark.slow
def test_wmt14_en_fr_smoke_on_two_nodes(tmp_path):
    """Two "nodes" on this machine sharing WORK: node rank 0 prepares the data (En-Fr's UN
    and Gigaword archives included), both join one torchrun, node rank 0 scores."""
    env = {"SMOKE": "1", "WORK": str(tmp_path / "wmt14"), "NNODES": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(29400 + os.getpid() % 500), "WAIT_POLL": "1"}
    nodes = [subprocess.Popen(["bash", str(ROOT / "recipes" / "wmt14_en_fr.sh")],
                              env=recipe_env({**env, "NODE_RANK": str(rank)}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=1200) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    (out0, err0), (out1, err1) = outputs
    assert BLEU_LINE.search(out0) and TOKENIZED_BLEU_LINE.search(out0) and "compound-split:yes" not in out0
    assert "2 process(es) on cpu" in err0
    assert "node rank 1: training done" in err1 and not BLEU_LINE.search(out1)
    assert "== data" not in err1 and "== prepare" not in err1
