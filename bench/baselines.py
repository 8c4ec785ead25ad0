"""Eager TARGET_VERIFY metadata written the way the engines first did it (the bench baseline).

One small op per quantity (arange, add, cumsum, pad, slicing) and a ``max().item()`` on device
data to size the page table: every op is a kernel launch on a GPU and ``.item()`` a host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def eager_uniform(
    seq_lens: torch.Tensor,
    num_tokens: int,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """cu_seqlens_q, cache_seqlens, cu_seqlens_k, page_table and max_seq_len_k, eagerly."""
    bs = seq_lens.shape[0]
    t = num_tokens // bs
    cu_q = torch.arange(0, bs * t + 1, t, dtype=torch.int32, device=seq_lens.device)
    cache = (seq_lens + t).to(torch.int32)
    cu_k = F.pad(torch.cumsum(cache, dim=0, dtype=torch.int32), (1, 0))
    max_k = int(cache.max().item())  # the host sync the fused path avoids
    pages = req_to_token[req_pool_indices, :max_k][:, ::page_size] // page_size
    return cu_q, cache, cu_k, pages.to(torch.int32), max_k


def eager_graph(
    bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    seq_lens: torch.Tensor,
    tokens: int,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> int:
    """The replay-time update of static buffers: eager ops, then copies into the buffers."""
    cu_q, cache_buf, cu_k, page_buf = bufs
    bs = seq_lens.shape[0]
    cache_buf[:bs].copy_(seq_lens + tokens)
    cache_buf[bs:].fill_(tokens)
    cu_q.copy_(
        torch.arange(0, cu_q.shape[0] * tokens, tokens, dtype=torch.int32, device=cu_q.device)
    )
    cu_k[1:].copy_(torch.cumsum(cache_buf, dim=0, dtype=torch.int32))
    max_k = int(cache_buf.max().item())
    pages = req_to_token[req_pool_indices, :max_k][:, ::page_size] // page_size
    page_buf[:bs, : pages.shape[1]].copy_(pages)
    page_buf[bs:].fill_(0)
    return max_k


def eager_ragged(
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Per-request token counts, rebuilt eagerly on every replay as the engines do."""
    cu_q = F.pad(torch.cumsum(num_tokens_per_req, dim=0, dtype=torch.int32), (1, 0))
    cache = (seq_lens + num_tokens_per_req).to(torch.int32)
    cu_k = F.pad(torch.cumsum(cache, dim=0, dtype=torch.int32), (1, 0))
    max_q = int(num_tokens_per_req.max().item())
    max_k = int(cache.max().item())
    pages = req_to_token[req_pool_indices, :max_k][:, ::page_size] // page_size
    return cu_q, cache, cu_k, pages.to(torch.int32), max_q, max_k


def eager_tree_structure(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve: torch.Tensor,
) -> None:
    """What SGLang's tree kernel computes, as eager torch ops over the batch (one token at a
    time, as its Triton fallback walks them): the ancestor mask, positions and the retrieve links,
    the links by prepending each child to its parent's list from the highest index down.

    On a GPU SGLang runs this part as one CUDA kernel; the bench counts it both ways.
    """
    bs, n = parents.shape
    t = n + 1
    rows = torch.arange(bs, device=parents.device)
    mask = tree_mask.view(bs, t, t)
    mask.copy_(torch.eye(t, dtype=torch.bool, device=parents.device).expand(bs, t, t))
    depth = torch.zeros((bs, t), dtype=torch.long, device=parents.device)
    parent = F.pad(parents + 1, (1, 0), value=-1)
    for i in range(1, t):
        mask[:, i] |= mask[rows, parent[:, i]]
        depth[:, i] = depth[rows, parent[:, i]] + 1
    positions.copy_((seq_lens[:, None] + depth).flatten())
    index, next_token, next_sibling = retrieve
    index.copy_(rows[:, None] * t + torch.arange(t, device=parents.device))
    for i in range(n, 0, -1):
        live = lengths >= i
        p = parent[:, i]
        first = next_token[rows, p]
        next_sibling[:, i] = torch.where(live, first, next_sibling[:, i])
        next_token[rows, p] = torch.where(live, i, first)


