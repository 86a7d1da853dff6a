"""What an import (`nmt import-fairseq`, `nmt import-marian`) reports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImportResult:
    checkpoint: Path  # the run's checkpoint.pt
    written: bool  # False when out_dir already held this same import, left as it was
