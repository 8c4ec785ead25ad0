"""Tree TARGET_VERIFY metadata (EAGLE-2 style): one fused Triton launch, no host sync, a torch twin.

A draft tree per request (:class:`~specstrat.drafting.DraftTree` convention: ``parents [bs, N]``
with ``parents[b, j]`` in ``-1..j-1``, ``-1`` = a child of the root, ``lengths [bs]`` real nodes,
the rest filler) is verified as a row of ``T = N + 1`` tokens: token 0 is the root (the last
verified token), token ``i >= 1`` is draft node ``i - 1``. One launch writes

* the uniform metadata with ``T`` tokens per row (``cu_seqlens_q``, ``cache_seqlens = seq_lens +
  T``, ``cu_seqlens_k``, ``page_table``), exactly as :func:`~specstrat.kernels.build_verify_metadata`
  does, by the same kernel body;
* ``positions [padded_bs * T]`` int64: ``seq_len + depth`` (the root has depth 0), e.g. depths
  ``[0, 1, 1, 2]`` at prompt length 7 give ``[7, 8, 8, 9]``;
* ``tree_mask [padded_bs, T, T]`` bool: row ``i`` sees column ``j`` iff ``j == i`` or ``j`` is an
  ancestor of ``i`` (the root, column 0, is every token's ancestor). Only the ``T`` new tokens:
  the prefix is always visible and is not part of this tensor;
* SGLang's retrieve layout, ``[padded_bs, T]`` int64 each: ``retrive_index[b, i] = b * T + i``
  (the token's flat row in the verify batch), ``retrive_next_token`` (first child, lowest index;
  -1: none) and ``retrive_next_sibling`` (the next child of the same parent, higher index; -1:
  none). Walking ``next_token`` then ``next_sibling`` from token 0 enumerates the tree.

Filler nodes (token index ``> lengths[b]``) are linked from nowhere and link nowhere (-1), but
still get a mask row (themselves plus their ancestors per ``parents``), a position and a
``retrive_index``; attention over them is harmless and nothing accepts them.

Padding rows ``bs..padded_bs`` of the graph form are the uniform form's padding (length
:data:`~specstrat.kernels.PAD_SEQ_LEN`, pages :data:`~specstrat.kernels.PAD_PAGE`) with positions
0, a mask of the diagonal plus column 0, and every retrieve entry -1.

Value checks (parents outside ``-1..j-1``, lengths outside ``0..N``, and every check of the
uniform launchers) read the tensors: they always run on CPU tensors and, on CUDA, only with
``validate=True`` (otherwise they would be host syncs). Nothing is written when a check fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import index_tensor, reads_values
from specstrat.kernels._tree_kernel import TreeVerifyMetadataBuffers as TreeVerifyMetadataBuffers
from specstrat.kernels._tree_kernel import _tree_verify_kernel
from specstrat.kernels._tree_kernel import tree_verify_metadata_ref as tree_verify_metadata_ref
from specstrat.kernels._triton import Backend, cdiv, launch, resolve_backend
from specstrat.kernels._verify_buffers import VerifyMetadata, VerifyMetadataBuffers
from specstrat.kernels._verify_checks import (
    Paging,
    check_paging,
    check_total,
    check_values,
    max_k_bound,
)
from specstrat.kernels._verify_kernel import _BLOCK_PAGES, _BLOCK_ROWS

__all__ = [
    "TreeVerifyMetadata",
    "TreeVerifyMetadataBuffers",
    "build_tree_verify_metadata",
    "build_tree_verify_metadata_into",
    "tree_verify_metadata_ref",
]


@dataclass(frozen=True, slots=True)
class TreeVerifyMetadata:
    """Tree TARGET_VERIFY metadata: the uniform metadata of ``T = N + 1`` tokens per row plus the
    tree's tensors (see the module docstring for the layout and the padding rows).

    ``base``: :class:`~specstrat.kernels.VerifyMetadata` with ``tokens_per_req = T`` (also for
    ``bs == 0``, where ``T`` still comes from the shape of ``parents``).
    ``positions``: ``[padded_bs * T]`` int64, ``seq_len + depth`` of each token.
    ``tree_mask``: ``[padded_bs, T, T]`` bool, token ``i`` sees itself and its ancestors.
    ``retrive_index``: ``[padded_bs, T]`` int64, ``b * T + i`` (-1 on padding rows).
    ``retrive_next_token``: ``[padded_bs, T]`` int64, the lowest-index live child or -1.
    ``retrive_next_sibling``: ``[padded_bs, T]`` int64, the next live child of the same parent
    by index, or -1.
    """

    base: VerifyMetadata
    positions: torch.Tensor
    tree_mask: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor

    @property
    def bs(self) -> int:
        """Real requests (rows ``bs..padded_bs`` are padding)."""
        return self.base.bs

    @property
    def padded_bs(self) -> int:
        """Rows in the buffers, padding included."""
        return self.base.padded_bs

    @property
    def tokens_per_req(self) -> int:
        """``T = N + 1``: the root plus the draft nodes of each row."""
        return self.tree_mask.shape[-1]


def _tree_inputs(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    device: torch.device | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shapes, dtypes and devices of the tree inputs (their values: :func:`_check_tree_values`)."""
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1, device=device)
    bs, dev = seq_lens.shape[0], seq_lens.device
    parents = index_tensor("parents", parents, ndim=2, device=dev, rows=bs)
    lengths = index_tensor("lengths", lengths, ndim=1, device=dev, rows=bs)
    return parents, lengths, seq_lens


