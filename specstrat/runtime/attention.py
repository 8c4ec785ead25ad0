"""Paged attention that reads the metadata the kernels build (page size 1: pages are KV slots).

Every mode goes through here: EXTEND and DRAFT_EXTEND with ragged metadata, DECODE with T = 1,
TARGET_VERIFY with T from the algorithm's policy. Query ``j`` of request ``i`` sits at position
``cache_seqlens[i] - q_len[i] + j`` and sees keys ``0..that position`` of its own page-table row,
so a wrong ``cu_seqlens_q``, ``cache_seqlens`` or page table yields wrong tokens. With a draft
tree (``batch.tree``), a query also sees, among its request's tree columns, only those its tree
mask allows: its ancestors and itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specstrat.errors import InvalidConfig
from specstrat.runtime.forward import ForwardBatch, TreeAttention
from specstrat.runtime.memory import KVPool

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
        # Query rows past a request's length are discarded; key 0 keeps their softmax finite.
        self.mask = (visible | (k_pos == 0)[None, None, :])[:, None]
        if meta.page_table is None:
            raise InvalidConfig("paged attention needs metadata built with req_to_token")
        self.slots = meta.page_table[:, : batch.max_k].long()

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Store this layer's new K/V at ``out_cache_loc``, then attend through the pages."""
        loc = self.batch.out_cache_loc
        self.pool.k[layer].index_copy_(0, loc, k.to(self.pool.k.dtype))
        self.pool.v[layer].index_copy_(0, loc, v.to(self.pool.v.dtype))
        rows, (_, heads, dim) = self.slots.shape[0], q.shape
        queries = q.new_zeros(rows, self.batch.max_q, heads, dim)
        queries[self.req, self.qi] = q
        keys = self.pool.k[layer][self.slots]  # [rows, max_k, heads, dim]
        values = self.pool.v[layer][self.slots]
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=self.mask,
        )
        return out.transpose(1, 2)[self.req, self.qi]
