"""A stateful hypothesis test of the relay as the scheduler drives it: no stale read, ever."""

from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from specstrat import FutureMapFactory, RelayPayload
from specstrat.strategies import RingFutureMapFactory, SlotFutureMapFactory

MRR = 4


class RelayMachine(RuleBasedStateMachine):
    """Requests are admitted into free slots, step, finish (draining their slot), and slots are
    reused; padded graph rows write the padding index 0. Every resolve must return exactly the
    latest values written for each slot."""

    factory: FutureMapFactory = SlotFutureMapFactory()

    def __init__(self) -> None:
        super().__init__()
        self.relay: Any = None
        self.live: dict[int, tuple[int, int, float]] = {}  # slot -> (bonus, seq_len, hidden)
        self.counter = 0

    @initialize()
    def create(self) -> None:
        """The scheduler's init_overlap."""
        self.relay = self.factory.create_future_map(MRR, 8, 64, torch.device("cpu"))

    def _write(self, slots: list[int]) -> None:
        values = {}
        for slot in slots:
            self.counter += 1
            values[slot] = (self.counter, 1000 + self.counter, self.counter / 4)  # exact in float32
        index = torch.tensor(slots, dtype=torch.int64)
        self.relay.publish(index, torch.tensor([values[s][1] for s in slots]))
        self.relay.stash(
            index,
            RelayPayload(
                bonus_tokens=torch.tensor([values[s][0] for s in slots]),
                hidden_states=torch.tensor([[values[s][2]] * 3 for s in slots]),
            ),
        )
        self.live.update(values)

    def _check(self, slots: list[int]) -> None:
        got = self.relay.resolve(torch.tensor(slots, dtype=torch.int64))
        assert got.bonus_tokens.tolist() == [self.live[s][0] for s in slots]
        assert got.seq_lens.tolist() == [self.live[s][1] for s in slots]
        assert got.hidden_states[:, 0].tolist() == [self.live[s][2] for s in slots]

    @precondition(lambda self: len(self.live) < MRR)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        """Prefill stashes a new request's first token in a free slot (maybe a reused one)."""
        free = [s for s in range(1, MRR + 1) if s not in self.live]
        self._write([data.draw(st.sampled_from(free))])

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """A decode step resolves its running slots, then writes their new results."""
        running = data.draw(st.permutations(sorted(self.live)))
        self._check(list(running))
        self._write(list(running))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A finished request's slot is drained and freed."""
        slot = data.draw(st.sampled_from(sorted(self.live)))
        self._check([slot])
        del self.live[slot]

    @rule(n=st.integers(1, 3))
    def padded_write(self, n: int) -> None:
        """Padded graph rows write the padding index 0 several times in one call."""
        pad = torch.zeros(n, dtype=torch.int64)
        self.relay.publish(pad, torch.full((n,), -1))
        self.relay.stash(
            pad, RelayPayload(bonus_tokens=torch.full((n,), -1), hidden_states=torch.zeros(n, 3))
        )

    @invariant()
    def nothing_leaks(self) -> None:
        """At most MRR requests are live."""
        assert len(self.live) <= MRR


class RingRelayMachine(RelayMachine):
    """The same life cycle through the engines' ring, sized by their formula."""

    factory = RingFutureMapFactory()


TestSlotRelay = RelayMachine.TestCase
TestRingRelay = RingRelayMachine.TestCase
