"""What :class:`~specstrat.hf.fast_llama.FastLlamaForward` reads from a transformers Llama:
which models qualify, each layer's weights and settings as plain references, the fused
query/key/value and gate/up stacks the model's own weights become views into, and the watch
that notices a model changed after wrapping."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import is_
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat.hf.matmul_padding import weight_version

__all__ = [
    "FusedLayer",
    "ModelWatch",
    "activation",
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
    """One decoder layer as the fast forward reads it: plain references to its weights, norm
    epsilons, attention index and scaling and activation (read without ``nn.Module``
    attribute lookups; :class:`ModelWatch` notices any of them replaced or changed), and the
    fused query/key/value and gate/up stacks."""

    norm_in: torch.Tensor  # the input RMSNorm's weight [H]
    eps_in: float
    norm_post: torch.Tensor  # the post-attention RMSNorm's weight [H]
    eps_post: float
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, H]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, heads * head_dim]
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [2 * I, H]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [H, I]
    down_bias: torch.Tensor | None
    act: Callable[[torch.Tensor], torch.Tensor]
    layer_idx: int
    scaling: float
    heads: int
    kv_heads: int
    head_dim: int


def activation(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``F.silu`` where ``module`` is torch's ``nn.SiLU`` or transformers' ``SiLUActivation``
    itself (no subclass, no ``forward`` set on the instance; a module call costs about ten
    microseconds, thirty times a forward), else the module itself."""
    plain = type(module) in _silu_classes() and "forward" not in vars(module)
    return F.silu if plain else module


def _silu_classes() -> tuple[type, ...]:
    """torch's SiLU module class, and transformers' where it has one."""
    try:
        from transformers.activations import SiLUActivation
    except ImportError:
        return (nn.SiLU,)
    return (nn.SiLU, SiLUActivation)


def fused_layer(layer: Any) -> FusedLayer:
    """Decoder ``layer`` as the fast forward reads it: its weights, its fused stacks (views
    where the weights already lie one after another) and its head widths."""
    qkv_parts, gate_up_parts = fused_groups(layer)
    attn, mlp = layer.self_attn, layer.mlp
    qkv = stacked([p.weight for p in qkv_parts])
    gate_up = stacked([p.weight for p in gate_up_parts])
    if qkv is None or gate_up is None:  # an nn.Linear always has a weight
        raise TypeError("a Llama projection without a weight")
    head_dim = int(attn.head_dim)
    norm_in, norm_post = layer.input_layernorm, layer.post_attention_layernorm
    return FusedLayer(
        norm_in=norm_in.weight,
        eps_in=float(norm_in.variance_epsilon),
        norm_post=norm_post.weight,
        eps_post=float(norm_post.variance_epsilon),
        qkv=qkv,
        qkv_bias=stacked([p.bias for p in qkv_parts]),
        o=attn.o_proj.weight,
        o_bias=attn.o_proj.bias,
        gate_up=gate_up,
        gate_up_bias=stacked([p.bias for p in gate_up_parts]),
        down=mlp.down_proj.weight,
        down_bias=mlp.down_proj.bias,
        act=activation(mlp.act_fn),
        layer_idx=int(attn.layer_idx),
        scaling=float(attn.scaling),
        heads=int(attn.q_proj.out_features) // head_dim,
        kv_heads=int(attn.k_proj.out_features) // head_dim,
        head_dim=head_dim,
    )


