"""A model worker: one model, its request pool and KV cache, and forwards in every mode.

The worker owns where tokens sit (its request pool's page table and fill), not sequence lengths
or committed tokens, which are the slot table's. It turns per-request
token lists into one :class:`~specstrat.runtime._forward.ForwardBatch`: it allocates KV indices for
the new tokens, records them and their token ids in the request's rows, and builds the attention
metadata with the kernels (ragged form for EXTEND/DRAFT_EXTEND and ragged verify, uniform form
with ``T`` tokens for DECODE and TARGET_VERIFY). ``rewind`` frees the KV of rejected positions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels import (
    Paging,
    VerifyMetadata,
    build_ragged_verify_metadata,
    build_verify_metadata,
)
from specstrat.models import CausalLM, RowLogitsLM
from specstrat.runtime._attention import PagedAttention
from specstrat.runtime._forward import ForwardBatch, ForwardMode, TreeAttention
from specstrat.runtime._memory import KVPool, RequestPool
from specstrat.runtime._model_check import check_model_outputs

__all__ = ["ModelWorker", "PreparedTokens", "TreeTokens", "kv_bytes", "run_offsets"]

_UNIFORM = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)

#: Up to this many requests, a rewind reads each one's dropped KV indices as a slice.
_FEW = 4


@dataclass(frozen=True, slots=True)
class PreparedTokens:
    """New tokens placed in the KV cache: per request its prefix length and count (host
    lists), and per token its position and KV index (tensors on the worker's device)."""

    slots: list[int]
    prefix: list[int]
    counts: list[int]
    positions: torch.Tensor
    locations: torch.Tensor


@dataclass(frozen=True, slots=True)
class TreeTokens:
    """New tokens that are draft-tree nodes: ``positions`` ``[bs, k]`` (prefix + depth) and
    ``mask`` ``[bs, k, W]``, which of the last ``W`` columns (the tree, new tokens included)
    each new token sees."""

    positions: torch.Tensor
    mask: torch.Tensor


def run_offsets(counts: torch.Tensor) -> torch.Tensor:
    """For runs of ``counts[i]`` items laid end to end, each item's index within its run
    (``[2, 3] -> [0, 1, 0, 1, 2]``)."""
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    return torch.arange(int(starts.numel()), device=counts.device) - starts


def kv_bytes(model: CausalLM, max_total_tokens: int, dtype: torch.dtype) -> int:
    """Bytes the K and V caches of ``max_total_tokens`` slots take for ``model``."""
    s = model.shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * s.layers * (max_total_tokens + 1) * s.num_kv_heads * s.head_dim * itemsize


#: Linux's estimate of memory a new allocation can have without swapping: free pages plus the
#: page cache and other reclaimable memory (free pages alone fall near zero once files are read).
_MEMINFO = Path("/proc/meminfo")


def _available_bytes(device: torch.device, meminfo: Path = _MEMINFO) -> int | None:
    """Memory a KV cache can take on ``device`` (None when it cannot be told): CUDA's free
    memory; on the CPU, ``MemAvailable`` where the kernel reports it, else free pages."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
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
        #: The model, where it can leave the LM head out of rows nobody reads (settled once).
        self._row_logits = model if isinstance(model, RowLogitsLM) else None
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
        self.kv = KVPool(
            max_total_tokens, shape, self.dtype, self.device, blocks=max_running_requests
        )

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

    def cached(self, slots: Sequence[int]) -> list[int]:
        """Positions whose KV is written, per request (the page table's fill)."""
        cached = self.requests.cached
        return [cached[s] for s in slots]

    def keep_path(self, slot: int, start: int, nodes: Sequence[int]) -> None:
        """Keep, after the first ``start`` positions, the tree nodes at offsets ``nodes`` (an
        accepted root-to-node path, in order) and free the rest: the path's keys, values and
        positions are copied, every layer at once, into the first ``len(nodes)`` tree indices, so
        the page table's row keeps the indices it had and a request's indices stay consecutive
        (attention reads them without a gather:
        :class:`~specstrat.runtime._attention.PagedAttention`)."""
        old = self.requests.cached[slot]
        if not 0 <= start <= old or any(not 0 <= n < old - start for n in nodes):
            raise InvalidConfig(
                f"keep_path(slot={slot}, start={start}, nodes={list(nodes)}) outside the "
                f"{old} cached positions"
            )
        moved = [(i, n) for i, n in enumerate(nodes) if i != n]
        if moved:
            row = self.requests.req_to_token[slot]
            dst = row[start + torch.tensor([i for i, _ in moved], device=self.device)].long()
            src = row[start + torch.tensor([n for _, n in moved], device=self.device)].long()
            kv = self.kv
            kv.k[:, dst] = kv.k[:, src]  # the right side is read whole before the write
            kv.v[:, dst] = kv.v[:, src]
            kv.positions[dst] = kv.positions[src]
        self.rewind(slot, start + len(nodes))

    def rewind(self, slot: int, new_len: int) -> None:
        """Drop the KV of positions ``new_len..`` (rejected drafts); their indices are reused."""
        self.rewind_many([slot], [new_len])

    def rewind_many(self, slots: Sequence[int], new_lens: Sequence[int]) -> None:
        """:meth:`rewind` for a batch: one gather of every dropped position's KV index."""
        cached = self.requests.cached
        old = [cached[s] for s in slots]
        drop = [o - n for o, n in zip(old, new_lens, strict=True)]
        if drop and (min(drop) < 0 or min(new_lens) < 0):
            bad = next(
                (s, n, o) for s, n, o in zip(slots, new_lens, old, strict=True) if not 0 <= n <= o
            )
            raise InvalidConfig(f"rewind to new_len={bad[1]} outside 0..{bad[2]} for slot {bad[0]}")
        total = sum(drop)
        if total and len(slots) <= _FEW:  # a few slices read faster than one batched gather
            table = self.requests.req_to_token
            for slot, n, o in zip(slots, new_lens, old, strict=True):
                if o > n:
                    self.kv.free(table[slot, n:o].tolist())
        elif total:
            dev = self.device
            counts = torch.tensor(drop, device=dev)
            rows = torch.repeat_interleave(torch.tensor(list(slots), device=dev), counts)
            starts = torch.repeat_interleave(torch.tensor(list(new_lens), device=dev), counts)
            offsets = run_offsets(counts)
            self.kv.free(self.requests.req_to_token[rows, starts + offsets].tolist())
        for slot, n in zip(slots, new_lens, strict=True):
            cached[slot] = n

    # -- forwards -----------------------------------------------------------------------------

    def place(self, slots: Sequence[int], counts: Sequence[int]) -> PreparedTokens:
        """Allocate KV indices for ``counts[i]`` new tokens after request ``slots[i]`` and
        record them (batched: one indexed write of the page table for the whole batch)."""
        counts = list(counts)
        cached = self.requests.cached
        prefix = [cached[s] for s in slots]
        ends = [p + c for p, c in zip(prefix, counts, strict=True)]
        if max(ends, default=0) > self.context_len:
            slot, start, count = next(
                (s, p, c)
                for s, p, c in zip(slots, prefix, counts, strict=True)
                if p + c > self.context_len
            )
            raise InvalidConfig(
                f"slot {slot}: {start} + {count} tokens exceed context_len={self.context_len}"
            )
        dev = self.device
        locs = self.kv.alloc_many(slots, counts)
        locations = torch.tensor(locs, dtype=torch.int64, device=dev)
        first = torch.tensor(prefix, dtype=torch.int64, device=dev)
        rows = torch.tensor(list(slots), dtype=torch.int64, device=dev)
        if len(set(counts)) == 1:  # uniform: a grid, no per-token bookkeeping
            count = counts[0]
            positions = (first[:, None] + torch.arange(count, device=dev)).reshape(-1)
            rows = rows.repeat_interleave(count)
        else:
            per = torch.tensor(counts, dtype=torch.int64, device=dev)
            offsets = run_offsets(per)
            positions = torch.repeat_interleave(first, per) + offsets
            rows = torch.repeat_interleave(rows, per)
        self.requests.req_to_token[rows, positions] = locations.to(torch.int32)
        for slot, end in zip(slots, ends, strict=True):
            cached[slot] = end
        return PreparedTokens(list(slots), prefix, counts, positions, locations)

    def metadata(self, mode: ForwardMode, prepared: PreparedTokens) -> VerifyMetadata:
        """Attention metadata for tokens placed by :meth:`place` (page size 1)."""
        rpi = torch.tensor(prepared.slots, dtype=torch.int64, device=self.device)
        prefix = torch.tensor(prepared.prefix, dtype=torch.int64, device=self.device)
        paging = Paging(req_pool_indices=rpi, req_to_token=self.requests.req_to_token)
        if mode in _UNIFORM and len(set(prepared.counts)) <= 1:
            return build_verify_metadata(
                prefix,
                num_tokens=sum(prepared.counts),
                paging=paging,
                seq_lens_cpu=prepared.prefix,
            )
        counts = torch.tensor(prepared.counts, dtype=torch.int64, device=self.device)
        return build_ragged_verify_metadata(
            prefix,
            counts,
            paging=paging,
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
        logit_rows: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens[i]`` after request ``slots[i]``; logits and hidden, one row per token
        (with ``logit_rows``, the logits of those flat rows only, ascending; a
        :class:`~specstrat.models.RowLogitsLM` then leaves the LM head out elsewhere).

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
        prepared = self.place(slots, counts)
        meta = self.metadata(mode, prepared)
        dev = self.device
        positions = prepared.positions
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
            out_cache_loc=prepared.locations,
            metadata=meta,
            max_q=max(counts),
            max_k=max(p + c for p, c in zip(prepared.prefix, counts, strict=True)),
            tree=attention,
            logit_rows=None
            if logit_rows is None
            else torch.tensor(logit_rows, dtype=torch.long, device=dev),
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
        logit_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over one batch, attention reading ``metadata`` (and ``tree``, for draft
        trees), the logits of ``logit_rows`` only when given; the one place a
        :class:`~specstrat.runtime._forward.ForwardBatch` is built (eager and graph paths)."""
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
        model, attention = self.model, PagedAttention(self.kv, batch)
        asked: int | None = None  # rows of logits a RowLogitsLM was asked for
        with torch.inference_mode():
            if logit_rows is not None and self._row_logits is not None:
                logits, hidden = self._row_logits.forward_rows(
                    batch.input_ids, batch.positions, attention, logit_rows
                )
                asked = int(logit_rows.numel())
            else:
                logits, hidden = model(batch.input_ids, batch.positions, attention)
        check_model_outputs(model, self.shape, input_ids.shape[0], logits, hidden, asked)
        if logit_rows is not None and asked is None:
            logits = logits[logit_rows]
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
        locs = self.requests.req_to_token[slot, : self.requests.cached[slot]].long()
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
        if self.requests.cached[slot]:
            raise InvalidConfig(f"slot {slot} already holds {self.requests.cached[slot]} tokens")
        prepared = self.place([slot], [len(tokens)])
        locs = prepared.locations
        self.kv.k[:, locs] = k.to(self.kv.k.dtype)
        self.kv.v[:, locs] = v.to(self.kv.v.dtype)
        self.kv.positions[locs] = prepared.positions
