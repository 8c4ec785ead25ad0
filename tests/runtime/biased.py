"""Deliberately biased acceptance rules: what check_lossless_in_distribution must catch."""

from dataclasses import dataclass

import torch

from specstrat import Acceptance, VerifyInputs
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE
from specstrat.sampling import SamplingBatch, choose_tokens
from specstrat.strategies import RejectionSamplingAcceptance


@dataclass(frozen=True, slots=True)
class AcceptEveryDraft:
    """Accepts every real draft node, then takes the bonus from the target: biased towards q."""

    @property
    def lossless(self) -> bool:
        """Claims to be lossless (it is not)."""
        return True

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """The whole chain, and a sample from p after it."""
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        lengths = drafts.lengths
        cols = torch.arange(n)[None, :]
        index = torch.where(cols < lengths[:, None], cols.expand(bs, n), -1)
        sampling = SamplingBatch.of(inputs.sampling)
        at = inputs.logits[torch.arange(bs), lengths]
        bonus, _ = choose_tokens(at, sampling, inputs.positions + 1 + lengths, DRAW_SAMPLE)
        return Acceptance(index, lengths.clone(), bonus)


@dataclass(frozen=True, slots=True)
class NoResidualRejection:
    """Rejection sampling that, on rejection, samples from p instead of the residual max(0, p -
    q)."""

    @property
    def lossless(self) -> bool:
        """Claims to be lossless (it is not)."""
        return True

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """The real rule's path; after a rejection, a sample from p at that node."""
        answer = RejectionSamplingAcceptance().accept(inputs)
        bs = inputs.drafts.bs
        accepted = answer.accept_lengths
        rejected = accepted < inputs.drafts.lengths
        at = inputs.logits[torch.arange(bs), accepted]
        plain, _ = choose_tokens(
            at, SamplingBatch.of(inputs.sampling), inputs.positions + 1 + accepted, DRAW_SAMPLE
        )
        return Acceptance(
            answer.accept_index, accepted, torch.where(rejected, plain, answer.bonus_tokens)
        )


ACCEPT_ALL = AcceptEveryDraft()
NO_RESIDUAL = NoResidualRejection()
