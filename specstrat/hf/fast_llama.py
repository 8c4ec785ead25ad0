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

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat.hf.attention_probe import Probe
from specstrat.models import AttentionBackend

#: ``(tokens, positions, backend) -> (logits, hidden)``: a forward to check the fast one by.
AttentionCall = Callable[
    [torch.Tensor, torch.Tensor, AttentionBackend], tuple[torch.Tensor, torch.Tensor]
]

__all__ = [
    "PAD_GAIN",
    "PAD_ROWS",
    "PROBE_TOLERANCE",
    "AttentionCall",
    "FastLlamaForward",
    "head_padding",
    "proven",
]

#: The largest difference between the fast forward's logits (and hidden state) and
#: transformers' on the probe sequence, relative to their largest magnitude, at which the fast
#: forward is kept in float32 (in a narrower dtype: 8 of its epsilons, if more). Fused matmuls
#: sum in another order: float32 SmolLM2 differs by under 1e-6 of the range; a real difference
#: in arithmetic (a missed bias, another norm) is orders above this.
PROBE_TOLERANCE = 1e-4


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


def _decoder(model: Any) -> list[Any]:
    """The decoder layers transformers' Llama forward runs (``num_hidden_layers`` of them)."""
    return list(model.model.layers[: model.config.num_hidden_layers])


def _groups(layer: Any) -> tuple[tuple[nn.Linear, ...], tuple[nn.Linear, ...]]:
    """The projections fused into one matmul: query/key/value, and gate/up."""
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)


def _plain(t: torch.Tensor | None, like: torch.Tensor) -> bool:
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


def _adjacent(tensors: Sequence[torch.Tensor]) -> bool:
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


def _stacked(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """``tensors`` stacked by rows (``None`` where all are absent, as biases may be): a view
    where they already lie one after another (the model's own weights after
    :meth:`FastLlamaForward.adopt`), else a new tensor."""
    present = [t for t in tensors if t is not None]
    if not present:
        return None
    parts = [t.detach() for t in present]
    if len(parts) == len(tensors) and _adjacent(parts):
        first = parts[0]
        rows = sum(int(t.shape[0]) for t in parts)
        return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
    # Outside inference mode even when loaded inside it: once adopted, these are the model's
    # own parameters, and an inference tensor could never take part in autograd again.
    with torch.inference_mode(False), torch.no_grad():
        return torch.cat(parts)


@dataclass(frozen=True, slots=True)
class _Layer:
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


def _layer(layer: Any) -> _Layer:
    qkv_parts, gate_up_parts = _groups(layer)
    attn = layer.self_attn
    qkv = _stacked([p.weight for p in qkv_parts])
    gate_up = _stacked([p.weight for p in gate_up_parts])
    if qkv is None or gate_up is None:  # an nn.Linear always has a weight
        raise TypeError("a Llama projection without a weight")
    head_dim = int(attn.head_dim)
    return _Layer(
        attn=attn,
        mlp=layer.mlp,
        norm_in=layer.input_layernorm,
        norm_post=layer.post_attention_layernorm,
        qkv=qkv,
        qkv_bias=_stacked([p.bias for p in qkv_parts]),
        gate_up=gate_up,
        gate_up_bias=_stacked([p.bias for p in gate_up_parts]),
        heads=int(attn.q_proj.out_features) // head_dim,
        kv_heads=int(attn.k_proj.out_features) // head_dim,
        head_dim=head_dim,
    )


class _Watch:
    """What a fast forward was built from, to be checked before each forward at the cost of
    dictionary reads (about 0.1 ms on SmolLM2's 30 layers; ``nn.Module`` attribute access
    would cost ten times that): every module it reads is still its parent's child, no hook was
    added to one, and every fused weight still lies where it was adopted (``model.to(...)``, a
    cast or ``load_state_dict(assign=True)`` moves it)."""

    def __init__(self, model: Any) -> None:
        base = model.model
        edges: list[tuple[dict[str, Any], str, Any]] = [
            (model._modules, "model", base),
            (model._modules, "lm_head", model.lm_head),
            *((base._modules, n, getattr(base, n)) for n in ("embed_tokens", "norm", "rotary_emb")),
            (base._modules, "layers", base.layers),
        ]
        params: list[tuple[dict[str, Any], str, int]] = []
        layers = _decoder(model)
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
                    for field in ("weight", "bias"):
                        tensor = child._parameters.get(field)
                        if tensor is not None:
                            params.append((child._parameters, field, tensor.data_ptr()))
        self._count = len(layers)
        self._layers = base.layers
        self._edges = tuple(edges)
        self._params = tuple(params)
        self._watched = (model, *(child for _, _, child in edges))
        self._hooks = self._hook_count()

    def _hook_count(self) -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self._watched)

    def holds(self) -> bool:
        """Whether the model is still the one this watch was made on."""
        if len(self._layers._modules) < self._count:
            return False
        if any(d.get(name) is not child for d, name, child in self._edges):
            return False
        if any((t := d.get(name)) is None or t.data_ptr() != ptr for d, name, ptr in self._params):
            return False
        return self._hook_count() == self._hooks


