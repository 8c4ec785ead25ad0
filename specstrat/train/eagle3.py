"""An EAGLE-3-style draft head for a Hugging Face causal LM, and its one-token drafting form.

The head fuses the hidden states of ``k`` target layers (low, middle, high) with a linear
``k*H -> H``, concatenates the normed fused feature with the normed embedding of the current
token (the target's own input embedding, frozen), and runs one decoder layer in the target's
shape whose attention reads that ``2H``-wide input (RMSNorm, q/k/v from ``2H``, RoPE,
grouped-query attention, a SiLU-gated MLP), then a final RMSNorm and an LM head over the draft
vocabulary (``d2t``: draft id -> target id). The layer's output (before the final norm) is the
head's own hidden state: on later steps it replaces the fused feature, so the input is either
``[.., k*H]`` fused features or ``[.., H]`` a hidden state of the head's.

A head built with ``Eagle3Config.context`` attends over the context: each committed position
is a row of its own KV cache, and a draft attends to every row and to the drafts before it on
its path (:class:`Eagle3ContextDraftHead`, drafted by
:class:`~specstrat.strategies.ContextHeadDrafter`); without it each row attends to itself only
(:class:`Eagle3DraftHead`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat._head_attention import rope
from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.hf.matmul_padding import PlannedLinears
from specstrat.train.head_config import head_intermediate_size

__all__ = ["Eagle3Config", "Eagle3ContextDraftHead", "Eagle3DraftHead", "Eagle3Head", "Project"]

#: ``(linear, x) -> linear(x)``, however computed: the head's matmuls go through one
#: (:class:`~specstrat.hf.matmul_padding.PlannedLinears` when drafting on the CPU).
Project = Callable[[nn.Linear, torch.Tensor], torch.Tensor]


def _call(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = linear(x)
    return out


_POSITIVE = (
    "hidden_size",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "draft_vocab_size",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Eagle3Config:
    """The head's shape: the target's widths (``hidden_size``, ``heads``, ``kv_heads``,
    ``head_dim``, ``intermediate_size``, ``rope_theta``, ``rms_eps``), its ``vocab_size``
    (embedding rows), the fused target ``layers``, the ``draft_vocab_size``, and ``context``:
    the head attends over the context through its own KV cache (trained so; ``False``: each
    row attends to itself only)."""

    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    layers: tuple[int, ...]
    draft_vocab_size: int
    context: bool = False

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidConfig(f"Eagle3Config.{name}={value!r} must be an int >= 1")
        if self.heads % self.kv_heads:
            raise InvalidConfig(
                f"Eagle3Config.heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        if self.head_dim % 2:
            raise InvalidConfig(f"Eagle3Config.head_dim={self.head_dim} must be even (RoPE)")
        if len(self.layers) < 2 or not all(is_int(x) and x >= 0 for x in self.layers):
            raise InvalidConfig(
                f"Eagle3Config.layers={self.layers!r} must be at least 2 layer indices >= 0 (the "
                "fused width k*H must differ from the head's own hidden width H)"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise InvalidConfig(
                f"Eagle3Config.draft_vocab_size={self.draft_vocab_size} exceeds the target's "
                f"vocab_size={self.vocab_size}; pass a smaller draft vocabulary"
            )
        for name in ("rope_theta", "rms_eps"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise InvalidConfig(f"Eagle3Config.{name}={value!r} must be a number > 0")

        if not isinstance(self.context, bool):
            raise InvalidConfig(f"Eagle3Config.context={self.context!r} must be a bool")

    @classmethod
    def from_hf(
        cls, config: Any, *, layers: Sequence[int], draft_vocab_size: int, context: bool = False
    ) -> Eagle3Config:
        """The head's shape from a transformers config (``head_dim`` defaults to
        ``hidden_size // num_attention_heads``, ``rope_theta`` to 10000, ``rms_eps`` to 1e-6)."""
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        eps = getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", None)
        return cls(
            hidden_size=hidden,
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            intermediate_size=head_intermediate_size(config),
            rope_theta=float(theta),
            rms_eps=float(eps or 1e-6),
            vocab_size=int(config.vocab_size),
            layers=tuple(int(x) for x in layers),
            draft_vocab_size=int(draft_vocab_size),
            context=context,
        )


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


