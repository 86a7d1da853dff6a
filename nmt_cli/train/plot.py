"""`nmt plot`: the learning curves of one or more runs on one figure, as PNG, SVG or HTML.

One row per quantity (loss; BLEU and chrF when a run logged them), plotted against
updates (left) and wall time (right); each run has one colour, train solid and valid
dashed. Drawn with matplotlib's object API (no pyplot, so no GUI backend or global
state); HTML is the SVG inside a small self-contained page.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from nmt_cli.config import PlotConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import published_output, write_output
from nmt_cli.train.curves import Curve, RunCurves, read_runs

EXTRA_HINT = "pip install 'nmt-cli[plot]'"
ROW_TITLES = {"loss": "loss (bits/token)", "bleu": "valid BLEU", "chrf": "valid chrF"}


def plot(cfg: PlotConfig) -> Path:
    """Read the runs' logs and write the figure to `cfg.output`; returns its path."""
    figure_type = _require_matplotlib()
    runs = read_runs(cfg.runs)
    figure = draw(runs, figure_type)
    suffix = Path(cfg.output).suffix.lower()
    if suffix == ".png":
        content = _render(figure, "png", cfg.dpi)
    else:
        svg = _render(figure, "svg", cfg.dpi)
        content = svg if suffix == ".svg" else html_page(svg, [run.name for run in runs])
    with published_output(cfg.output, "wb") as out:
        write_output(out, content, cfg.output)
    return Path(cfg.output)


def _require_matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise NmtError(f"nmt plot needs matplotlib: {EXTRA_HINT}") from None
    except OSError as error:  # no writable config or cache directory: its message names MPLCONFIGDIR
        raise NmtError(f"nmt plot cannot start matplotlib: {error}") from None
    return Figure


def draw(runs: list[RunCurves], figure_type):
    rows = ["loss"] + [metric for metric in ("bleu", "chrf") if any(metric in run.valid for run in runs)]
    time_unit, time_scale = _time_unit(max((w for run in runs for w in run.train_loss.wall if not math.isnan(w)),
                                           default=0.0))
    figure = figure_type(figsize=(12, 3.6 * len(rows)), layout="constrained")
    axes = figure.subplots(len(rows), 2, squeeze=False)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for row, metric in enumerate(rows):
        by_update, by_time = axes[row]
        for run, colour in zip(runs, colours):
            if metric == "loss":
                _line(by_update, by_time, run.train_loss, time_scale, colour, f"{run.name} train", "-")
            if metric in run.valid:
                _line(by_update, by_time, run.valid[metric], time_scale, colour, f"{run.name} valid", "--", marker="o")
        by_update.set_ylabel(ROW_TITLES[metric])
        for ax in (by_update, by_time):
            ax.grid(True, alpha=0.3)
        by_update.set_xlabel("updates")
        by_time.set_xlabel(f"wall time ({time_unit})")
        by_update.legend(fontsize="small")
    figure.suptitle("training curves: " + ", ".join(run.name for run in runs))
    return figure


def _time_unit(longest: float) -> tuple[str, float]:
    """The unit that keeps the wall-time axis' numbers readable, and its seconds."""
    if longest > 2 * 3600:
        return "hours", 3600.0
    return ("minutes", 60.0) if longest > 120 else ("seconds", 1.0)


def _line(by_update, by_time, curve: Curve, time_scale: float, colour: str, label: str, style: str,
          marker: str | None = None) -> None:
    if not curve.updates:
        return
    by_update.plot(curve.updates, curve.values, style, color=colour, label=label, marker=marker, markersize=3)
    timed = [(w / time_scale, v) for w, v in zip(curve.wall, curve.values) if not math.isnan(w)]
    if timed:
        by_time.plot(*zip(*timed), style, color=colour, label=label, marker=marker, markersize=3)


def _render(figure, file_format: str, dpi: int) -> bytes:
    buffer = io.BytesIO()
    # No creation date in the metadata: the same logs give the same file.
    metadata = {"Date": None} if file_format == "svg" else {"Software": None}
    figure.savefig(buffer, format=file_format, dpi=dpi, metadata=metadata)
    return buffer.getvalue()


def html_page(svg: bytes, names: list[str]) -> bytes:
    """A page holding the SVG inline: opens in any browser, no scripts, no other files."""
    from html import escape

    body = svg.decode("utf-8")
    body = body[body.index("<svg"):]  # drop the XML declaration and doctype, not allowed inside HTML
    title = escape("training curves: " + ", ".join(names))
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
            '<style>body { margin: 1em; font-family: sans-serif; } svg { max-width: 100%; height: auto; }</style>\n'
            f"</head>\n<body>\n{body}\n</body>\n</html>\n")
    return page.encode("utf-8")
