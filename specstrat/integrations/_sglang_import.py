"""Importing SGLang on demand, with one error that says how to install it.

Every SGLang module the adapter touches is imported here, lazily and through
``importlib`` (SGLang ships no type information, so what comes back is ``Any``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from specstrat.errors import IntegrationError

__all__ = [
    "SGLANG_VERSION",
    "IntegrationError",
    "SGLangModules",
    "import_sglang_module",
    "load_sglang",
]

#: The SGLang release the adapter was written against (its plugin contract and call sites).
SGLANG_VERSION = "0.5.23"

_INSTALL = (
    f"install it with `pip install --no-deps sglang=={SGLANG_VERSION}` plus its import-time "
    "dependencies (`make sglang-env` in a specstrat checkout builds such a venv), or a full "
    "SGLang install"
)


@dataclass(frozen=True, slots=True)
class SGLangModules:
    """The SGLang modules the adapter uses, imported once per call site that needs them."""

    version: str
    spec_info: Any
    spec_registry: Any
    overlap_utils: Any

    @property
    def algorithm_enum(self) -> Any:
        """SGLang's ``SpeculativeAlgorithm`` enum."""
        return self.spec_info.SpeculativeAlgorithm

    @property
    def custom_spec_algo(self) -> Any:
        """SGLang's ``CustomSpecAlgo``, the base class of a registered algorithm."""
        return self.spec_registry.CustomSpecAlgo


def import_sglang_module(name: str) -> ModuleType:
    """Import ``name`` (an ``sglang.*`` module) or raise :class:`IntegrationError` saying why."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing = exc.name or name
        if missing == "sglang" or missing.startswith("sglang."):
            raise IntegrationError(
                f"SGLang is not installed ({name} not found); {_INSTALL}"
            ) from exc
        raise IntegrationError(
            f"importing {name} failed: {type(exc).__name__}: {exc}; SGLang is installed but "
            f"module {missing!r} it needs is missing ({_INSTALL})"
        ) from exc


def load_sglang() -> SGLangModules:
    """SGLang's registry, ``spec_info`` and ``overlap_utils`` modules."""
    root = import_sglang_module("sglang")
    return SGLangModules(
        version=str(getattr(root, "__version__", "unknown")),
        spec_info=import_sglang_module("sglang.srt.speculative.spec_info"),
        spec_registry=import_sglang_module("sglang.srt.speculative.spec_registry"),
        overlap_utils=import_sglang_module("sglang.srt.managers.overlap_utils"),
    )
