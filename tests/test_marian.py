"""nmt import-marian: Hugging Face MarianMTModel directories (OPUS-MT) as nmt run directories.

The truth is transformers itself (in the reference environment, NMT_FAIRSEQ_PYTHON, when
it has transformers): a tiny randomly initialised MarianMTModel saved with save_pretrained,
with sentencepiece models trained here, must translate raw text through `nmt translate`
exactly as MarianTokenizer + MarianMTModel.generate do, greedy and with beams. Without
it, hand-written model directories check the reader, the refusals and the line guarantees.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from click.testing import CliRunner

from nmt_cli.checkpoints.format import load_checkpoint
from nmt_cli.cli import main
from nmt_cli.interop.marian.weights import read_safetensors
from nmt_cli.models.layers import marian_sinusoid_table

HERE = Path(__file__).resolve().parent
REFERENCE_PYTHON = os.environ.get("NMT_FAIRSEQ_PYTHON")
WORDS = ["".join(random.Random(i).choice("abcdefghiklmnoprstu") for _ in range(random.Random(-i).randint(2, 7)))
         for i in range(120)]


@functools.cache
def has_transformers() -> bool:
    if not REFERENCE_PYTHON:
        return False
    probe = subprocess.run([REFERENCE_PYTHON, "-c", "import transformers, sentencepiece"], capture_output=True)
    return probe.returncode == 0


def sentences(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(count)]


def train_spm(path: Path, seed: int, size: int) -> list[str]:
    """A small unigram model (sentencepiece's defaults, as OPUS-MT's) -> its pieces, specials left out."""
    text = path.with_suffix(".txt")
    text.write_text("\n".join(sentences(seed, 400)) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(path.with_suffix("")), vocab_size=size,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    path.with_suffix(".model").rename(path)
    processor = spm.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))]


def marian_vocab(pieces: list[str], pad_last: bool = True) -> dict[str, int]:
    """OPUS-MT's layout: </s> 0, <unk> 1, the pieces, <pad> last; or <pad> 2, where two
    vocabularies of different sizes share config.json's one pad_token_id."""
    pieces = list(dict.fromkeys(pieces))
    symbols = ["</s>", "<unk>", *pieces, "<pad>"] if pad_last else ["</s>", "<unk>", "<pad>", *pieces]
    return {symbol: i for i, symbol in enumerate(symbols)}


def write_text_files(directory: Path, separate: bool) -> None:
    directory.mkdir(parents=True)
    source = train_spm(directory / "source.spm", 1, 48)
    target = train_spm(directory / "target.spm", 2, 40)
    if separate:
        (directory / "vocab.json").write_text(json.dumps(marian_vocab(source, pad_last=False)), encoding="utf-8")
        (directory / "target_vocab.json").write_text(json.dumps(marian_vocab(target, pad_last=False)), encoding="utf-8")
    else:
        (directory / "vocab.json").write_text(json.dumps(marian_vocab(source + target)), encoding="utf-8")


