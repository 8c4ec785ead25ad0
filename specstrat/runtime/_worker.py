"""A model worker: one model, its request pool and KV cache, and forwards in every mode.

The worker owns sequence lengths and committed tokens (its request pool). It turns per-request
token lists into one :class:`~specstrat.runtime._forward.ForwardBatch`: it allocates KV indices for
the new tokens, records them and their token ids in the request's rows, and builds the attention
metadata with the kernels (ragged form for EXTEND/DRAFT_EXTEND and ragged verify, uniform form
with ``T`` tokens for DECODE and TARGET_VERIFY). ``rewind`` frees the KV of rejected positions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels import VerifyMetadata, build_ragged_verify_metadata, build_verify_metadata
from specstrat.models import CausalLM
from specstrat.runtime._attention import PagedAttention
from specstrat.runtime._forward import ForwardBatch, ForwardMode, TreeAttention
from specstrat.runtime._memory import KVPool, RequestPool
from specstrat.runtime._model_check import check_model_outputs

__all__ = ["ModelWorker", "PreparedTokens", "TreeTokens", "kv_bytes"]

_UNIFORM = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)


@dataclass(frozen=True, slots=True)
class PreparedTokens:
    """New tokens placed in the KV cache: per request its prefix length and count, and per
    token its position and KV index."""

    slots: list[int]
    prefix: list[int]
    counts: list[int]
    positions: list[int]
    locations: list[int]


@dataclass(frozen=True, slots=True)
class TreeTokens:
    """New tokens that are draft-tree nodes: ``positions`` ``[bs, k]`` (prefix + depth) and
    ``mask`` ``[bs, k, W]``, which of the last ``W`` columns (the tree, new tokens included)
    each new token sees."""

    positions: torch.Tensor
    mask: torch.Tensor


def kv_bytes(model: CausalLM, max_total_tokens: int, dtype: torch.dtype) -> int:
    """Bytes the K and V caches of ``max_total_tokens`` slots take for ``model``."""
    s = model.shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * s.layers * (max_total_tokens + 1) * s.num_kv_heads * s.head_dim * itemsize


def _available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (None when it cannot be told)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class ModelWorker:
    """Runs one model over a request pool and a KV cache of ``max_total_tokens`` slots."""

    def __init__(
        self,
        model: CausalLM,
        *,
        max_running_requests: int,
        context_len: int,
        max_total_tokens: int,
    ) -> None:
        shape = model.shape
        if context_len > shape.max_positions:
            raise InvalidConfig(
                f"context_len={context_len} exceeds the model's max_positions="
                f"{shape.max_positions}; lower context_len"
            )
        param = next(model.parameters())
        self.model = model
        self.shape = shape
        self.device, self.dtype = param.device, param.dtype
        self.context_len = context_len
        need = kv_bytes(model, max_total_tokens, self.dtype)
        free = _available_bytes(self.device)
        if free is not None and need > free:
            raise InvalidConfig(
                f"max_total_tokens={max_total_tokens} needs {need / 2**30:.1f} GiB of KV cache "
                f"but {free / 2**30:.1f} GiB is free on {self.device}; lower max_total_tokens "
                "(unset, it is max_running_requests * context_len)"
            )
        self.requests = RequestPool(max_running_requests, context_len, self.device)
        self.kv = KVPool(max_total_tokens, shape, self.dtype, self.device)

    # -- request lifetime ---------------------------------------------------------------------

    def alloc_request(self) -> int:
        """A request slot with an empty KV."""
        return self.requests.alloc()

    def free_request(self, slot: int) -> None:
        """Release a request's KV and slot."""
        self.rewind(slot, 0)
        self.requests.free(slot)

    def reset(self) -> None:
        """Release every request and all KV at once (after a failed run)."""
        self.requests.reset()
        self.kv.reset()

    def length(self, slot: int) -> int:
        """Positions of the request whose KV is cached."""
        return len(self.requests.tokens[slot])

    def tokens(self, slot: int) -> Sequence[int]:
        """The request's committed tokens (those in its KV), in order; read-only view."""
        return self.requests.tokens[slot]

    def last(self, slots: Sequence[int]) -> list[int]:
        """The verified token that follows each request's cached ones (the next input)."""
        return [self.requests.last[s] for s in slots]

    def set_last(self, slots: Sequence[int], tokens: Sequence[int]) -> None:
        """Record the verified token that follows each request's cached ones."""
        for slot, token in zip(slots, tokens, strict=True):
            self.requests.last[slot] = token

    def keep_path(self, slot: int, start: int, nodes: Sequence[int]) -> None:
        """Keep, after the first ``start`` positions, the tree nodes at offsets ``nodes`` (an
        accepted root-to-node path, in order) and free the rest: the path's KV indices move into
        place in the page table (page size 1: no KV is copied)."""
        old = len(self.requests.tokens[slot])
        if not 0 <= start <= old or any(not 0 <= n < old - start for n in nodes):
            raise InvalidConfig(
                f"keep_path(slot={slot}, start={start}, nodes={list(nodes)}) outside the "
                f"{old} cached positions"
            )
        if list(nodes) == list(range(len(nodes))):  # a chain prefix: nothing moves
            self.rewind(slot, start + len(nodes))
            return
        row = self.requests.req_to_token[slot]
        locs = row[start:old].tolist()
        tokens = self.requests.tokens[slot]
        kept_tokens = [tokens[start + n] for n in nodes]
        kept = [locs[n] for n in nodes]
        keep = set(nodes)
        self.kv.free([int(x) for i, x in enumerate(locs) if i not in keep])
        row[start : start + len(kept)] = torch.tensor(kept, dtype=row.dtype, device=row.device)
        del tokens[start:]
        tokens.extend(kept_tokens)

    def rewind(self, slot: int, new_len: int) -> None:
        """Drop the KV of positions ``new_len..`` (rejected drafts); their slots are reused."""
        old = len(self.requests.tokens[slot])
        if not 0 <= new_len <= old:
            raise InvalidConfig(f"rewind to new_len={new_len} outside 0..{old} for slot {slot}")
        if new_len < old:
            locs = self.requests.req_to_token[slot, new_len:old].tolist()
            self.kv.free([int(x) for x in locs])
            del self.requests.tokens[slot][new_len:]

    # -- forwards -----------------------------------------------------------------------------

    def place(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> PreparedTokens:
        """Allocate KV indices for ``tokens[i]`` after request ``slots[i]`` and record them."""
        counts = [len(t) for t in tokens]
        prefix = [len(self.requests.tokens[s]) for s in slots]
        for slot, start, count in zip(slots, prefix, counts, strict=True):
            if start + count > self.context_len:
                raise InvalidConfig(
                    f"slot {slot}: {start} + {count} tokens exceed context_len={self.context_len}"
                )
        positions = [p + j for p, c in zip(prefix, counts, strict=True) for j in range(c)]
        locations = self.kv.alloc(sum(counts))
        # One indexed write for the whole batch: row = request slot, column = position.
        rows = [slot for slot, count in zip(slots, counts, strict=True) for _ in range(count)]
        self.requests.req_to_token[rows, positions] = torch.tensor(
            locations, dtype=torch.int32, device=self.device
        )
        for slot, seq in zip(slots, tokens, strict=True):
            self.requests.tokens[slot].extend(int(t) for t in seq)
        return PreparedTokens(list(slots), prefix, counts, positions, locations)

    def metadata(self, mode: ForwardMode, prepared: PreparedTokens) -> VerifyMetadata:
        """Attention metadata for tokens placed by :meth:`place` (page size 1)."""
        rpi = torch.tensor(prepared.slots, dtype=torch.int64, device=self.device)
        prefix = torch.tensor(prepared.prefix, dtype=torch.int64, device=self.device)
        table = self.requests.req_to_token
        if mode in _UNIFORM and len(set(prepared.counts)) <= 1:
            return build_verify_metadata(
                prefix,
                num_tokens=sum(prepared.counts),
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
        self,
        mode: ForwardMode,
        slots: Sequence[int],
        tokens: Sequence[Sequence[int]],
        *,
        tree: TreeTokens | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens[i]`` after request ``slots[i]``; logits and hidden, one row per token.

        DECODE needs one token per request; TARGET_VERIFY with unequal counts is ragged. With
        ``tree`` the new tokens are draft-tree nodes: their positions are ``tree.positions``
        and each sees the prefix before the last ``tree.mask.shape[2]`` columns plus the tree
        columns its mask row allows.
        """
        if mode is ForwardMode.PREBUILT:
            raise InvalidConfig("mode=PREBUILT runs no forward; use admit_prebuilt")
        if not slots:
            return self._empty()
        counts = [len(t) for t in tokens]
        if mode is ForwardMode.DECODE and set(counts) != {1}:
            raise InvalidConfig(f"mode=DECODE needs one token per request, got {counts}")
        prepared = self.place(slots, tokens)
        meta = self.metadata(mode, prepared)
        dev = self.device
        positions = torch.tensor(prepared.positions, dtype=torch.int64, device=dev)
        attention = None
        if tree is not None:
            positions = tree.positions.to(dev).reshape(-1)
            ends = torch.tensor(
                [p + c for p, c in zip(prepared.prefix, counts, strict=True)], device=dev
            )
            attention = TreeAttention(start=ends - tree.mask.shape[2], mask=tree.mask.to(dev))
        return self.execute(
            mode,
            input_ids=torch.tensor([t for seq in tokens for t in seq], device=dev),
            positions=positions,
            out_cache_loc=torch.tensor(prepared.locations, dtype=torch.int64, device=dev),
            metadata=meta,
            max_q=max(counts),
            max_k=max(p + c for p, c in zip(prepared.prefix, counts, strict=True)),
            tree=attention,
        )

    def execute(
        self,
        mode: ForwardMode,
        *,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        metadata: VerifyMetadata,
        max_q: int,
        max_k: int,
        tree: TreeAttention | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over one batch, attention reading ``metadata`` (and ``tree``, for draft
        trees); the one place a :class:`~specstrat.runtime._forward.ForwardBatch` is built (eager
        and graph paths)."""
        batch = ForwardBatch(
            mode=mode,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            metadata=metadata,
            max_q=max_q,
            max_k=max_k,
            tree=tree,
        )
        with torch.inference_mode():
            logits, hidden = self.model(
                batch.input_ids, batch.positions, PagedAttention(self.kv, batch)
            )
        check_model_outputs(self.model, self.shape, input_ids.shape[0], logits, hidden)
        return logits, hidden

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        s, dev = self.shape, self.device
        return (
            torch.zeros(0, s.vocab_size, dtype=self.dtype, device=dev),
            torch.zeros(0, s.hidden_size, dtype=self.dtype, device=dev),
        )

    # -- disaggregation -----------------------------------------------------------------------

    def export_kv(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a request, ``[layers, length, kv_heads, head_dim]`` each (for transfer)."""
        locs = self.requests.req_to_token[slot, : self.length(slot)].long()
        return self.kv.k[:, locs].clone(), self.kv.v[:, locs].clone()

    def admit_prebuilt(
        self, slot: int, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """PREBUILT admission: the empty request ``slot`` gets ``tokens`` whose ``k``/``v``
        were computed elsewhere."""
        want = (self.kv.k.shape[0], len(tokens), *self.kv.k.shape[2:])
        if tuple(k.shape) != want or k.shape != v.shape:
            raise InvalidConfig(
                f"prebuilt KV shapes k={tuple(k.shape)} v={tuple(v.shape)}; expected "
                f"[layers, length, kv_heads, head_dim] = {want}"
            )
        if self.length(slot):
            raise InvalidConfig(f"slot {slot} already holds {self.length(slot)} tokens")
        prepared = self.place([slot], [tokens])
        locs = torch.tensor(prepared.locations, dtype=torch.int64, device=self.device)
        self.kv.k[:, locs] = k.to(self.kv.k.dtype)
        self.kv.v[:, locs] = v.to(self.kv.v.dtype)
        self.kv.positions[locs] = torch.tensor(prepared.positions, device=self.device)
