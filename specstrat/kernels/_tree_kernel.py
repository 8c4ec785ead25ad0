"""Tree TARGET_VERIFY metadata: its buffers, the fused Triton kernel and the torch twin.

The launchers in :mod:`specstrat.kernels.tree_metadata` validate the inputs and pick the path;
the kernel and :func:`tree_verify_metadata_ref` only compute, and compute the same outputs.

A verify row holds ``T = N + 1`` tokens: token 0 is the root (the bonus token) and token
``i >= 1`` is draft node ``i - 1``, whose parent token is ``parents[b, i - 1] + 1`` (so the
DraftTree convention's ``-1`` becomes token 0, the root).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int
from specstrat.kernels._paging import Paging
from specstrat.kernels._triton import jit, tl
from specstrat.kernels._verify_buffers import VerifyMetadataBuffers
from specstrat.kernels._verify_kernel import _verify_metadata_kernel, verify_metadata_ref

__all__ = ["TreeVerifyMetadataBuffers", "tree_verify_metadata_ref"]


def _out_buffer(
    name: str, tensor: object, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    """A caller-owned output buffer of exactly ``dtype``, ``shape`` and ``device``."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidConfig(f"{name}={type(tensor).__name__} must be a torch.Tensor")
    if tensor.dtype != dtype or tuple(tensor.shape) != shape or not tensor.is_contiguous():
        raise InvalidConfig(
            f"{name} is {tensor.dtype} {tuple(tensor.shape)}; it must be a contiguous "
            f"{dtype} buffer of shape {shape}"
        )
    if tensor.device != device:
        raise InvalidConfig(f"{name}.device={tensor.device} differs from the inputs' {device}")


@dataclass(frozen=True, slots=True)
class TreeVerifyMetadataBuffers:
    """The tensors tree TARGET_VERIFY reads: the uniform ``base`` buffers with ``T`` tokens per
    row plus the tree's positions, mask and retrieve links; static buffers in the graph form.

    Shapes: ``positions [padded_bs * T]`` int64, ``tree_mask [padded_bs, T, T]`` bool, and
    ``retrive_index``/``retrive_next_token``/``retrive_next_sibling [padded_bs, T]`` int64.
    """

    base: VerifyMetadataBuffers
    positions: torch.Tensor
    tree_mask: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.base, VerifyMetadataBuffers):
            raise InvalidConfig(
                f"base={type(self.base).__name__}; pass VerifyMetadataBuffers.allocate(...)"
            )
        padded_bs, dev = self.base.padded_bs, self.base.cache_seqlens.device
        mask = self.tree_mask
        t = mask.shape[-1] if isinstance(mask, torch.Tensor) and mask.dim() == 3 else -1
        if t < 1:
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise InvalidConfig(f"tree_mask is {shape}; it must be [padded_bs, T, T] with T >= 1")
        _out_buffer("tree_mask", mask, torch.bool, (padded_bs, t, t), dev)
        _out_buffer("positions", self.positions, torch.int64, (padded_bs * t,), dev)
        for name in ("retrive_index", "retrive_next_token", "retrive_next_sibling"):
            _out_buffer(name, getattr(self, name), torch.int64, (padded_bs, t), dev)

    @classmethod
    def allocate(
        cls,
        padded_bs: int,
        tokens_per_req: int,
        *,
        max_pages: int | None = None,
        device: torch.device | str = "cpu",
    ) -> TreeVerifyMetadataBuffers:
        """Buffers for ``padded_bs`` rows of ``tokens_per_req = N + 1`` tokens (and ``max_pages``
        pages per row, if given), every tree row holding the padding rows' values."""
        padded_bs = host_int("padded_bs", padded_bs, minimum=0)
        t = host_int("tokens_per_req", tokens_per_req, minimum=1)
        dev = torch.device(device)
        base = VerifyMetadataBuffers.allocate(padded_bs, max_pages=max_pages, device=dev)
        out = cls.uninitialized(base, t)
        _fill_padding(out, 0)
        return out

    @classmethod
    def uninitialized(
        cls, base: VerifyMetadataBuffers, tokens_per_req: int
    ) -> TreeVerifyMetadataBuffers:
        """Tree buffers without a fill beside ``base``: for the allocating launcher, whose kernel
        and twin write every element."""
        padded_bs, t, dev = base.padded_bs, tokens_per_req, base.cache_seqlens.device

        def links() -> torch.Tensor:
            return torch.empty((padded_bs, t), dtype=torch.int64, device=dev)

        positions = torch.empty((padded_bs * t,), dtype=torch.int64, device=dev)
        mask = torch.empty((padded_bs, t, t), dtype=torch.bool, device=dev)
        return cls(base, positions, mask, links(), links(), links())

    @property
    def padded_bs(self) -> int:
        """Rows the buffers hold (the captured batch bucket)."""
        return self.base.padded_bs

    @property
    def tokens_per_req(self) -> int:
        """``T = N + 1``: the root plus ``N`` draft nodes per row."""
        return self.tree_mask.shape[-1]