def nmt(*args: object, input: str | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


# --- against transformers ------------------------------------------------------------------

CASES = {
    "shared-swish": {"separate_vocabs": False, "tied": True, "activation": "swish", "d_model": 32, "seed": 3,
                     "eos_bias": 4.0},
    "separate-gelu": {"separate_vocabs": True, "tied": True, "activation": "gelu", "d_model": 32, "seed": 4,
                      "eos_bias": 4.0},
    "shared-untied-relu": {"separate_vocabs": False, "tied": False, "activation": "relu", "d_model": 32, "seed": 5,
                           "eos_bias": 4.0},
}


BEAMS = (1, 4)
# Hugging Face's max_length counts the start token and </s>: 30 tokens before the forced </s>.
LONGEST = 30


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory) -> dict[str, dict]:
    """Per case: a MarianMTModel directory written by transformers, its nmt import, and what
    MarianTokenizer + generate make of `sentences(11, 40)` with each of BEAMS (one reference
    process for them all: importing transformers is most of its time)."""
    if not has_transformers():
        pytest.skip("needs NMT_FAIRSEQ_PYTHON with transformers (benchmarks/setup_peers.sh)")
    root = tmp_path_factory.mktemp("marian")
    jobs = {}
    for name, case in CASES.items():
        model_dir = root / name / "opus-mt-xx-yy"
        write_text_files(model_dir, case["separate_vocabs"])
        jobs[name] = {"directory": str(model_dir), "settings": {**case, "source_lang": "xx", "target_lang": "yy"},
                      "generate": [{"beam": beam, "lenpen": 1.0, "max_length": LONGEST + 2} for beam in BEAMS]}
    spec = root / "jobs.json"
    spec.write_text(json.dumps({"jobs": jobs, "sentences": sentences(11, 40)}), encoding="utf-8")
    done = subprocess.run([REFERENCE_PYTHON, HERE / "marian_reference.py", spec], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    translations = json.loads(done.stdout)
    models = {}
    for name, job in jobs.items():
        result = nmt("import-marian", job["directory"], "--out", root / name / "run")
        assert result.exit_code == 0, result.output
        models[name] = {"run": root / name / "run", "translations": dict(zip(BEAMS, translations[name]))}
    return models


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("beam", BEAMS)
def test_translations_equal_transformers_generate(hf_models, case, beam, tmp_path):
    run, theirs = hf_models[case]["run"], hf_models[case]["translations"][beam]
    lines = sentences(11, 40)
    source = tmp_path / "in.xx"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = nmt("translate", "--path", run / "checkpoint.pt", "-i", source, "--beam", beam, "--lenpen", 1.0,
                 "--max-len-a", 0, "--max-len-b", LONGEST, "--batch-size", 7, "--output-format", "jsonl")
    assert result.exit_code == 0, result.output
    ours = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(ours) == len(lines)
    # A </s> forced at the maximum length costs nothing in Hugging Face's beam scores and its
    # log-probability in fairseq's (and nmt's): beams that reach it may rank differently.
    # Greedy search has no ranking to change.
    compared = [(hyp["hyp"], text) for hyp, (text, length) in zip(ours, theirs)
                if beam == 1 or (len(hyp["tokens"]) <= LONGEST and length <= LONGEST)]
    assert [mine for mine, _ in compared] == [reference for _, reference in compared]
    assert len(compared) >= 20 and len({text for _, text in compared}) >= 3  # not one answer to everything


# MarianMTModel's log_softmax, teacher-forced: JSON {"jobs": [[DIR, SOURCE_IDS, TARGET_IDS], ...]}
# on stdin (Marian ids; the source ends in </s>, the target does not) -> per job the (T, V)
# log-probs after the decoder start token and each target token.
LOG_PROBS_SCRIPT = """
import json, sys, torch
from transformers import MarianMTModel
results, models = [], {}
for directory, source, target in json.load(sys.stdin)["jobs"]:
    if directory not in models:
        models[directory] = MarianMTModel.from_pretrained(directory).eval()
    model = models[directory]
    prev = [[model.config.decoder_start_token_id] + target]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor(prev)).logits
    results.append(torch.log_softmax(logits.double(), dim=-1)[0].tolist())
print(json.dumps(results))
"""


def marian_model_dir(run: Path) -> Path:
    return run.parent / "opus-mt-xx-yy"


@functools.cache
def imported_model(checkpoint: Path) -> torch.nn.Module:
    from nmt_cli.checkpoints.format import model_from_checkpoint

    return model_from_checkpoint(load_checkpoint(checkpoint)).eval()


def nmt_log_probs(checkpoint: Path, source: list[int], target: list[int]) -> torch.Tensor:
    """The imported model's teacher-forced log-probs (T, V) of nmt ids `source` (ending in
    </s>) and `target` (without it): after </s> (the start) and each target token."""
    from nmt_cli.decode.forced import previous_tokens

    eos = 2
    with torch.no_grad():
        logits = imported_model(checkpoint)(torch.tensor([source]), previous_tokens(torch.tensor([target + [eos]])))
    return torch.log_softmax(logits.double(), dim=-1)[0]


def random_pieces(vocab: dict[str, int], seed: int, length: int) -> list[str]:
    pieces = sorted(piece for piece in vocab if piece not in ("</s>", "<unk>", "<pad>"))
    rng = random.Random(seed)
    return [rng.choice(pieces) for _ in range(length)]


def test_log_probs_equal_transformers_teacher_forced(hf_models):
    """Every target symbol's log-probability, teacher-forced, is MarianMTModel's: the
    permuted rows, the output bias, and the rows for symbols Marian lacks (whose bias keeps
    them out of the softmax's normaliser)."""
    jobs, ours = [], []
    for number, name in enumerate(sorted(hf_models)):
        run = hf_models[name]["run"]
        directory = marian_model_dir(run)
        src_vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        tgt_file = directory / ("target_vocab.json" if CASES[name]["separate_vocabs"] else "vocab.json")
        tgt_vocab = json.loads(tgt_file.read_text(encoding="utf-8"))
        checkpoint = load_checkpoint(run / "checkpoint.pt")
        src_ids = {symbol: i for i, symbol in enumerate(checkpoint["src_dict"])}
        tgt_symbols = list(checkpoint["tgt_dict"])
        for length in (0, 3, 9):
            source = random_pieces(src_vocab, 10 * number + length, 5) + ["</s>"]
            target = random_pieces(tgt_vocab, 100 + 10 * number + length, length)
            jobs.append([str(directory), [src_vocab[p] for p in source], [tgt_vocab[p] for p in target]])
            lprobs = nmt_log_probs(run / "checkpoint.pt", [src_ids[p] for p in source],
                                   [tgt_symbols.index(p) for p in target])
            ours.append((lprobs, [tgt_vocab.get(symbol) for symbol in tgt_symbols]))
    done = subprocess.run([REFERENCE_PYTHON, "-c", LOG_PROBS_SCRIPT], input=json.dumps({"jobs": jobs}),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for (lprobs, marian_of), theirs in zip(ours, json.loads(done.stdout)):
        theirs = torch.tensor(theirs, dtype=torch.float64)
        known = [i for i, m in enumerate(marian_of) if m is not None]
        assert len(known) == theirs.size(1) and lprobs.shape == (theirs.size(0), len(marian_of))
        torch.testing.assert_close(lprobs[:, known], theirs[:, [marian_of[i] for i in known]], atol=2e-5, rtol=0)
        assert (lprobs[:, [i for i, m in enumerate(marian_of) if m is None]] < -5e3).all()


# --- without transformers: hand-written model directories ----------------------------------


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file, written from its specification (header length, JSON header, bytes)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        data = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": {torch.float32: "F32", torch.float16: "F16"}[tensor.dtype],
                        "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def marian_weights(vocab_size: int, dim: int, layers: int, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under MarianMTModel's names (shared embeddings, tied output)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.4

    weights = {"model.shared.weight": rand(vocab_size, dim), "final_logits_bias": rand(1, vocab_size)}
    for side in ("encoder", "decoder"):
        for i in range(layers):
            prefix = f"model.{side}.layers.{i}"
            attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for attention in attentions:
                for proj in "qkvo":
                    name = f"{prefix}.{attention}.{'out' if proj == 'o' else proj}_proj"
                    weights[f"{name}.weight"], weights[f"{name}.bias"] = rand(dim, dim), rand(dim)
                weights[f"{prefix}.{attention}_layer_norm.weight"] = 1 + rand(dim) / 4
                weights[f"{prefix}.{attention}_layer_norm.bias"] = rand(dim) / 4
            weights[f"{prefix}.fc1.weight"], weights[f"{prefix}.fc1.bias"] = rand(2 * dim, dim), rand(2 * dim)
            weights[f"{prefix}.fc2.weight"], weights[f"{prefix}.fc2.bias"] = rand(dim, 2 * dim), rand(dim)
            weights[f"{prefix}.final_layer_norm.weight"] = 1 + rand(dim) / 4
            weights[f"{prefix}.final_layer_norm.bias"] = rand(dim) / 4
    return weights


def hand_written_model(directory: Path, **config_changes: object) -> Path:
    write_text_files(directory, separate=False)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    config = {"model_type": "marian", "architectures": ["MarianMTModel"], "d_model": 16, "encoder_layers": 1,
              "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
              "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "vocab_size": len(vocab), "max_position_embeddings": 64,
              "activation_function": "swish", "scale_embedding": True, "pad_token_id": vocab["<pad>"],
              "decoder_start_token_id": vocab["<pad>"], "eos_token_id": 0, **config_changes}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"source_lang": "xx", "target_lang": "yy"}))
    write_safetensors(directory / "model.safetensors", marian_weights(len(vocab), 16, 1, seed=7))
    return directory


