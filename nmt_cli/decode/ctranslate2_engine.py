"""`nmt translate --engine ctranslate2`: CTranslate2 runs the batch -> hypotheses step.

Everything around that step is the Translator's, as with nmt's own engine: reading
lines, tokenization and BPE (the export carries meta.json and the BPE model), the
dictionaries, truncation of long sources, batching, one output line per input line,
the output formats and the error messages. This module only turns a batch of source
ids into CTranslate2's source tokens, runs `ctranslate2.Translator.translate_batch`
with nmt's decoding options, and turns its results back into `Hypothesis` objects.

The model is an export (`nmt export --format ctranslate2`): either `--path` names
such a directory, or `--path` is an nmt checkpoint and its export is kept beside it as
`NAME.ctranslate2/`, made once and made again whenever the checkpoint's contents
change (the export records their sha256, nmt_cli/interop/export.py), written whole or
not at all (nmt_cli/staging.py). It replaces only its own earlier export there: anything
else of that name is refused, never deleted.

Decoding options map onto CTranslate2's: --beam (beam_size), --nbest
(num_hypotheses), --lenpen with fairseq's style (length_penalty: CTranslate2 too
divides the summed log-probability by length ** lenpen, the length counting `</s>`),
--max-len-a/-b (max_decoding_length, per group of sentences with the same limit),
--min-len (min_decoding_length), --no-repeat-ngram-size, and --sampling with its
top-k/top-p/temperature for one sample per sentence. What CTranslate2 cannot do
(GNMT's length penalty, --unk-penalty, ensembles, --workers, --use-ema) is refused by name.
fairseq's --source-lang/--target-lang/--tokenizer/--bpe/--bpe-codes are checked against
the export's languages and meta.json as with nmt's engine (decode/loading.py).
Two differences remain. At the length limit nmt forces `</s>` after the last allowed
token, CTranslate2 stops there; such an output gets its `</s>` appended. And the tokens
--min-len and --no-repeat-ngram-size ban are taken out before CTranslate2's softmax
(the rest are renormalized) but after nmt's, as after fairseq's: where they ban a
token, scores differ, and at times the hypothesis chosen. jsonl output
takes each token's log-probability from CTranslate2's scoring of the hypothesis
(`score_batch`), and its score is nmt's: their sum / length ** lenpen.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from nmt_cli.config import TranslateConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, Dictionary
from nmt_cli.decode.lenpen import length_penalty
from nmt_cli.decode.loading import LoadedModels
from nmt_cli.decode.search import Hypothesis, max_output_lengths
from nmt_cli.errors import NmtError
from nmt_cli.interop.ctranslate2.export import CT2_PAD, EXPORT_INFO, ExportInfo, write_ctranslate2_model
from nmt_cli.interop.ctranslate2.extra import import_ctranslate2
from nmt_cli.staging import build_then_publish, failure_line

COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "bf16": "bfloat16", "fp16": "float16"}
CACHE_SUFFIX = ".ctranslate2"


def check_engine_options(cfg: TranslateConfig) -> None:
    """NmtError naming the first setting that CTranslate2 cannot honour."""
    d = cfg.decode
    if len(cfg.checkpoints) > 1:
        raise NmtError("--engine ctranslate2 translates with one model; an ensemble (--path a.pt:b.pt) needs --engine nmt")
    if cfg.workers > 1:
        raise NmtError("--workers needs --engine nmt (with --engine ctranslate2, --threads sets CTranslate2's threads)")
    if cfg.cuda_graphs:
        raise NmtError("--cuda-graphs needs --engine nmt")
    if cfg.use_ema:  # an export holds one set of weights: the checkpoint's model weights, never its EMA
        raise NmtError("--use-ema needs --engine nmt (a CTranslate2 export holds the checkpoint's weights, "
                       "not its EMA weights)")
    if d.lenpen_style == "gnmt" and d.lenpen != 0:
        raise NmtError("--lenpen-style gnmt needs --engine nmt (CTranslate2's length penalty is fairseq's: len ** lenpen)")
    if d.unk_penalty != 0:
        raise NmtError("--unk-penalty needs --engine nmt")
    if d.temperature != 1.0 and not d.sampling:
        raise NmtError("--temperature without --sampling needs --engine nmt")
    if d.sampling and d.beam > 1:
        raise NmtError("--sampling with --engine ctranslate2 draws one sample per sentence: give --beam 1")
    g = cfg.guided
    for flag, given in (("--prefix-file", g.prefix_file is not None), ("--constraints", g.constraints is not None),
                        ("--json-input", g.json_input), ("--print-alignment", g.print_alignment),
                        ("--replace-unk", g.replace_unk), ("--score-reference", g.score_reference)):
        if given:  # guided decoding is nmt's own search
            raise NmtError(f"{flag} needs --engine nmt")


class CTranslate2Engine:
    """A CTranslate2 translator and the description of its model that the Translator uses."""

    def __init__(self, cfg: TranslateConfig, warn: Callable[[str], None]) -> None:
        check_engine_options(cfg)
        self.cfg = cfg
        ct2 = import_ctranslate2("--engine ctranslate2")
        self.directory = model_directory(Path(cfg.checkpoints[0]), warn, cfg.quiet)
        info = ExportInfo.read(self.directory)
        src_dict = _load_dictionary(self.directory, info.source_lang)
        tgt_dict = _load_dictionary(self.directory, info.target_lang)
        device, _, index = cfg.device.partition(":")
        try:
            self.translator = ct2.Translator(str(self.directory), device=device, device_index=int(index or 0),
                                             compute_type=COMPUTE_TYPES[cfg.precision], intra_threads=cfg.threads or 0)
        except (RuntimeError, ValueError) as error:
            raise NmtError(f"CTranslate2 cannot load {self.directory} on {cfg.device} with --precision "
                           f"{cfg.precision}: {' '.join(str(error).split())}") from None
        self.restart_sampling()
        # No nmt model: the search step is CTranslate2's (see Translator._search).
        self.models = LoadedModels(decoder=None, transformers=[], src_dict=src_dict, tgt_dict=tgt_dict,  # type: ignore[arg-type]
                                   source_lang=info.source_lang, target_lang=info.target_lang,
                                   max_source_positions=info.max_source_positions,
                                   max_target_positions=info.max_target_positions)
        self.with_positional_scores = cfg.output_format == "jsonl"

    def restart_sampling(self) -> None:
        """Sample from --seed's start again (CTranslate2's generator is one per process)."""
        if self.cfg.decode.sampling:
            import_ctranslate2("--engine ctranslate2").set_random_seed(self.cfg.decode.seed)

    def with_decode(self, cfg: TranslateConfig) -> CTranslate2Engine:
        """This engine's loaded translator searching with `cfg`'s decoding settings (the Python
        API's and the server's per-call options), after the same checks as at load."""
        check_engine_options(cfg)
        other = copy.copy(self)
        other.cfg = cfg
        return other

    def generate(self, src_tokens: torch.Tensor) -> list[list[Hypothesis]]:
        """Right-padded source ids (B, S), each row ending in </s> -> the hypotheses of each, best first."""
        rows = [[t for t in row if t != PAD_ID] for row in src_tokens.tolist()]
        symbols = self.models.src_dict.symbols
        # CTranslate2 appends </s> itself (the export sets add_source_eos).
        sources = [[symbols[t] for t in row[:-1]] for row in rows]
        limits = max_output_lengths([len(row) for row in rows], self.cfg.decode, self.models.max_target_positions)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, limit in enumerate(limits):
            groups[limit].append(i)
        results: list[list[Hypothesis]] = [[] for _ in rows]
        for limit, members in groups.items():
            for i, hyps in zip(members, self._translate([sources[i] for i in members], limit)):
                results[i] = hyps
        return results

    def _translate(self, sources: list[list[str]], limit: int) -> list[list[Hypothesis]]:
        d = self.cfg.decode
        options = dict(beam_size=d.beam, num_hypotheses=d.nbest, length_penalty=d.lenpen,
                       max_decoding_length=limit, min_decoding_length=d.min_len,
                       no_repeat_ngram_size=d.no_repeat_ngram_size, return_scores=True, max_input_length=0)
        if d.sampling:
            options.update(sampling_topk=d.sampling_topk if d.sampling_topk > 0 else 0,
                           sampling_topp=d.sampling_topp if d.sampling_topp > 0 else 1.0,
                           sampling_temperature=d.temperature)
        if limit == 0:  # CTranslate2 refuses a maximum of 0; the output is </s> alone, as nmt's search gives
            hypotheses = [[Hypothesis(tokens=[EOS_ID], score=0.0, positional_scores=[])] for _ in sources]
        else:
            results = self.translator.translate_batch(sources, **options)
            hypotheses = [[self._hypothesis(tokens, score) for tokens, score in zip(r.hypotheses, r.scores)]
                          for r in results]
        if self.with_positional_scores or limit == 0:  # the </s> alone is scored here
            self._add_positional_scores(sources, hypotheses)
        return hypotheses

    def _hypothesis(self, tokens: list[str], score: float) -> Hypothesis:
        index = self.models.tgt_dict.index  # symbol -> id; CTranslate2 returns its vocabulary's tokens only
        ids = [PAD_ID if token == CT2_PAD else index[token] for token in tokens] + [EOS_ID]
        return Hypothesis(tokens=ids, score=float(score), positional_scores=[])

    def _add_positional_scores(self, sources: list[list[str]], hypotheses: list[list[Hypothesis]]) -> None:
        """Each token's log-probability (</s> included), from CTranslate2's scoring of the hypothesis."""
        pairs = [(source, hyp) for source, hyps in zip(sources, hypotheses) for hyp in hyps]
        if not pairs:
            return
        symbols = self.models.tgt_dict.symbols
        targets = [[symbols[t] for t in hyp.tokens[:-1]] for _, hyp in pairs]
        scored = self.translator.score_batch([source for source, _ in pairs], targets, max_input_length=0)
        lenpen = self.cfg.decode.lenpen
        for (_, hyp), result in zip(pairs, scored):
            hyp.positional_scores = [float(s) for s in result.log_probs]
            # nmt's score of these tokens (CTranslate2's search score accumulates differently).
            hyp.score = sum(hyp.positional_scores) / length_penalty(len(hyp.tokens), lenpen, "fairseq")


def _load_dictionary(directory: Path, lang: str) -> Dictionary:
    path = directory / f"dict.{lang}.txt"
    if not path.is_file():
        raise NmtError(f"{path} not found: {directory} is not a complete `nmt export --format ctranslate2`")
    return Dictionary.load(path)


def cache_directory(checkpoint: Path) -> Path:
    """Where a checkpoint's automatic export lives: beside it, `NAME.ctranslate2/`."""
    return checkpoint.parent / (checkpoint.stem + CACHE_SUFFIX)


