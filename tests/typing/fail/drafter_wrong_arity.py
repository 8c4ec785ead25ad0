# expect: assignment Drafter[None]
# member: propose
from collections.abc import Sequence

from specstrat import DraftAdmission, Drafter, DraftStep, DraftTree, RelayPayload, StepOutcome


class TwoArgDrafter:  # propose takes the width separately; the scheduler passes only the step
    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None: ...

    def propose(self, step: DraftStep, width: int) -> DraftTree:
        return DraftTree.chain(step.bonus_tokens[:, None].expand(-1, width).contiguous())

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        return RelayPayload()


DRAFTER: Drafter[None] = TwoArgDrafter()
