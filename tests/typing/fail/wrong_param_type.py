# expect: arg-type target_verify
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
)


class StringWidthPolicy:
    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: str, is_draft_worker: bool) -> int:
        return len(num_draft_tokens)


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=StringWidthPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
