"""The early-exit view of a Hugging Face model: its first layers, final norm and LM head.

The view is a shallow copy of the model whose decoder-layer list holds only the first
``exit_layer`` layers: every module and parameter is the original's (no weight is copied), and
the model's own forward runs it, so whatever it does after its layers (the final norm, a logit
soft-cap) the view does too.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from specstrat.errors import InvalidConfig, ModelLoadError

__all__ = ["truncated_model"]


def _layer_list(base: nn.Module, count: int) -> str:
    """The attribute of ``base`` holding its ``count`` decoder layers."""
    names = [
        name
        for name, child in base.named_children()
        if isinstance(child, nn.ModuleList) and len(child) == count
    ]
    if len(names) != 1:
        raise ModelLoadError(
            f"{type(base).__name__}: cannot tell which module list holds its {count} decoder "
            f"layers (found {names or 'none'}); early exit needs exactly one"
        )
    return names[0]


def _shallow(module: Any) -> Any:
    """A copy of ``module`` sharing its parameters, buffers and children, with a children
    dict of its own (so replacing a child leaves the original untouched)."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def truncated_model(model: Any, layers: int, exit_layer: int, name: str = "model") -> Any:
    """A shallow copy of the transformers ``model`` (``layers`` decoder layers) running only its
    first ``exit_layer`` layers, then whatever its forward does after them."""
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int):
        raise InvalidConfig(f"exit_layer={exit_layer!r} must be an int")
    if not 1 <= exit_layer < layers:
        raise InvalidConfig(f"exit_layer={exit_layer} must be in 1..{layers - 1} ({name})")
    base = _shallow(model.base_model)
    attr = _layer_list(model.base_model, layers)
    base._modules[attr] = nn.ModuleList(list(getattr(model.base_model, attr))[:exit_layer])
    top = _shallow(model)
    top._modules[model.base_model_prefix] = base
    return top
