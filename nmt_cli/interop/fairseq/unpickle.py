"""Read fairseq's pickled checkpoints without running code stored in them.

fairseq pickles its checkpoints with `argparse.Namespace` arguments (old) or an
omegaconf configuration (new). `torch.load(weights_only=False)` would import and
call whatever the pickle names, so a file from the internet could run code. The
restricted unpickler here rebuilds tensors and storages, plain containers,
`argparse.Namespace` and torch dtypes as usual; classes of omegaconf, hydra,
fairseq (and numpy scalars, enums) become inert `OpaqueRecord`s holding their
pickled state; anything else stops loading. fairseq need not be installed.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import pickle
from dataclasses import dataclass
from typing import Any

import torch

# Globals a fairseq checkpoint may name that are rebuilt for real: all are data
# constructors that run no user code.
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("argparse", "Namespace"): argparse.Namespace,
    ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("torch", "Size"): torch.Size,
}
# Plain builtin types (omegaconf pickles some of them by name, e.g. a node's type hint).
SAFE_BUILTINS = {t.__name__: t for t in (dict, list, tuple, set, frozenset, slice, complex, int, float, str, bool, bytes)}
# Modules whose classes become inert records (configuration objects and enums).
OPAQUE_MODULE_PREFIXES = ("omegaconf", "hydra", "fairseq", "typing", "pathlib", "numpy")


@dataclass
class OpaqueRecord:
    """Stands in for an object of a class we do not import: keeps what the pickle gave it."""

    qualified_name: str
    args: tuple = ()
    state: Any = None

    def __setstate__(self, state: Any) -> None:  # pickle's BUILD
        self.state = state


def _record_factory(qualified_name: str) -> type:
    """A class that, called or instantiated by the unpickler, yields an `OpaqueRecord`.

    The unpickler needs a class (NEWOBJ calls `cls.__new__`); every instance it makes
    is a plain `OpaqueRecord`, whose `__setstate__` keeps the state.
    """

    def new(cls: type, *args: Any) -> OpaqueRecord:
        return OpaqueRecord(qualified_name, tuple(args))

    return type(qualified_name, (), {"__new__": new})


class RestrictedUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only allow-listed globals (see the module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (pickle protocol 2 writes `__builtin__.long` and the like).
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if module == "builtins" and name in SAFE_BUILTINS:
            return SAFE_BUILTINS[name]
        if (module, name) in SAFE_GLOBALS:
            return SAFE_GLOBALS[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module.split(".")[0] in OPAQUE_MODULE_PREFIXES:
            return _record_factory(f"{module}.{name}")
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _restricted_load(file: Any, **kwargs: Any) -> Any:
    return RestrictedUnpickler(file, **kwargs).load()


# What torch.load needs of a `pickle_module`.
PICKLE_MODULE = argparse.Namespace(__name__="nmt_restricted_pickle", Unpickler=RestrictedUnpickler, load=_restricted_load)


def plain(value: Any) -> Any:
    """Namespaces, omegaconf containers/nodes and enums -> dicts, lists and scalars."""
    if isinstance(value, argparse.Namespace):
        return {k: plain(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, OpaqueRecord):
        state = value.state if isinstance(value.state, dict) else {}
        if "_content" in state:  # omegaconf DictConfig / ListConfig
            return plain(state["_content"])
        if "_val" in state:  # omegaconf value node
            return plain(state["_val"])
        if len(value.args) == 1:  # an enum member, pickled as Enum(value)
            return plain(value.args[0])
        return None
    return value
