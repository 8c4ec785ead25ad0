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

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig, ModelLoadError

__all__ = ["decoder_layers", "truncated_model"]


def _layer_list(base: nn.Module, count: int) -> tuple[nn.Module, str]:
    """The module under ``base`` (itself or a descendant, such as OPT's ``decoder``) and the
    attribute of it that holds the ``count`` decoder layers."""
    found = [
        (owner, name)
        for _, owner in base.named_modules()
        for name, child in owner.named_children()
        if isinstance(child, nn.ModuleList) and len(child) == count
    ]
    if len(found) != 1:
        names = [name for _, name in found]
        raise ModelLoadError(
            f"{type(base).__name__}: cannot tell which module list holds its {count} decoder "
            f"layers (found {names or 'none'}); early exit and layer features need exactly one"
        )
    return found[0]


def decoder_layers(model: Any, count: int) -> list[nn.Module]:
    """The ``count`` decoder layers of the transformers ``model``, in order."""
    owner, attr = _layer_list(model.base_model, count)
    return list(getattr(owner, attr))


def _shallow(module: Any) -> Any:
    """A copy of ``module`` sharing its parameters, buffers and children, with a children
    dict of its own (so replacing a child leaves the original untouched)."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def _named_path(root: nn.Module, target: nn.Module) -> list[tuple[str, nn.Module]]:
    """(child name, child) from ``root`` down to ``target``."""
    for name, child in root.named_children():
        if child is target:
            return [(name, child)]
        below = _named_path(child, target)
        if below:
            return [(name, child), *below]
    return []


def truncated_model(model: Any, layers: int, exit_layer: int, name: str = "model") -> Any:
    """A shallow copy of the transformers ``model`` (``layers`` decoder layers) running only its
    first ``exit_layer`` layers, then whatever its forward does after them."""
    if not is_int(exit_layer):
        raise InvalidConfig(f"exit_layer={exit_layer!r} must be an int")
    if not 1 <= exit_layer < layers:
        raise InvalidConfig(f"exit_layer={exit_layer} must be in 1..{layers - 1} ({name})")
    owner, attr = _layer_list(model.base_model, layers)
    # Shallow copies down the path from the model to the layer list's owner, each with a
    # children dict of its own, so the original model keeps all its layers.
    steps = _named_path(model, owner) if owner is not model else []
    copies = [_shallow(model), *(_shallow(child) for _, child in steps)]
    for parent, child, (child_name, _) in zip(copies[:-1], copies[1:], steps, strict=True):
        parent._modules[child_name] = child
    copies[-1]._modules[attr] = nn.ModuleList(list(getattr(owner, attr))[:exit_layer])
    return copies[0]
