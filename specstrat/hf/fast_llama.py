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

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat.hf.attention_probe import Probe
from specstrat.hf.fast_llama_weights import (
    ModelWatch,
    decoder_layers,
    foreign_hooks,
    fused_groups,
    fused_layer,
    llama_classes,
    plain_weight,
)
from specstrat.hf.matmul_padding import MatmulPlan, matmul_plan, pack
from specstrat.models import AttentionBackend

#: ``(tokens, positions, backend) -> (logits, hidden)``: a forward to check the fast one by.
AttentionCall = Callable[
    [torch.Tensor, torch.Tensor, AttentionBackend], tuple[torch.Tensor, torch.Tensor]
]

__all__ = [
    "PLAN_LAYERS",
    "PROBE_TOLERANCE",
    "AttentionCall",
    "FastLlamaForward",
    "disagreement",
    "probe_inputs",
    "probe_tolerance",
    "proven",
]

#: The largest difference between the fast forward's logits (and hidden state) and
#: transformers' on the probe sequence, relative to their largest magnitude, at which the fast
#: forward is kept in float32 (in a narrower dtype: 8 of its epsilons, if more). Fused matmuls
#: sum in another order: float32 SmolLM2 differs by under 1e-6 of the range; a real difference
#: in arithmetic (a missed bias, another norm) is orders above this.
PROBE_TOLERANCE = 1e-4

#: Decoder layers whose matmuls the layers' plan is timed on: enough weights (SmolLM2: 113 MB)
#: to be read from memory, as a forward reads them, in a fraction of a second.
PLAN_LAYERS = 8


def probe_tolerance(dtype: torch.dtype) -> float:
    """The largest probe difference, relative to the range, kept for outputs in ``dtype``:
    :data:`PROBE_TOLERANCE`, or 8 of the dtype's epsilons where that is more."""
    return max(PROBE_TOLERANCE, 8 * torch.finfo(dtype).eps)


