"""The outputs of chosen decoder layers, captured during the engine's own forward.

An EAGLE-3-style head reads the hidden states of a few target layers (low, middle, high), not
only the final one. A forward hook on each decoder layer appends the layer's output to a
per-call box while :func:`captured` holds one open; outside it the hooks do nothing, so a model
whose hooks are installed runs unchanged (transformers' ``generate`` included). Layer ``l`` is
what transformers' ``output_hidden_states`` calls ``hidden_states[l + 1]`` (what
:mod:`specstrat.train.capture` trains on): the output of decoder layer ``l``, except the last
layer's, which is the final normalised state.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf.early_exit_view import decoder_layers

__all__ = ["captured", "checked_layers", "fused", "install_layer_hooks"]

_BOX: contextvars.ContextVar[dict[int, torch.Tensor] | None] = contextvars.ContextVar(
    "specstrat_layer_outputs", default=None
)


def checked_layers(layers: Sequence[int], num_layers: int, name: str) -> tuple[int, ...]:
    """``layers`` as a tuple, refused unless distinct ints in ``0..num_layers - 1``."""
    picked = tuple(layers)
    bad = [x for x in picked if not is_int(x) or not 0 <= x < num_layers]
    if not picked or bad or len(set(picked)) != len(picked):
        raise InvalidConfig(
            f"{name}: layers={list(picked)} must be distinct layer indices in 0..{num_layers - 1} "
            "(the head's metadata names the layers it was trained on)"
        )
    return picked


def install_layer_hooks(model: Any, num_layers: int) -> None:
    """A forward hook on each of ``model``'s ``num_layers`` decoder layers (once per model)."""
    for index, layer in enumerate(decoder_layers(model, num_layers)):
        if getattr(layer, "_specstrat_layer_hook", None) == index:
            continue
        layer.register_forward_hook(_hook(index))
        setattr(layer, "_specstrat_layer_hook", index)  # noqa: B010  (nn.Module typing)


def _hook(index: int) -> Any:
    def record(module: torch.nn.Module, args: Any, output: Any) -> None:
        box = _BOX.get()
        if box is not None:
            box[index] = output[0] if isinstance(output, tuple) else output

    return record


@contextlib.contextmanager
def captured(layers: tuple[int, ...]) -> Iterator[dict[int, torch.Tensor]]:
    """Inside the block the hooked layers record their outputs into the yielded dict (layer ->
    ``[1, n, H]``); with no ``layers`` nothing is recorded."""
    box: dict[int, torch.Tensor] = {}
    if not layers:
        yield box
        return
    token = _BOX.set(box)
    try:
        yield box
    finally:
        _BOX.reset(token)


def fused(
    box: dict[int, torch.Tensor], layers: tuple[int, ...], final: torch.Tensor, name: str
) -> torch.Tensor:
    """``layers``' outputs side by side (``[1, n, len(layers) * H]``). The last layer's is
    ``final``, the normalised state the LM head reads, as in transformers' ``hidden_states``."""
    last = max(box, default=-1)
    outputs = {**box, last: final} if last >= 0 else box
    missing = [x for x in layers if x not in outputs]
    if missing:
        raise ModelLoadError(
            f"{name}: decoder layers {missing} never ran their forward hook; the model's forward "
            "skips or replaces them, so their hidden states cannot be read"
        )
    return torch.cat([outputs[x] for x in layers], dim=-1)
