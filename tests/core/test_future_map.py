"""Future maps: slot-indexed relay semantics, the ring's capacity formula and its refusals."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specstrat import RelayError, RelayPayload
from specstrat.strategies import (
    RingFutureMap,
    RingFutureMapFactory,
    SlotFutureMap,
    SlotFutureMapFactory,
    ring_capacity,
)

CPU = torch.device("cpu")


def slots(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_slot_map_has_a_row_per_slot_plus_padding() -> None:
    """A slot map for mrr requests has mrr + 1 rows."""
    relay = SlotFutureMapFactory().create_future_map(6, 8, 64, CPU)
    assert isinstance(relay, SlotFutureMap)
    assert relay.num_rows == 7


def test_slot_map_allocates_fields_on_first_write() -> None:
    """resolve returns only fields that some write carried."""
    relay = SlotFutureMapFactory().create_future_map(4, 8, 64, CPU)
    assert relay.resolve(slots(1)).present() == {}
    relay.publish(slots(1), slots(9))
    assert set(relay.resolve(slots(1)).present()) == {"seq_lens"}


def test_slot_map_refuses_dtype_change_and_keeps_state() -> None:
    """A later payload of another dtype raises naming the field; the old values stay."""
    relay = SlotFutureMapFactory().create_future_map(4, 8, 64, CPU)
    relay.stash(slots(1), RelayPayload(hidden_states=torch.ones(1, 2)))
    with pytest.raises(
        RelayError, match=r"hidden_states is torch.float16 .* relay holds torch.float32"
    ):
        relay.stash(slots(1), RelayPayload(hidden_states=torch.zeros(1, 2, dtype=torch.float16)))
    assert torch.equal(relay.resolve(slots(1)).hidden_states, torch.ones(1, 2))  # type: ignore[arg-type]


def test_refused_multi_field_write_changes_nothing() -> None:
    """A payload with one good and one bad field writes neither."""
    relay = SlotFutureMapFactory().create_future_map(4, 8, 64, CPU)
    relay.stash(slots(2), RelayPayload(bonus_tokens=slots(5), topk_p=torch.zeros(1, 2)))
    bad = RelayPayload(bonus_tokens=slots(6), topk_p=torch.zeros(1, 3))
    with pytest.raises(RelayError, match=r"topk_p") as caught:
        relay.stash(slots(2), bad)
    error = caught.value
    assert (error.field, error.writer, error.algorithm) == ("topk_p", None, None)
    assert relay.resolve(slots(2)).bonus_tokens.tolist() == [5]  # type: ignore[union-attr]


def test_padding_row_may_be_written_repeatedly() -> None:
    """Padded graph batches write slot 0 many times in one call without error."""
    relay = SlotFutureMapFactory().create_future_map(4, 8, 64, CPU)
    relay.publish(slots(0, 0, 3), slots(1, 2, 3))
    assert relay.resolve(slots(3)).seq_lens.tolist() == [3]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mrr", "chunk", "ctx", "want"),
    [
        (1, 1, 1, 6),
        (8, 2048, 4096, 8 * 5 + 16),
        (48, 8192, 131072, 48 * 19 + 96),
        (3, 10, 25, 3 * 6 + 6),
    ],
)
def test_ring_capacity_matches_engine_formula(mrr: int, chunk: int, ctx: int, want: int) -> None:
    """Ring capacity is mrr * (3 + ceil(ctx / chunk)) + 2 * mrr."""
    assert ring_capacity(mrr, chunk, ctx) == want
    relay = RingFutureMapFactory().create_future_map(mrr, chunk, ctx, CPU)
    assert isinstance(relay, RingFutureMap)
    assert relay.capacity == want


def test_ring_refuses_rather_than_aliases_past_capacity() -> None:
    """With every entry live, the next new slot's write raises and overwrites nothing."""
    relay = RingFutureMapFactory(capacity=3).create_future_map(8, 8, 64, CPU)
    relay.stash(slots(1, 2, 3), RelayPayload(bonus_tokens=slots(10, 20, 30)))
    with pytest.raises(
        RelayError,
        match=r"capacity=3 is exhausted: slot=4 would overwrite the live entry of slot=1",
    ):
        relay.stash(slots(4), RelayPayload(bonus_tokens=slots(40)))
    assert relay.resolve(slots(1, 2, 3)).bonus_tokens.tolist() == [10, 20, 30]  # type: ignore[union-attr]


def test_ring_reuses_entries_after_resolve() -> None:
    """Resolved entries are free again, so a steady workload cycles through the ring."""
    relay = RingFutureMapFactory(capacity=2).create_future_map(8, 8, 64, CPU)
    for step in range(10):
        s = slots(1 + step % 5, 6)
        relay.publish(s, slots(step, step))
        assert relay.resolve(s).seq_lens.tolist() == [step, step]  # type: ignore[union-attr]


def test_ring_resolve_of_unwritten_slot_is_an_error() -> None:
    """Reading a slot with no live entry names the slot instead of returning stale data."""
    relay = RingFutureMapFactory().create_future_map(4, 8, 64, CPU)
    relay.publish(slots(1), slots(3))
    relay.resolve(slots(1))
    with pytest.raises(RelayError, match=r"slots=\[1\] have no live ring entry"):
        relay.resolve(slots(1))


@given(
    st.lists(
        st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=6, unique=True), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_slot_map_never_returns_a_stale_value(steps: list[tuple[list[int], bool]]) -> None:
    """Over any write/resolve sequence, each slot resolves to its latest write (model check)."""
    relay = SlotFutureMapFactory().create_future_map(6, 8, 64, CPU)
    model: dict[int, int] = {}
    for counter, (batch, write) in enumerate(steps):
        s = torch.tensor(batch)
        if write:
            values = torch.tensor([counter * 10 + i for i in range(len(batch))])
            relay.stash(s, RelayPayload(bonus_tokens=values))
            model.update(zip(batch, values.tolist(), strict=True))
        elif relay.resolve(s).bonus_tokens is not None:
            got = relay.resolve(s).bonus_tokens.tolist()  # type: ignore[union-attr]
            assert got == [model.get(slot, 0) for slot in batch]


def test_ring_refuses_one_write_wider_than_its_capacity() -> None:
    """A single write of more fresh slots than the ring holds is refused, never aliased."""
    ring = RingFutureMapFactory(capacity=3).create_future_map(8, 8, 64, torch.device("cpu"))
    with pytest.raises(RelayError, match=r"capacity=3 is exhausted: slot=4 would overwrite"):
        ring.publish(torch.arange(1, 7), torch.arange(6))
