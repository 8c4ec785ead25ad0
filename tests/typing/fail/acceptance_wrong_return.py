# expect: arg-type AcceptanceRule
# member: accept
from dataclasses import dataclass, replace

import torch

from specstrat import NGRAM, SpecAlgorithm, VerifyInputs


@dataclass(frozen=True)
class TupleAcceptance:  # returns (accept_lengths, bonus_tokens) instead of an Acceptance
    @property
    def lossless(self) -> bool:
        return True

    def accept(self, inputs: VerifyInputs) -> tuple[torch.Tensor, torch.Tensor]:
        bs = inputs.drafts.bs
        return torch.zeros(bs, dtype=torch.int64), inputs.logits[:, 0].argmax(-1)


ALGO: SpecAlgorithm[None] = replace(NGRAM, name="BROKEN", acceptance=TupleAcceptance())
