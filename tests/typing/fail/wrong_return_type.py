# expect: arg-type target_verify
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
)


class YesNoPolicy:
    def supports_target_verify_for_draft(self) -> str:
        return "no"

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        return num_draft_tokens


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=YesNoPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
