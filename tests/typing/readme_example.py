"""A custom algorithm: EAGLE's draft state, verifying one token fewer on the draft worker."""

from dataclasses import dataclass

import specstrat
from specstrat import (
    Capabilities,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    SlotFutureMapFactory,
    SpecAlgorithm,
)


@dataclass(frozen=True, slots=True)
class ShortDraftVerifyPolicy:
    """Target verifies D tokens; the draft worker verifies D - 1 (at least 1)."""

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        return max(1, num_draft_tokens - 1) if is_draft_worker else num_draft_tokens


MY_EAGLE: SpecAlgorithm[EagleDraftInput] = specstrat.register(
    SpecAlgorithm(
        name="MY_EAGLE",
        capabilities=Capabilities(
            has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True
        ),
        target_verify=ShortDraftVerifyPolicy(),
        future_map=SlotFutureMapFactory(),
        disagg=EagleDisaggDraftBuilder(),
    )
)