def model_directory(path: Path, warn: Callable[[str], None], quiet: bool) -> Path:
    """The CTranslate2 model directory for --path: an export itself, or a checkpoint's
    cached export, made (again) when missing or not of this checkpoint's contents."""
    if path.is_dir() and (path / EXPORT_INFO).is_file():
        return path
    from nmt_cli.checkpoints.names import resolve_checkpoint
    from nmt_cli.interop.export import export_settings
    from nmt_cli.interop.source import load_export_source

    checkpoint = resolve_checkpoint(path)
    cache = cache_directory(checkpoint)
    source = load_export_source(checkpoint, export_settings("ctranslate2", None))
    info = _cached_info(cache)
    if info is not None and info.fingerprint == source.fingerprint:
        return cache
    check_replaceable_cache(cache, checkpoint, info)
    if not quiet:
        warn(f"exporting {checkpoint} for CTranslate2 into {cache} (reused while the checkpoint is unchanged)")
    build_then_publish(cache, lambda staging: write_ctranslate2_model(source, staging, None),
                       lambda error: failure_line(f"writing the CTranslate2 export {cache} (or export it elsewhere "
                                                  "with `nmt export --format ctranslate2` and pass --path OUT)", error))
    return cache


def _cached_info(cache: Path) -> ExportInfo | None:
    """The record of the export in `cache`; None where there is none (or it is unreadable)."""
    if not (cache / EXPORT_INFO).is_file():
        return None
    try:
        return ExportInfo.read(cache)
    except NmtError:
        return None


def check_replaceable_cache(cache: Path, checkpoint: Path, info: ExportInfo | None) -> None:
    """NmtError unless what stands at `cache` (whose export record is `info`) is nmt's own
    (older) cached export of this checkpoint, an empty directory or nothing: the new export replaces it whole, and a
    user's files there (or an export of their own: quantized, of another checkpoint) are
    not nmt's to delete."""
    if not cache.exists() and not cache.is_symlink():
        return
    if not cache.is_symlink() and cache.is_dir():
        try:
            if not any(cache.iterdir()):
                return
        except OSError:
            pass  # unreadable: not known to be nmt's
        if info is not None and info.checkpoint == checkpoint.name and info.quantization is None:
            return  # made for this checkpoint's earlier contents (or by an earlier nmt)
    raise NmtError(f"{cache} is where --engine ctranslate2 keeps its export of {checkpoint}, but it holds something "
                   "else, which nmt does not replace: move it, or export with `nmt export --format ctranslate2 "
                   f"{checkpoint} OUT` and pass --path OUT")
