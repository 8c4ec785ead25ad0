"""Start a fresh EAGLE-3 head from the target's own decoder layer instead of random weights.

The head reads the fused features of layers ``(low, middle, high)`` and runs one decoder layer
in the target's shape. :func:`start_from_target` makes that layer, at the start of training, the
target's layer after ``high`` (its last layer when ``high`` is the last): the fusing linear
passes ``high``'s hidden state through (identity on its block, the other blocks near zero), the
layer's input norm, the feature half of ``q``/``k``/``v``, ``o``, the post-attention norm, the
MLP (where its width is the target's) and the final norm are the target's. The token-embedding
half of ``q``/``k``/``v`` keeps its random start, and what the head has no place for is left
out (Qwen2's q/k/v biases, Qwen3's q/k norms). Only targets whose layers are Llama's in form
(:data:`LLAMA_STYLE`: RMSNorms that scale by their weight, norms before attention and MLP) are
copied; any other starts at random. Trained from there on 112,701 positions of SmolLM2's
responses (360 steps), the head reached held-out τ 1.88 against 1.81 from a random start, and
1.33 against 1.28 on Spec-Bench; a 60-minute run (1,566 steps) gained nothing over the random
start (Spec-Bench τ 1.42 both), so ``specstrat train`` starts at random by default
(``docs/real-models.md``).
"""

from __future__ import annotations

from typing import Any

import torch

from specstrat.train.eagle3 import Eagle3Head

__all__ = ["LLAMA_STYLE", "start_from_target"]

#: The transformers ``model_type`` values whose decoder layers the head's layer has the form of
#: (Gemma's norms scale by ``1 + weight`` and sit elsewhere; Phi's attention is another shape).
LLAMA_STYLE = frozenset({"llama", "mistral", "qwen2", "qwen3"})

#: The scale of the random start of the fusing linear's blocks other than ``high``'s: small
#: beside the identity on ``high``'s block, as the measured start used it.
_FC_NOISE = 0.01


def start_from_target(head: Eagle3Head, model: Any) -> str:
    """Start ``head`` (fresh, built for ``model``: a transformers causal LM) from ``model``'s
    decoder layer after the highest fused layer (see the module docstring); draws from torch's
    generator (seed it first). Returns what it did, for the head's record: e.g. ``"layer 29
    (attention, MLP, norms)"``, or ``"random (...)"`` naming why nothing was copied (a target
    not :data:`LLAMA_STYLE`, or whose attention is not the head's shape); then ``head`` is
    left as it was."""
    c = head.config
    h = c.hidden_size
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in LLAMA_STYLE:
        return f"random (model_type={kind!r} is not Llama-style: {', '.join(sorted(LLAMA_STYLE))})"
    high = max(c.layers)
    layers = model.model.layers
    index = min(high + 1, len(layers) - 1)
    layer = layers[index]
    attn = layer.self_attn
    pairs = [
        (getattr(head, name).weight[:, h:], _weight(attn, name))
        for name in ("q_proj", "k_proj", "v_proj")
    ]
    pairs.append((head.o_proj.weight, _weight(attn, "o_proj")))
    if not all(_fits(into, source) for into, source in pairs):
        return f"random (layer {index}'s attention is not the head's shape)"
    block = len(c.layers) - 1 - c.layers[::-1].index(high)  # high's block, the last if repeated
    with torch.no_grad():
        for into, source in pairs:
            _copy(into, source)
        head.fc.weight.copy_(torch.randn_like(head.fc.weight) * _FC_NOISE)
        head.fc.weight[:, block * h : (block + 1) * h] += torch.eye(h)
        norms = [
            _copy(head.hidden_norm.weight, _weight(layer, "input_layernorm")),
            _copy(head.post_norm.weight, _weight(layer, "post_attention_layernorm")),
            _copy(head.norm.weight, _weight(model.model, "norm")),
        ]
        mlp = getattr(layer, "mlp", None)
        copied = [
            _copy(getattr(head, name).weight, _weight(mlp, name))
            for name in ("gate_proj", "up_proj", "down_proj")
        ]
    parts = ["attention"]
    if all(copied):
        parts.append("MLP")
    if all(norms):
        parts.append("norms")
    return f"layer {index} ({', '.join(parts)})"


def _fits(into: torch.Tensor, source: Any) -> bool:
    return isinstance(source, torch.Tensor) and tuple(source.shape) == tuple(into.shape)


def _copy(into: torch.Tensor, source: Any) -> bool:
    """Copy ``source`` (a tensor, or None) into ``into`` where the shapes match."""
    if not _fits(into, source):
        return False
    into.copy_(source.detach().to(into.dtype))
    return True


def _weight(module: Any, name: str) -> Any:
    return getattr(getattr(module, name, None), "weight", None)
