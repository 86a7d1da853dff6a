"""`--eval-bleu`: translate the valid split at each validation and score it with sacreBLEU.

The translation is `nmt translate`'s: the binarized source sentences (what preprocess
made of the raw source with the data-bin's tokenizer and BPE, so the ids translate
would encode), batched as translate batches them, searched with `decode/search.generate`,
turned back into text by the data-bin's pipeline (`text/pipeline.py`), and scored
against the raw references the data-bin keeps (`preprocess/references.py`) exactly as
`nmt score` scores them. So the logged BLEU is what `nmt translate` + `nmt score` give
for the same checkpoint and search settings. With `--eval-tokenized-bleu` (fairseq's)
the tokenized text is scored instead: hypotheses with their BPE removed but not
detokenized, references tokenized as preprocessing tokenized the target side, and
sacreBLEU's tokenize 'none'.

Only the main rank translates; the other ranks receive its scores, so that every rank
takes the same best-checkpoint and --patience decisions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from sacremoses import MosesDetokenizer

from nmt_cli.config import EVAL_BLEU_DETOK, EVAL_BLEU_REMOVE_BPE, TrainConfig
from nmt_cli.data.pairs import DataBin, PairDataset
from nmt_cli.decode.search import check_beam_fits, generate
from nmt_cli.decode.translator import make_batches, pad_batch, truncated_source
from nmt_cli.errors import NmtError
from nmt_cli.preprocess.references import read_references
from nmt_cli.scoring.sacre import build_metrics
from nmt_cli.text.pipeline import SENTENCEPIECE_MARKER, SUBWORD_NMT_MARKER, PresegmentedPieces, TextPipeline
from nmt_cli.train import distributed
from nmt_cli.train.distributed import DistInfo

SAMPLES_PRINTED = 3  # --eval-bleu-print-samples: hypothesis/reference pairs per validation


@dataclass(frozen=True)
class BleuScores:
    """The scores of one --eval-bleu; `record_fields` are its fields of the valid record."""

    bleu: float
    bleu_signature: str
    chrf: float | None
    chrf_signature: str | None
    sentences: int
    seconds: float

    def record_fields(self) -> dict[str, float | int | str]:
        fields: dict[str, float | int | str] = {"bleu": self.bleu, "bleu_signature": self.bleu_signature}
        if self.chrf is not None and self.chrf_signature is not None:
            fields.update(chrf=self.chrf, chrf_signature=self.chrf_signature)
        fields.update(eval_bleu_sentences=self.sentences, eval_bleu_seconds=self.seconds)
        return fields


def detokenizer_name(data: DataBin) -> str:
    tokenizer = data.meta.get("tokenizer") or {"name": "none"}
    return str(tokenizer.get("name", "moses"))


def target_segmentation(meta: dict) -> str:
    """How the data-bin's target pieces are marked, by fairseq's --post-process name:
    subword_nmt (`@@ `), sentencepiece (`▁`) or none (whole words)."""
    bpe = meta.get("bpe")
    if bpe:
        return "subword_nmt" if bpe.get("type") == "subword_nmt" else "sentencepiece"
    return {SUBWORD_NMT_MARKER: "subword_nmt", SENTENCEPIECE_MARKER: "sentencepiece"}.get(
        meta.get("segmented_input"), "none")


# How the refusal of a contradicting --eval-bleu-remove-bpe names each segmentation, and the value that fits it.
SEGMENTATIONS = {"subword_nmt": ("subword-nmt pieces ('@@ ')", "--eval-bleu-remove-bpe alone ('@@ ')"),
                 "sentencepiece": ("sentencepiece pieces ('▁')", "--eval-bleu-remove-bpe sentencepiece"),
                 "none": ("whole words (no BPE)", "--eval-bleu-remove-bpe none")}


def check_remove_bpe(cfg: TrainConfig, data: DataBin) -> None:
    """nmt removes the data-bin's own segmentation: a --eval-bleu-remove-bpe naming another is refused."""
    if cfg.eval_bleu_remove_bpe is None:
        return
    own = target_segmentation(data.meta)
    if EVAL_BLEU_REMOVE_BPE[cfg.eval_bleu_remove_bpe] != own:
        described, fitting = SEGMENTATIONS[own]
        given = "alone ('@@ ')" if cfg.eval_bleu_remove_bpe == "@@ " else repr(cfg.eval_bleu_remove_bpe)
        raise NmtError(f"--eval-bleu-remove-bpe {given}: the target side of {data.path} is {described}, which nmt "
                       f"removes as it was made; give {fitting} or drop the flag")


def check_detok_languages(cfg: TrainConfig, data: DataBin) -> None:
    """--eval-bleu-detok-args may name only the data-bin's own languages."""
    own = {"source_lang": data.source_lang, "target_lang": data.target_lang}
    for key, lang in cfg.eval_bleu_detok_languages().items():
        if lang != own[key]:
            raise NmtError(f"--eval-bleu-detok-args: {key} {lang!r} is not the {key.split('_')[0]} language of "
                           f"{data.path} ({own[key]!r}); nmt detokenizes the data-bin's target language")