#: Row counts :func:`head_padding` times, and how much faster a padded matmul must be to pad.
PAD_ROWS, PAD_GAIN = 8, 0.85


def _matmul_seconds(weight: torch.Tensor, rows: int, repeats: int) -> float:
    """The median time of ``repeats`` matmuls of ``rows`` rows by ``weight``, after one."""
    x = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            start = time.perf_counter()
            F.linear(x, weight)
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def head_padding(weight: torch.Tensor, repeats: int = 3) -> dict[int, int]:
    """For ``n`` of 1 .. :data:`PAD_ROWS` rows, the row count ``m >= n`` at which a matmul by
    ``weight`` (the LM head) runs fastest, where that beats ``n`` rows by :data:`PAD_GAIN`;
    rows missing from the map are not padded. Timed on this machine, each count's median of
    ``repeats`` after a warm-up: on one 2-core AMD EPYC host, SmolLM2's LM head took 12.4, 28.3,
    41.1 and 22.9 ms for 1, 2, 3 and 4 rows (torch 2.13, two threads), so 2 and 3 rows (a
    verify of 2 or 3 tokens) ran fastest padded to 4; an Intel host showed no such step."""
    cost = {rows: _matmul_seconds(weight, rows, repeats) for rows in range(1, PAD_ROWS + 1)}
    padding: dict[int, int] = {}
    for rows in cost:
        best = min(range(rows, PAD_ROWS + 1), key=lambda m: cost[m])
        if best != rows and cost[best] < PAD_GAIN * cost[rows]:
            padding[rows] = best
    return padding


def proven(model: Any, reference: AttentionCall, vocab_size: int) -> FastLlamaForward | None:
    """The fast forward for ``model``, adopted, where :meth:`FastLlamaForward.of` takes the
    model and its logits (the first ``vocab_size`` columns) and hidden state match
    ``reference`` (transformers' forward: ``(tokens, positions, backend) -> (logits,
    hidden)``) on a probe sequence, both through dense attention; ``None`` otherwise, the model
    left as it was. A fast forward that cannot be built or run is ``None`` too: whatever it
    cannot read, transformers' forward can."""
    try:
        fast = FastLlamaForward.of(model)
        if fast is None:
            return None
        n = 7
        device = next(model.parameters()).device
        tokens = (torch.arange(n, device=device) * 7919 + 13) % vocab_size
        positions = torch.arange(n, device=device) + 3
        with torch.inference_mode():
            want_logits, want_hidden = reference(tokens, positions, Probe())
            logits, hidden, _ = fast(tokens, positions, Probe())
        for want, got in ((want_logits, logits[:, :vocab_size]), (want_hidden, hidden)):
            tolerance = max(PROBE_TOLERANCE, 8 * torch.finfo(want.dtype).eps)
            gap = float((got.float() - want.float()).abs().max())
            if not gap <= tolerance * float(want.float().abs().max()):
                return None
        fast.adopt()
        if device.type == "cpu":  # where one matmul shape can cost more than a larger one
            fast.head_rows = head_padding(model.lm_head.weight)
    except Exception:  # a forward the fast path cannot build: transformers' forward runs
        return None
    return fast


