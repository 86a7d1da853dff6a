"""`nmt export`: an nmt checkpoint -> a CTranslate2 model directory or a fairseq checkpoint.

The output directory is built beside its destination and moved into place whole
(nmt_cli/staging.py). One that already holds anything is refused unless --force; one
that holds this same export (same checkpoint contents, text files and settings) is
left as it is. One that another nmt process writes is refused (nmt_cli/run_lock.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt_cli.config import ExportConfig
from nmt_cli.errors import NmtError
from nmt_cli.interop.source import ExportSource, load_export_source
from nmt_cli.run_lock import directory_lock
from nmt_cli.staging import build_then_publish, check_destination, failure_line, refuse_inputs_inside


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    checkpoint: Path  # the checkpoint exported
    written: bool  # False when out_dir already held this same export


def export_settings(export_format: str, quantization: str | None) -> dict[str, str | None]:
    """What, besides the checkpoint and its text files, the fingerprint of an export holds."""
    return {"format": export_format, "quantization": quantization}


def export(cfg: ExportConfig) -> ExportResult:
    """Write `cfg.out_dir` in `cfg.format`."""
    source = load_export_source(cfg.source, export_settings(cfg.format, cfg.quantization))
    # One writer: another export checking OUT while this one builds would find it empty
    # and then replace this one's output.
    with directory_lock(cfg.out_dir, "OUT"):
        if check_destination(cfg.out_dir, "OUT", source.fingerprint, cfg.force, recorded=_recorded_fingerprint,
                             others="other files"):
            return ExportResult(cfg.out_dir, source.checkpoint, written=False)
        refuse_inputs_inside([source.checkpoint, *source.text_files], cfg.out_dir, "OUT")
        build_then_publish(cfg.out_dir, lambda staging: write_export(source, staging, cfg.format, cfg.quantization),
                           lambda error: failure_line(f"writing {cfg.out_dir}", error))
    return ExportResult(cfg.out_dir, source.checkpoint, written=True)


def write_export(source: ExportSource, directory: Path, export_format: str, quantization: str | None) -> None:
    if export_format == "ctranslate2":
        from nmt_cli.interop.ctranslate2.export import write_ctranslate2_model

        write_ctranslate2_model(source, directory, quantization)
    else:
        from nmt_cli.interop.fairseq.export import write_fairseq_model

        write_fairseq_model(source, directory)
        (directory / FAIRSEQ_FINGERPRINT).write_text(source.fingerprint + "\n", encoding="utf-8")


# Where a fairseq export records what made it (fairseq ignores the file).
FAIRSEQ_FINGERPRINT = "nmt_export.fingerprint"


def _recorded_fingerprint(out_dir: Path) -> str | None:
    """The fingerprint an export in `out_dir` records; None where there is none."""
    from nmt_cli.interop.ctranslate2.export import EXPORT_INFO, ExportInfo

    if (out_dir / EXPORT_INFO).is_file():
        try:
            return ExportInfo.read(out_dir).fingerprint
        except NmtError:
            return None
    try:
        return (out_dir / FAIRSEQ_FINGERPRINT).read_text(encoding="utf-8").strip()
    except OSError:
        return None
