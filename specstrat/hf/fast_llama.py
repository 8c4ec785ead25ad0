"""A plain forward over a Llama model's own weights, for the engine's decode and verify steps.

transformers' Llama forward spends about as long in module calls, keyword handling and small ops
as in its matmuls on a small model (SmolLM2-135M on 2 CPU threads: 8.4 ms of a 36.4 ms decode
step, ``specstrat bench --profile``). :class:`FastLlamaForward` runs the same arithmetic
straight through: one query/key/value matmul and one gate/up matmul per layer (the module
weights become views into the fused tensors, so no weight is held twice), the model's own
rotary module computed once per forward, and the engine's attention backend called directly.

It serves only what it can prove it computes as transformers does:
:meth:`FastLlamaForward.of` takes a model whose every module is transformers' own Llama class
(a subclass may change a forward), whose linears are plain ``nn.Linear`` (no quantized or
offloaded weights) and that carries no hook but specstrat's; :class:`~specstrat.hf.HFCausalLM`
then compares its logits with transformers' own forward on a probe sequence at load and keeps it
only when they agree (:data:`PROBE_TOLERANCE`). Anything else runs transformers' forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat.models import AttentionBackend

__all__ = ["PROBE_TOLERANCE", "FastLlamaForward"]

#: The largest difference between the fast forward's logits and transformers' on the probe
#: sequence, relative to the logits' largest magnitude, at which the fast forward is kept. Fused
#: matmuls sum in another order: float32 SmolLM2 differs by about 1e-6 of the range; a real
#: difference in arithmetic (a missed bias, another norm) is orders above this.
PROBE_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer as the fast forward reads it: its modules (their weights read at each
    call) and the fused query/key/value and gate/up stacks their weights are views into."""

    attn: Any
    mlp: Any
    norm_in: Any
    norm_post: Any
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, H]
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [2 * I, H]
    gate_up_bias: torch.Tensor | None

    def current(self) -> bool:
        """Whether the modules still read the stacks (``model.to(...)`` replaces them)."""
        q: torch.Tensor = self.attn.q_proj.weight
        gate: torch.Tensor = self.mlp.gate_proj.weight
        return q.data_ptr() == self.qkv.data_ptr() and gate.data_ptr() == self.gate_up.data_ptr()


def _classes() -> tuple[Any, ...] | None:
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


def _foreign_hooks(model: nn.Module) -> bool:
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


def _fuse(parts: Sequence[nn.Linear], owner: nn.Module, field: str) -> torch.Tensor | None:
    """The ``field`` (``weight`` or ``bias``) tensors of ``parts`` stacked by rows, each part's
    own made a view into the stack (so the model keeps its weights once); ``None`` where the
    parts have no bias. A stack already made for the same parts (kept on ``owner``) is
    reused."""
    tensors = [getattr(p, field) for p in parts]
    if all(t is None for t in tensors):
        return None
    attr = f"_specstrat_{field}_stack"  # one stack of each field per owner
    stacked: torch.Tensor | None = getattr(owner, attr, None)
    offsets = [sum(int(t.shape[0]) for t in tensors[:i]) for i in range(len(tensors))]
    if stacked is not None and all(
        t.data_ptr() == stacked[o:].data_ptr() for t, o in zip(tensors, offsets, strict=True)
    ):
        return stacked
    # Outside inference mode even when loaded inside it: an inference tensor could never take
    # part in autograd again, and these are the model's own parameters from now on.
    with torch.inference_mode(False), torch.no_grad():
        stacked = torch.cat([t.detach() for t in tensors], dim=0)
        for p, t, o in zip(parts, tensors, offsets, strict=True):
            view = stacked[o : o + int(t.shape[0])]
            setattr(p, field, nn.Parameter(view, requires_grad=t.requires_grad))
    object.__setattr__(owner, attr, stacked)  # a plain attribute: not a parameter or buffer
    return stacked