def _fill_padding(out: TreeVerifyMetadataBuffers, start: int) -> None:
    """Rows ``start..padded_bs`` of the tree buffers as padding: position 0, each token seeing
    itself and the root, no retrieve links."""
    t = out.tokens_per_req
    eye = torch.eye(t, dtype=torch.bool, device=out.positions.device)
    eye[:, 0] = True
    out.tree_mask[start:] = eye
    out.positions.view(-1, t)[start:] = 0
    for links in (out.retrive_index, out.retrive_next_token, out.retrive_next_sibling):
        links[start:] = -1


@jit
def _tree_verify_kernel(  # type: ignore[no-untyped-def]
    parents_ptr,
    lengths_ptr,
    seq_lens_ptr,
    req_pool_ptr,
    req_to_token_ptr,
    cu_q_ptr,
    cache_ptr,
    cu_k_ptr,
    page_ptr,
    positions_ptr,
    mask_ptr,
    index_ptr,
    next_token_ptr,
    next_sibling_ptr,
    bs,
    padded_bs,
    num_nodes,
    req_to_token_width,
    max_pages,
    page_size,
    base_programs,
    HAS_PAGES: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    t = num_nodes + 1
    # Programs 0..base_programs-1 also write the uniform metadata of their BLOCK_ROWS rows, with
    # the uniform kernel's own body (it reads the same program id), so all of it is one launch.
    if pid < base_programs:
        _verify_metadata_kernel(
            seq_lens_ptr,
            seq_lens_ptr,
            req_pool_ptr,
            req_to_token_ptr,
            cu_q_ptr,
            cache_ptr,
            cu_k_ptr,
            page_ptr,
            bs,
            padded_bs,
            t,
            0,
            req_to_token_width,
            max_pages,
            page_size,
            RAGGED=False,
            BUCKETED=False,
            HAS_PAGES=HAS_PAGES,
            BLOCK_ROWS=BLOCK_ROWS,
            BLOCK_PAGES=BLOCK_PAGES,
        )
    # Program ``row`` builds the tree of request ``row``: one [T, T] tile per program.
    row = pid
    if row < padded_bs:
        tok = tl.arange(0, BLOCK_T)
        in_row = tok < t
        # A per-token copy of "this row is a real request" (the interpreter mistypes the `&` of
        # a scalar bool with a vector as int32).
        real = (tl.zeros((BLOCK_T,), dtype=tl.int64) + row) < bs
        length = tl.load(lengths_ptr + row + tok * 0, mask=real, other=0).to(tl.int64)
        seq = tl.load(seq_lens_ptr + row + tok * 0, mask=real, other=0).to(tl.int64)
        tree_row = parents_ptr + row * num_nodes
        is_node = in_row & (tok >= 1)
        # Parent token of each token; a padding row is a star (every node a child of the root).
        loaded = tl.load(tree_row + tok - 1, mask=is_node & real, other=-1).to(tl.int64)
        parent = tl.where(is_node, loaded + 1, -1)

        # Ancestor closure by walking every token up at once: depth <= N, so N steps suffice.
        sees = tok[:, None] == tok[None, :]
        depth = tl.zeros((BLOCK_T,), dtype=tl.int64)
        cur = parent
        for _ in range(0, num_nodes):
            up = cur >= 0
            sees = sees | ((tok[None, :] == cur[:, None]) & up[:, None])
            depth += up.to(tl.int64)
            # In-row reads only: an unvalidated bad parent gives wrong metadata, never a stray read.
            climb = up & (cur >= 1) & (cur <= num_nodes)
            above = tl.load(tree_row + cur - 1, mask=climb & real, other=-1).to(tl.int64)
            cur = tl.where(climb, above + 1, -1)
        tile = row * t * t + tok[:, None] * t + tok[None, :]
        tl.store(mask_ptr + tile, sees.to(tl.uint8), mask=in_row[:, None] & in_row[None, :])
        position = tl.where(real, seq + depth, 0)
        tl.store(positions_ptr + row * t + tok, position, mask=in_row)

        # Links among live tokens only (the root and the real nodes; filler is linked nowhere).
        live = in_row & (tok <= length) & real
        none = BLOCK_T  # larger than every token index
        is_child = (parent[None, :] == tok[:, None]) & live[None, :]
        first = tl.min(tl.where(is_child, tok[None, :], none), axis=1)
        later = (parent[None, :] == parent[:, None]) & (tok[None, :] > tok[:, None])
        later = later & live[None, :] & (live & (tok >= 1))[:, None]
        sibling = tl.min(tl.where(later, tok[None, :], none), axis=1)
        links = row * t + tok
        tl.store(index_ptr + links, tl.where(real, row * t + tok, -1), mask=in_row)
        tl.store(
            next_token_ptr + links, tl.where(first < none, first, -1).to(tl.int64), mask=in_row
        )
        tl.store(
            next_sibling_ptr + links,
            tl.where(sibling < none, sibling, -1).to(tl.int64),
            mask=in_row,
        )


def tree_verify_metadata_ref(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    out: TreeVerifyMetadataBuffers,
    paging: Paging | None = None,
) -> None:
    """Torch twin of the kernel: writes the tree metadata of ``parents`` into ``out``.

    ``parents [bs, N]`` follows :class:`~specstrat.drafting.DraftTree` (``-1`` = the root),
    ``lengths [bs]`` counts real nodes, ``out`` holds ``T = N + 1`` tokens and ``padded_bs >= bs``
    rows; with ``paging`` (and ``out.base.page_table``) the page table is written too. The
    launchers validate; this only computes.
    """
    bs, n = parents.shape
    t, dev = n + 1, parents.device
    verify_metadata_ref(seq_lens, t, out.base, paging)
    # Parent token of each token [bs, T]: the root has none (-1), node j is token j + 1.
    root = torch.full((bs, 1), -1, dtype=torch.int64, device=dev)
    parent = torch.cat([root, parents.to(torch.int64) + 1], dim=1)
    # Parents come before children, so a token sees what its parent sees, plus itself; its
    # depth is its parent's plus one. Reads row parent[:, i] of `sees`, writes row i.
    sees = torch.eye(t, dtype=torch.bool, device=dev).repeat(bs, 1, 1)
    depth = torch.zeros((bs, t), dtype=torch.int64, device=dev)
    batch = torch.arange(bs, device=dev)
    for i in range(1, t):
        sees[:, i] |= sees[batch, parent[:, i]]
        depth[:, i] = depth[batch, parent[:, i]] + 1
    # Live tokens: the root and the real nodes (token i is real when i <= lengths[b]).
    tok = torch.arange(t, device=dev)
    live = tok[None, :] <= lengths.to(torch.int64)[:, None]
    # is_child[b, p, k]: live token k hangs under p (the root's -1 matches no token).
    is_child = (parent[:, None, :] == tok[None, :, None]) & live[:, None, :]
    first = torch.where(is_child, tok, t).amin(dim=-1)
    # later[b, k, k2]: live k2 > k shares live non-root k's parent (the root's -1 is unique).
    later = (parent[:, None, :] == parent[:, :, None]) & (tok[None, None, :] > tok[None, :, None])
    later &= live[:, None, :] & live[:, :, None]
    sibling = torch.where(later, tok, t).amin(dim=-1)

    out.tree_mask[:bs] = sees
    out.positions.view(-1, t)[:bs] = seq_lens.to(torch.int64)[:, None] + depth
    out.retrive_index[:bs] = batch[:, None] * t + tok
    out.retrive_next_token[:bs] = torch.where(first < t, first, -1)
    out.retrive_next_sibling[:bs] = torch.where(sibling < t, sibling, -1)
    _fill_padding(out, bs)