class ModelWatch:
    """What a fast forward was built from, to be checked before each forward at the cost of
    dictionary reads (about 0.15 ms on SmolLM2's 30 layers; ``nn.Module`` attribute access
    would cost about four times that): every module it reads is still its parent's child, no hook
    but specstrat's layer hooks was added to one, every projection's, norm's and the LM
    head's weight is still the same parameter lying where it was adopted (``model.to(...)``,
    a cast or ``load_state_dict(assign=True)`` replaces or moves it), and none was written in
    place through itself since (``load_state_dict``, an in-place op: a packed copy of it,
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
        # Settings the fast forward copied (FusedLayer) and the activation's own forward, if
        # one was set on it: each as the dictionary it lies in, its name, its value then.
        settings: list[tuple[dict[str, Any], str, object]] = []
        for i, layer in enumerate(layers):
            edges.append((base.layers._modules, str(i), layer))
            attn, mlp = layer.self_attn, layer.mlp
            act = mlp.act_fn  # a module (its forward may be set), or a plain function
            for module, name in (
                (layer.input_layernorm, "variance_epsilon"),
                (layer.post_attention_layernorm, "variance_epsilon"),
                (attn, "layer_idx"),
                (attn, "scaling"),
                (act, "forward") if isinstance(act, nn.Module) else (mlp, "act_fn"),
            ):
                state = vars(module)
                settings.append((state, name, state.get(name)))
            for name in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
                edges.append((layer._modules, name, getattr(layer, name)))
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                params.extend(_weights(norm))
            for parent, names in (
                (attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                (mlp, ("gate_proj", "up_proj", "down_proj", "act_fn")),
            ):
                for name in names:
                    if name not in parent._modules:  # an activation kept as a plain function
                        continue
                    child = parent._modules[name]
                    edges.append((parent._modules, name, child))
                    params.extend(_weights(child))
        params.extend(_weights(model.lm_head) + _weights(base.norm))
        self._count = len(layers)
        self._layers = base.layers
        # One pass of ``map`` over ``dict.get`` and ``operator.is_`` per check, in C (a Python
        # loop over SmolLM2's 272 weights and 396 modules took about twice as long). The
        # mappings are ``nn.Module``'s own ``__dict__``, ``_modules`` and ``_parameters``: dicts.
        self._edge_dicts, self._edge_names, self._children = _columns(edges)
        self._param_dicts, self._param_names, self._tensors = _columns(params)
        self._setting_dicts, self._setting_names, settled = _columns(settings)
        self._settings = list(settled)
        self._ptrs = [t.data_ptr() for t in self._tensors]
        kept = [(t, version) for _, _, t, _, version in params if version is not None]
        self._versioned, self._versions = tuple(t for t, _ in kept), [v for _, v in kept]
        self._watched = (model, *self._children)
        self._hooks = self._hook_count()

    def _hook_count(self) -> int:
        """Hooks on the watched modules, specstrat's own layer hooks left out (the fast forward
        records those layers itself). Read from each module's ``__dict__``: ``getattr`` on an
        ``nn.Module`` that lacks the attribute goes through ``Module.__getattr__`` and an
        exception, about 0.4 ms a forward on SmolLM2 (``holds()`` timed in a loop)."""
        hooks = 0
        for state in map(vars, self._watched):
            hooks += len(state["_forward_hooks"]) + len(state["_forward_pre_hooks"])
            hooks -= state.get("_specstrat_layer_hook") is not None
        return hooks

    def holds(self) -> bool:
        """Whether the model is still the one this watch was made on."""
        if len(self._layers._modules) < self._count:
            return False
        if not all(map(is_, map(dict.get, self._edge_dicts, self._edge_names), self._children)):
            return False
        if not all(map(is_, map(dict.get, self._param_dicts, self._param_names), self._tensors)):
            return False
        if [t.data_ptr() for t in self._tensors] != self._ptrs:
            return False
        if [t._version for t in self._versioned] != self._versions:
            return False
        if list(map(dict.get, self._setting_dicts, self._setting_names)) != self._settings:
            return False
        return self._hook_count() == self._hooks


def _columns(
    rows: Sequence[tuple[Any, ...]],
) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """The first three columns of ``rows`` (a mapping, a name, what it held), each a tuple."""
    first, second, third = (tuple(row[i] for row in rows) for i in range(3))
    return first, second, third


def _weights(module: Any) -> list[tuple[dict[str, Any], str, torch.Tensor, int, int | None]]:
    """``module``'s weight and bias, each as its parameter dictionary, name, the parameter, its
    data pointer and its version (which an in-place write through it advances)."""
    return [
        (module._parameters, field, tensor, tensor.data_ptr(), weight_version(tensor))
        for field in ("weight", "bias")
        if (tensor := module._parameters.get(field)) is not None
    ]
