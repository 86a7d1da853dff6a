"""`nmt preprocess`: parse flags into a `PreprocessConfig` and run the pipeline."""

from __future__ import annotations

from pathlib import Path

import click

from nmt_cli.config import PreprocessConfig
from nmt_cli.errors import NmtError


def _prefixes(flag: str, value: str | None) -> tuple[Path, ...]:
    """A comma-separated list of prefixes; an empty item (`a,,b`, `a,`) is a mistake, never skipped."""
    if value is None:
        return ()
    prefixes = value.split(",")
    if "" in prefixes:
        raise NmtError(
            f"{flag} {value!r} has an empty prefix (item {prefixes.index('') + 1}); "
            "give comma-separated file prefixes such as a,b"
        )
    return tuple(Path(p) for p in prefixes)


def _ignored_bpe_options(ctx: click.Context, bpe: str, bpe_model: str | None) -> list[str]:
    """Warnings for options of BPE learning given on the command line when none is learned."""
    if bpe == "sentencepiece" and bpe_model is None:
        return []
    reason = "--bpe none learns no BPE" if bpe == "none" else "--bpe-model gives the BPE model"
    given = [name for name in ("bpe_size", "bpe_sample", "bpe_seed")
             if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
    return [f"warning: --{name.replace('_', '-')} is ignored: {reason}" for name in given]


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


@click.command(name="preprocess")
@click.option("-s", "--source-lang", required=True, help="Source language code; files are PREFIX.SRC.")
@click.option("-t", "--target-lang", required=True, help="Target language code; files are PREFIX.TGT.")
@click.option("--trainpref", required=True, help="Training files prefix (reads PREFIX.SRC and PREFIX.TGT).")
@click.option("--validpref", help="Validation prefix(es), comma-separated: splits valid, valid1, ...")
@click.option("--testpref", help="Test prefix(es), comma-separated: splits test, test1, ...")
@click.option("--destdir", default="data-bin", show_default=True, help="Output directory (data-bin/).")
@click.option("--joined-dictionary", is_flag=True, help="One dictionary for both languages (needed to share embeddings).")
@click.option("--workers", default=1, show_default=True, help="Processes for tokenization, BPE and binarization.")
@click.option("--thresholdsrc", default=0, show_default=True, help="Drop source symbols seen fewer times (they map to <unk>).")
@click.option("--thresholdtgt", default=0, show_default=True, help="Drop target symbols seen fewer times.")
@click.option("--nwordssrc", default=-1, show_default=True,
              help="Keep at most this many source symbols, the 4 specials included, as in fairseq (0 or -1: all).")
@click.option("--nwordstgt", default=-1, show_default=True,
              help="Keep at most this many target symbols, the 4 specials included (0 or -1: all).")
@click.option("--srcdict", help="Reuse this source dictionary instead of building one (needs --bpe-model or --bpe none).")
@click.option("--tgtdict", help="Reuse this target dictionary instead of building one.")
@click.option("--tokenizer", type=click.Choice(["moses", "none"]), default="moses", show_default=True,
              help="moses: sacremoses tokenization (no escaping); none: split on whitespace only.")
@click.option("--normalize-punctuation/--no-normalize-punctuation", default=True, show_default=True,
              help="Moses punctuation normalization (and removal of non-printing characters) before tokenizing.")
@click.option("--aggressive-dash-splits", is_flag=True, help="Moses -a: split hyphenated words (A-B -> A @-@ B).")
@click.option("--bpe", type=click.Choice(["sentencepiece", "none"]), default="sentencepiece", show_default=True,
              help="Subword segmentation; none: the text is already segmented.")
@click.option("--bpe-size", default=32000, show_default=True, help="BPE vocabulary size (sentencepiece pieces).")
@click.option("--bpe-sample", default=2_000_000, show_default=True,
              help="Learn BPE on at most this many sentences (a seeded random sample; both languages count "
                   "for joint BPE); bounds memory on large corpora. 0: all.")
@click.option("--bpe-seed", default=1, show_default=True, help="Seed of the BPE sentence sample.")
@click.option("--separate-bpe", is_flag=True, help="Learn one BPE model per language instead of a joint one.")
@click.option("--bpe-model", help="Reuse this (joint) sentencepiece model instead of learning one.")
@click.option("--min-len", default=1, show_default=True, help="Drop training pairs with a side shorter than this (tokens, before BPE).")
@click.option("--max-len", default=250, show_default=True, help="Drop training pairs with a side longer than this (tokens, before BPE).")
@click.option("--max-ratio", default=9.0, show_default=True,
              help="Drop training pairs whose length ratio exceeds this (Moses clean-corpus-n; fairseq's WMT recipe uses 1.5).")
@click.option("--force", is_flag=True, help="Replace a --destdir that holds a different dataset.")
def preprocess(
    source_lang: str, target_lang: str, trainpref: str, validpref: str | None, testpref: str | None,
    destdir: str, joined_dictionary: bool, workers: int, thresholdsrc: int, thresholdtgt: int,
    nwordssrc: int, nwordstgt: int, srcdict: str | None, tgtdict: str | None, tokenizer: str,
    normalize_punctuation: bool, aggressive_dash_splits: bool, bpe: str, bpe_size: int, bpe_sample: int,
    bpe_seed: int, separate_bpe: bool, bpe_model: str | None, min_len: int, max_len: int, max_ratio: float,
    force: bool,
) -> None:
    """Raw parallel text -> tokenized, BPE-segmented, binarized data-bin/.

    \b
    Reads PREFIX.SRC / PREFIX.TGT for every split (UTF-8, one sentence per line;
    CRLF endings and a leading byte order mark are accepted and removed). Steps:
      1. punctuation normalization + Moses tokenization of every split;
      2. cleaning of the training pairs only (empty, too long, bad length ratio),
         as Moses clean-corpus-n does; valid/test lines are never dropped;
      3. sentencepiece BPE learned on the tokenized training text and applied
         to every split;
      4. dictionaries from the training pieces (fairseq format);
      5. binarized splits SPLIT.SRC-TGT.LANG.bin/.idx.

    \b
    DESTDIR also gets meta.json (settings and counts), dict.LANG.txt and the
    BPE model, so `nmt translate` can process raw text the same way. The output
    is built in a hidden sibling directory and moved into place when complete.
    Re-running with the same inputs and settings finds the dataset up to date
    and does nothing; a DESTDIR holding anything else needs --force.
    The output is identical for any --workers. Counts go to stdout.
    """
    from nmt_cli.preprocess.progress import StageReporter
    from nmt_cli.preprocess.run import preprocess as run_preprocess, summary_lines

    cfg = PreprocessConfig(
        source_lang=source_lang, target_lang=target_lang, trainpref=Path(trainpref), destdir=Path(destdir),
        validpref=_prefixes("--validpref", validpref), testpref=_prefixes("--testpref", testpref),
        joined_dictionary=joined_dictionary, workers=workers, thresholdsrc=thresholdsrc, thresholdtgt=thresholdtgt, nwordssrc=nwordssrc,
        nwordstgt=nwordstgt, srcdict=_optional_path(srcdict), tgtdict=_optional_path(tgtdict),
        tokenizer=tokenizer, normalize_punctuation=normalize_punctuation,
        aggressive_dash_splits=aggressive_dash_splits, bpe=bpe, bpe_size=bpe_size, bpe_sample=bpe_sample,
        bpe_seed=bpe_seed, separate_bpe=separate_bpe, bpe_model=_optional_path(bpe_model), min_len=min_len,
        max_len=max_len, max_ratio=max_ratio, force=force,
    )
    for line in _ignored_bpe_options(click.get_current_context(), bpe, bpe_model):
        click.echo(line, err=True)
    result = run_preprocess(cfg, StageReporter())
    for line in summary_lines(result):
        click.echo(line)
