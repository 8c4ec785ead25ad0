# expect: assignment HalfPolicy
from specstrat import TargetVerifyPolicy


class HalfPolicy:
    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> float:
        return num_draft_tokens / 2


POLICY: TargetVerifyPolicy = HalfPolicy()
