"""Choosing tokens under per-request sampling parameters, the same way everywhere.

The engine's prefill (the first token), drafters that sample and the acceptance rules all go
through these helpers, so a request's tokens depend only on its parameters, seed and prompt:
every random number is :func:`~specstrat.kernels.sampling.uniform` of (seed, absolute position,
draw index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.drafting import SamplingParams
from specstrat.kernels.sampling import sample_from, sampling_probs, uniform

__all__ = ["SamplingBatch", "choose_tokens"]


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row sampling parameters as tensors: ``temperature``, ``top_p``, ``top_k``, ``seed``."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def of(
        cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu"
    ) -> SamplingBatch:
        """The parameters of ``params``, one row each."""
        return cls(
            torch.tensor([p.temperature for p in params], dtype=torch.float64, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.seed for p in params], dtype=torch.int64, device=device),
        )

    def repeat(self, times: int) -> SamplingBatch:
        """Each row ``times`` times in a row (for ``[bs, n, V]`` logits flattened to rows)."""
        return SamplingBatch(
            *(
                t.repeat_interleave(times)
                for t in (self.temperature, self.top_p, self.top_k, self.seed)
            )
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[rows, V]`` logits to the probabilities each row samples from."""
        return sampling_probs(logits, self.temperature, self.top_p, self.top_k)

    @property
    def greedy(self) -> torch.Tensor:
        """Rows with temperature 0."""
        return self.temperature <= 0


def choose_tokens(
    logits: torch.Tensor, sampling: SamplingBatch, positions: torch.Tensor, draw: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token at ``positions`` for each row of ``logits`` ``[rows, V]``, and the distribution
    it was drawn from: the argmax (one-hot) for greedy rows, an inverse-CDF sample with the
    counter-based uniform of (seed, position, ``draw``) for the others."""
    probs = sampling.probs(logits)
    drawn = sample_from(probs, uniform(sampling.seed, positions, draw))
    tokens = torch.where(sampling.greedy, logits.argmax(-1), drawn)
    return tokens, probs
