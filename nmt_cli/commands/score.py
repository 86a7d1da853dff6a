"""`nmt score`: parse flags into a `ScoreConfig` and print the report."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import ScoreConfig
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(ScoreConfig)
def score(**params: Any) -> None:
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

    cfg = config_from_params(ScoreConfig, params)
    for line in run_score(cfg):
        click.echo(line)
