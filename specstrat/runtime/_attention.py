"""Paged attention that reads the metadata the kernels build (page size 1: pages are single KV
indices).

Every mode goes through here: EXTEND and DRAFT_EXTEND with ragged metadata, DECODE with T = 1,
TARGET_VERIFY with T from the algorithm's policy. Query ``j`` of request ``i`` sits at position
``cache_seqlens[i] - q_len[i] + j`` and sees keys ``0..that position`` of its own page-table row,
so a wrong ``cu_seqlens_q``, ``cache_seqlens`` or page table yields wrong tokens. With a draft
tree (``batch.tree``), a query also sees, among its request's tree columns, only those its tree
mask allows: its ancestors and itself. Grouped-query attention shares each cached key/value head
among ``heads // kv_heads`` query heads; a layer's ``sliding_window`` and ``softcap`` (see
:class:`~specstrat.models.AttentionBackend`) narrow the mask and cap the scores. The window
measures distance in token positions, which the KV pool keeps per slot (a draft-tree node sits
at its prefix plus depth, whatever column it occupies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.runtime._forward import ForwardBatch, TreeAttention
from specstrat.runtime._memory import KVPool

__all__ = ["PagedAttention"]


def _tree_visible(tree: TreeAttention, k_pos: torch.Tensor, max_q: int) -> torch.Tensor:
    """``[bs, max_q, max_k]``: prefix columns, and tree columns the tree mask allows."""
    mask, start = tree.mask, tree.start.to(k_pos.device)
    width = mask.shape[2]
    col = k_pos[None, :] - start[:, None]  # [bs, max_k]: column within the tree
    inside = (col >= 0) & (col < width)
    index = col.clamp(0, max(width - 1, 0))[:, None, :].expand(-1, max_q, -1)
    padded = mask[:, :max_q] if mask.shape[1] >= max_q else _pad_rows(mask, max_q)
    allowed = padded.gather(2, index) if width else torch.zeros_like(index, dtype=torch.bool)
    return (col < 0)[:, None, :] | (inside[:, None, :] & allowed)


def _pad_rows(mask: torch.Tensor, rows: int) -> torch.Tensor:
    extra = mask.new_zeros(mask.shape[0], rows - mask.shape[1], mask.shape[2])
    return torch.cat([mask, extra], dim=1)


class PagedAttention:
    """The attention backend for one forward: writes new K/V, then attends through pages."""

    def __init__(self, pool: KVPool, batch: ForwardBatch) -> None:
        self.pool = pool
        self.batch = batch
        meta = batch.metadata
        cu_q = meta.cu_seqlens_q.long()
        cache = meta.cache_seqlens.long()
        n = batch.input_ids.shape[0]
        q_len = cu_q[1:] - cu_q[:-1]
        # Which request each flat token belongs to, and its index within that request.
        token = torch.arange(n, device=cu_q.device)
        self.req = torch.searchsorted(cu_q[1:], token, right=True)
        self.qi = token - cu_q[self.req]
        # Absolute position of every (request, query row), and of every key column.
        q_rows = torch.arange(batch.max_q, device=cu_q.device)
        q_pos = (cache - q_len)[:, None] + q_rows[None, :]
        k_pos = torch.arange(batch.max_k, device=cu_q.device)
        visible = (k_pos[None, None, :] < cache[:, None, None]) & (
            k_pos[None, None, :] <= q_pos[:, :, None]
        )
        if batch.tree is not None:
            visible &= _tree_visible(batch.tree, k_pos, batch.max_q)
        self._visible, self._k_pos = visible, k_pos
        self._masks: dict[int | None, torch.Tensor] = {None: _finite(visible, k_pos)}
        if meta.page_table is None:
            raise InvalidConfig("paged attention needs metadata built with req_to_token")
        self.slots = meta.page_table[:, : batch.max_k].long()
        self._flat_slots = self.slots.reshape(-1)
        # Every request runs max_q tokens (DECODE, uniform TARGET_VERIFY): the flat tokens are
        # already [rows, max_q] and need no scatter into padded rows (a host fact: n and bounds).
        self._dense = n == self.slots.shape[0] * batch.max_q
        self._packed: dict[tuple[int | None, int, torch.dtype | None], torch.Tensor] = {}
        # On the CPU (where checking costs no device sync): requests whose KV indices run
        # consecutively from starts a fixed stride apart (the KV pool's blocks) read their keys
        # as one strided view of the pool, not a gather, and a forward whose every query sees
        # every key column needs no mask.
        self._view: _StridedRows | None = None
        self._unmasked = False
        if cu_q.device.type == "cpu":
            self._unmasked, self._view = _host_facts(
                visible, self.slots, cache, pool.block_size, pool.capacity + 1
            )
        # Each new token's position goes with its KV index (read by later windowed forwards).
        pool.positions.index_copy_(0, batch.out_cache_loc, batch.positions.to(torch.int64))

    @property
    def mask(self) -> torch.Tensor:
        """``[rows, 1, max_q, max_k]``: which key columns each query row sees (no window)."""
        return self._masks[None]

    def _mask(
        self, window: int | None, group: int, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The mask of a layer with ``sliding_window=window`` whose ``group`` query heads share a
        key/value head, rows packed as ``g * max_q + j``, in the order the keys are read (built
        once per forward): boolean, or with a ``dtype`` SDPA's additive form (0 where seen,
        -inf elsewhere; SDPA converts a boolean mask so on every call, and adding the same
        zeros and infinities gives the same output bit for bit)."""
        key = (window, group, dtype)
        if key not in self._packed:
            if window not in self._masks:
                if not is_int(window) or window < 1:
                    raise InvalidConfig(f"sliding_window={window!r} must be an int >= 1 or None")
                start = self._query_positions()[:, :, None] - window
                near = self._key_positions()[:, None, :] > start
                self._masks[window] = _finite(self._visible & near, self._k_pos)
            packed = self._masks[window].repeat(1, 1, group, 1)
            view = self._view
            if view is not None and view.order is not None:
                packed = packed[view.order]
            if dtype is not None:
                hidden = torch.full(packed.shape, float("-inf"), dtype=dtype, device=packed.device)
                packed = hidden.masked_fill_(packed, 0.0)
            self._packed[key] = packed
        return self._packed[key]

    def _key_positions(self) -> torch.Tensor:
        """``[rows, max_k]``: the position of the token in each key column."""
        return self.pool.positions[self._flat_slots].view(self.slots.shape)

    def _query_positions(self) -> torch.Tensor:
        """``[rows, max_q]``: each query row's position (rows past a request's length: 0)."""
        positions = self.batch.positions.to(torch.int64)
        rows, max_q = self.slots.shape[0], self.batch.max_q
        if self._dense:
            return positions.view(rows, max_q)
        out = positions.new_zeros(rows, max_q)
        out[self.req, self.qi] = positions
        return out

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scaling: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Store this layer's new K/V at ``out_cache_loc``, then attend through the pages."""
        loc = self.batch.out_cache_loc
        self.pool.k[layer].index_copy_(0, loc, k.to(self.pool.k.dtype))
        self.pool.v[layer].index_copy_(0, loc, v.to(self.pool.v.dtype))
        rows, max_q, (n, heads, dim) = self.slots.shape[0], self.batch.max_q, q.shape
        if self._dense:
            queries = q.view(rows, max_q, heads, dim)
        else:
            queries = q.new_zeros(rows, max_q, heads, dim)
            queries[self.req, self.qi] = q
        pool_k, pool_v = self.pool.k[layer], self.pool.v[layer]
        kv_heads = pool_k.shape[1]
        group, rest = divmod(heads, kv_heads)
        if rest:
            raise InvalidConfig(
                f"layer {layer}: {heads} query heads are not a multiple of the cache's "
                f"{kv_heads} key/value heads; set ModelShape.kv_heads to the model's"
            )
        max_k = self.slots.shape[1]
        # [rows, max_k, kv_heads, dim]: each request's keys through its page-table row.
        view = self._view
        unmasked = self._unmasked and sliding_window is None
        # SDPA takes the additive form; the softcap's eager form masks with the boolean one
        form = q.dtype if softcap is None else None
        mask = None if unmasked else self._mask(sliding_window, group, form)
        if view is not None:
            keys, values = view.read(pool_k, max_k), view.read(pool_v, max_k)
            if view.order is not None:  # the view's rows in block order: queries follow
                queries = queries[view.order]
        else:
            keys = pool_k.index_select(0, self._flat_slots).view(rows, max_k, kv_heads, dim)
            values = pool_v.index_select(0, self._flat_slots).view(rows, max_k, kv_heads, dim)
        kt, vt = keys.transpose(1, 2), values.transpose(1, 2)
        # Grouped-query attention without repeating K/V: the `group` query heads of a KV head
        # stack along the query axis (row g * max_q + j), as transformers' pack_gqa does.
        qt = queries.transpose(1, 2).reshape(rows, kv_heads, group * max_q, dim)
        if softcap is None:
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scaling)
        else:  # SDPA has no score cap: the eager form, softmax in float32 as transformers does
            scale = dim**-0.5 if scaling is None else scaling
            scores = softcap * torch.tanh((qt @ kt.transpose(-1, -2)) * scale / softcap)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vt.dtype) @ vt
        out = out.reshape(rows, heads, max_q, dim).transpose(1, 2)  # [rows, max_q, heads, dim]
        if view is not None and view.row_of is not None:
            out = out[view.row_of]  # back to the batch's order
        if self._dense:
            return out.reshape(n, heads, dim)
        return out[self.req, self.qi]