@pytest.fixture(scope="module")
def hand_model(tmp_path_factory) -> Path:
    return hand_written_model(tmp_path_factory.mktemp("hand") / "model")


def test_safetensors_reader_reads_what_the_specification_describes(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).half(), "empty": torch.zeros(0, 2)}
    write_safetensors(tmp_path / "m.safetensors", tensors)
    read = read_safetensors(tmp_path / "m.safetensors")
    assert set(read) == set(tensors)
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor)


def test_marian_sinusoids_are_hugging_face_s_formula():
    # MarianSinusoidalPositionalEmbedding, element by element: pos / 10000^(2 (j // 2) / dim),
    # the sines of the even columns first, then the cosines of the odd ones.
    for dim in (8, 9, 16):
        table = marian_sinusoid_table(20, dim)
        sentinel = (dim + 1) // 2
        for pos in range(20):
            enc = [pos / math.pow(10000, 2 * (j // 2) / dim) for j in range(dim)]
            expected = [math.sin(v) for v in enc[0::2]] + [math.cos(v) for v in enc[1::2]]
            assert table[pos, :sentinel].tolist() == pytest.approx(expected[:sentinel], abs=1e-6)
            assert table[pos, sentinel:].tolist() == pytest.approx(expected[sentinel:], abs=1e-6)


def test_an_imported_model_translates_raw_text_one_line_per_input(hand_model, tmp_path):
    result = nmt("import-marian", hand_model, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert checkpoint["src_dict"][:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert checkpoint["model_config"]["sinusoids"] == "marian" and checkpoint["model_config"]["activation_fn"] == "swish"
    lines = sentences(5, 6) + ["", ">>yy<< " + sentences(6, 1)[0]]
    out = nmt("translate", "--path", tmp_path / "run" / "checkpoint.pt", "--beam", 3, "--max-len-b", 12, input="\n".join(lines) + "\n")
    assert out.exit_code == 0, out.output
    assert len(out.stdout.splitlines()) == len(lines) and out.stdout.splitlines()[6] == ""
    again = nmt("import-marian", hand_model, "--out", tmp_path / "run")
    assert again.exit_code == 0 and "nothing written" in again.output


def test_symbols_marian_lacks_never_get_probability(hand_model, tmp_path):
    """nmt's `<s>` has no row in a Marian vocabulary: whatever the prefix, its log-probability
    lies about 1e4 below the others', so it is never chosen nor takes mass from them."""
    assert nmt("import-marian", hand_model, "--out", tmp_path / "run").exit_code == 0
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    vocab = json.loads((hand_model / "vocab.json").read_text(encoding="utf-8"))
    symbols = list(checkpoint["tgt_dict"])
    lacking = [i for i, symbol in enumerate(symbols) if symbol not in vocab]
    assert [symbols[i] for i in lacking] == ["<s>"]
    ids = {symbol: i for i, symbol in enumerate(checkpoint["src_dict"])}
    source = [ids[p] for p in random_pieces(vocab, 1, 6)] + [2]
    lprobs = nmt_log_probs(tmp_path / "run" / "checkpoint.pt", source, [ids[p] for p in random_pieces(vocab, 2, 7)])
    assert (lprobs[:, lacking] < lprobs.max(dim=1, keepdim=True).values - 9e3).all()
    known = [i for i in range(len(symbols)) if i not in lacking]
    torch.testing.assert_close(lprobs[:, known].exp().sum(dim=1), torch.ones(lprobs.size(0), dtype=torch.float64))


def test_translate_never_writes_over_the_sentencepiece_models_it_reads(hand_model, tmp_path):
    """An imported run's BPE files are meta.json's source.spm and target.spm, not a data-bin's
    *.model: an --output naming one is refused before anything is written."""
    run = tmp_path / "run"
    assert nmt("import-marian", hand_model, "--out", run).exit_code == 0
    for name in ("source.spm", "target.spm"):
        before = (run / name).read_bytes()
        result = nmt("translate", "--path", run / "checkpoint.pt", "-o", run / name, input="a b\n")
        assert result.exit_code == 1 and "would destroy the input" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
        assert (run / name).read_bytes() == before


def test_a_language_tag_stays_one_piece(hand_model, tmp_path):
    from nmt_cli.text.pipeline import TextPipeline

    assert nmt("import-marian", hand_model, "--out", tmp_path / "run").exit_code == 0
    pipeline = TextPipeline.from_data_bin(tmp_path / "run", "xx")
    pieces = pipeline.encode(">>yy<< " + WORDS[0])
    assert pieces[0] == ">>yy<<" and "".join(pieces[1:]).replace("▁", "") == WORDS[0]


@pytest.mark.parametrize("change, message", [
    ({"model_type": "bart"}, "model_type is 'bart'"),
    ({"architectures": ["MarianForCausalLM"]}, "holds no MarianMTModel"),
    ({"activation_function": "gelu_new"}, "activation_function 'gelu_new'"),
    ({"d_model": 0}, "d_model must be a positive integer"),
    ({"dropout": None}, "dropout must be a number from 0 up to 1 (got None)"),
    ({"attention_dropout": [1]}, "attention_dropout must be a number from 0 up to 1 (got [1])"),
    ({"scale_embedding": "false"}, "scale_embedding must be true or false (got 'false')"),
    ({"eos_token_id": 5}, "eos_token_id 5 is not the id of '</s>'"),
])
def test_what_nmt_cannot_compute_is_refused_by_name(tmp_path, change, message):
    model = hand_written_model(tmp_path / "model", **change)
    result = nmt("import-marian", model, "--out", tmp_path / "run")
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_a_language_code_that_is_a_path_is_refused(hand_model, tmp_path):
    """The language names the run's dictionary, dict.LANG.txt: `-s ../x` would write it
    outside --out. Given or read from tokenizer_config.json, such a code is one error line."""
    work = tmp_path / "work"
    work.mkdir()
    result = nmt("import-marian", hand_model, "--out", work / "run", "-s", "../x")
    assert result.exit_code == 1, result.output
    assert result.output.strip() == "error: --source-lang must be a plain language code like 'en' (got '../x')"
    model = copy_model(hand_model, tmp_path / "model")
    (model / "tokenizer_config.json").write_text(json.dumps({"source_lang": "xx", "target_lang": "../y"}))
    result = nmt("import-marian", model, "--out", work / "run")
    assert result.exit_code == 1 and "tokenizer_config.json: target_lang must be a plain language code" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert list(work.iterdir()) == [] and not list(tmp_path.glob("*.txt"))


def copy_model(source: Path, dest: Path, leave_out: str | None = None) -> Path:
    """A copy of the model directory `source` at `dest`, without the file `leave_out`."""
    dest.mkdir()
    for name in os.listdir(source):
        if name != leave_out:
            (dest / name).write_bytes((source / name).read_bytes())
    return dest


def imported_weights(model_dir: Path, run: Path) -> dict[str, torch.Tensor]:
    """The weights of `nmt import-marian model_dir --out run`."""
    assert nmt("import-marian", model_dir, "--out", run).exit_code == 0
    return load_checkpoint(run / "checkpoint.pt")["model"]


def test_broken_files_are_one_error_line(hand_model, tmp_path):
    model = copy_model(hand_model, tmp_path / "model")
    weights = read_safetensors(model / "model.safetensors")
    cases = [
        ("model.safetensors", (hand_model / "model.safetensors").read_bytes()[:-10], "outside the file"),
        ("model.safetensors", b"\x05\x00", "not a safetensors file"),
        ("vocab.json", json.dumps({"</s>": 0, "<unk>": 2, "<pad>": 3}).encode(), "must be the integers 0 to 2"),
        ("config.json", b"{not json", "config.json: not JSON (Expecting property name enclosed in double quotes: column 2)"),
    ]
    for name, content, message in cases:
        original = (model / name).read_bytes()
        (model / name).write_bytes(content)
        result = nmt("import-marian", model, "--out", tmp_path / "run")
        assert result.exit_code == 1 and message in result.output, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
        (model / name).write_bytes(original)
    write_safetensors(model / "model.safetensors", {**weights, "model.encoder.layernorm_embedding.weight": torch.ones(16)})
    result = nmt("import-marian", model, "--out", tmp_path / "run")
    assert result.exit_code == 1 and "layernorm_embedding.weight belongs to a part of the model nmt does not have" in result.output
    del weights["model.decoder.layers.0.fc2.bias"]
    write_safetensors(model / "model.safetensors", weights)
    result = nmt("import-marian", model, "--out", tmp_path / "run")
    assert result.exit_code == 1 and "decoder.layers.0.fc2.bias is missing" in result.output


def test_sharded_safetensors_read_as_one_file(hand_model, tmp_path):
    model = copy_model(hand_model, tmp_path / "model", leave_out="model.safetensors")
    weights = read_safetensors(hand_model / "model.safetensors")
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in halves.items():
        write_safetensors(model / shard, {name: weights[name] for name in shard_names})
    index = {"weight_map": {name: shard for shard, shard_names in halves.items() for name in shard_names}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    sharded, single = imported_weights(model, tmp_path / "sharded"), imported_weights(hand_model, tmp_path / "single")
    assert sharded.keys() == single.keys() and all(torch.equal(sharded[k], single[k]) for k in single)
    (model / "model-00002-of-00002.safetensors").unlink()
    result = nmt("import-marian", model, "--out", tmp_path / "broken")
    assert result.exit_code == 1 and "lists the shard model-00002-of-00002.safetensors" in result.output


def test_pytorch_model_bin_is_read_without_running_its_code(hand_model, tmp_path):
    model = copy_model(hand_model, tmp_path / "model", leave_out="model.safetensors")
    torch.save(read_safetensors(hand_model / "model.safetensors"), model / "pytorch_model.bin")
    ours, reference = imported_weights(model, tmp_path / "from-bin"), imported_weights(hand_model, tmp_path / "from-safetensors")
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in reference)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo ran > " + str(tmp_path / "ran"),))

    torch.save({"x": Payload()}, model / "pytorch_model.bin", _use_new_zipfile_serialization=True)
    result = nmt("import-marian", model, "--out", tmp_path / "evil")
    assert result.exit_code == 1 and "without running its code" in result.output
    assert not (tmp_path / "ran").exists()


def jsonl_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_ctranslate2_translates_an_imported_model_as_nmt_does(hand_model, tmp_path):
    pytest.importorskip("ctranslate2")
    assert nmt("import-marian", hand_model, "--out", tmp_path / "run").exit_code == 0
    source = tmp_path / "in.xx"
    source.write_text("\n".join(sentences(8, 30)) + "\n", encoding="utf-8")
    for beam in (1, 4):
        common = ["--path", tmp_path / "run" / "checkpoint.pt", "-i", source, "--beam", beam, "--max-len-b", 20,
                  "--output-format", "jsonl"]
        ours, exported = nmt("translate", *common), nmt("translate", *common, "--engine", "ctranslate2")
        assert ours.exit_code == 0 and exported.exit_code == 0, exported.output
        ours, exported = jsonl_lines(ours.stdout), jsonl_lines(exported.stdout)
        # Beams that reach the maximum length end differently in CTranslate2 (it stops there
        # without a forced </s>); every other line is the same translation.
        differ = [len(a["tokens"]) for a, b in zip(ours, exported) if a["hyp"] != b["hyp"]]
        assert len(ours) == len(exported) == 30 and all(length == 21 for length in differ), differ
        assert len(differ) <= (0 if beam == 1 else 6)
    refused = nmt("export", "--format", "fairseq", tmp_path / "run" / "checkpoint.pt", tmp_path / "fairseq")
    assert refused.exit_code == 1 and "fairseq's Transformer has no --sinusoids marian" in refused.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
