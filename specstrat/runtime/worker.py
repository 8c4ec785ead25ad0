"""A model worker: one model, its request pool and KV cache, and forwards in every mode.

The worker turns per-request token lists into a :class:`~specstrat.runtime.forward.ForwardBatch`:
it allocates KV slots for the new tokens, records them in the request's token table, and builds
the attention metadata with the kernels (ragged form for EXTEND/DRAFT_EXTEND, uniform form with
``T`` tokens for DECODE and TARGET_VERIFY). ``rewind`` frees the KV of rejected draft positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels import VerifyMetadata, build_ragged_verify_metadata, build_verify_metadata
from specstrat.runtime.attention import PagedAttention
from specstrat.runtime.forward import ForwardBatch, ForwardMode
from specstrat.runtime.memory import KVPool, RequestPool
from specstrat.runtime.model import TinyLM

__all__ = ["ModelWorker", "PreparedTokens"]

_RAGGED = (ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND)
_UNIFORM = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)


class PreparedTokens:
    """New tokens placed in the KV cache: positions, KV slots and each request's prefix length."""

    def __init__(self, slots: list[int], prefix: list[int], counts: list[int]) -> None:
        self.slots = slots
        self.prefix = prefix
        self.counts = counts
        self.positions: list[int] = [
            p + j for p, c in zip(prefix, counts, strict=True) for j in range(c)
        ]
        self.locations: list[int] = []


