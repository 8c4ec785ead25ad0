"""A custom algorithm with its own disaggregation builder and draft-input type (importable by the
prefill process the disaggregation tests spawn)."""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from specstrat import NGRAM, FutureMap, PrebuiltBatch, RelayPayload, SpecAlgorithm
from specstrat.strategies import NgramDrafterFactory, OffsetVerifyPolicy

# Prompt lookup that verifies only what it found (SGLang's NGRAM row has no ragged verify).
NGRAM_RAGGED = replace(
    NGRAM,
    name="NGRAM_RAGGED",
    capabilities=replace(NGRAM.capabilities, supports_ragged_verify=True),
)


@dataclass(frozen=True, slots=True)
class LookupDraftInput:
    """Where each request's prompt lookup starts: its last token and its length."""

    last_tokens: torch.Tensor
    seq_lens: torch.Tensor


@dataclass(frozen=True, slots=True)
class LookupDisaggDraftBuilder:
    """Relays the first tokens and records every batch it saw (for the tests)."""

    seen: ClassVar[list[LookupDraftInput]] = []

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: FutureMap | None
    ) -> LookupDraftInput:
        """One batched draft input; given a relay, publish and stash at the slots."""
        if future_map is not None:
            future_map.publish(batch.slots, batch.seq_lens)
            future_map.stash(batch.slots, RelayPayload(bonus_tokens=last_tokens))
        result = LookupDraftInput(last_tokens, batch.seq_lens)
        self.seen.append(result)
        return result


# A new draft-input type changes the algorithm's type parameter: compose it field by field.
LOOKUP: SpecAlgorithm[LookupDraftInput] = SpecAlgorithm(
    name="LOOKUP",
    capabilities=NGRAM.capabilities,
    target_verify=OffsetVerifyPolicy(target_offset=-1),
    future_map=NGRAM.future_map,
    disagg=LookupDisaggDraftBuilder(),
    drafter=NgramDrafterFactory(),
    acceptance=NGRAM.acceptance,
)
