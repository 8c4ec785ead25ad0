"""The slot table owns each request slot's state: reservations, committed tokens (drafts never
enter them), the bonus token, and the output."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from specstrat import (
    NGRAM,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    InternalError,
    LoadedModels,
    RelayPayload,
    StepOutcome,
)
from specstrat.protocols import Drafter
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._memory import RequestPool
from specstrat.runtime._slots import SlotTable


def test_reservations_return_when_finished_requests_are_released() -> None:
    """admit reserves, unreserve returns only a finished row's reservation, once."""
    table = SlotTable(RequestPool(4, 64, torch.device("cpu")), kv_capacity=100)
    a = table.admit(Request("a", [1, 2], 8), 40, "prefill")
    b = table.admit(Request("b", [1], 8), 50, "prebuilt")
    assert (table.reserved, table.fits(10), table.fits(11)) == (90, True, False)
    table.unreserve([a])  # not finished yet: nothing returns
    assert table.reserved == 90
    table.row(a).finished = True
    table.unreserve([a, a])
    assert (table.reserved, table.running()) == (50, [b])
    assert table.row(b).origin == "prebuilt"


def test_a_freed_slot_is_an_internal_error_to_read() -> None:
    """Reading a slot that holds no request is a bug in specstrat, said so."""
    table = SlotTable(RequestPool(2, 64, torch.device("cpu")), kv_capacity=10)
    with pytest.raises(InternalError, match=r"slot 1 holds no request; this is a bug"):
        table.row(1)


@dataclass(frozen=True, slots=True)
class _Watching:
    """A drafter wrapper that records, at each propose and commit, the committed tokens the
    engine shows it against the step's lengths."""

    inner: Drafter[Any]
    tokens: Callable[[int], Sequence[int]]
    seen: list[tuple[str, int, int]]

    def admit(self, admission: DraftAdmission[Any]) -> RelayPayload:
        for slot, n in zip(admission.slots, admission.seq_lens.tolist(), strict=True):
            self.seen.append(("admit", len(self.tokens(slot)), n))
        return self.inner.admit(admission)

    def release(self, slots: Sequence[int]) -> None:
        self.inner.release(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        for slot, n in zip(step.slots, step.seq_lens.tolist(), strict=True):
            self.seen.append(("propose", len(self.tokens(slot)), n))
        return self.inner.propose(step)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        step, accepted = outcome.step, outcome.acceptance.accept_lengths.tolist()
        for slot, n, a in zip(step.slots, step.seq_lens.tolist(), accepted, strict=True):
            self.seen.append(("commit", len(self.tokens(slot)), n + 1 + a))
        return self.inner.commit(outcome)


@dataclass(frozen=True, slots=True)
class _WatchingFactory:
    seen: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def needs(self) -> DrafterNeeds:
        return NGRAM.drafter.needs

    def create_drafter(self, context: DrafterContext) -> _Watching:
        return _Watching(NGRAM.drafter.create_drafter(context), context.target_tokens, self.seen)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return NGRAM.drafter.prefill_payload(models, bonus_tokens, hidden)


@pytest.mark.parametrize("overlap", [False, True])
def test_drafts_never_enter_the_committed_tokens(overlap: bool) -> None:
    """At admission the committed tokens are the prompt; while a step proposes, the sequence;
    at commit they have grown by the root and the accepted drafts only, never by the rejected
    ones."""
    watching = _WatchingFactory()
    algo = replace(NGRAM, name="WATCHED", drafter=watching)
    engine = Engine(algo, EmbeddedModels.load(), EngineConfig(overlap=overlap))
    engine.run(workload(3))
    assert {what for what, _, _ in watching.seen} == {"admit", "propose", "commit"}
    assert all(got == want for _, got, want in watching.seen)
