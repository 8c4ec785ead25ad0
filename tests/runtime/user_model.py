"""A user's own model for the engine: any torch module with ``shape`` and the CausalLM call."""

import torch
from torch import nn

from specstrat import AttentionBackend, ModelShape


class BigramLM(nn.Module):
    """One attention layer over token embeddings; logits through the tied embedding."""

    def __init__(self, vocab_size: int, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.heads = heads
        self._shape = ModelShape(
            vocab_size=vocab_size,
            hidden_size=dim,
            layers=1,
            heads=heads,
            head_dim=dim // heads,
            max_positions=128,
        )

    @property
    def shape(self) -> ModelShape:
        """What the engine sizes the KV cache by."""
        return self._shape

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden states per token; attention goes through the engine's KV cache."""
        x = self.embed(tokens)
        q, k, v = self.qkv(x).view(len(tokens), 3, self.heads, -1).unbind(1)
        hidden = x + attention(0, q, k, v).reshape(x.shape)
        return hidden @ self.embed.weight.T, hidden
