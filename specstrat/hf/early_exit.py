"""The early-exit view of a Hugging Face model: its first layers, final norm and LM head.

The view is a shallow copy of the model whose decoder-layer list holds only the first
``exit_layer`` layers: every module and parameter is the original's (no weight is copied), and
the model's own forward runs it, so whatever it does after its layers (the final norm, a logit
soft-cap) the view does too.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from torch import nn

from specstrat.errors import InvalidConfig, ModelLoadError

if TYPE_CHECKING:
    from specstrat.hf.adapter import HFCausalLM

__all__ = ["early_exit_view"]


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


def early_exit_view(lm: HFCausalLM, exit_layer: int) -> HFCausalLM:
    """``lm``'s first ``exit_layer`` layers plus its final norm and LM head, weights shared."""
    from specstrat.hf.adapter import HFCausalLM

    layers = lm.shape.layers
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int):
        raise InvalidConfig(f"exit_layer={exit_layer!r} must be an int")
    if not 1 <= exit_layer < layers:
        raise InvalidConfig(f"exit_layer={exit_layer} must be in 1..{layers - 1} ({lm.name})")
    model = lm.model
    base = _shallow(model.base_model)
    name = _layer_list(model.base_model, layers)
    base._modules[name] = nn.ModuleList(list(getattr(model.base_model, name))[:exit_layer])
    top = _shallow(model)
    top._modules[model.base_model_prefix] = base
    view = HFCausalLM(top, vocab_size=lm.vocab_size, name=f"{lm.name}[:{exit_layer}]")
    view.reference_attention = lm.reference_attention  # the shared config says ours by now
    return view