def _first_bad(bad: torch.Tensor) -> int | None:
    """Flat index of the first ``True`` in ``bad``, or ``None`` (one host read, two on failure)."""
    if not bool(bad.any()):
        return None
    return int(bad.reshape(-1).to(torch.int32).argmax())


def _check_tree_values(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    padded_bs: int,
    paging: Paging | None,
    page_cols: int | None,
    validate: bool,
) -> bool:
    """Run the value checks when they may read the tensors (see :func:`reads_values`); say if so."""
    tensors = [parents, lengths, seq_lens, *(paging.tensors if paging is not None else ())]
    if not reads_values(validate, *tensors):
        return False
    n = parents.shape[1]
    column = torch.arange(n, device=parents.device)
    if (flat := _first_bad((parents < -1) | (parents >= column))) is not None:
        b, j = divmod(flat, n)
        raise InvalidConfig(
            f"parents[{b}, {j}]={int(parents[b, j])} is outside -1..{j - 1}; a node's parent "
            "must come before it (-1 = a child of the root)"
        )
    if (i := _first_bad((lengths < 0) | (lengths > n))) is not None:
        raise InvalidConfig(
            f"lengths[{i}]={int(lengths[i])} is outside 0..{n}; a row has at most "
            f"parents.shape[1]={n} real nodes"
        )
    check_values(seq_lens, n + 1, padded_bs=padded_bs, paging=paging, page_cols=page_cols)
    return True


def _run(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    out: TreeVerifyMetadataBuffers,
    paging: Paging | None,
    backend: Backend,
) -> None:
    """Dispatch one tree metadata build to the Triton kernel or the twin."""
    rpi = paging.req_pool_indices if paging is not None else None
    rtt = paging.req_to_token if paging is not None else None
    page_size = paging.page_size if paging is not None else 1
    tensors = [parents, lengths, seq_lens, out.positions]
    tensors += list(paging.tensors) if paging is not None else []
    if resolve_backend(backend, *tensors) == "torch":
        tree_verify_metadata_ref(parents, lengths, seq_lens, out, rpi, rtt, page_size)
        return
    padded_bs, n = out.padded_bs, parents.shape[1]
    base = out.base
    base_programs = max(1, cdiv(padded_bs, _BLOCK_ROWS))
    launch(
        _tree_verify_kernel,
        (max(base_programs, padded_bs),),
        parents,
        lengths,
        seq_lens,
        rpi if rpi is not None else seq_lens,
        rtt if rtt is not None else seq_lens,
        base.cu_seqlens_q,
        base.cache_seqlens,
        base.cu_seqlens_k,
        base.page_table if base.page_table is not None else base.cache_seqlens,
        out.positions,
        out.tree_mask.view(torch.uint8),
        out.retrive_index,
        out.retrive_next_token,
        out.retrive_next_sibling,
        seq_lens.shape[0],
        padded_bs,
        n,
        rtt.shape[1] if rtt is not None else 0,
        base.page_table.shape[1] if base.page_table is not None else 0,
        page_size,
        base_programs,
        HAS_PAGES=base.page_table is not None,
        BLOCK_ROWS=_BLOCK_ROWS,
        BLOCK_PAGES=_BLOCK_PAGES,
        # One program holds a [T, T] tile: sized for EAGLE-2 trees (T <= 64).
        BLOCK_T=max(2, 1 << n.bit_length()),
        # ptxas -v for sm_90 (compiled, not run: no GPU was lent): 4 warps spill 1-3 KB of stack
        # with a page table (the base body's 128x64 page tile) and 8 warps 88 bytes; without a
        # page table 8 warps spill nothing up to T = 64. Not timed on a GPU yet.
        num_warps=8,
    )


