"""Choosing tokens under per-request sampling parameters, the same way everywhere.

The engine's prefill (the first token), drafters that sample and the acceptance rules all go through
these helpers, so a request's tokens depend only on its parameters, seed and prompt: every random
number is :func:`~specstrat.kernels.rejection_sampling.uniform` of (seed, absolute position, draw
index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.drafting import DraftStep, DraftTree, SamplingParams
from specstrat.kernels.rejection_sampling import DRAW_DRAFT, sample_from, sampling_probs, uniform

__all__ = ["DraftChooser", "SamplingBatch", "choose_tokens"]


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row sampling parameters as tensors: ``temperature``, ``top_p``, ``top_k``, ``seed``;
    ``filtered``: whether any row uses top-k or top-p (known on the host, so the probabilities
    skip their sort without reading the device)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor
    filtered: bool = True

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
            filtered=any(p.top_k > 0 or p.top_p < 1 for p in params),
        )

    def repeat(self, times: int) -> SamplingBatch:
        """Each row ``times`` times in a row (for ``[bs, n, V]`` logits flattened to rows)."""
        return SamplingBatch(
            self.temperature.repeat_interleave(times),
            self.top_p.repeat_interleave(times),
            self.top_k.repeat_interleave(times),
            self.seed.repeat_interleave(times),
            filtered=self.filtered,
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[rows, V]`` logits to the probabilities each row samples from."""
        return sampling_probs(
            logits, self.temperature, self.top_p, self.top_k, filtered=self.filtered
        )

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


class DraftChooser:
    """Picks each draft node's token: the argmax for greedy requests; for sampling ones a draw
    (index 2) from the drafter's distribution under the request's parameters, recorded as ``q``."""

    def __init__(self, step: DraftStep) -> None:
        self.sampled = any(not p.greedy for p in step.sampling)
        self.sampling = SamplingBatch.of(step.sampling, step.bonus_tokens.device)
        self.root = step.seq_lens.to(step.bonus_tokens.device)
        self.tokens: list[torch.Tensor] = []
        self.q: list[torch.Tensor] = []

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next node's token per request, from the drafter's logits ``[bs, V]``."""
        if not self.sampled:
            token = logits.argmax(-1)
        else:
            at = self.root + 1 + len(self.tokens)
            token, probs = choose_tokens(logits, self.sampling, at, DRAW_DRAFT)
            self.q.append(probs)
        self.tokens.append(token)
        return token

    def tree(self, device: torch.device, lengths: torch.Tensor | None = None) -> DraftTree:
        """The chain of picked tokens, with ``q`` when any request samples."""
        tokens = torch.stack(self.tokens, dim=1).to(device=device, dtype=torch.int64)
        q = torch.stack(self.q, dim=1).to(device) if self.q else None
        return DraftTree.chain(tokens, lengths=lengths, q=q)
