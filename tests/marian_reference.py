"""Hugging Face's side of tests/test_marian.py; runs in the reference environment (transformers).

    python marian_reference.py JOBS_JSON
        JOBS_JSON: {"jobs": {NAME: {"directory": DIR, "settings": {...}, "generate": [OPTIONS, ...]}},
        "sentences": [...]}. Each DIR holds source.spm, target.spm, vocab.json (and
        target_vocab.json for separate vocabularies); a randomly initialised MarianMTModel
        and its tokenizer are written there with save_pretrained. Prints, as JSON, NAME ->
        for each OPTIONS the translations of MarianTokenizer + MarianMTModel.generate:
        [text, tokens generated] per sentence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer


def build(directory: Path, settings: dict) -> None:
    separate = settings["separate_vocabs"]
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    target_vocab = json.loads((directory / "target_vocab.json").read_text(encoding="utf-8")) if separate else vocab
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(target_vocab), d_model=settings["d_model"],
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=2 * settings["d_model"], decoder_ffn_dim=2 * settings["d_model"],
        activation_function=settings["activation"], scale_embedding=True, max_position_embeddings=128,
        pad_token_id=pad, decoder_start_token_id=target_vocab["<pad>"], eos_token_id=0, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=not separate, tie_word_embeddings=settings["tied"],
        dropout=0.1,
    )
    torch.manual_seed(settings["seed"])
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Weights far from Hugging Face's small initialisation, so that the best tokens are
        # far apart and both toolkits' rounding picks the same ones.
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.normal_(1.0, 0.1) if name.endswith("weight") else parameter.normal_(0.0, 0.1)
            else:
                parameter.normal_(0.0, 0.25)
        model.final_logits_bias.normal_(0.0, 1.0)
        model.final_logits_bias[0, 0] += settings["eos_bias"]  # sentences end at varied lengths
    model.save_pretrained(directory)
    tokenizer = MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"), str(directory / "vocab.json"),
        target_vocab_file=str(directory / "target_vocab.json") if separate else None, separate_vocabs=separate,
        source_lang=settings["source_lang"], target_lang=settings["target_lang"],
    )
    tokenizer.save_pretrained(directory)


def generate(directory: Path, options: dict, sentences: list[str]) -> list[list]:
    tokenizer = MarianTokenizer.from_pretrained(directory)
    model = MarianMTModel.from_pretrained(directory).eval()
    outputs = []
    for sentence in sentences:  # one at a time: no padding in either toolkit's batch
        batch = tokenizer([sentence], return_tensors="pt")
        with torch.no_grad():
            tokens = model.generate(
                **batch, num_beams=options["beam"], do_sample=False, early_stopping=True,
                length_penalty=options["lenpen"], max_length=options["max_length"], min_new_tokens=1,
                bad_words_ids=[[model.config.pad_token_id]], num_return_sequences=1,
            )
        # The text, and the number of tokens after the start token (</s> included).
        outputs.append([tokenizer.decode(tokens[0], skip_special_tokens=True), tokens.size(1) - 1])
    return outputs


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    results = {}
    for name, job in spec["jobs"].items():
        directory = Path(job["directory"])
        build(directory, job["settings"])
        results[name] = [generate(directory, options, spec["sentences"]) for options in job["generate"]]
    print(json.dumps(results))
