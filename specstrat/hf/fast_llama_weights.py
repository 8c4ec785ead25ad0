"""The weights and modules :class:`~specstrat.hf.fast_llama.FastLlamaForward` reads from a
transformers Llama: which models qualify, the fused query/key/value and gate/up stacks the
model's own weights become views into, and the watch that notices a model changed after
wrapping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specstrat.hf.matmul_padding import weight_version

__all__ = [
    "FusedLayer",
    "ModelWatch",
    "adjacent",
    "decoder_layers",
    "foreign_hooks",
    "fused_groups",
    "fused_layer",
    "llama_classes",
    "plain_weight",
    "stacked",
]


def llama_classes() -> tuple[Any, ...] | None:
    """transformers' own Llama classes (causal LM, model, decoder layer, attention, MLP,
    RMSNorm, rotary embedding), or ``None`` where this transformers has no Llama."""
    try:
        from transformers.models.llama import modeling_llama as m
    except ImportError:  # a transformers without Llama: nothing qualifies
        return None
    return (
        m.LlamaForCausalLM,
        m.LlamaModel,
        m.LlamaDecoderLayer,
        m.LlamaAttention,
        m.LlamaMLP,
        m.LlamaRMSNorm,
        m.LlamaRotaryEmbedding,
    )


def foreign_hooks(model: nn.Module) -> bool:
    """Whether a module of ``model`` carries a hook specstrat did not put there (accelerate's
    offloading, a user's forward hook), which the fast forward would skip."""
    for m in model.modules():
        if getattr(m, "_hf_hook", None) is not None:
            return True
        ours_pre = 1 if getattr(m, "_specstrat_hidden_hook", False) else 0
        ours_post = 0 if getattr(m, "_specstrat_layer_hook", None) is None else 1
        if len(m._forward_pre_hooks) > ours_pre or len(m._forward_hooks) > ours_post:
            return True
    return False


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers transformers' Llama forward runs (``num_hidden_layers`` of them)."""
    return list(model.model.layers[: model.config.num_hidden_layers])


def fused_groups(layer: Any) -> tuple[tuple[nn.Linear, ...], tuple[nn.Linear, ...]]:
    """The projections fused into one matmul: query/key/value, and gate/up."""
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)


def plain_weight(t: torch.Tensor | None, like: torch.Tensor) -> bool:
    """Whether ``t`` is a plain floating-point tensor (no subclass, as quantized weights are)
    on ``like``'s device and dtype, or absent."""
    if t is None:
        return True
    data = t.data if isinstance(t, nn.Parameter) else t
    return (
        type(data) is torch.Tensor
        and t.is_floating_point()
        and (t.dtype, t.device) == (like.dtype, like.device)
    )