def probe_inputs(
    n: int, vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe sequence of ``n`` tokens (spread over the first ``vocab_size`` ids) and its
    positions, on which a forward is checked against another."""
    tokens = (torch.arange(n, device=device) * 7919 + 13) % vocab_size
    return tokens, torch.arange(n, device=device) + 3


def disagreement(want: torch.Tensor, got: torch.Tensor) -> float | None:
    """``got``'s largest difference from ``want`` where it is past :func:`probe_tolerance` of
    ``want``'s range; ``None`` where they agree."""
    gap = float((got.float() - want.float()).abs().max())
    return None if gap <= probe_tolerance(want.dtype) * float(want.float().abs().max()) else gap


def proven(model: Any, reference: AttentionCall, vocab_size: int) -> FastLlamaForward | None:
    """The fast forward for ``model``, adopted, where :meth:`FastLlamaForward.of` takes the
    model and its logits (the first ``vocab_size`` columns) and hidden state match
    ``reference`` (transformers' forward: ``(tokens, positions, backend) -> (logits,
    hidden)``) on a probe sequence, both through dense attention; ``None`` otherwise, the model
    left as it was. A fast forward that cannot be built or run is ``None`` too: whatever it
    cannot read, transformers' forward can. On the CPU its matmul plan is timed, then checked
    the same way on a probe of each form the plan runs; a plan that fails is dropped for
    ``F.linear`` throughout."""
    try:
        fast = FastLlamaForward.of(model)
        if fast is None:
            return None
        if not _agrees(fast, reference, 7, vocab_size):
            return None
        fast.adopt()
        if next(model.parameters()).device.type == "cpu":  # torch's pick for few rows is poor
            fast.plan_matmuls()
            counts = _first_rows(fast.plan) | _first_rows(fast.head_plan)
            if not all(_agrees(fast, reference, n, vocab_size) for n in sorted(counts)):
                fast.plan, fast.head_plan = MatmulPlan(), MatmulPlan()
                fast.pack_weights()
    except Exception:  # a forward the fast path cannot build: transformers' forward runs
        return None
    return fast


def _agrees(fast: FastLlamaForward, reference: AttentionCall, n: int, vocab_size: int) -> bool:
    """Whether ``fast`` gives ``reference``'s logits and hidden state on a probe of ``n``
    tokens, within :data:`PROBE_TOLERANCE` of their range."""
    tokens, positions = probe_inputs(n, vocab_size, fast.device)
    with torch.inference_mode():
        want_logits, want_hidden = reference(tokens, positions, Probe())
        logits, hidden, _ = fast(tokens, positions, Probe())
    pairs = ((want_logits, logits[:, :vocab_size]), (want_hidden, hidden))
    return all(disagreement(want, got) is None for want, got in pairs)


def _first_rows(plan: MatmulPlan) -> set[int]:
    """A row count for each way ``plan`` runs (the fewest rows that run it)."""
    first: dict[tuple[str, bool], int] = {}
    for n in sorted(plan.ways, reverse=True):
        form, rows = plan.ways[n]
        first[form, rows == n] = n
    if plan.beyond is not None:
        first.setdefault((plan.beyond, True), max(plan.ways, default=0) + 1)
    return set(first.values())


class FastLlamaForward:
    """The forward of a transformers ``LlamaForCausalLM`` (or an early-exit view of one) over
    its own weights; see the module docstring. Build it with :meth:`of`, check it against
    transformers' forward, then :meth:`adopt` it; :meth:`current` says whether the model is
    still the one it was built from."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._layers = tuple(fused_layer(layer) for layer in decoder_layers(model))
        self._watch: ModelWatch | None = None
        #: How each layer projection's matmul runs, and the LM head's, by their rows (see
        #: :func:`~specstrat.hf.matmul_padding.matmul_plan`; empty: ``F.linear`` throughout).
        self.plan, self.head_plan = MatmulPlan(), MatmulPlan()
        self._packs: tuple[tuple[torch.Tensor | None, ...], ...] = ((None,) * 4,) * len(
            self._layers
        )
        self._head_pack: torch.Tensor | None = None

    @classmethod
    def of(cls, model: Any) -> FastLlamaForward | None:
        """The fast forward for ``model``, or ``None`` where the model is not plainly a
        transformers Llama (another class or a subclass, a projection that is not an
        ``nn.Linear`` over plain floating-point weights, a bias on only some fused parts, a
        foreign hook, pretraining tensor parallelism)."""
        classes = llama_classes()
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
        if int(getattr(model.config, "pretraining_tp", 1) or 1) != 1 or foreign_hooks(model):
            return None
        for layer in decoder_layers(model):
            kinds = (type(layer), type(layer.self_attn), type(layer.mlp))
            norms = (type(layer.input_layernorm), type(layer.post_attention_layernorm))
            if kinds != (decoder, attention, mlp) or norms != (norm, norm):
                return None
            fused = fused_groups(layer)
            others = (layer.self_attn.o_proj, layer.mlp.down_proj)
            if any(type(x) is not nn.Linear for x in (*fused[0], *fused[1], *others)):
                return None
            for group in fused:
                first = group[0].weight
                if len({x.bias is None for x in group}) > 1:  # a bias on some parts only
                    return None
                if not all(
                    plain_weight(x.weight, first) and plain_weight(x.bias, first) for x in group
                ):
                    return None
        return cls(model)

    def adopt(self) -> None:
        """Make the model's fused projections' weights views into this forward's stacks (the
        ``Parameter`` objects stay; only their data moves), so no weight is held twice."""
        with torch.inference_mode(False), torch.no_grad():
            for layer, w in zip(decoder_layers(self._model), self._layers, strict=True):
                qkv_parts, gate_up_parts = fused_groups(layer)
                for parts, stack, bias in (
                    (qkv_parts, w.qkv, w.qkv_bias),
                    (gate_up_parts, w.gate_up, w.gate_up_bias),
                ):
                    start = 0
                    for part in parts:
                        _into(part.weight, stack, start)
                        _into(part.bias, bias, start)
                        start += int(part.weight.shape[0])
        self._watch = ModelWatch(self._model)

    @property
    def device(self) -> torch.device:
        """Where the model's weights lie."""
        device: torch.device = self._model.lm_head.weight.device
        return device

    def layer_weights(self, layers: int) -> list[torch.Tensor]:
        """The weights of the first ``layers`` decoder layers' matmuls, in the order a forward
        runs them (what :func:`~specstrat.hf.matmul_padding.matmul_plan` times)."""
        return [weight for w in self._layers[:layers] for weight in (w.qkv, w.o, w.gate_up, w.down)]

    def plan_matmuls(self) -> None:
        """Time this machine's ways of computing each matmul
        (:func:`~specstrat.hf.matmul_padding.matmul_plan`) on the first :data:`PLAN_LAYERS`
        layers and on the LM head, then :meth:`pack_weights` for the plans."""
        self.plan = matmul_plan(self.layer_weights(PLAN_LAYERS))
        self.head_plan = matmul_plan([self._model.lm_head.weight])
        self.pack_weights()

    def pack_weights(self) -> None:
        """Hold packed copies (:func:`~specstrat.hf.matmul_padding.pack`) of the layers'
        weights where :attr:`plan` runs the ``packed`` form, and of the LM head's where
        :attr:`head_plan` does; drop them where it does not."""
        packs = "packed" in self.plan.forms()
        self._packs = tuple(
            tuple(pack(t) if packs else None for t in (w.qkv, w.o, w.gate_up, w.down))
            for w in self._layers
        )
        head = self._model.lm_head.weight
        self._head_pack = pack(head) if "packed" in self.head_plan.forms() else None

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
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """Logits ``[n, V]`` (the LM head's full width; with ``rows``, of those rows only:
        ``[len(rows), V]``, the LM head left out elsewhere), the final normalised hidden state
        ``[n, H]`` and the outputs ``[1, n, H]`` of the decoder layers in ``keep`` and of the last
        layer (with any ``keep``; what transformers' layer hooks would record, read by
        :func:`~specstrat.hf.layer_features.fused`) for flat ``tokens`` at ``positions``. It
        reads packed copies of the weights and does not check :meth:`current` itself:
        :class:`~specstrat.hf.HFCausalLM` checks before each forward."""
        model, n = self._model, tokens.shape[0]
        base = model.model
        x = F.embedding(tokens, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(x, positions[None])
        cos, sin = cos[0, :, None], _signed(sin[0, :, None])  # [n, 1, d]
        outputs: dict[int, torch.Tensor] = {}
        last, linear = len(self._layers) - 1, self.plan.linear
        for index, (w, p) in enumerate(zip(self._layers, self._packs, strict=True)):
            q_width, kv_width = w.heads * w.head_dim, w.kv_heads * w.head_dim
            qkv = linear(_rms(x, w.norm_in, w.eps_in), w.qkv, w.qkv_bias, p[0])
            qk = qkv[:, : q_width + kv_width].view(n, w.heads + w.kv_heads, w.head_dim)
            qk = _rotate(qk, cos, sin)
            q, k = qk[:, : w.heads], qk[:, w.heads :]  # rotated together: one op for both
            v = qkv[:, q_width + kv_width :].view(n, w.kv_heads, w.head_dim)
            out = attention(w.layer_idx, q, k, v, scaling=w.scaling)
            x = x + linear(out.reshape(n, q_width), w.o, w.o_bias, p[1])
            gate_up = linear(_rms(x, w.norm_post, w.eps_post), w.gate_up, w.gate_up_bias, p[2])
            width = gate_up.shape[1] // 2
            gate, up = gate_up[:, :width], gate_up[:, width:]
            x = x + linear(w.act(gate) * up, w.down, w.down_bias, p[3])
            if index in keep or (keep and index == last):
                outputs[index] = x[None]
        norm = base.norm
        final = _rms(x, norm.weight, norm.variance_epsilon)
        head = model.lm_head
        read = final if rows is None else final[rows]
        logits = self.head_plan.linear(read, head.weight, head.bias, self._head_pack)
        return logits, final, outputs


def _into(t: torch.Tensor | None, stack: torch.Tensor | None, start: int) -> None:
    """Make ``t``'s data rows ``start ..`` of ``stack`` (where it is not already)."""
    if t is not None and stack is not None and t.data_ptr() != stack[start].data_ptr():
        t.data = stack[start : start + int(t.shape[0])]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm of ``weight`` and ``eps``: in float32, then back to ``x``'s
    dtype before the weight (in float32 the same sums in one fused op)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out: torch.Tensor = weight * h.to(x.dtype)
    return out


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin [n, 1, d]`` with its first half negated, for :func:`_rotate`."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [n, heads, d]`` (rotate-half layout) with ``cos [n, 1, d]`` and
    ``signed_sin = _signed(sin)``: transformers' ``x * cos + cat(-x2, x1) * sin``, its halves
    swapped by one flip and the sign carried by ``signed_sin`` (``-a * s == a * -s`` exactly)."""
    n, heads, d = x.shape
    swapped = x.view(n, heads, 2, d // 2).flip(2).view(n, heads, d)
    return x * cos + swapped * signed_sin
