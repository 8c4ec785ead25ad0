"""Tree TARGET_VERIFY metadata (EAGLE-2 style): one fused Triton launch, no host sync, a torch twin.

A draft tree per request (:class:`~specstrat.drafting.DraftTree` convention: ``parents [bs, N]``
with ``parents[b, j]`` in ``-1..j-1``, ``-1`` = a child of the root, ``lengths [bs]`` real nodes,
the rest filler) is verified as a row of ``T = N + 1`` tokens: token 0 is the root (the last
verified token), token ``i >= 1`` is draft node ``i - 1``. One launch writes

* the uniform metadata with ``T`` tokens per row (``cu_seqlens_q``, ``cache_seqlens = seq_lens +
  T``, ``cu_seqlens_k``, ``page_table``), exactly as
  :func:`~specstrat.kernels.build_verify_metadata` does, by the same kernel body;
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

Both builders take the keywords every metadata builder shares (``paging``, ``seq_lens_cpu``,
``backend``, ``validate``; see :mod:`specstrat.kernels.verify_metadata`). Value checks (parents
outside ``-1..j-1``, lengths outside ``0..N``, and every check of the uniform builders) read the
tensors: they always run on CPU tensors and, on CUDA, only with ``validate=True`` (otherwise they
would be host syncs). Nothing is written when a check fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import index_tensor
from specstrat.kernels._paging import Paging
from specstrat.kernels._tree_kernel import TreeVerifyMetadataBuffers as TreeVerifyMetadataBuffers
from specstrat.kernels._tree_kernel import _tree_verify_kernel
from specstrat.kernels._tree_kernel import tree_verify_metadata_ref as tree_verify_metadata_ref
from specstrat.kernels._triton import Backend, cdiv, launch, resolve_backend
from specstrat.kernels._verify_buffers import VerifyMetadata
from specstrat.kernels._verify_checks import first_true
from specstrat.kernels._verify_inputs import Batch, check_batch
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


def _tree(batch: Batch, parents: object, lengths: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes, dtypes and devices of the tree inputs (their values: :func:`_check_tree`)."""
    dev, bs = batch.seq_lens.device, batch.bs
    parents = index_tensor("parents", parents, ndim=2, device=dev, rows=bs)
    lengths = index_tensor("lengths", lengths, ndim=1, device=dev, rows=bs)
    return parents, lengths


def _check_tree(parents: torch.Tensor, lengths: torch.Tensor) -> None:
    """Every parent comes before its node and every length is at most ``N`` (reads both)."""
    n = parents.shape[1]
    column = torch.arange(n, device=parents.device)
    if (flat := first_true((parents < -1) | (parents >= column))) is not None:
        b, j = divmod(flat, n)
        raise InvalidConfig(
            f"parents[{b}, {j}]={int(parents[b, j])} is outside -1..{j - 1}; a node's parent "
            "must come before it (-1 = a child of the root)"
        )
    if (i := first_true((lengths < 0) | (lengths > n))) is not None:
        raise InvalidConfig(
            f"lengths[{i}]={int(lengths[i])} is outside 0..{n}; a row has at most "
            f"parents.shape[1]={n} real nodes"
        )


def _build(
    batch: Batch,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    out: TreeVerifyMetadataBuffers | None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None,
    backend: Backend,
    validate: bool,
) -> TreeVerifyMetadata:
    """What both tree builders do once their inputs are checked: value checks, the host bound,
    the buffers (``out``, or fresh ones) and the one launch."""
    t = parents.shape[1] + 1
    batch.check_query_total(t)
    read = batch.reads_values(validate, parents, lengths)
    if read:
        _check_tree(parents, lengths)
        batch.check_values(t)
    max_k = batch.max_seq_len_k(seq_lens_cpu, t, read=read)
    if out is None:
        out = TreeVerifyMetadataBuffers.uninitialized(batch.allocate(), t)
    _run(batch, parents, lengths, out, backend)
    return TreeVerifyMetadata(
        batch.metadata(out.base, t, t, max_k),
        out.positions,
        out.tree_mask,
        out.retrive_index,
        out.retrive_next_token,
        out.retrive_next_sibling,
    )


def _run(
    batch: Batch,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    out: TreeVerifyMetadataBuffers,
    backend: Backend,
) -> None:
    """Dispatch one tree metadata build to the Triton kernel or the twin."""
    seq_lens, paging = batch.seq_lens, batch.paging
    tensors = (*batch.tensors, parents, lengths, out.positions)
    if resolve_backend(backend, *tensors) == "torch":
        tree_verify_metadata_ref(parents, lengths, seq_lens, out, paging)
        return
    padded_bs, n = out.padded_bs, parents.shape[1]
    base = out.base
    base_programs = max(1, cdiv(padded_bs, _BLOCK_ROWS))
    rtt = paging.req_to_token if paging is not None else seq_lens
    launch(
        _tree_verify_kernel,
        (max(base_programs, padded_bs),),
        parents,
        lengths,
        seq_lens,
        paging.req_pool_indices if paging is not None else seq_lens,
        rtt,
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
        rtt.shape[1] if paging is not None else 0,
        base.page_table.shape[1] if base.page_table is not None else 0,
        batch.page_size,
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


def build_tree_verify_metadata(
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> TreeVerifyMetadata:
    """Tree TARGET_VERIFY metadata for ``bs = len(seq_lens)`` draft trees of ``N`` nodes each.

    ``parents [bs, N]`` and ``lengths [bs]`` follow :class:`~specstrat.drafting.DraftTree`; every
    row verifies ``T = N + 1`` tokens (the root, then the nodes). With ``paging`` the page table
    is built too; ``seq_lens_cpu`` gives the host bound ``max_seq_len_k``. Values are checked on
    CPU tensors, and on CUDA tensors only with ``validate=True`` (there the checks are host
    syncs). One launch on the Triton path.
    """
    batch = check_batch(seq_lens, paging)
    parents, lengths = _tree(batch, parents, lengths)
    return _build(batch, parents, lengths, None, seq_lens_cpu, backend, validate)


def build_tree_verify_metadata_into(
    buffers: TreeVerifyMetadataBuffers,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> TreeVerifyMetadata:
    """Graph form: write tree metadata for ``len(seq_lens) <= buffers.padded_bs`` trees in place.

    ``buffers`` come from :meth:`TreeVerifyMetadataBuffers.allocate` with ``tokens_per_req =
    parents.shape[1] + 1`` and hold a page table exactly when ``paging`` is given. Rows past the
    real batch are padding (see the module docstring). On the Triton path this is one launch, no
    allocation, no host sync; ``validate=True`` adds the value checks of
    :func:`build_tree_verify_metadata` (host syncs), which always run on CPU tensors.
    """
    if not isinstance(buffers, TreeVerifyMetadataBuffers):
        raise InvalidConfig(
            f"buffers={type(buffers).__name__}; pass "
            "TreeVerifyMetadataBuffers.allocate(padded_bs, tokens_per_req, ...)"
        )
    batch = check_batch(seq_lens, paging, buffers.base, table="buffers.base.page_table")
    parents, lengths = _tree(batch, parents, lengths)
    if (t := parents.shape[1] + 1) != buffers.tokens_per_req:
        raise InvalidConfig(
            f"parents.shape[1]={t - 1} gives T={t} tokens per request but the buffers hold "
            f"tokens_per_req={buffers.tokens_per_req}; allocate them with tokens_per_req = N + 1"
        )
    return _build(batch, parents, lengths, buffers, seq_lens_cpu, backend, validate)
