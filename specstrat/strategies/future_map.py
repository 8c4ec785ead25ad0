"""Future-map factories: the overlap relay between scheduler steps.

:class:`SlotFutureMapFactory` is the design we recommend: every relay buffer is indexed by the
request's pool slot (row 0 is the padding row), so two live requests can never share a row and a
slot's entry is whatever was last written to it. :class:`RingFutureMapFactory` reproduces the
engines' first design (a ring of ``mrr * (3 + ceil(ctx / chunk)) + 2 * mrr`` entries) for
comparison, except that it *refuses* a write that would overwrite an entry nobody has resolved
yet, where the engines silently aliased it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig, RelayError
from specstrat.kernels.relay_gather import gather_relay
from specstrat.relay import RelayField, RelayPayload

__all__ = [
    "RingFutureMap",
    "RingFutureMapFactory",
    "SlotFutureMap",
    "SlotFutureMapFactory",
    "ring_capacity",
]


def _positive_int(name: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise InvalidConfig(f"{name}={value!r} must be an int >= 1")
    return value


def _check_slots(slots: object, num_rows: int, device: torch.device) -> torch.Tensor:
    """Rank, dtype and device always; range and uniqueness on CPU only (free there)."""
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        raise RelayError(f"slots={slots!r} must be a 1-D int64 tensor of request-pool indices")
    if slots.dtype not in (torch.int32, torch.int64):
        raise RelayError(f"slots.dtype={slots.dtype} must be torch.int64 (or int32)")
    if slots.device != device:
        raise RelayError(f"slots.device={slots.device} differs from the relay's device={device}")
    if slots.device.type == "cpu" and slots.numel():
        values = slots.tolist()  # one read; Python's min, max and set beat tensor ops here
        lo, hi = min(values), max(values)
        if lo < 0 or hi >= num_rows:
            raise RelayError(
                f"slots range {lo}..{hi} is outside 0..{num_rows - 1}; slots are request-pool "
                f"indices (0 is the padding row, 1..{num_rows - 1} are requests)"
            )
        real = [v for v in values if v]
        if len(set(real)) != len(real):
            raise RelayError(
                f"slots={slots.tolist()} repeats a request slot; one write per slot per call"
            )
    return slots


class _RelayBuffers:
    """Per-field row buffers, allocated on the first write that carries the field."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        self.num_rows = num_rows
        self.device = device
        self.fields: dict[RelayField, torch.Tensor] = {}

    def check(self, payload: RelayPayload, rows: int) -> None:
        """Refuse a payload that disagrees with existing buffers; changes nothing."""
        if not isinstance(payload, RelayPayload):
            raise RelayError(f"payload={type(payload).__name__}; pass a RelayPayload")
        for name, tensor in payload.present().items():
            if tensor.shape[0] != rows:
                raise RelayError(
                    f"{name} has {tensor.shape[0]} rows for {rows} slots; one row per slot",
                    field=name,
                )
            if tensor.device != self.device:
                raise RelayError(
                    f"{name}.device={tensor.device} differs from the relay's device={self.device}",
                    field=name,
                )
            buf = self.fields.get(name)
            if buf is not None and (buf.dtype != tensor.dtype or buf.shape[1:] != tensor.shape[1:]):
                raise RelayError(
                    f"{name} is {tensor.dtype} with row shape {tuple(tensor.shape[1:])} but the "
                    f"relay holds {buf.dtype} {tuple(buf.shape[1:])} for {name}; a relay keeps "
                    "one width and dtype per field (never casts)",
                    field=name,
                )

    def write(self, rows: torch.Tensor, payload: RelayPayload) -> None:
        """Copy each present field into ``rows`` (call :meth:`check` first)."""
        for name, tensor in payload.present().items():
            buf = self.fields.get(name)
            if buf is None:
                shape = (self.num_rows, *tensor.shape[1:])
                buf = torch.zeros(shape, dtype=tensor.dtype, device=self.device)
                self.fields[name] = buf
            buf.index_copy_(0, rows.long(), tensor)

    def read(self, rows: torch.Tensor) -> RelayPayload:
        """Every allocated field at ``rows``, in one relay-gather launch."""
        return gather_relay(RelayPayload(**self.fields), rows)