def _stack(parts: Sequence[nn.Linear], owner: nn.Module) -> torch.Tensor:
    stacked = _fuse(parts, owner, "weight")
    assert stacked is not None  # an nn.Linear always has a weight
    return stacked


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' LlamaRMSNorm: in float32, then back to ``x``'s dtype before the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    out: torch.Tensor = norm.weight * h.to(x.dtype)
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [n, heads, d]`` with ``cos``/``sin [n, 1, d]`` (rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FastLlamaForward:
    """The forward of a transformers ``LlamaForCausalLM`` (or an early-exit view of one) over
    its own weights; see the module docstring. Build it with :meth:`of`."""

    def __init__(self, model: Any, layers: Sequence[Any]) -> None:
        self._model = model
        self._decoder = tuple(layers)
        cfg = model.config
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self._layers = tuple(self._layer(layer) for layer in layers)

    @classmethod
    def of(cls, model: Any) -> FastLlamaForward | None:
        """The fast forward for ``model``, or ``None`` where the model is not plainly a
        transformers Llama (another class or a subclass, a projection that is not an
        ``nn.Linear``, a foreign hook, pretraining tensor parallelism)."""
        classes = _classes()
        if classes is None:
            return None
        causal, llama, decoder, attention, mlp, norm, rotary = classes
        base: Any = getattr(model, "model", None)
        if type(model) is not causal or type(base) is not llama:
            return None
        if type(base.norm) is not norm or type(base.rotary_emb) is not rotary:
            return None
        if type(model.lm_head) is not nn.Linear or type(base.embed_tokens) is not nn.Embedding:
            return None
        if int(getattr(model.config, "pretraining_tp", 1) or 1) != 1 or _foreign_hooks(model):
            return None
        layers = list(base.layers)
        for layer in layers:
            kinds = (type(layer), type(layer.self_attn), type(layer.mlp))
            norms = (type(layer.input_layernorm), type(layer.post_attention_layernorm))
            if kinds != (decoder, attention, mlp) or norms != (norm, norm):
                return None
            attn, ff = layer.self_attn, layer.mlp
            linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
            if any(type(x) is not nn.Linear for x in [*linears, ff.gate_proj, ff.up_proj]):
                return None
            if type(ff.down_proj) is not nn.Linear:
                return None
            for group in ((attn.q_proj, attn.k_proj, attn.v_proj), (ff.gate_proj, ff.up_proj)):
                if len({x.bias is None for x in group}) > 1:  # a bias on some parts only
                    return None
        return cls(model, layers)

    @staticmethod
    def _layer(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_parts = (attn.q_proj, attn.k_proj, attn.v_proj)
        gate_up_parts = (mlp.gate_proj, mlp.up_proj)
        return _Layer(
            attn=attn,
            mlp=mlp,
            norm_in=layer.input_layernorm,
            norm_post=layer.post_attention_layernorm,
            qkv=_stack(qkv_parts, attn),
            qkv_bias=_fuse(qkv_parts, attn, "bias"),
            gate_up=_stack(gate_up_parts, mlp),
            gate_up_bias=_fuse(gate_up_parts, mlp, "bias"),
        )

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        keep: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """Logits ``[n, V]`` (the LM head's full width), the final normalised hidden state
        ``[n, H]`` and the outputs ``[1, n, H]`` of the decoder layers in ``keep`` and of the last
        layer (with any ``keep``; what transformers' layer hooks would record, read by
        :func:`~specstrat.hf.layer_features.fused`) for flat ``tokens`` at ``positions``."""
        if not self._layers[0].current():  # the model was moved or cast: stack its weights anew
            self._layers = tuple(self._layer(layer) for layer in self._decoder)
        model, n = self._model, tokens.shape[0]
        base = model.model
        x = F.embedding(tokens, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(x, positions[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [n, 1, d]
        q_width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        outputs: dict[int, torch.Tensor] = {}
        last = len(self._layers) - 1
        for index, w in enumerate(self._layers):
            qkv = F.linear(_rms(x, w.norm_in), w.qkv, w.qkv_bias)
            q = qkv[:, :q_width].view(n, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(n, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(n, self.kv_heads, self.head_dim)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            out = attention(w.attn.layer_idx, q, k, v, scaling=w.attn.scaling)
            o = w.attn.o_proj
            x = x + F.linear(out.reshape(n, q_width), o.weight, o.bias)
            gate_up = F.linear(_rms(x, w.norm_post), w.gate_up, w.gate_up_bias)
            gate, up = gate_up.chunk(2, dim=-1)
            down = w.mlp.down_proj
            x = x + F.linear(w.mlp.act_fn(gate) * up, down.weight, down.bias)
            if index in keep or (keep and index == last):
                outputs[index] = x[None]
        final = _rms(x, base.norm)
        head = model.lm_head
        return F.linear(final, head.weight, head.bias), final, outputs
