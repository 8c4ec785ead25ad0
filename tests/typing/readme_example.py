"""A custom algorithm: EAGLE's draft state, verifying one token fewer on the draft worker."""

from dataclasses import dataclass, replace

import specstrat
from specstrat import EAGLE, SpecAlgorithm
from specstrat.strategies import EagleDraftInput


@dataclass(frozen=True, slots=True)
class ShortDraftVerifyPolicy:
    """Target verifies D tokens; the draft worker verifies D - 1 (at least 1)."""

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def get_num_tokens_per_req_for_target_verify(self, d: int, is_draft_worker: bool) -> int:
        return max(1, d - 1) if is_draft_worker else d


# Everything else (relay, disagg builder, EAGLE-head drafter, rejection sampling) is EAGLE's.
MY_EAGLE: SpecAlgorithm[EagleDraftInput] = specstrat.register(
    replace(EAGLE, name="MY_EAGLE", target_verify=ShortDraftVerifyPolicy())
)
