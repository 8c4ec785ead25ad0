"""Value checks of the kernel launchers: garbage inputs are named InvalidConfig, valid ones
unchanged."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specstrat import InvalidConfig
from specstrat.kernels import (
    Backend,
    Paging,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_ragged_verify_metadata_into,
    build_verify_metadata,
    build_verify_metadata_into,
    gather_relay,
)
from specstrat.relay import RelayPayload

I64 = torch.int64
BIG = 2**31  # one past the int32 max
SEQ = torch.tensor([3, 4, 9])
RPI = torch.tensor([2, 0, 1])
RTT = torch.arange(4 * 64, dtype=torch.int32).reshape(4, 64)
PAGING = Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=8)
NARROW = replace(PAGING, req_to_token=RTT[:, :12].contiguous())


def with_pool_rows(rows: list[int]) -> Paging:
    """PAGING reading the pool rows ``rows`` instead."""
    return replace(PAGING, req_pool_indices=torch.tensor(rows))


def graph(
    seq: torch.Tensor, t: int, *, padded_bs: int = 4, pages: int | None = None, **kw: Any
) -> VerifyMetadata:
    """Graph form into fresh buffers (``paging.max_pages`` columns unless ``pages`` says)."""
    if pages is None and kw.get("paging") is not None:
        pages = kw["paging"].max_pages
    buffers = VerifyMetadataBuffers.allocate(padded_bs, max_pages=pages)
    return build_verify_metadata_into(buffers, seq, tokens_per_req=t, **kw)


def ragged(seq: torch.Tensor, ntok: torch.Tensor | None = None, **kw: Any) -> VerifyMetadata:
    """Ragged form with one token per request unless ``ntok`` says otherwise."""
    return build_ragged_verify_metadata(seq, torch.ones_like(seq) if ntok is None else ntok, **kw)


def bucketed(
    seq: torch.Tensor,
    ntok: torch.Tensor | None = None,
    *,
    padded_bs: int = 5,
    padded_tokens: int = 12,
    pages: int | None = None,
    **kw: Any,
) -> VerifyMetadata:
    """Ragged graph form into fresh buffers (one token per request unless ``ntok`` says)."""
    if pages is None and kw.get("paging") is not None:
        pages = kw["paging"].max_pages
    buffers = VerifyMetadataBuffers.allocate(padded_bs, max_pages=pages)
    widths = torch.ones_like(seq) if ntok is None else ntok
    return build_ragged_verify_metadata_into(
        buffers, seq, widths, padded_tokens=padded_tokens, **kw
    )


def relay(index: list[int], **kw: Any) -> RelayPayload:
    """Gather from a three-row relay."""
    source = RelayPayload(bonus_tokens=torch.arange(3), seq_lens=torch.arange(3))
    return gather_relay(source, torch.tensor(index), **kw)


# (id, call taking backend= and validate=, message); every class of garbage for every form.
CASES: list[tuple[str, Any, str]] = [
    (
        "uniform-negative-seq",
        lambda **kw: build_verify_metadata(torch.tensor([3, 4, -1]), num_tokens=6, **kw),
        r"seq_lens\[2\]=-1 is negative; sequence lengths are >= 0",
    ),
    (
        "graph-negative-seq",
        lambda **kw: graph(torch.tensor([-5, 4]), 2, **kw),
        r"seq_lens\[0\]=-5 is negative; sequence lengths are >= 0",
    ),
    (
        "ragged-negative-seq",
        lambda **kw: ragged(torch.tensor([3, -2]), **kw),
        r"seq_lens\[1\]=-2 is negative",
    ),
    (
        "ragged-zero-tokens",
        lambda **kw: ragged(SEQ, torch.tensor([1, 2, 0]), **kw),
        r"num_tokens_per_req\[2\]=0 is < 1; every request verifies >= 1 token",
    ),
    (
        "uniform-cache-past-int32",
        lambda **kw: build_verify_metadata(torch.tensor([5, BIG - 2]), num_tokens=4, **kw),
        r"cache_seqlens\[1\]=seq_lens\[1\] \+ tokens=2147483648 exceeds the int32 max 2147483647",
    ),
    (
        "uniform-cu-k-past-int32",
        lambda **kw: build_verify_metadata(torch.tensor([BIG // 2, BIG // 2]), num_tokens=2, **kw),
        (
            r"cu_seqlens_k\[-1\]=2147483650 \(sum of cache_seqlens\) "
            r"exceeds the int32 max 2147483647; split the batch"
        ),
    ),
    (
        "uniform-cu-q-past-int32",
        lambda **kw: build_verify_metadata(torch.tensor([0]), num_tokens=BIG, **kw),
        r"cu_seqlens_q\[-1\]=2147483648 \(query tokens of the batch\) exceeds the int32 max",
    ),
    (
        "graph-cu-q-past-int32-by-padding",
        lambda **kw: graph(torch.tensor([1]), BIG // 4, **kw),
        r"cu_seqlens_q\[-1\]=2147483648 \(query tokens of the padded batch\)",
    ),
    (
        "graph-cu-k-past-int32-by-padding",
        lambda **kw: graph(torch.tensor([BIG - 10]), 4, **kw),
        r"cu_seqlens_k\[-1\]=2147483654 \(sum of cache_seqlens\)",
    ),
    (
        "ragged-cache-past-int32",
        lambda **kw: ragged(torch.tensor([0, 7]), torch.tensor([1, BIG]), **kw),
        r"cache_seqlens\[1\]=seq_lens\[1\] \+ tokens=2147483655 exceeds the int32 max",
    ),
    (
        "ragged-cu-q-past-int32",
        lambda **kw: ragged(torch.tensor([0, 0]), torch.tensor([BIG // 2, BIG // 2]), **kw),
        r"cu_seqlens_q\[-1\]=2147483648 \(query tokens of the batch\)",
    ),
    (
        "uniform-page-id-past-int32",
        lambda **kw: build_verify_metadata(
            torch.tensor([1, 1]),
            num_tokens=2,
            paging=Paging(
                req_pool_indices=torch.tensor([0, 1]),
                req_to_token=torch.tensor([[0, 0, 0, 0], [8 * BIG, 0, 0, 0]]),
                page_size=8,
            ),
            **kw,
        ),
        r"req_to_token\[1, 0\]=17179869184 gives page id 2147483648, past the int32 max",
    ),
    (
        "uniform-req-to-token-narrow",
        lambda **kw: build_verify_metadata(SEQ, num_tokens=12, paging=NARROW, **kw),
        r"cache_seqlens\[2\]=13 \(seq_lens \+ tokens\) needs 13 KV indices \(2 pages of "
        r"page_size=8\) but req_to_token.shape\[1\]=12; widen req_to_token to >= 13 columns",
    ),
    (
        "graph-req-to-token-narrow",
        lambda **kw: graph(SEQ, 4, paging=NARROW, **kw),
        r"cache_seqlens\[2\]=13 \(seq_lens \+ tokens\) needs 13 KV indices \(2 pages of "
        r"page_size=8\) but req_to_token.shape\[1\]=12; widen req_to_token to >= 13 columns",
    ),
    (
        "graph-page-table-narrow",
        lambda **kw: graph(SEQ, 12, pages=2, paging=PAGING, **kw),
        r"row 2 needs 3 pages \(cache_seqlens\[2\]=21, page_size=8\) but buffers.page_table has "
        r"2 columns; allocate the buffers with max_pages >= 3",
    ),
    (
        "ragged-req-to-token-narrow",
        lambda **kw: ragged(SEQ, torch.tensor([1, 1, 4]), paging=NARROW, **kw),
        r"cache_seqlens\[2\]=13 .* req_to_token.shape\[1\]=12",
    ),
    (
        "graph-pool-index-out-of-range",
        lambda **kw: graph(SEQ, 2, paging=with_pool_rows([0, 4, 1]), **kw),
        r"req_pool_indices range 0\.\.4 is outside req_to_token's 4 rows",
    ),
    (
        "ragged-pool-index-negative",
        lambda **kw: ragged(SEQ, paging=with_pool_rows([0, -1, 1]), **kw),
        r"req_pool_indices range -1\.\.1 is outside req_to_token's 4 rows",
    ),
    (
        "uniform-mirror-disagrees",
        lambda **kw: build_verify_metadata(SEQ, num_tokens=3, seq_lens_cpu=[3, 5, 9], **kw),
        r"seq_lens_cpu\[1\]=5 but seq_lens\[1\]=4; the CPU mirror must be a copy of seq_lens",
    ),
    (
        "graph-mirror-disagrees",
        lambda **kw: graph(SEQ, 2, seq_lens_cpu=torch.tensor([3, 4, 10]), **kw),
        r"seq_lens_cpu\[2\]=10 but seq_lens\[2\]=9",
    ),
    (
        "ragged-seq-mirror-disagrees",
        lambda **kw: ragged(SEQ, seq_lens_cpu=[0, 4, 9], num_tokens_per_req_cpu=[1, 1, 1], **kw),
        r"seq_lens_cpu\[0\]=0 but seq_lens\[0\]=3",
    ),
    (
        "ragged-token-mirror-disagrees",
        lambda **kw: ragged(SEQ, seq_lens_cpu=SEQ, num_tokens_per_req_cpu=[1, 2, 1], **kw),
        r"num_tokens_per_req_cpu\[1\]=2 but num_tokens_per_req\[1\]=1",
    ),
    (
        "uniform-mirror-negative",
        lambda **kw: build_verify_metadata(SEQ, num_tokens=3, seq_lens_cpu=[3, -4, 9], **kw),
        r"seq_lens_cpu\[1\]=-4 must be >= 0",
    ),
    (
        "ragged-token-mirror-zero",
        lambda **kw: ragged(SEQ, num_tokens_per_req_cpu=[1, 0, 1], **kw),
        r"num_tokens_per_req_cpu\[1\]=0 must be >= 1",
    ),
    (
        "ragged-graph-negative-seq",
        lambda **kw: bucketed(torch.tensor([3, -2]), **kw),
        r"seq_lens\[1\]=-2 is negative",
    ),
    (
        "ragged-graph-zero-width-real-row",
        lambda **kw: bucketed(SEQ, torch.tensor([1, 0, 2]), **kw),
        r"num_tokens_per_req\[1\]=0 is < 1; every request verifies >= 1 token",
    ),
    (
        "ragged-graph-real-tokens-past-bucket",
        lambda **kw: bucketed(SEQ, torch.tensor([4, 4, 5]), **kw),
        r"num_tokens_per_req sums to 13 tokens, more than padded_tokens=12; pick the smallest "
        r"token bucket >= 13",
    ),
    (
        "ragged-graph-leftover-without-padding-row",
        lambda **kw: bucketed(SEQ, torch.tensor([1, 2, 3]), padded_bs=3, **kw),
        r"padded_tokens=12 leaves 6 tokens past the 6 real ones but padded_bs=bs=3 has no "
        r"padding row to take them; use buffers with padded_bs > bs, or padded_tokens=6",
    ),
    (
        "ragged-graph-cu-q-past-int32",
        lambda **kw: bucketed(SEQ, padded_tokens=BIG, **kw),
        r"cu_seqlens_q\[-1\]=2147483648 \(query tokens of the bucket\)",
    ),
    (
        "ragged-graph-cu-k-past-int32-by-padding",
        lambda **kw: bucketed(torch.tensor([BIG - 10]), padded_tokens=20, **kw),
        r"cu_seqlens_k\[-1\]=2147483658 \(sum of cache_seqlens\)",
    ),
    (
        "ragged-graph-req-to-token-narrow",
        lambda **kw: bucketed(SEQ, torch.tensor([1, 1, 4]), paging=NARROW, **kw),
        r"cache_seqlens\[2\]=13 .* req_to_token.shape\[1\]=12",
    ),
    (
        "ragged-graph-page-table-narrow",
        lambda **kw: bucketed(SEQ, torch.tensor([1, 1, 8]), pages=2, paging=PAGING, **kw),
        r"row 2 needs 3 pages \(cache_seqlens\[2\]=17, page_size=8\) but buffers.page_table "
        r"has 2 columns; allocate the buffers with max_pages >= 3",
    ),
    (
        "ragged-graph-token-mirror-disagrees",
        lambda **kw: bucketed(SEQ, seq_lens_cpu=SEQ, num_tokens_per_req_cpu=[1, 1, 2], **kw),
        r"num_tokens_per_req_cpu\[2\]=2 but num_tokens_per_req\[2\]=1",
    ),
    (
        "relay-index-past-rows",
        lambda **kw: relay([0, 5], **kw),
        r"index range 0\.\.5 is outside the source's 3 rows; every index must lie in 0\.\.2",
    ),
    (
        "relay-index-negative",
        lambda **kw: relay([-1, 2], **kw),
        r"index range -1\.\.2 is outside the source's 3 rows",
    ),
]

MODES: list[tuple[Backend, bool]] = [
    ("torch", False),
    ("torch", True),
    ("triton", False),
    ("triton", True),
]


def test_case_table_is_large_and_ids_unique() -> None:
    """The table covers at least 15 distinct garbage inputs, each id once."""
    ids = [c[0] for c in CASES]
    assert len(ids) >= 15
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(("backend", "validate"), MODES)
@pytest.mark.parametrize(("call", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_garbage_is_refused_by_name(
    call: Any, message: str, backend: Backend, validate: bool
) -> None:
    """On CPU tensors each garbage input is a named InvalidConfig, whatever backend and validate."""
    with pytest.raises(InvalidConfig, match=message):
        call(backend=backend, validate=validate)


@pytest.mark.parametrize("launcher", ["uniform", "graph", "ragged", "ragged_graph", "relay"])
def test_validate_must_be_a_bool(launcher: str) -> None:
    """validate='yes' is refused naming the value, in every launcher."""
    calls: dict[str, Callable[[], object]] = {
        "uniform": lambda: build_verify_metadata(SEQ, num_tokens=3, validate="yes"),  # type: ignore[arg-type]
        "graph": lambda: graph(SEQ, 1, validate="yes"),
        "ragged": lambda: ragged(SEQ, validate="yes"),
        "ragged_graph": lambda: bucketed(SEQ, validate="yes"),
        "relay": lambda: relay([0], validate="yes"),
    }
    with pytest.raises(InvalidConfig, match=r"validate='yes' must be True or False"):
        calls[launcher]()


def test_failed_check_leaves_graph_buffers_untouched() -> None:
    """The graph form checks before it writes: a refused build leaves the static buffers as they
    were."""
    buffers = VerifyMetadataBuffers.allocate(4, max_pages=2)
    for tensor in (buffers.cu_seqlens_q, buffers.cache_seqlens, buffers.cu_seqlens_k):
        tensor.fill_(-7)
    with pytest.raises(InvalidConfig, match=r"row 2 needs 3 pages"):
        build_verify_metadata_into(buffers, SEQ, tokens_per_req=12, paging=PAGING)
    assert (buffers.cache_seqlens == -7).all()
    assert (buffers.cu_seqlens_q == -7).all()


FIELDS = ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table")


def at_the_limits(form: str, backend: Backend, validate: bool) -> VerifyMetadata:
    """Valid inputs on every boundary: req_to_token exactly as wide as the longest row needs."""
    seq = torch.tensor([3, 4, 9, 0])
    # The longest row needs 9 + 4 = 13 slots, 2 pages: req_to_token is exactly that wide.
    tight = Paging(
        req_pool_indices=torch.tensor([2, 0, 1, 3]),
        req_to_token=RTT[:, :13].contiguous(),
        page_size=8,
    )
    kw: dict[str, Any] = {"backend": backend, "validate": validate, "paging": tight}
    if form == "uniform":
        return build_verify_metadata(seq, num_tokens=16, seq_lens_cpu=seq.tolist(), **kw)
    if form == "graph":
        return graph(seq, 4, padded_bs=6, pages=2, seq_lens_cpu=seq, **kw)
    ntok = torch.tensor([1, 4, 4, 2])
    if form == "ragged_graph":  # 11 real tokens, 5 leftover over 2 padding rows
        return bucketed(
            seq,
            ntok,
            padded_bs=6,
            padded_tokens=16,
            pages=2,
            seq_lens_cpu=seq,
            num_tokens_per_req_cpu=ntok.tolist(),
            **kw,
        )
    return ragged(seq, ntok, seq_lens_cpu=seq, num_tokens_per_req_cpu=ntok.tolist(), **kw)


@pytest.mark.parametrize("form", ["uniform", "graph", "ragged", "ragged_graph"])
def test_valid_inputs_give_identical_results(form: str) -> None:
    """Valid inputs on the limits build the same metadata on every backend, validate on or off."""
    base = at_the_limits(form, "torch", False)
    for backend, validate in MODES[1:]:
        other = at_the_limits(form, backend, validate)
        for name in FIELDS:
            assert torch.equal(getattr(base, name), getattr(other, name)), (name, backend)
        assert (base.max_seq_len_q, base.max_seq_len_k) == (
            other.max_seq_len_q,
            other.max_seq_len_k,
        )
    assert base.max_seq_len_k == 13
    assert base.page_table is not None
    assert base.page_table[2].tolist() == [64 // 8, 72 // 8]  # row 2 reads pool row 1: slots 64..


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_int32_max_itself_is_valid(backend: Backend) -> None:
    """A row of exactly 2**31 - 1 keys is accepted and written without wrapping."""
    meta = build_verify_metadata(torch.tensor([BIG - 3]), num_tokens=2, backend=backend)
    assert meta.cache_seqlens.tolist() == [BIG - 1]
    assert meta.cu_seqlens_k.tolist() == [0, BIG - 1]


class _FakeDeviceReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Answers host reads of meta tensors with 0, counting them (a device that holds valid data)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            self.reads += 1
            return 0
        return func(*args, **(kwargs or {}))


def on_meta(form: str, validate: bool) -> None:
    """One paged build (or relay gather) whose tensors live on the meta device."""
    dev = "meta"
    seq = torch.zeros(3, dtype=I64, device=dev)
    paging = Paging(
        req_pool_indices=torch.zeros(3, dtype=I64, device=dev),
        req_to_token=torch.zeros(4, 64, dtype=I64, device=dev),
        page_size=8,
    )
    kw: dict[str, Any] = {"paging": paging, "backend": "torch", "validate": validate}
    if form == "uniform":
        build_verify_metadata(seq, num_tokens=6, seq_lens_cpu=[0, 0, 0], **kw)
    elif form == "graph":
        buffers = VerifyMetadataBuffers.allocate(4, max_pages=8, device=dev)
        build_verify_metadata_into(buffers, seq, tokens_per_req=2, **kw)
    elif form == "ragged":
        ntok = torch.ones(3, dtype=I64, device=dev)
        build_ragged_verify_metadata(seq, ntok, num_tokens_per_req_cpu=[1, 1, 1], **kw)
    elif form == "ragged_graph":
        ntok = torch.ones(3, dtype=I64, device=dev)
        buffers = VerifyMetadataBuffers.allocate(4, max_pages=8, device=dev)
        build_ragged_verify_metadata_into(buffers, seq, ntok, padded_tokens=5, **kw)
    else:
        source = RelayPayload(bonus_tokens=torch.zeros(3, dtype=I64, device=dev))
        gather_relay(
            source, torch.zeros(2, dtype=I64, device=dev), backend="torch", validate=validate
        )


@pytest.mark.parametrize("form", ["uniform", "graph", "ragged", "ragged_graph", "relay"])
def test_validate_opts_in_to_device_reads(form: str) -> None:
    """Off the CPU the checks read device values only with validate=True (the default stays
    sync-free)."""
    quiet, checked = _FakeDeviceReads(), _FakeDeviceReads()
    with quiet:
        on_meta(form, validate=False)
    with checked:
        on_meta(form, validate=True)
    assert quiet.reads == 0
    assert checked.reads > 0
