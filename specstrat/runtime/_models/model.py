"""The embedded byte-level models: a small target LM, a smaller draft LM, an EAGLE-style head and
a block head that lets the draft LM propose a whole block in one forward.

The models never own a KV cache or a mask: each attention layer calls an
:class:`~specstrat.models.AttentionBackend`, so one model definition serves training (dense causal
attention over ``[B, L]`` sequences) and the engine (paged attention that reads the
TARGET_VERIFY/EXTEND/DECODE metadata the kernels build, so wrong metadata produces wrong tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.models import AttentionBackend, ModelShape

__all__ = [
    "BlockDraftLM",
    "BlockHead",
    "BoundEagleHead",
    "CausalAttention",
    "EagleHead",
    "ModelConfig",
    "TinyLM",
]

VOCAB = 256  # bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Shape of a :class:`TinyLM`: width, depth, heads, MLP width and learned positions."""

    dim: int
    layers: int
    heads: int
    mlp: int
    max_positions: int

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.heads

    def as_dict(self) -> dict[str, int]:
        """The config as plain ints (how it is stored beside the weights)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CausalAttention:
    """Dense causal attention over ``batch`` sequences of equal length (training, tests)."""

    batch: int

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Causal self-attention within each of the ``batch`` sequences."""
        n, h, d = q.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(self.batch, n // self.batch, h, d).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return out.transpose(1, 2).reshape(n, h, d)


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, cfg.mlp)
        self.down = nn.Linear(cfg.mlp, cfg.dim)

    def forward(self, x: torch.Tensor, layer: int, attention: AttentionBackend) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.cfg.heads, self.cfg.head_dim).unbind(1)
        x = x + self.proj(attention(layer, q, k, v).reshape(n, self.cfg.dim))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out


class TinyLM(nn.Module):
    """A pre-norm GPT over bytes with learned positions and a tied output embedding.

    ``forward(tokens, positions, attention)`` takes flat ``[n]`` tokens and positions and returns
    ``(logits [n, 256], hidden [n, dim])``; ``hidden`` is the last layer's normalised state, the
    one an EAGLE-style head reads.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.dim)
        self.pos = nn.Embedding(cfg.max_positions, cfg.dim)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        # Small embeddings: the output head is tied, so N(0, 1) would start at huge logits.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    @property
    def shape(self) -> ModelShape:
        """Vocabulary, widths and depth, as the engine's :class:`~specstrat.models.CausalLM`."""
        cfg = self.cfg
        return ModelShape(
            vocab_size=VOCAB,
            hidden_size=cfg.dim,
            layers=cfg.layers,
            heads=cfg.heads,
            head_dim=cfg.head_dim,
            max_positions=cfg.max_positions,
        )

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and final hidden states for each token."""
        x = self.embed(tokens) + self.pos(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, attention)
        hidden = self.norm(x)
        return self.logits(hidden), hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits from normalised hidden states (the tied embedding)."""
        return hidden @ self.embed.weight.T


class EagleHead(nn.Module):
    """Predicts the token after next from the target's hidden state and the next token.

    ``forward(hidden, next_tokens, target)`` returns ``(logits, new_hidden)``: ``new_hidden``
    stands in for the target's hidden state one position later, so drafting chains
    ``(hidden, token) -> (token', hidden')`` without running the target. It reuses the target's
    embedding and output head (passed in, not copied).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fuse = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.out_norm = nn.LayerNorm(dim)

    def forward(
        self, hidden: torch.Tensor, next_tokens: torch.Tensor, target: TinyLM
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits for the token after ``next_tokens``, and the predicted hidden state."""
        x = self.fuse(torch.cat([hidden, target.embed(next_tokens)], dim=-1))
        x = x + self.down(F.gelu(self.up(self.norm(x))))
        new_hidden = self.out_norm(x)
        return target.logits(new_hidden), new_hidden


@dataclass(frozen=True, slots=True)
class BoundEagleHead:
    """An :class:`EagleHead` bound to its target, as a :class:`~specstrat.models.DraftHead`."""

    head: EagleHead
    target: TinyLM

    def __call__(
        self, hidden: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits for the token after ``tokens``, and the predicted hidden state."""
        out: tuple[torch.Tensor, torch.Tensor] = self.head(hidden, tokens, self.target)
        return out


class BlockHead(nn.Module):
    """Block prediction for a draft :class:`TinyLM`: placeholder inputs and layers of its own.

    ``placeholder`` holds one learned input embedding per block offset ``1..max_block`` (the
    token ``offset`` positions after the anchor, not known yet). ``layers`` are trainable
    transformer blocks that run after the frozen draft LM's layers on every row (so placeholder
    rows attend to their keys over the context); their output, through ``out_norm``, replaces the
    draft LM's hidden state at placeholder rows only, and the draft LM's tied output embedding
    turns it into logits. The draft LM's own rows are untouched.
    """

    def __init__(self, cfg: ModelConfig, max_block: int, layers: int = 1) -> None:
        super().__init__()
        self.max_block = max_block
        self.placeholder = nn.Embedding(max_block, cfg.dim)
        self.layers = nn.ModuleList(_Block(cfg) for _ in range(layers))
        self.out_norm = nn.LayerNorm(cfg.dim)
        nn.init.normal_(self.placeholder.weight, std=0.02)


class BlockDraftLM(nn.Module):
    """The draft LM with a :class:`BlockHead`, as a :class:`~specstrat.models.BlockDraftModel`.

    Input ids ``0..255`` are bytes; ``256 + k - 1`` is the placeholder for offset ``k``
    (:meth:`placeholder`). Rows of bytes produce exactly the draft LM's logits and hidden states
    (so catching up on committed tokens is the draft LM's forward); a placeholder row at absolute
    position ``p`` predicts the token *at* ``p`` (mask filling), given everything before it.
    The KV cache holds the draft LM's layers and the head's.
    """

    def __init__(self, draft: TinyLM, head: BlockHead) -> None:
        super().__init__()
        self.draft = draft
        self.head = head

    @property
    def shape(self) -> ModelShape:
        """The draft LM's shape with the head's layers added (they size the KV cache)."""
        s = self.draft.shape
        return ModelShape(
            vocab_size=s.vocab_size,
            hidden_size=s.hidden_size,
            layers=s.layers + len(self.head.layers),
            heads=s.heads,
            head_dim=s.head_dim,
            max_positions=s.max_positions,
        )

    def placeholder(self, offset: int) -> int:
        """The input id standing for the token ``offset >= 1`` positions after the anchor;
        offsets past ``max_block`` reuse the last learned placeholder."""
        if not is_int(offset) or offset < 1:
            raise InvalidConfig(
                f"offset={offset!r} must be an int >= 1 (1: the token after the anchor)"
            )
        return VOCAB + min(offset, self.head.max_block) - 1

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden states: the draft LM's at byte rows, the head's at placeholders."""
        held = (tokens >= VOCAB)[:, None]
        blank = self.head.placeholder((tokens - VOCAB).clamp(0, self.head.max_block - 1))
        x = torch.where(held, blank, self.draft.embed(tokens.clamp(max=VOCAB - 1)))
        x = x + self.draft.pos(positions)
        for layer, block in enumerate(self.draft.blocks):
            x = block(x, layer, attention)
        own = self.draft.norm(x)
        for layer, block in enumerate(self.head.layers, start=len(self.draft.blocks)):
            x = block(x, layer, attention)
        ahead = self.head.out_norm(x)
        hidden = torch.where(held, ahead, own)
        return self.draft.logits(hidden), hidden