@dataclass(frozen=True, slots=True)
class _StridedRows:
    """A batch's keys as a view of the pool: row ``v`` of the view starts at KV index
    ``start + v * stride``; ``order[v]`` is the batch row there and ``row_of[i]`` the view row
    of batch row ``i`` (both None when they agree)."""

    start: int
    stride: int
    rows: int
    order: torch.Tensor | None
    row_of: torch.Tensor | None

    def read(self, pool: torch.Tensor, max_k: int) -> torch.Tensor:
        """``[rows, max_k, kv_heads, dim]`` of one layer's ``pool`` ``[indices, kv_heads, dim]``,
        no copy."""
        step = pool.stride(0)
        return pool.as_strided(
            (self.rows, max_k, *pool.shape[1:]),
            (self.stride * step, *pool.stride()),
            pool.storage_offset() + self.start * step,
        )


def _host_facts(
    visible: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, stride: int, end: int
) -> tuple[bool, _StridedRows | None]:
    """Whether every query sees every key column, and the view that reads ``slots``
    ``[rows, max_k]`` (each row's first ``cache[i]`` columns matter) without a gather, or None:
    every row's indices must run consecutively from a start a multiple of ``stride`` past the
    lowest (one row: any start), the starts must fill ``rows`` consecutive steps of ``stride``
    in some order, and the view must end by ``end``. One read of the host for both."""
    rows, max_k = slots.shape
    unmasked = visible.all().long()
    if rows == 0 or max_k == 0 or (rows > 1 and stride <= 0):
        return bool(unmasked), None
    step = max(stride, 1)
    first = slots[:, 0].long()
    low = first.min()
    cols = torch.arange(max_k, dtype=torch.int64)
    runs = (slots == first[:, None] + cols) | (cols[None, :] >= cache[:, None])
    offset = first - low
    row_of = offset // step
    seen = torch.zeros(rows + 1, dtype=torch.int64).index_add_(
        0, row_of.clamp(max=rows), torch.ones_like(row_of)
    )
    in_order = row_of == torch.arange(rows)
    facts = torch.stack(
        [
            unmasked,
            low,
            cache.min().long(),
            runs.all().long(),
            (offset % step == 0).all().long(),
            seen[:rows].eq(1).all().long(),  # each block start once, none past rows
            in_order.all().long(),
        ]
    ).tolist()
    seen_all, start, fill, running, aligned, once, ordered = facts
    if min(start, fill, running, aligned, once) < 1 or start + (rows - 1) * stride + max_k > end:
        return bool(seen_all), None
    if ordered:  # one row always is
        return bool(seen_all), _StridedRows(start, stride if rows > 1 else 0, rows, None, None)
    order = torch.empty_like(row_of)
    order[row_of] = torch.arange(rows)
    return bool(seen_all), _StridedRows(start, stride, rows, order, row_of)


def _finite(visible: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``visible`` as an SDPA mask ``[rows, 1, max_q, max_k]``. A query row that sees no key (a
    row past its request's length, discarded) sees key 0, which keeps its softmax finite."""
    blind = ~visible.any(dim=-1, keepdim=True)
    return (visible | (blind & (k_pos == 0)[None, None, :]))[:, None]