class SlotFutureMap:
    """A relay with one row per request-pool slot (``max_running_requests + 1`` rows).

    Slot ranges and duplicates are checked when ``slots`` are on the CPU; on a GPU those checks
    would be host syncs, so they are the scheduler's contract there.
    """

    def __init__(self, max_running_requests: int, device: torch.device) -> None:
        self._buffers = _RelayBuffers(max_running_requests + 1, device)

    @property
    def num_rows(self) -> int:
        """Rows in every buffer: one per slot plus the padding row 0."""
        return self._buffers.num_rows

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Record ``new_seq_lens`` at ``slots``."""
        self.stash(slots, RelayPayload(seq_lens=new_seq_lens))

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        """Record every present field of ``payload`` at ``slots``."""
        slots = _check_slots(slots, self.num_rows, self._buffers.device)
        self._buffers.check(payload, slots.shape[0])
        self._buffers.write(slots, payload)

    def resolve(self, slots: torch.Tensor) -> RelayPayload:
        """Every field written so far, at ``slots`` (zeros for a slot never written)."""
        slots = _check_slots(slots, self.num_rows, self._buffers.device)
        return self._buffers.read(slots)


@dataclass(frozen=True, slots=True)
class SlotFutureMapFactory:
    """Creates a :class:`SlotFutureMap`: relay rows are request-pool slots, row 0 padding."""

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> SlotFutureMap:
        """A slot-indexed relay with ``max_running_requests + 1`` rows on ``device``."""
        mrr = _positive_int("max_running_requests", max_running_requests)
        _positive_int("chunked_prefill_size", chunked_prefill_size)
        _positive_int("context_len", context_len)
        return SlotFutureMap(mrr, torch.device(device))


def ring_capacity(max_running_requests: int, chunked_prefill_size: int, context_len: int) -> int:
    """The engines' first ring size: ``mrr * (3 + ceil(ctx / chunk)) + 2 * mrr``."""
    mrr = _positive_int("max_running_requests", max_running_requests)
    chunk = _positive_int("chunked_prefill_size", chunked_prefill_size)
    ctx = _positive_int("context_len", context_len)
    return mrr * (3 + -(-ctx // chunk)) + 2 * mrr


class RingFutureMap:
    """A ring of relay entries allocated in write order, refusing rather than aliasing.

    A slot's first write after it was resolved takes the next ring entry; the entry stays
    *live* until ``resolve`` reads it. A write that would land on a live entry raises
    :class:`~specstrat.errors.RelayError` (the engines' ring overwrote it: a stale read for the
    request that owned it). Slot 0 always maps to ring row 0, the padding row. Bookkeeping is on
    the host, so slots on a GPU are read back (this is the baseline, not the fast path).
    """

    def __init__(self, capacity: int, num_slots: int, device: torch.device) -> None:
        self.capacity = _positive_int("capacity", capacity)
        self._buffers = _RelayBuffers(self.capacity + 1, device)
        self._entry_of_slot = [0] * num_slots  # 0: no live entry
        self._live_slot = [0] * (self.capacity + 1)  # entry -> owning slot, 0: free
        self._cursor = 0

    def _entries_for_write(self, slot_list: list[int]) -> tuple[list[int], dict[int, int]]:
        """Ring entries for a write, and the new allocations; raises before changing anything."""
        entries: list[int] = []
        fresh: dict[int, int] = {}
        taken: dict[int, int] = {}  # entries this write already took -> their slot
        cursor = self._cursor
        for slot in slot_list:
            if slot == 0:
                entries.append(0)
                continue
            entry = self._entry_of_slot[slot] or fresh.get(slot, 0)
            if not entry:
                cursor = cursor % self.capacity + 1
                owner = self._live_slot[cursor] or taken.get(cursor, 0)
                if owner:
                    raise RelayError(
                        f"ring future map capacity={self.capacity} is exhausted: slot={slot} "
                        f"would overwrite the live entry of slot={owner}, which nobody has "
                        "resolved yet; raise the capacity or use SlotFutureMapFactory"
                    )
                entry = fresh[slot] = cursor
                taken[cursor] = slot
            entries.append(entry)
        return entries, fresh

    def _slot_list(self, slots: torch.Tensor) -> list[int]:
        slots = _check_slots(slots, len(self._entry_of_slot), self._buffers.device)
        return [int(s) for s in slots.tolist()]

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Record ``new_seq_lens`` at the slots' live entries (allocating where needed)."""
        self.stash(slots, RelayPayload(seq_lens=new_seq_lens))

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        """Record every present field of ``payload`` at the slots' live entries."""
        slot_list = self._slot_list(slots)
        self._buffers.check(payload, len(slot_list))
        entries, fresh = self._entries_for_write(slot_list)
        for slot, entry in fresh.items():
            self._entry_of_slot[slot] = entry
            self._live_slot[entry] = slot
            self._cursor = entry
        rows = torch.tensor(entries, dtype=torch.int64, device=self._buffers.device)
        self._buffers.write(rows, payload)

    def resolve(self, slots: torch.Tensor) -> RelayPayload:
        """Read and free the slots' live entries; a slot with nothing live is an error."""
        slot_list = self._slot_list(slots)
        missing = [s for s in slot_list if s and not self._entry_of_slot[s]]
        if missing:
            raise RelayError(
                f"slots={missing} have no live ring entry (never stashed, or already resolved); "
                "publish/stash before resolve"
            )
        entries = [self._entry_of_slot[s] for s in slot_list]
        payload = self._buffers.read(
            torch.tensor(entries, dtype=torch.int64, device=self._buffers.device)
        )
        for slot, entry in zip(slot_list, entries, strict=True):
            if slot:
                self._entry_of_slot[slot] = 0
                self._live_slot[entry] = 0
        return payload


@dataclass(frozen=True, slots=True, kw_only=True)
class RingFutureMapFactory:
    """Creates a :class:`RingFutureMap` sized by :func:`ring_capacity`, or by ``capacity``."""

    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.capacity is not None:
            _positive_int("capacity", self.capacity)

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> RingFutureMap:
        """A ring relay for slots ``0..max_running_requests`` on ``device``."""
        size = ring_capacity(max_running_requests, chunked_prefill_size, context_len)
        capacity = self.capacity if self.capacity is not None else size
        return RingFutureMap(capacity, max_running_requests + 1, torch.device(device))