def adjacent(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` lie one after another in one storage, each contiguous."""
    end = tensors[0].data_ptr()
    storage = tensors[0].untyped_storage().data_ptr()
    for t in tensors:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != storage:
            return False
        if t.data_ptr() != end:
            return False
        end += t.numel() * t.element_size()
    return True


def stacked(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """``tensors`` stacked by rows (``None`` where all are absent, as biases may be): a view
    where they already lie one after another (the model's own weights after
    :meth:`~specstrat.hf.fast_llama.FastLlamaForward.adopt`), else a new tensor."""
    present = [t for t in tensors if t is not None]
    if not present:
        return None
    parts = [t.detach() for t in present]
    if len(parts) == len(tensors) and adjacent(parts):
        first = parts[0]
        rows = sum(int(t.shape[0]) for t in parts)
        return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
    # Outside inference mode even when loaded inside it: once adopted, these are the model's
    # own parameters, and an inference tensor could never take part in autograd again.
    with torch.inference_mode(False), torch.no_grad():
        return torch.cat(parts)


@dataclass(frozen=True, slots=True)
class FusedLayer:
    """One decoder layer as the fast forward reads it: its modules (their other weights read
    at each call) and the fused query/key/value and gate/up stacks."""

    attn: Any
    mlp: Any
    norm_in: Any
    norm_post: Any
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, H]
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [2 * I, H]
    gate_up_bias: torch.Tensor | None
    heads: int
    kv_heads: int
    head_dim: int


def fused_layer(layer: Any) -> FusedLayer:
    """Decoder ``layer`` as the fast forward reads it: its modules, its fused stacks (views
    where the weights already lie one after another) and its head widths."""
    qkv_parts, gate_up_parts = fused_groups(layer)
    attn = layer.self_attn
    qkv = stacked([p.weight for p in qkv_parts])
    gate_up = stacked([p.weight for p in gate_up_parts])
    if qkv is None or gate_up is None:  # an nn.Linear always has a weight
        raise TypeError("a Llama projection without a weight")
    head_dim = int(attn.head_dim)
    return FusedLayer(
        attn=attn,
        mlp=layer.mlp,
        norm_in=layer.input_layernorm,
        norm_post=layer.post_attention_layernorm,
        qkv=qkv,
        qkv_bias=stacked([p.bias for p in qkv_parts]),
        gate_up=gate_up,
        gate_up_bias=stacked([p.bias for p in gate_up_parts]),
        heads=int(attn.q_proj.out_features) // head_dim,
        kv_heads=int(attn.k_proj.out_features) // head_dim,
        head_dim=head_dim,
    )


class ModelWatch:
    """What a fast forward was built from, to be checked before each forward at the cost of
    dictionary reads (about 0.1 ms on SmolLM2's 30 layers; ``nn.Module`` attribute access
    would cost ten times that): every module it reads is still its parent's child, no hook
    but specstrat's layer hooks was added to one, every projection's and the LM head's weight
    is still the same parameter lying where it was adopted (``model.to(...)``, a cast or
    ``load_state_dict(assign=True)`` replaces or moves it), and none was written in place
    through itself since (``load_state_dict``, an in-place op: a packed copy of it,
    :func:`~specstrat.hf.matmul_padding.pack`, would be stale). A write through
    ``weight.data``, or to an inference tensor, keeps no version and is not seen: wrap the
    model anew (``HFCausalLM(model)``) after one."""

    def __init__(self, model: Any) -> None:
        base = model.model
        edges: list[tuple[dict[str, Any], str, Any]] = [
            (model._modules, "model", base),
            (model._modules, "lm_head", model.lm_head),
            *((base._modules, n, getattr(base, n)) for n in ("embed_tokens", "norm", "rotary_emb")),
            (base._modules, "layers", base.layers),
        ]
        params: list[tuple[dict[str, Any], str, torch.Tensor, int, int | None]] = []
        layers = decoder_layers(model)
        for i, layer in enumerate(layers):
            edges.append((base.layers._modules, str(i), layer))
            attn, mlp = layer.self_attn, layer.mlp
            for name in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
                edges.append((layer._modules, name, getattr(layer, name)))
            for parent, names in (
                (attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                (mlp, ("gate_proj", "up_proj", "down_proj")),
            ):
                for name in names:
                    child = getattr(parent, name)
                    edges.append((parent._modules, name, child))
                    params.extend(_weights(child))
        params.extend(_weights(model.lm_head))
        self._count = len(layers)
        self._layers = base.layers
        self._edges = tuple(edges)
        self._params = tuple(params)
        self._watched = (model, *(child for _, _, child in edges))
        self._hooks = self._hook_count()

    def _hook_count(self) -> int:
        """Hooks on the watched modules, specstrat's own layer hooks left out (the fast forward
        records those layers itself)."""
        return sum(
            len(m._forward_hooks)
            + len(m._forward_pre_hooks)
            - (getattr(m, "_specstrat_layer_hook", None) is not None)
            for m in self._watched
        )

    def holds(self) -> bool:
        """Whether the model is still the one this watch was made on."""
        if len(self._layers._modules) < self._count:
            return False
        if any(d.get(name) is not child for d, name, child in self._edges):
            return False
        for d, name, tensor, ptr, version in self._params:
            t = d.get(name)
            if t is not tensor or t.data_ptr() != ptr:
                return False
            if version is not None and t._version != version:  # None: it keeps no version
                return False
        return self._hook_count() == self._hooks


def _weights(module: Any) -> list[tuple[dict[str, Any], str, torch.Tensor, int, int | None]]:
    """``module``'s weight and bias, each as its parameter dictionary, name, the parameter, its
    data pointer and its version (which an in-place write through it advances)."""
    return [
        (module._parameters, field, tensor, tensor.data_ptr(), weight_version(tensor))
        for field in ("weight", "bias")
        if (tensor := module._parameters.get(field)) is not None
    ]