def _metadata(
    out: TreeVerifyMetadataBuffers, bs: int, page_size: int, max_k: int | None
) -> TreeVerifyMetadata:
    t = out.tokens_per_req
    return TreeVerifyMetadata(
        VerifyMetadata(out.base, bs, page_size, t, t, max_k),
        out.positions,
        out.tree_mask,
        out.retrive_index,
        out.retrive_next_token,
        out.retrive_next_sibling,
    )


def build_tree_verify_metadata(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> TreeVerifyMetadata:
    """Tree TARGET_VERIFY metadata for ``bs = len(seq_lens)`` draft trees of ``N`` nodes each.

    ``parents [bs, N]`` and ``lengths [bs]`` follow :class:`~specstrat.drafting.DraftTree`; every
    row verifies ``T = N + 1`` tokens (the root, then the nodes). With ``req_pool_indices`` and
    ``req_to_token`` the page table for ``page_size`` is built too; ``seq_lens_cpu`` gives the
    host bound ``max_seq_len_k``. Values are checked on CPU tensors, and on CUDA tensors only
    with ``validate=True`` (there the checks are host syncs). One launch on the Triton path.
    """
    parents, lengths, seq_lens = _tree_inputs(parents, lengths, seq_lens, None)
    bs, t = seq_lens.shape[0], parents.shape[1] + 1
    paging = check_paging(req_pool_indices, req_to_token, page_size, seq_lens)
    max_pages = paging.max_pages if paging is not None else None
    check_total("cu_seqlens_q", bs * t, "query tokens of the batch")
    read = _check_tree_values(parents, lengths, seq_lens, bs, paging, max_pages, validate)
    max_k = max_k_bound(seq_lens_cpu, seq_lens if read else None, bs, t)
    base = VerifyMetadataBuffers.uninitialized(bs, max_pages, seq_lens.device)
    out = TreeVerifyMetadataBuffers.uninitialized(base, t)
    _run(parents, lengths, seq_lens, out, paging, backend)
    return _metadata(out, bs, page_size, max_k)


def build_tree_verify_metadata_into(
    buffers: TreeVerifyMetadataBuffers,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> TreeVerifyMetadata:
    """Graph form: write tree metadata for ``len(seq_lens) <= buffers.padded_bs`` trees in place.

    ``buffers`` come from :meth:`TreeVerifyMetadataBuffers.allocate` with ``tokens_per_req =
    parents.shape[1] + 1``. Rows past the real batch are padding (see the module docstring). On
    the Triton path this is one launch, no allocation, no host sync; ``validate=True`` adds the
    value checks of :func:`build_tree_verify_metadata` (host syncs), which always run on CPU
    tensors. Nothing is written when a check fails.
    """
    if not isinstance(buffers, TreeVerifyMetadataBuffers):
        raise InvalidConfig(
            f"buffers={type(buffers).__name__}; pass "
            "TreeVerifyMetadataBuffers.allocate(padded_bs, tokens_per_req, ...)"
        )
    device = buffers.positions.device
    parents, lengths, seq_lens = _tree_inputs(parents, lengths, seq_lens, device)
    bs, t = seq_lens.shape[0], parents.shape[1] + 1
    if t != buffers.tokens_per_req:
        raise InvalidConfig(
            f"parents.shape[1]={t - 1} gives T={t} tokens per request but the buffers hold "
            f"tokens_per_req={buffers.tokens_per_req}; allocate them with tokens_per_req = N + 1"
        )
    if bs > buffers.padded_bs:
        raise InvalidConfig(
            f"bs={bs} exceeds the buffers' padded_bs={buffers.padded_bs}; "
            "pick the smallest captured bucket with padded_bs >= bs"
        )
    paging = check_paging(req_pool_indices, req_to_token, page_size, seq_lens)
    page_table = buffers.base.page_table
    if (paging is None) != (page_table is None):
        have = (
            "None but req_to_token was given" if paging is not None else "set but no req_to_token"
        )
        raise InvalidConfig(
            f"buffers.base.page_table is {have}; allocate the buffers with max_pages exactly "
            "when a page table is built"
        )
    padded_bs = buffers.padded_bs
    page_cols = page_table.shape[1] if page_table is not None else None
    check_total("cu_seqlens_q", padded_bs * t, "query tokens of the padded batch")
    read = _check_tree_values(parents, lengths, seq_lens, padded_bs, paging, page_cols, validate)
    max_k = max_k_bound(seq_lens_cpu, seq_lens if read else None, bs, t)
    _run(parents, lengths, seq_lens, buffers, paging, backend)
    return _metadata(buffers, bs, page_size, max_k)
