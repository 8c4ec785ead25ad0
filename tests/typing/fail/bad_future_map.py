# expect: arg-type future_map
import torch

from specstrat import Capabilities, RelayPayload, SpecAlgorithm

from specstrat.strategies import (
    OffsetVerifyPolicy,
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
)


class WriteOnlyMap:
    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None: ...
    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None: ...


class WriteOnlyFactory:
    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> WriteOnlyMap:
        return WriteOnlyMap()


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OffsetVerifyPolicy(),
    future_map=WriteOnlyFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
