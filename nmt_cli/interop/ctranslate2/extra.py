"""The optional `ctranslate2` package, imported only by the features that use it."""

from __future__ import annotations

from types import ModuleType

from nmt_cli.errors import NmtError

# The oldest CTranslate2 these exports were tested with (pyproject.toml pins the same).
MIN_VERSION = (4, 8)


def import_ctranslate2(feature: str) -> ModuleType:
    """The ctranslate2 module, or one NmtError line naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise NmtError(f"{feature} needs CTranslate2: pip install 'nmt-cli[ctranslate2]'") from None
    version = tuple(int(part) for part in ctranslate2.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_VERSION:
        raise NmtError(f"{feature} needs CTranslate2 >= {'.'.join(map(str, MIN_VERSION))} "
                       f"(installed: {ctranslate2.__version__}): pip install -U 'nmt-cli[ctranslate2]'")
    return ctranslate2
