"""`nmt score`: parse flags into a `ScoreConfig` and print the report."""

from __future__ import annotations

import click

from nmt_cli.config import HYP_FORMATS, SCORE_METRICS, ScoreConfig


def _tokenizer_choices() -> list[str]:
    from nmt_cli.scoring.sacre import bleu_tokenizers

    return bleu_tokenizers()


def _split_metrics(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    return tuple(name.strip().lower() for name in value.split(",") if name.strip())


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--ref", "-r", "refs", multiple=True, required=True, metavar="FILE",
              help="Reference translations, one per line (detokenized). Repeat for several references.")
@click.option("--hyp", "-i", default="-", show_default=True, metavar="FILE",
              help="Hypotheses (detokenized): plain text or `nmt translate --output-format jsonl`; - reads stdin.")
@click.option("--hyp-format", type=click.Choice(HYP_FORMATS), default="auto", show_default=True,
              help="auto: JSON lines when the first line is a JSON object with a \"hyp\" or \"text\" field.")
@click.option("--metrics", "-m", default="bleu", show_default=True, callback=_split_metrics,
              help=f"Comma-separated sacreBLEU metrics: {','.join(SCORE_METRICS)}.")
@click.option("--tokenize", type=click.Choice(_tokenizer_choices()), default="13a", show_default=True,
              help="sacreBLEU's BLEU tokenizer (as `sacrebleu --tokenize`).")
@click.option("--lowercase", "-lc", is_flag=True,
              help="Case-insensitive sacreBLEU BLEU (as `sacrebleu -lc`); chrF, TER and tokenized BLEU "
                   "keep their defaults (tokenized BLEU is case-sensitive, as in the papers).")
@click.option("--width", "-w", type=int, default=1, show_default=True,
              help="Decimals printed for sacreBLEU scores (as `sacrebleu --width`).")
@click.option("--tokenized-bleu", is_flag=True,
              help="Also report paper-style BLEU: Moses-tokenize hypotheses and references, then "
                   "multi-bleu.perl (case-sensitive, no smoothing).")
@click.option("--target-lang", "-t", metavar="LANG",
              help="Language of the hypotheses, for the Moses tokenizer of --tokenized-bleu (e.g. de, fr).")
@click.option("--already-tokenized", is_flag=True,
              help="With --tokenized-bleu: the inputs are already Moses-tokenized; only split on spaces.")
@click.option("--compound-split", is_flag=True,
              help="With --tokenized-bleu: split hyphenated compounds (a-b -> a ##AT##-##AT## b) in both "
                   "hypotheses and references, as tensor2tensor's get_ende_bleu.sh (En-De only).")
@click.option("--sentence-level", "-sl", is_flag=True,
              help="One score per hypothesis line (BLEU with effective order, as `sacrebleu -sl`).")
@click.option("--json", "output_json", is_flag=True,
              help="JSON output: a list of sacreBLEU-style results; with --sentence-level one object per line.")
@click.option("--compare", metavar="FILE",
              help="A second system's hypotheses: paired bootstrap resampling (sacreBLEU's --paired-bs), "
                   "--hyp being the baseline. Prints both scores, their bootstrap mean and 95% interval, "
                   "and the p-value (identical outputs: p = 1).")
@click.option("--paired-bs-n", type=int, default=1000, show_default=True,
              help="Number of bootstrap resamples for --compare.")
@click.option("--seed", type=int, default=12345, show_default=True,
              help="Random seed of the bootstrap resampling (sacreBLEU's default; >= 1).")
def score(
    refs: tuple[str, ...],
    hyp: str,
    hyp_format: str,
    metrics: tuple[str, ...],
    tokenize: str,
    lowercase: bool,
    width: int,
    tokenized_bleu: bool,
    target_lang: str | None,
    already_tokenized: bool,
    compound_split: bool,
    sentence_level: bool,
    output_json: bool,
    compare: str | None,
    paired_bs_n: int,
    seed: int,
) -> None:
    """Score detokenized hypotheses against references: BLEU, chrF, TER as sacreBLEU reports them.

    The numbers and signatures are those of the `sacrebleu` command line on the same
    files (`sacrebleu REF -i HYP -m bleu chrf ter -f text`).

    \b
    Which number to compare with which publication:
      * detokenized sacreBLEU (default line, with its signature): compare with other
        sacreBLEU numbers, e.g. ~28.6 for a fairseq big En-De model on newstest2014
        (Ott et al., 2018 report it alongside their tokenized BLEU);
      * --tokenized-bleu --target-lang de --compound-split: Vaswani et al. (2017)
        En-De, 27.3 (base) / 28.4 (big), and fairseq's compound-split En-De numbers;
      * --tokenized-bleu --target-lang fr: Vaswani et al. (2017) En-Fr, 41.8 (big);
        no compound splitting for En-Fr.
    Both kinds need the full newstest2014 (3003 lines) as reference.

    \b
    Examples:
      nmt score --ref test.de --hyp hyp.de --metrics bleu,chrf,ter
      nmt translate --path avg.pt < test.en | nmt score --ref test.de \\
          --tokenized-bleu --target-lang de --compound-split
      nmt score --ref test.de --hyp base.de --compare new.de
    """
    from nmt_cli.scoring.report import score as run_score

    cfg = ScoreConfig(
        refs=refs,
        hyp=hyp,
        hyp_format=hyp_format,
        metrics=metrics,
        tokenize=tokenize,
        lowercase=lowercase,
        width=width,
        tokenized_bleu=tokenized_bleu,
        target_lang=target_lang,
        already_tokenized=already_tokenized,
        compound_split=compound_split,
        sentence_level=sentence_level,
        output_json=output_json,
        compare=compare,
        paired_bs_n=paired_bs_n,
        seed=seed,
    )
    for line in run_score(cfg):
        click.echo(line)