class Eagle3Head(nn.Module):
    """The trainable head (see the module docstring); ``d2t [N]`` maps draft ids to target ids
    and ``embed [vocab_size, H]`` is the target's input embedding (a frozen, unsaved buffer)."""

    def __init__(self, config: Eagle3Config, d2t: torch.Tensor, embed: torch.Tensor) -> None:
        super().__init__()
        c, h = config, config.hidden_size
        if tuple(d2t.shape) != (c.draft_vocab_size,) or d2t.dtype != torch.int64:
            raise InvalidConfig(
                f"d2t has shape {tuple(d2t.shape)} and dtype {d2t.dtype}; the head needs "
                f"[{c.draft_vocab_size}] int64 (draft_vocab(counts, {c.draft_vocab_size}))"
            )
        if d2t.numel() and not 0 <= int(d2t.min()) <= int(d2t.max()) < c.vocab_size:
            raise InvalidConfig(f"d2t holds ids outside the target's vocab [0, {c.vocab_size})")
        if tuple(embed.shape) != (c.vocab_size, h):
            raise InvalidConfig(
                f"embed has shape {tuple(embed.shape)}; the target's input embedding is "
                f"[{c.vocab_size}, {h}] by its config (pass model.get_input_embeddings().weight)"
            )
        self.config = config
        self.register_buffer("d2t", d2t.clone(), persistent=True)
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)
        self.fc = nn.Linear(len(c.layers) * h, h, bias=False)
        self.embed_norm, self.hidden_norm = _RMSNorm(h, c.rms_eps), _RMSNorm(h, c.rms_eps)
        self.q_proj = nn.Linear(2 * h, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, h, bias=False)
        self.post_norm = _RMSNorm(h, c.rms_eps)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.norm = _RMSNorm(h, c.rms_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)

    @classmethod
    def from_target(
        cls,
        model: Any,
        *,
        layers: Sequence[int],
        d2t: torch.Tensor,
        context: bool = False,
        intermediate_size: int | None = None,
    ) -> Eagle3Head:
        """A fresh head for a transformers causal LM: its shape from ``model.config`` (its MLP
        ``intermediate_size`` wide when given, else the target's own width), the
        frozen embedding copied from the model, and the LM head started from the target's LM
        head rows at ``d2t`` when the target's head reads ``hidden_size`` wide states (random
        otherwise; seed torch before calling for a reproducible start); ``context``: see
        :class:`Eagle3Config`."""
        config = Eagle3Config.from_hf(
            model.config, layers=layers, draft_vocab_size=d2t.numel(), context=context
        )
        embed = model.get_input_embeddings().weight
        config = dataclasses.replace(
            config,
            vocab_size=int(embed.shape[0]),  # the rows it has
            intermediate_size=head_intermediate_size(model.config, intermediate_size),
        )
        head = cls(config, d2t.to(torch.int64).cpu(), embed.detach().cpu())
        out = model.get_output_embeddings()
        if out is not None and int(out.weight.shape[1]) == config.hidden_size:
            with torch.no_grad():
                head.lm_head.weight.copy_(out.weight.detach().float().cpu()[d2t.cpu()])
        return head

    def fuse(self, x: torch.Tensor, project: Project = _call) -> torch.Tensor:
        """``[.., k*H]`` fused-layer features through the fusing linear, or ``[.., H]`` the
        head's own hidden state as it is; any other width raises naming it."""
        h, k = self.config.hidden_size, len(self.config.layers)
        if x.shape[-1] == k * h:
            return project(self.fc, x)
        if x.shape[-1] == h:
            return x
        raise InvalidConfig(
            f"head input width={x.shape[-1]}; pass the {k} fused layers' hidden states "
            f"concatenated ({k}*{h}={k * h} wide, layers {self.config.layers}) or the head's own "
            f"hidden state ({h} wide)"
        )

    def layer_input(
        self,
        features_or_hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        project: Project = _call,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder layer up to its attention, for inputs ``[B, T, k*H or H]``, target ids
        ``tokens [B, T]`` and ``positions [B, T]``: the residual ``[B, T, H]``, and the rotated
        ``q [B, T, heads, d]``, ``k`` and ``v [B, T, kv_heads, d]`` (each matmul through
        ``project``)."""
        c = self.config
        b, t = tokens.shape
        hidden, x = self._inputs(features_or_hidden, tokens, project)
        q = rope(project(self.q_proj, x).view(b, t, c.heads, c.head_dim), positions, c.rope_theta)
        k = project(self.k_proj, x).view(b, t, c.kv_heads, c.head_dim)
        v = project(self.v_proj, x).view(b, t, c.kv_heads, c.head_dim)
        return hidden, q, rope(k, positions, c.rope_theta), v

    def _inputs(
        self, features_or_hidden: torch.Tensor, tokens: torch.Tensor, project: Project
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual ``[B, T, H]`` and the layer's ``2H``-wide normed input."""
        hidden = self.fuse(features_or_hidden.to(self.fc.weight.dtype), project)
        emb = self.get_buffer("embed")[tokens].to(hidden.dtype)
        return hidden, torch.cat([self.embed_norm(emb), self.hidden_norm(hidden)], dim=-1)

    def layer_output(
        self, residual: torch.Tensor, attn: torch.Tensor, project: Project = _call
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits ``[B, T, N]`` and the head's hidden states ``[B, T, H]`` from the
        residual and the attention output ``[B, T, heads * d]`` (each matmul through
        ``project``)."""
        hidden = residual + project(self.o_proj, attn)
        y = self.post_norm(hidden)
        gated = F.silu(project(self.gate_proj, y)) * project(self.up_proj, y)
        hidden = hidden + project(self.down_proj, gated)
        return project(self.lm_head, self.norm(hidden)), hidden

    def forward(
        self,
        features_or_hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        causal: bool = True,
        project: Project = _call,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits ``[B, T, N]`` and the head's hidden states ``[B, T, H]`` for inputs
        ``[B, T, k*H or H]``, target ids ``tokens [B, T]`` and ``positions [B, T]``: row ``t``
        predicts the token after ``tokens[:, t]``. ``causal``: each row attends to the rows up
        to it; ``False``: to itself only (what :class:`Eagle3DraftHead` runs). Each matmul runs
        through ``project``."""
        c = self.config
        b, t = tokens.shape
        group = c.heads // c.kv_heads
        if causal:
            residual, q, k, v = self.layer_input(features_or_hidden, tokens, positions, project)
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=c.head_dim**-0.5)
            attn = attn.transpose(1, 2)
        else:  # each row's only key is its own: the softmax is 1 and the output is its value
            residual, x = self._inputs(features_or_hidden, tokens, project)
            attn = project(self.v_proj, x).view(b, t, c.kv_heads, c.head_dim)
            attn = attn.repeat_interleave(group, dim=2)
        return self.layer_output(residual, attn.reshape(b, t, c.heads * c.head_dim), project)

    def draft_head(self, vocab_size: int | None = None, *, narrow: bool = True) -> Eagle3DraftHead:
        """This head as a :class:`~specstrat.models.DraftHead` over ``vocab_size`` target ids
        (default: the embedding's rows): an :class:`Eagle3ContextDraftHead` when the head
        attends over the context. ``narrow``: see :class:`Eagle3DraftHead`."""
        vocab = self.config.vocab_size if vocab_size is None else vocab_size
        if self.config.context:
            return Eagle3ContextDraftHead(self, vocab, narrow=narrow)
        return Eagle3DraftHead(self, vocab, narrow=narrow)


class Eagle3DraftHead:
    """An :class:`Eagle3Head` as a :class:`~specstrat.models.DraftHead`, one token at a time:
    ``head(hidden [n, k*H or H], tokens [n]) -> (logits [n, vocab_size], new_hidden [n, H])``,
    logits ``-inf`` outside the draft vocabulary (a token outside it is never drafted).

    Simplification: there is no KV cache, so each row's attention sees only itself (the
    softmax over one key is 1: the attention is ``o_proj(v_proj(x))``), not the earlier
    positions a cached EAGLE-3 head attends to. ``positions`` are not passed, which is exact
    here: RoPE rotates a query and its only key alike. Train with ``causal=False`` (the
    training loop's default) to train exactly what this drafts (in float32; with ``narrow``,
    the default, its matmuls may run on bfloat16 copies where this machine runs those faster,
    and its drafts then carry bfloat16's rounding).
    """

    def __init__(self, head: Eagle3Head, vocab_size: int, *, narrow: bool = True) -> None:
        if not isinstance(narrow, bool):
            raise InvalidConfig(f"narrow={narrow!r}: pass True (a draft model) or False")
        d2t = head.get_buffer("d2t")
        if not is_int(vocab_size) or vocab_size < 1 or int(d2t.max()) >= vocab_size:
            raise InvalidConfig(
                f"vocab_size={vocab_size!r} must be an int above the largest draft id's target "
                f"id {int(d2t.max())}; pass the target's vocabulary (model.shape.vocab_size)"
            )
        self.head, self.vocab_size = head, vocab_size
        #: The head's matmuls, run as a plan timed on its weights chose where it drafts on the
        #: CPU (:class:`~specstrat.hf.matmul_padding.PlannedLinears`); with ``narrow``, on
        #: bfloat16 copies of its weights where this machine runs those faster (a draft only
        #: proposes: the target's verify keeps the output exact).
        self.project: Project = _call
        if head.fc.weight.device.type == "cpu":
            linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
            self.project = PlannedLinears(linears, narrow=narrow)

    def __call__(
        self, hidden: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits for the token after ``tokens`` (target ids), and the head's hidden."""
        if hidden.dim() != 2 or tokens.shape != hidden.shape[:1]:
            raise InvalidConfig(
                f"hidden {tuple(hidden.shape)} and tokens {tuple(tokens.shape)}; pass hidden "
                "[n, k*H or H] and tokens [n]"
            )
        n = tokens.shape[0]
        zeros = torch.zeros(n, 1, dtype=torch.int64, device=tokens.device)
        logits, new_hidden = self.head(
            hidden[:, None], tokens[:, None].long(), zeros, causal=False, project=self.project
        )
        full = torch.full((n, self.vocab_size), -math.inf, dtype=logits.dtype, device=logits.device)
        full[:, self.head.get_buffer("d2t")] = logits[:, 0]
        return full, new_hidden[:, 0]


class Eagle3ContextDraftHead(Eagle3DraftHead):
    """An :class:`Eagle3Head` trained to attend over the context, as a
    :class:`~specstrat.models.ContextDraftHead`: the drafter keeps the KV cache and calls
    the layer in two halves around its attention, logits over ``vocab_size`` target ids
    (``-inf`` outside the draft vocabulary). Called as a plain
    :class:`~specstrat.models.DraftHead` (a PREBUILT request's first token on the prefill
    side), each row attends to itself only."""

    def layer_input(
        self, features_or_hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`Eagle3Head.layer_input`."""
        return self.head.layer_input(features_or_hidden, tokens.long(), positions, self.project)

    def layer_output(
        self, residual: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, T, vocab_size]`` and the head's hidden states ``[B, T, H]``."""
        logits, hidden = self.head.layer_output(residual, attn, self.project)
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), -math.inf)
        full[..., self.head.get_buffer("d2t")] = logits
        return full, hidden
