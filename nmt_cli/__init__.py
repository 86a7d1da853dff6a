"""nmt: neural machine translation with the Transformer (Vaswani et al., 2017)."""

__version__ = "0.1.0"

# The Python API (nmt_cli/api.py), imported on first use so that `import nmt_cli` and the
# CLI's start-up stay light.
__all__ = ["load", "Model", "Result", "Hypothesis"]


def __getattr__(name: str):
    if name in __all__:
        from nmt_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'nmt_cli' has no attribute {name!r}")
