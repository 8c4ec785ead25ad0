"""Tree TARGET_VERIFY: hypothesis strategies for draft trees and verify batches, and an invariant
checker for any tree metadata object.

A user property-tests their own tree metadata builder in three lines::

    @given(tree_verify_batches())
    def test_my_tree_metadata(batch):
        check_tree_verify_metadata(batch.build(), batch)

:func:`check_tree_verify_metadata` states every invariant from the definitions (walking the
parents on the host, never calling the twin), so it judges the kernel, the twin and a user's own
builder alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from specstrat.drafting import DraftTree
from specstrat.errors import ConformanceError, InvalidConfig
from specstrat.kernels import (
    Backend,
    Paging,
    TreeVerifyMetadata,
    TreeVerifyMetadataBuffers,
    build_tree_verify_metadata,
    build_tree_verify_metadata_into,
)
from specstrat.testing.invariants import VerifyBatch, check_verify_metadata

__all__ = [
    "TreeForm",
    "TreeVerifyBatch",
    "check_tree_verify_metadata",
    "draft_trees",
    "tree_verify_batches",
]

TreeForm = Literal["uniform", "graph"]
_SHAPES = ("random", "chain", "star", "eagle")


@st.composite
def _parent_rows(draw: st.DrawFn, bs: int, n: int) -> list[list[int]]:
    """``bs`` rows of ``n`` parents in the DraftTree convention, each row of a drawn shape:
    a chain, a star under the root, EAGLE-style top-k levels, or any parents at all."""
    rows = []
    for _ in range(bs):
        shape = draw(st.sampled_from(_SHAPES))
        if shape == "chain":
            rows.append(list(range(-1, n - 1)))
        elif shape == "star":
            rows.append([-1] * n)
        elif shape == "eagle":
            # Level by level, as EAGLE expands top-k: topk children under one drawn node of the
            # previous level (the re-ranked tree keeps the rest of that level as leaves).
            topk = draw(st.integers(1, 4))
            row = [-1] * min(topk, n)
            level = list(range(len(row)))
            while len(row) < n:
                node = draw(st.sampled_from(level))
                grown = [node] * min(topk, n - len(row))
                level = list(range(len(row), len(row) + len(grown)))
                row += grown
            rows.append(row)
        else:
            rows.append([draw(st.integers(-1, j - 1)) for j in range(n)])
    return rows


@st.composite
def draft_trees(
    draw: st.DrawFn, *, max_bs: int = 8, max_nodes: int = 12, min_bs: int = 0
) -> DraftTree:
    """A :class:`~specstrat.drafting.DraftTree` of ``min_bs..max_bs`` rows of ``0..max_nodes``
    nodes: chains, stars, EAGLE-style levels and arbitrary trees, with drawn real lengths."""
    bs = draw(st.integers(min_bs, max_bs))
    n = draw(st.integers(0, max_nodes))
    parents = torch.tensor(draw(_parent_rows(bs, n)), dtype=torch.int64).reshape(bs, n)
    full = st.just(n)
    lengths = draw(st.lists(st.one_of(full, st.integers(0, n)), min_size=bs, max_size=bs))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    tokens = torch.randint(0, 256, (bs, n), generator=gen)
    return DraftTree(tokens, parents, torch.tensor(lengths, dtype=torch.int64).reshape(bs))


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeVerifyBatch:
    """Inputs of one tree TARGET_VERIFY metadata build: uniform (``padded_bs`` None) or graph.

    ``parents [bs, N]`` and ``lengths [bs]`` follow :class:`~specstrat.drafting.DraftTree`;
    each row verifies ``T = N + 1`` tokens. ``paging`` is what the builder gets (``None``: no
    page table).
    """

    parents: torch.Tensor
    lengths: torch.Tensor
    seq_lens: torch.Tensor
    padded_bs: int | None = None
    paging: Paging | None = None

    def __post_init__(self) -> None:
        if self.padded_bs is not None and self.padded_bs < self.bs:
            raise InvalidConfig(f"padded_bs={self.padded_bs} must be >= bs={self.bs}")

    @property
    def bs(self) -> int:
        """Real requests in the batch."""
        return self.seq_lens.shape[0]

    @property
    def tokens_per_req(self) -> int:
        """``T = N + 1``: the root plus the draft nodes."""
        return self.parents.shape[1] + 1

    @property
    def form(self) -> TreeForm:
        """Which builder this batch is for."""
        return "uniform" if self.padded_bs is None else "graph"

    def verify_batch(self) -> VerifyBatch:
        """The uniform batch the tree metadata's ``base`` must satisfy (``T`` tokens per row).

        Stated as the graph form with ``padded_bs = bs`` for the uniform form, because ``T`` is
        known from the shape of ``parents`` even when ``bs == 0``.
        """
        return VerifyBatch(
            seq_lens=self.seq_lens,
            tokens_per_req=self.tokens_per_req,
            padded_bs=self.padded_bs if self.padded_bs is not None else self.bs,
            paging=self.paging,
        )

    def build(self, backend: Backend = "auto") -> TreeVerifyMetadata:
        """Run the library's builder for this batch's form (graph buffers start poisoned)."""
        seq_cpu = self.seq_lens.cpu()
        if self.padded_bs is None:
            return build_tree_verify_metadata(
                self.parents,
                self.lengths,
                self.seq_lens,
                paging=self.paging,
                seq_lens_cpu=seq_cpu,
                backend=backend,
            )
        max_pages = self.paging.max_pages if self.paging is not None else None
        buffers = TreeVerifyMetadataBuffers.allocate(
            self.padded_bs, self.tokens_per_req, max_pages=max_pages, device=self.seq_lens.device
        )
        # Poison the static buffers so a builder that skips a row or an entry is caught.
        base = buffers.base
        for tensor in (base.cu_seqlens_q, base.cache_seqlens, base.cu_seqlens_k, base.page_table):
            if tensor is not None:
                tensor.fill_(-7)
        for tensor in (
            buffers.positions,
            buffers.retrive_index,
            buffers.retrive_next_token,
            buffers.retrive_next_sibling,
        ):
            tensor.fill_(-7)
        buffers.tree_mask.fill_(True)
        return build_tree_verify_metadata_into(
            buffers,
            self.parents,
            self.lengths,
            self.seq_lens,
            paging=self.paging,
            seq_lens_cpu=seq_cpu,
            backend=backend,
        )


@st.composite
def tree_verify_batches(
    draw: st.DrawFn,
    *,
    forms: Sequence[TreeForm] = ("uniform", "graph"),
    max_bs: int = 8,
    max_nodes: int = 12,
    max_seq_len: int = 1 << 20,
    max_pad: int = 4,
    page_sizes: Sequence[int] = (1, 3, 16, 64),
) -> TreeVerifyBatch:
    """Tree TARGET_VERIFY inputs: a :func:`draft_trees` tree, long or paged contexts, and for the
    graph form up to ``max_pad`` padding rows. Paged batches draw a context of at most 4096
    tokens (the request-to-token table is materialised); unpaged ones reach ``max_seq_len``."""
    form = draw(st.sampled_from(list(forms)))
    tree = draw(draft_trees(max_bs=max_bs, max_nodes=max_nodes))
    bs, t = tree.parents.shape[0], tree.parents.shape[1] + 1
    paging = None
    if draw(st.booleans()):
        ctx = draw(st.integers(t + 1, 4096))
        pool = bs + draw(st.integers(1, 4))
        page_size = draw(st.sampled_from(list(page_sizes)))
        seqs = draw(st.lists(st.integers(0, ctx - t), min_size=bs, max_size=bs))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        rtt = torch.randint(0, 1 << 24, (pool, ctx), generator=gen, dtype=torch.int32)
        rpi = torch.randperm(pool, generator=gen)[:bs].to(torch.int64)
        paging = Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=page_size)
    else:
        seqs = draw(st.lists(st.integers(0, max_seq_len), min_size=bs, max_size=bs))
    return TreeVerifyBatch(
        parents=tree.parents,
        lengths=tree.lengths,
        seq_lens=torch.tensor(seqs, dtype=torch.int64).reshape(bs),
        padded_bs=bs + draw(st.integers(0, max_pad)) if form == "graph" else None,
        paging=paging,
    )


def _require(ok: bool, invariant: str, detail: str) -> None:
    if not ok:
        raise ConformanceError(f"tree verify metadata broke '{invariant}': {detail}")


def _ancestors(parent: list[int], i: int) -> list[int]:
    """Tokens above token ``i`` (nearest first), the root last, walking ``parent`` on the host."""
    up = []
    while parent[i] >= 0:
        i = parent[i]
        up.append(i)
    return up


def _walk(nxt: list[int], sib: list[int], node: int, t: int) -> list[int]:
    """The children of ``node`` as the links enumerate them (stops after ``t`` to catch cycles)."""
    out: list[int] = []
    child = nxt[node]
    while child != -1 and len(out) <= t:
        out.append(child)
        child = sib[child] if 0 <= child < t else -1
    return out


def check_tree_verify_metadata(meta: TreeVerifyMetadata, batch: TreeVerifyBatch) -> None:
    """Assert every tree TARGET_VERIFY invariant of ``meta`` for ``batch``; raise naming the first
    broken (:class:`~specstrat.errors.ConformanceError`).

    Dtypes and shapes; ``base`` keeps every :func:`~specstrat.testing.check_verify_metadata`
    invariant with ``T = N + 1`` tokens; the mask row of each token is itself plus its ancestors;
    ``position = seq_len + depth``; ``retrive_index = b * T + i``; ``next_token``/``next_sibling``
    enumerate exactly each live token's live children in index order (filler is linked nowhere
    and links nowhere); every root-to-leaf walk is a chain of parent links that reaches each live
    token once; padding rows have position 0, a diagonal-plus-root mask and no links.
    """
    bs, t = batch.bs, batch.tokens_per_req
    padded_bs = batch.padded_bs if batch.padded_bs is not None else bs
    want = {
        "positions": (torch.int64, (padded_bs * t,)),
        "tree_mask": (torch.bool, (padded_bs, t, t)),
        "retrive_index": (torch.int64, (padded_bs, t)),
        "retrive_next_token": (torch.int64, (padded_bs, t)),
        "retrive_next_sibling": (torch.int64, (padded_bs, t)),
    }
    for name, (dtype, shape) in want.items():
        tensor = getattr(meta, name)
        _require(
            tensor.dtype == dtype and tuple(tensor.shape) == shape,
            f"{name} is {dtype} of shape {shape}",
            f"{tensor.dtype} {tuple(tensor.shape)}",
        )
    check_verify_metadata(meta.base, batch.verify_batch())
    mask = meta.tree_mask.cpu()
    positions = meta.positions.cpu().view(padded_bs, t).tolist()
    index = meta.retrive_index.cpu().tolist()
    nxt_rows = meta.retrive_next_token.cpu().tolist()
    sib_rows = meta.retrive_next_sibling.cpu().tolist()
    parents, lengths = batch.parents.cpu().tolist(), batch.lengths.cpu().tolist()
    seqs = batch.seq_lens.cpu().tolist()
    for b in range(bs):
        parent = [-1] + [p + 1 for p in parents[b]]
        live = lengths[b] + 1
        for i in range(t):
            above = _ancestors(parent, i)
            row = torch.zeros(t, dtype=torch.bool)
            row[[i, *above]] = True
            _require(
                torch.equal(mask[b, i], row),
                "a token sees exactly itself and its ancestors",
                f"tree_mask[{b}, {i}]={mask[b, i].int().tolist()}, want {row.int().tolist()}",
            )
            _require(
                positions[b][i] == seqs[b] + len(above),
                "position = seq_len + depth",
                f"row {b} token {i}: {positions[b][i]}, want {seqs[b]} + {len(above)}",
            )
            _require(
                index[b][i] == b * t + i,
                "retrive_index = b * T + i",
                f"retrive_index[{b}, {i}]={index[b][i]}",
            )
        _check_links(b, parent, live, nxt_rows[b], sib_rows[b])
    eye = torch.eye(t, dtype=torch.bool)
    eye[:, 0] = True
    for b in range(bs, padded_bs):
        _require(
            torch.equal(mask[b], eye) and positions[b] == [0] * t,
            "a padding row has position 0 and sees itself and the root",
            f"row {b}: positions {positions[b]}, mask {mask[b].int().tolist()}",
        )
        links = (index[b], nxt_rows[b], sib_rows[b])
        _require(
            all(v == [-1] * t for v in links), "a padding row has no links", f"row {b}: {links}"
        )


def _check_links(b: int, parent: list[int], live: int, nxt: list[int], sib: list[int]) -> None:
    """next_token/next_sibling of row ``b``: chain walks first (they name a link that skips or
    jumps across the tree), then the exact children lists and the unlinked filler."""
    t = len(parent)
    # Depth-first over the links from the root: each root-to-leaf walk is a chain of consecutive
    # parent links, and the walks reach every live token exactly once (a revisit ends the walk).
    seen, stack = [0], [[0]]
    while stack and len(seen) <= t:
        path = stack.pop()
        for child in _walk(nxt, sib, path[-1], t):
            _require(
                0 <= child < t and parent[child] == path[-1],
                "every root-to-leaf walk is a chain of the draft",
                f"row {b}: walk {[*path, child]} steps to token {child}, which does not hang "
                f"under {path[-1]}",
            )
            seen.append(child)
            stack.append([*path, child])
    _require(
        sorted(seen) == list(range(live)),
        "the walks reach every live token exactly once",
        f"row {b}: reached {sorted(seen)}, live tokens 0..{live - 1}",
    )
    for i in range(t):
        want = [k for k in range(1, live) if parent[k] == i] if i < live else []
        got = _walk(nxt, sib, i, t)
        _require(
            got == want,
            "next_token/next_sibling enumerate exactly the live children in index order",
            f"row {b} token {i}: links give {got}, want {want}",
        )
        if i >= live or i == 0:
            _require(
                sib[i] == -1,
                "the root and filler have no next sibling",
                f"row {b} token {i}: next_sibling {sib[i]}",
            )
