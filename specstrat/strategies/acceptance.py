"""Acceptance rules: which drafts the target accepts, and the bonus token after them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.drafting import Acceptance, VerifyInputs

__all__ = ["GreedyAcceptance"]


@dataclass(frozen=True, slots=True)
class GreedyAcceptance:
    """The longest root-to-node path whose every token is the target's argmax; lossless.

    From the root, the target's greedy choice at the current node is looked up among the
    node's real children; the first child (lowest index) holding it is accepted and the walk
    goes on from there. The bonus token is the target's greedy choice at the last accepted node,
    so the output is token for token target-only greedy decoding (for a chain: the longest
    matching prefix, plus one). Sampling parameters are not read: lossless for temperature 0.
    """

    @property
    def lossless(self) -> bool:
        """Greedy acceptance reproduces target-only greedy output exactly."""
        return True

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """Walk the tree along the target's argmax, one depth per iteration (at most ``n``)."""
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        dev = drafts.tokens.device
        greedy = inputs.logits.argmax(dim=-1)  # [bs, n + 1]: choice at the root and each node
        real = torch.arange(n, device=dev)[None, :] < drafts.lengths[:, None]
        current = torch.full((bs,), -1, dtype=torch.int64, device=dev)
        index = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
        lengths = torch.zeros(bs, dtype=torch.int64, device=dev)
        alive = torch.ones(bs, dtype=torch.bool, device=dev)
        for depth in range(n):
            choice = greedy.gather(1, (current + 1)[:, None])
            match = (
                real
                & alive[:, None]
                & (drafts.parents == current[:, None])
                & (drafts.tokens == choice)
            )
            alive = match.any(dim=1)
            first = match.to(torch.int64).argmax(dim=1)  # lowest matching child
            current = torch.where(alive, first, current)
            index[:, depth] = torch.where(alive, first, index[:, depth])
            lengths += alive.to(torch.int64)
        bonus = greedy.gather(1, (current + 1)[:, None]).squeeze(1)
        return Acceptance(index, lengths, bonus)