class FastLlamaForward:
    """The forward of a transformers ``LlamaForCausalLM`` (or an early-exit view of one) over
    its own weights; see the module docstring. Build it with :meth:`of`, check it against
    transformers' forward, then :meth:`adopt` it; :meth:`current` says whether the model is
    still the one it was built from."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._layers = tuple(_layer(layer) for layer in _decoder(model))
        self._watch: _Watch | None = None
        #: Rows the LM head's matmul is padded to, by rows it has (see :func:`head_padding`).
        self.head_rows: dict[int, int] = {}

    @classmethod
    def of(cls, model: Any) -> FastLlamaForward | None:
        """The fast forward for ``model``, or ``None`` where the model is not plainly a
        transformers Llama (another class or a subclass, a projection that is not an
        ``nn.Linear`` over plain floating-point weights, a bias on only some fused parts, a
        foreign hook, pretraining tensor parallelism)."""
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
        for layer in _decoder(model):
            kinds = (type(layer), type(layer.self_attn), type(layer.mlp))
            norms = (type(layer.input_layernorm), type(layer.post_attention_layernorm))
            if kinds != (decoder, attention, mlp) or norms != (norm, norm):
                return None
            fused = _groups(layer)
            others = (layer.self_attn.o_proj, layer.mlp.down_proj)
            if any(type(x) is not nn.Linear for x in (*fused[0], *fused[1], *others)):
                return None
            for group in fused:
                first = group[0].weight
                if len({x.bias is None for x in group}) > 1:  # a bias on some parts only
                    return None
                if not all(_plain(x.weight, first) and _plain(x.bias, first) for x in group):
                    return None
        return cls(model)

    def adopt(self) -> None:
        """Make the model's fused projections' weights views into this forward's stacks (the
        ``Parameter`` objects stay; only their data moves), so no weight is held twice."""
        with torch.inference_mode(False), torch.no_grad():
            for layer, w in zip(_decoder(self._model), self._layers, strict=True):
                qkv_parts, gate_up_parts = _groups(layer)
                for parts, stack, bias in (
                    (qkv_parts, w.qkv, w.qkv_bias),
                    (gate_up_parts, w.gate_up, w.gate_up_bias),
                ):
                    start = 0
                    for part in parts:
                        _into(part.weight, stack, start)
                        _into(part.bias, bias, start)
                        start += int(part.weight.shape[0])
        self._watch = _Watch(self._model)

    def current(self) -> bool:
        """Whether the model still has the modules, hooks and weights this forward was adopted
        with."""
        return self._watch is not None and self._watch.holds()

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
        model, n = self._model, tokens.shape[0]
        base = model.model
        x = F.embedding(tokens, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(x, positions[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # [n, 1, d]
        outputs: dict[int, torch.Tensor] = {}
        last = len(self._layers) - 1
        for index, w in enumerate(self._layers):
            q_width, kv_width = w.heads * w.head_dim, w.kv_heads * w.head_dim
            qkv = F.linear(_rms(x, w.norm_in), w.qkv, w.qkv_bias)
            q = qkv[:, :q_width].view(n, w.heads, w.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(n, w.kv_heads, w.head_dim)
            v = qkv[:, q_width + kv_width :].view(n, w.kv_heads, w.head_dim)
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
        rows = self.head_rows.get(n, n)
        if rows == n:
            return F.linear(final, head.weight, head.bias), final, outputs
        padded = F.pad(final, (0, 0, 0, rows - n))
        return F.linear(padded, head.weight, head.bias)[:n], final, outputs


def _into(t: torch.Tensor | None, stack: torch.Tensor | None, start: int) -> None:
    """Make ``t``'s data rows ``start ..`` of ``stack`` (where it is not already)."""
    if t is not None and stack is not None and t.data_ptr() != stack[start].data_ptr():
        t.data = stack[start : start + int(t.shape[0])]


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