def eager_tree(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, ...]:
    """Tree verify metadata the way SGLang's Python side prepares it around its tree kernel:
    freshly filled mask and retrieve buffers (``torch.full``), an empty positions buffer, the tree
    itself, then the attention backend's own eager metadata with ``T = N + 1`` tokens per row."""
    bs, n = parents.shape
    t = n + 1
    device = seq_lens.device
    tree_mask = torch.full((t * bs * t,), True, dtype=torch.bool, device=device)
    retrieve = torch.full((3, bs, t), -1, dtype=torch.long, device=device)
    positions = torch.empty((bs * t,), dtype=torch.long, device=device)
    eager_tree_structure(parents, lengths, seq_lens, tree_mask, positions, retrieve)
    attention = eager_uniform(seq_lens, bs * t, req_pool_indices, req_to_token, page_size)
    return (tree_mask, positions, *retrieve, *attention[:4])


def eager_tree_graph(
    bufs: tuple[torch.Tensor, ...],
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> int:
    """Replay-time tree update of static buffers, rebuilt eagerly outside the graph: SGLang's
    ``tree_mask_buf.fill_(True)``, fresh retrieve and positions buffers, the tree, copies into
    the captured buffers, then the uniform static-buffer update."""
    cu_q, cache, cu_k, pages, positions_buf, mask_buf, *retrieve_bufs = bufs
    bs, n = parents.shape
    t = n + 1
    device = seq_lens.device
    mask_buf.fill_(True)
    retrieve = torch.full((3, bs, t), -1, dtype=torch.long, device=device)
    positions = torch.empty((bs * t,), dtype=torch.long, device=device)
    eager_tree_structure(parents, lengths, seq_lens, mask_buf, positions, retrieve)
    positions_buf[: bs * t].copy_(positions)
    for buf, links in zip(retrieve_bufs, retrieve, strict=True):
        buf[:bs].copy_(links)
    return eager_graph(
        (cu_q, cache, cu_k, pages), seq_lens, t, req_pool_indices, req_to_token, page_size
    )


def eager_ragged_graph(
    bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    padded_tokens: int,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    page_size: int,
) -> tuple[int, int]:
    """A ragged step padded to a token bucket the way SGLang's eager path does it: the padding token
    counts (``padded_to_bucket``), the query offsets (``build_qo_indptr``), the key geometry, then
    copies into the static buffers; ``max().item()`` sizes the page table."""
    cu_q, cache_buf, cu_k, page_buf = bufs
    bs, padded_bs = seq_lens.shape[0], cache_buf.shape[0]
    num_pad = padded_bs - bs
    counts = num_tokens_per_req.to(torch.int32)
    leftover = padded_tokens - counts.to(torch.int64).sum()
    base = leftover // num_pad
    rem = leftover - base * num_pad
    pad_block = base + (torch.arange(num_pad, device=counts.device) < rem)
    counts = torch.cat([counts, pad_block.to(torch.int32)])
    cu_q.copy_(F.pad(torch.cumsum(counts, dim=0, dtype=torch.int32), (1, 0)))
    cache_buf[:bs].copy_(seq_lens + num_tokens_per_req)
    cache_buf[bs:].copy_(pad_block)
    cu_k[1:].copy_(torch.cumsum(cache_buf, dim=0, dtype=torch.int32))
    max_q = int(counts.max().item())
    max_k = int(cache_buf.max().item())
    pages = req_to_token[req_pool_indices, :max_k][:, ::page_size] // page_size
    page_buf[:bs, : pages.shape[1]].copy_(pages)
    page_buf[bs:].fill_(0)
    return max_q, max_k
