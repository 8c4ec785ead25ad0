"""An acceptance rule of your own (docs/guides/acceptance.md): the first draft, when it is among
the target's top two."""

from dataclasses import dataclass, replace

import torch

from specstrat import EAGLE, Acceptance, SpecAlgorithm, VerifyInputs
from specstrat.strategies import EagleDraftInput


@dataclass(frozen=True, slots=True)
class TopTwoFirstDraftAcceptance:
    """Accepts node 0 (always a child of the root) when it is one of the target's two most
    likely tokens there; the bonus token is the target's greedy choice after what it kept."""

    @property
    def lossless(self) -> bool:
        return False  # a second choice changes the output: lossy, and it says so

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        greedy = inputs.logits.argmax(dim=-1)  # [bs, n + 1]: the root's choice, then each node's
        index = torch.full((bs, n), -1, dtype=torch.int64, device=drafts.tokens.device)
        if n == 0:
            return Acceptance(index, torch.zeros_like(drafts.lengths), greedy[:, 0])
        top2 = inputs.logits[:, 0].topk(2, dim=-1).indices  # [bs, 2]
        hit = (drafts.lengths > 0) & (top2 == drafts.tokens[:, :1]).any(dim=-1)
        index[:, 0] = torch.where(hit, 0, -1)
        bonus = torch.where(hit, greedy[:, 1], greedy[:, 0])
        return Acceptance(index, hit.to(torch.int64), bonus)


TOP_TWO: SpecAlgorithm[EagleDraftInput] = replace(
    EAGLE, name="TOP_TWO", acceptance=TopTwoFirstDraftAcceptance()
)
