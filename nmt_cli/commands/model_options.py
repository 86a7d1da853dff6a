"""click options that override fields of an architecture preset (shared by `train` and `info`).

They are ModelConfig's own flags (declared on its fields), each defaulting to None,
meaning "keep the preset's value"; `overrides_from` picks the options that were
given, ready for `resolve_config(arch, overrides)`.
"""

from __future__ import annotations

from typing import Any

from nmt_cli import options
from nmt_cli.config import ModelConfig

model_options = options.click_options(ModelConfig, overrides=True)


def overrides_from(params: dict[str, Any]) -> dict[str, Any]:
    """The model options that were given (not None), keyed by ModelConfig field name."""
    return options.overrides_from(ModelConfig, params)