class ValidBleu:
    """Everything --eval-bleu needs, loaded and checked once at the start of training."""

    def __init__(self, cfg: TrainConfig, data: DataBin, split: PairDataset, max_source_positions: int,
                 max_target_positions: int) -> None:
        self.cfg = cfg
        self.search = cfg.eval_bleu_search()
        check_beam_fits(self.search.beam, len(data.tgt_dict))
        references = read_references(data.path, data.meta, cfg.valid_subset)
        if references is None:
            raise NmtError(f"--eval-bleu needs the raw references of the '{cfg.valid_subset}' split, which {data.path} "
                           "does not keep (meta.json names none): run `nmt preprocess` again (with --force) to "
                           "keep them")
        if len(references) != len(split):
            raise NmtError(f"--eval-bleu: the references of '{cfg.valid_subset}' in {data.path} have "
                           f"{len(references)} lines, the binarized split {len(split)} sentences")
        check_remove_bpe(cfg, data)
        check_detok_languages(cfg, data)
        detok = detokenizer_name(data)
        segmented = data.meta.get("segmented_input")
        # --eval-tokenized-bleu scores the tokenized text, unless --eval-bleu-detok moses asks for
        # it detokenized (fairseq detokenizes, then scores without tokenizing).
        self.tokenized = cfg.eval_tokenized_bleu and cfg.eval_bleu_detok != "moses"
        # Text that came tokenized and segmented (fairseq's IWSLT14 recipe): its pieces are
        # joined, and --eval-bleu-detok moses detokenizes them, on both sides, as fairseq does.
        self.moses: MosesDetokenizer | None = None
        applied = "none" if self.tokenized else detok  # the detokenizer nmt applies
        if segmented and detok == "none" and cfg.eval_bleu_detok == "moses":
            self.moses = MosesDetokenizer(lang=data.target_lang)
        elif cfg.eval_bleu_detok is not None and EVAL_BLEU_DETOK[cfg.eval_bleu_detok] != applied:
            raise NmtError(f"--eval-bleu-detok {cfg.eval_bleu_detok}: {data.path} was tokenized with {detok}, and "
                           "nmt detokenizes as its data-bin says; drop the flag")
        self.pipeline = TextPipeline.from_data_bin(data.path, data.target_lang)
        count = min(cfg.eval_bleu_subset_lines or len(split), len(split))
        self.references = [line.rstrip() for line in references[:count]]  # as `nmt score` reads them
        if segmented:
            pieces = PresegmentedPieces(segmented)
            self.references = [self._detokenized(pieces.decode(line.split())) for line in self.references]
        elif self.tokenized:
            self.references = [self.pipeline.tokenizer.tokenize(line) for line in self.references]
        self.sources = [truncated_source(split.src[i].tolist(), max_source_positions) for i in range(count)]
        self.max_target_positions = max_target_positions
        self.tgt_dict = data.tgt_dict
        names = ["bleu", "chrf"] if cfg.eval_bleu_chrf or cfg.best_checkpoint_metric == "chrf" else ["bleu"]
        # sacreBLEU's defaults, those of `nmt score` (13a tokenization, mixed case); fairseq's
        # --eval-tokenized-bleu scores the text's own tokens.
        tokenize = "none" if cfg.eval_tokenized_bleu else "13a"
        self.metrics = build_metrics(names, [self.references], tokenize=tokenize, lowercase=False, sentence_level=False)

    @torch.no_grad()
    def translate(self, model: torch.nn.Module, device: torch.device,
                  autocast: Callable[[], AbstractContextManager]) -> list[str]:
        """The detokenized translation of every source sentence, in order (blank for a blank source)."""
        was_training = model.training
        model.eval()
        hypotheses = [""] * len(self.sources)
        todo = [i for i, ids in enumerate(self.sources) if len(ids) > 1]  # [</s>] alone: a blank line
        for batch in make_batches([len(self.sources[i]) for i in todo], None, None):  # translate's batches
            items = [todo[j] for j in batch]
            with autocast():
                found = generate(model, pad_batch([self.sources[i] for i in items], device), self.search,
                                 self.max_target_positions)
            for i, hyps in zip(items, found):
                if hyps:
                    text = self._text(self.tgt_dict.decode(hyps[0].tokens))
                    hypotheses[i] = " ".join(text.splitlines()).rstrip()  # one line, as score reads it
        model.train(was_training)
        return hypotheses

    def _text(self, pieces: list[str]) -> str:
        """A hypothesis' pieces as the text that is scored."""
        if self.tokenized:
            return self.pipeline.join_pieces(pieces)
        return self._detokenized(self.pipeline.decode(pieces))

    def _detokenized(self, text: str) -> str:
        return self.moses.detokenize(text.split(), return_str=True) if self.moses is not None else text

    def score(self, model: torch.nn.Module, device: torch.device, autocast: Callable[[], AbstractContextManager],
              print_line: Callable[[str], None]) -> BleuScores:
        start = time.monotonic()
        hypotheses = self.translate(model, device, autocast)
        if self.cfg.eval_bleu_print_samples:
            for hyp, ref in list(zip(hypotheses, self.references))[:SAMPLES_PRINTED]:
                print_line(f"eval-bleu example hypothesis: {hyp}")
                print_line(f"eval-bleu example reference:  {ref}")
        bleu = self.metrics["bleu"]
        chrf = self.metrics.get("chrf")
        return BleuScores(
            bleu=bleu.corpus_score(hypotheses, None).score, bleu_signature=bleu.get_signature().format(),
            chrf=chrf.corpus_score(hypotheses, None).score if chrf is not None else None,
            chrf_signature=chrf.get_signature().format() if chrf is not None else None,
            sentences=len(hypotheses), seconds=time.monotonic() - start,
        )


def shared_scores(scores: BleuScores | None, dist: DistInfo, device: torch.device) -> BleuScores:
    """The main rank's scores on every rank (the others pass None)."""
    if dist.world_size == 1:
        assert scores is not None
        return scores
    mine = [scores.bleu, scores.chrf or 0.0, float(scores.sentences)] if scores is not None else [0.0, 0.0, 0.0]
    bleu, chrf, sentences = distributed.all_reduce_sum(torch.tensor(mine, dtype=torch.float64, device=device),
                                                       dist).tolist()
    if scores is not None:
        return scores
    return BleuScores(bleu, "", chrf, None, int(sentences), 0.0)