class ModelWorker:
    """Runs one model over a request pool and a KV cache of ``max_total_tokens`` slots."""

    def __init__(
        self,
        model: TinyLM,
        *,
        max_running_requests: int,
        context_len: int,
        max_total_tokens: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        if context_len > model.cfg.max_positions:
            raise InvalidConfig(
                f"context_len={context_len} exceeds the model's max_positions="
                f"{model.cfg.max_positions}"
            )
        self.model = model
        self.device = device
        self.context_len = context_len
        self.requests = RequestPool(max_running_requests, context_len, device)
        self.kv = KVPool(max_total_tokens, model.cfg, dtype, device)

    # -- request lifetime ---------------------------------------------------------------------

    def alloc_request(self) -> int:
        """A request slot with an empty KV."""
        return self.requests.alloc()

    def free_request(self, slot: int) -> None:
        """Release a request's KV and slot."""
        self.rewind(slot, 0)
        self.requests.free(slot)

    def length(self, slot: int) -> int:
        """Tokens of the request whose KV is cached."""
        return self.requests.lens[slot]

    def rewind(self, slot: int, new_len: int) -> None:
        """Drop the KV of positions ``new_len..`` (rejected drafts); their slots are reused."""
        old = self.requests.lens[slot]
        if not 0 <= new_len <= old:
            raise InvalidConfig(f"rewind to new_len={new_len} outside 0..{old} for slot {slot}")
        if new_len < old:
            locs = self.requests.req_to_token[slot, new_len:old].tolist()
            self.kv.free([int(x) for x in locs])
            self.requests.lens[slot] = new_len

    # -- forwards -----------------------------------------------------------------------------

    def place(self, slots: Sequence[int], counts: Sequence[int]) -> PreparedTokens:
        """Allocate KV slots for ``counts[i]`` new tokens of each request and record them."""
        prefix = [self.requests.lens[s] for s in slots]
        for slot, start, count in zip(slots, prefix, counts, strict=True):
            if start + count > self.context_len:
                raise InvalidConfig(
                    f"slot {slot}: {start} + {count} tokens exceed context_len={self.context_len}"
                )
        prepared = PreparedTokens(list(slots), prefix, list(counts))
        prepared.locations = self.kv.alloc(sum(counts))
        # One indexed write for the whole batch: row = request slot, column = position.
        rows = [slot for slot, count in zip(slots, counts, strict=True) for _ in range(count)]
        self.requests.req_to_token[rows, prepared.positions] = torch.tensor(
            prepared.locations, dtype=torch.int32
        )
        for slot, start, count in zip(slots, prefix, counts, strict=True):
            self.requests.lens[slot] = start + count
        return prepared

    def metadata(self, mode: ForwardMode, prepared: PreparedTokens) -> VerifyMetadata:
        """Attention metadata for tokens placed by :meth:`place` (page size 1)."""
        rpi = torch.tensor(prepared.slots, dtype=torch.int64, device=self.device)
        prefix = torch.tensor(prepared.prefix, dtype=torch.int64, device=self.device)
        table = self.requests.req_to_token
        if mode in _UNIFORM and len(set(prepared.counts)) <= 1:
            return build_verify_metadata(
                prefix,
                sum(prepared.counts),
                req_pool_indices=rpi,
                req_to_token=table,
                seq_lens_cpu=prepared.prefix,
            )
        counts = torch.tensor(prepared.counts, dtype=torch.int64, device=self.device)
        return build_ragged_verify_metadata(
            prefix,
            counts,
            req_pool_indices=rpi,
            req_to_token=table,
            seq_lens_cpu=prepared.prefix,
            num_tokens_per_req_cpu=prepared.counts,
        )

    def forward(
        self, mode: ForwardMode, slots: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens[i]`` for request ``slots[i]``; logits and hidden states, one row per token.

        DECODE needs the same number of tokens for every request; TARGET_VERIFY with unequal
        counts builds ragged metadata.
        """
        if mode in (ForwardMode.PREBUILT, ForwardMode.IDLE) or not slots:
            if slots and mode is not ForwardMode.IDLE:
                raise InvalidConfig(f"mode={mode.name} runs no forward; use admit_prebuilt")
            empty = torch.zeros(0, self.model.cfg.dim, device=self.device)
            return self.model.logits(empty.to(self.kv.k.dtype)), empty
        counts = [len(t) for t in tokens]
        if mode is ForwardMode.DECODE and len(set(counts)) != 1:
            raise InvalidConfig(f"mode={mode.name} needs equal tokens per request, got {counts}")
        prepared = self.place(slots, counts)
        meta = self.metadata(mode, prepared)
        flat = [t for seq in tokens for t in seq]
        batch = ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(flat, dtype=torch.int64, device=self.device),
            positions=torch.tensor(prepared.positions, dtype=torch.int64, device=self.device),
            out_cache_loc=torch.tensor(prepared.locations, dtype=torch.int64, device=self.device),
            metadata=meta,
            max_q=max(counts),
            max_k=max(p + c for p, c in zip(prepared.prefix, counts, strict=True)),
        )
        return self.run(batch)

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over a prepared batch, attention reading ``batch.metadata``."""
        with torch.inference_mode():
            logits, hidden = self.model(
                batch.input_ids, batch.positions, PagedAttention(self.kv, batch)
            )
        return logits, hidden

    # -- disaggregation -----------------------------------------------------------------------

    def export_kv(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a request, ``[layers, length, heads, head_dim]`` each (for transfer)."""
        locs = self.requests.req_to_token[slot, : self.requests.lens[slot]].long()
        return self.kv.k[:, locs].clone(), self.kv.v[:, locs].clone()

    def admit_prebuilt(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """PREBUILT admission: the empty request ``slot`` gets ``k``/``v`` computed elsewhere."""
        want = (self.kv.k.shape[0], k.shape[1], *self.kv.k.shape[2:])
        if tuple(k.shape) != want or k.shape != v.shape:
            raise InvalidConfig(
                f"prebuilt KV shapes k={tuple(k.shape)} v={tuple(v.shape)}; expected "
                f"[layers, length, heads, head_dim] = {want}"
            )
        if self.requests.lens[slot]:
            raise InvalidConfig(f"slot {slot} already holds {self.requests.lens[slot]} tokens")
        prepared = self.place([slot], [k.shape[1]])
        locs = torch.tensor(prepared.locations, dtype=torch.int64, device=self.device)
        self.kv.k[:, locs] = k.to(self.kv.k.dtype)
        self.kv.v[:, locs] = v.to(self.kv.v.dtype)
