"""Hypothesis strategies for speculative-decoding inputs: draft widths, slots, relay payloads,
prebuilt disaggregation batches and TARGET_VERIFY batches.

A user property-tests their own verify policy in three lines::

    @given(verify_batches(policy=MyVerifyPolicy()))
    def test_my_policy_metadata(batch):
        check_verify_metadata(batch.build(), batch)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from specstrat.algorithm import Capabilities
from specstrat.batch import PrebuiltBatch
from specstrat.kernels import Paging
from specstrat.protocols import TargetVerifyPolicy
from specstrat.relay import RelayPayload
from specstrat.testing.invariants import Form, VerifyBatch

__all__ = [
    "num_draft_tokens",
    "prebuilt_batches",
    "relay_payloads",
    "slot_tensors",
    "verify_batches",
]

_FORMS: tuple[Form, ...] = ("uniform", "graph", "ragged", "ragged_graph")


def num_draft_tokens(max_value: int = 16) -> st.SearchStrategy[int]:
    """Draft widths ``D`` in ``1..max_value``."""
    return st.integers(1, max_value)


def slot_tensors(
    max_running_requests: int, *, min_size: int = 0
) -> st.SearchStrategy[torch.Tensor]:
    """Distinct request-pool slots in ``1..max_running_requests`` (int64, any order)."""
    return st.lists(
        st.integers(1, max_running_requests),
        min_size=min_size,
        max_size=max_running_requests,
        unique=True,
    ).map(lambda xs: torch.tensor(xs, dtype=torch.int64))


@st.composite
def relay_payloads(
    draw: st.DrawFn,
    rows: int,
    *,
    topk: int = 2,
    hidden: int = 4,
    fields: Sequence[str] = ("bonus_tokens", "seq_lens", "topk_p", "topk_index", "hidden_states"),
) -> RelayPayload:
    """A RelayPayload of ``rows`` rows holding a drawn non-empty subset of ``fields``."""
    chosen = draw(st.lists(st.sampled_from(list(fields)), min_size=1, unique=True))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    make = {
        "bonus_tokens": lambda: torch.randint(0, 256, (rows,), generator=gen),
        "seq_lens": lambda: torch.randint(1, 4096, (rows,), generator=gen),
        "topk_p": lambda: torch.rand(rows, topk, generator=gen),
        "topk_index": lambda: torch.randint(0, 256, (rows, topk), generator=gen),
        "hidden_states": lambda: torch.randn(rows, hidden, generator=gen),
    }
    return RelayPayload(**{name: make[name]() for name in chosen})


@st.composite
def prebuilt_batches(
    draw: st.DrawFn,
    capabilities: Capabilities | None = None,
    *,
    max_bs: int = 8,
    topk: int = 2,
    hidden: int = 4,
) -> PrebuiltBatch:
    """A received decode batch carrying the fields ``capabilities`` say travel (default: all)."""
    caps = capabilities or Capabilities(
        has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True
    )
    bs = draw(st.integers(0, max_bs))
    slots = draw(slot_tensors(max_bs * 2, min_size=bs).map(lambda t: t[:bs]))
    seq_lens = torch.tensor(draw(st.lists(st.integers(1, 4096), min_size=bs, max_size=bs)))
    payload = draw(relay_payloads(bs, topk=topk, hidden=hidden, fields=("topk_p",)))
    travel_topk = caps.need_topk or caps.carries_draft_hidden_states
    return PrebuiltBatch(
        rids=tuple(f"r{i}" for i in range(bs)),
        slots=slots,
        seq_lens=seq_lens.to(torch.int64),
        topk_p=payload.topk_p if travel_topk else None,
        topk_index=torch.zeros(bs, topk, dtype=torch.int64) if travel_topk else None,
        hidden_states=torch.ones(bs, hidden) if caps.carries_draft_hidden_states else None,
    )


@st.composite
def verify_batches(
    draw: st.DrawFn,
    *,
    policy: TargetVerifyPolicy | None = None,
    forms: Sequence[Form] = _FORMS,
    max_bs: int = 64,
    max_seq_len: int = 1 << 20,
    max_draft_tokens: int = 8,
    max_pad: int = 16,
    page_sizes: Sequence[int] = (1, 3, 16, 64),
) -> VerifyBatch:
    """TARGET_VERIFY inputs: bs from 0, long or paged contexts, T from ``policy`` (if any).

    With a ``policy``, ``T = policy.get_num_tokens_per_req_for_target_verify(D, is_draft_worker)``
    for a drawn ``D`` and worker, so T may differ from D. Paged batches draw a context of at most
    4096 tokens (the request-to-token table is materialised); unpaged ones reach ``max_seq_len``.
    Ragged and ragged-graph token counts are drawn in ``1..D + 1``. A ragged-graph batch adds up to
    ``max_pad`` padding rows and a token bucket of ``sum(num_tokens_per_req)`` plus up to ``D + 1``
    tokens per padding row (none without padding rows), so padding rows of 0 tokens are drawn too.
    """
    form = draw(st.sampled_from(list(forms)))
    bs = draw(st.integers(0, max_bs))
    d = draw(st.integers(1, max_draft_tokens))
    if policy is not None:
        worker = draw(st.booleans()) if policy.supports_target_verify_for_draft() else False
        t = policy.get_num_tokens_per_req_for_target_verify(d, worker)
    else:
        t = draw(st.integers(1, d + 1))
    ragged = None
    if form in ("ragged", "ragged_graph"):
        counts = draw(st.lists(st.integers(1, d + 1), min_size=bs, max_size=bs))
        ragged = torch.tensor(counts, dtype=torch.int64)
    widest = d + 1 if ragged is not None else t
    paging = None
    if draw(st.booleans()):
        ctx = draw(st.integers(widest + 1, 4096))
        pool = bs + draw(st.integers(1, 4))
        page_size = draw(st.sampled_from(list(page_sizes)))
        seqs = draw(st.lists(st.integers(0, ctx - widest), min_size=bs, max_size=bs))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        rtt = torch.randint(0, 1 << 24, (pool, ctx), generator=gen, dtype=torch.int32)
        rpi = torch.randperm(pool, generator=gen)[:bs].to(torch.int64)
        paging = Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=page_size)
    else:
        seqs = draw(st.lists(st.integers(0, max_seq_len), min_size=bs, max_size=bs))
    padded_bs = padded_tokens = None
    if form == "graph":
        padded_bs = bs + draw(st.integers(0, max_pad))
    elif form == "ragged_graph" and ragged is not None:
        pad = draw(st.integers(0, max_pad))
        padded_bs = bs + pad
        padded_tokens = int(ragged.sum()) + draw(st.integers(0, pad * (d + 1)))
    return VerifyBatch(
        seq_lens=torch.tensor(seqs, dtype=torch.int64),
        tokens_per_req=None if ragged is not None else t,
        num_tokens_per_req=ragged,
        padded_bs=padded_bs,
        padded_tokens=padded_tokens,
        paging=paging,
        num_draft_tokens=d if policy is not None else None,
    )
