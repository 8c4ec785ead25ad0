"""Bucketed ragged TARGET_VERIFY metadata: Triton body (interpreted) == twin, SGLang's padding
rule."""

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from torch.utils._python_dispatch import TorchDispatchMode

import specstrat.kernels._verify_inputs as verify_inputs
from specstrat import ConformanceError, InvalidConfig
from specstrat.kernels import (
    PAD_PAGE,
    Paging,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_ragged_verify_metadata_into,
)
from specstrat.testing import VerifyBatch, check_verify_metadata, verify_batches
from tests.kernels.test_verify_metadata import assert_same, both, counting_launches

# bs 0 and 1, non-powers of two, and 257 rows plus padding (three row blocks of 128).
BATCH_SIZES = [0, 1, 3, 7, 64, 257]
# Padding rows and, per padding row, how many leftover tokens: 0 (every padding row width 0),
# 0.5 (fewer tokens than padding rows: some get 1, the rest 0) and 3.
PADS = [1, 5, 130]
LEFTOVER_PER_PAD = [0.0, 0.5, 3.0]


def bucket(
    bs: int, pad: int, per_pad: float, *, seed: int, page_size: int = 4, max_width: int = 5
) -> VerifyBatch:
    """A paged ragged-graph batch with ``pad`` padding rows and ``int(pad * per_pad)`` leftover."""
    gen = torch.Generator().manual_seed(seed)
    ctx, pool = 200, bs + 3
    widths = torch.randint(1, max_width + 1, (bs,), generator=gen)
    seq_lens = torch.randint(0, ctx - max_width + 1, (bs,), generator=gen)
    rpi = torch.randperm(pool, generator=gen)[:bs]
    rtt = torch.randint(0, 1 << 20, (pool, ctx), generator=gen, dtype=torch.int32)
    return VerifyBatch(
        seq_lens=seq_lens,
        num_tokens_per_req=widths,
        padded_bs=bs + pad,
        padded_tokens=int(widths.sum()) + int(pad * per_pad),
        paging=Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=page_size),
    )


@pytest.mark.parametrize("per_pad", LEFTOVER_PER_PAD)
@pytest.mark.parametrize("pad", PADS[:2])
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_table(bs: int, pad: int, per_pad: float) -> None:
    """Every shape, padding and leftover: kernel == twin on poisoned buffers, invariants hold."""
    meta = both(bucket(bs, pad, per_pad, seed=bs * 7 + pad))
    assert meta.padded_bs == bs + pad
    assert meta.page_table is not None
    assert (meta.page_table[bs:] == PAD_PAGE).all()


@pytest.mark.slow
@pytest.mark.parametrize("per_pad", LEFTOVER_PER_PAD)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_table_many_padding_rows(bs: int, per_pad: float) -> None:
    """130 padding rows, so padding spans row blocks: kernel == twin, invariants hold."""
    both(bucket(bs, PADS[2], per_pad, seed=bs, page_size=16))


def test_no_padding_row_and_an_exact_bucket() -> None:
    """padded_bs == bs with padded_tokens == sum(widths) is the plain ragged form, in place."""
    batch = bucket(7, 0, 0.0, seed=3)
    meta = both(batch)
    assert batch.num_tokens_per_req is not None
    plain = build_ragged_verify_metadata(
        batch.seq_lens, batch.num_tokens_per_req, paging=batch.paging
    )
    for name in ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table"):
        assert torch.equal(getattr(meta, name), getattr(plain, name)), name


@given(verify_batches(forms=("ragged_graph",)))
def test_property(batch: VerifyBatch) -> None:
    """Any ragged-graph batch: kernel == twin, every invariant holds."""
    both(batch)


@pytest.mark.slow
@settings(max_examples=100)
@given(verify_batches(forms=("ragged_graph",), max_bs=300, max_pad=200, max_seq_len=1 << 16))
def test_property_across_row_blocks(batch: VerifyBatch) -> None:
    """Batches and padding spanning several 128-row blocks: kernel == twin, invariants hold."""
    both(batch)


def hand(backend: Any, **kw: Any) -> VerifyMetadata:
    """Widths [2, 1, 3] after prefixes [3, 5, 0], in a bucket of 6 rows (page size 2)."""
    rtt = torch.arange(8 * 16, dtype=torch.int32).reshape(8, 16)
    bufs = VerifyMetadataBuffers.allocate(6, max_pages=8)
    return build_ragged_verify_metadata_into(
        bufs,
        torch.tensor([3, 5, 0]),
        torch.tensor([2, 1, 3]),
        paging=Paging(req_pool_indices=torch.tensor([1, 2, 3]), req_to_token=rtt, page_size=2),
        seq_lens_cpu=[3, 5, 0],
        num_tokens_per_req_cpu=[2, 1, 3],
        backend=backend,
        **kw,
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_leftover_spread_over_padding_rows(backend: Any) -> None:
    """8 leftover tokens over 3 padding rows are 3, 3, 2 (SGLang's base + 1 for the first rem)."""
    meta = hand(backend, padded_tokens=14)
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3, 6, 9, 12, 14]
    assert meta.cache_seqlens.tolist() == [5, 6, 3, 3, 3, 2]
    assert meta.cu_seqlens_k.tolist() == [0, 5, 11, 14, 17, 20, 22]
    assert meta.page_table is not None
    assert meta.page_table[:3, :4].tolist() == [[8, 9, 10, 0], [16, 17, 18, 0], [24, 25, 0, 0]]
    assert (meta.page_table[3:] == PAD_PAGE).all()
    assert (meta.max_seq_len_q, meta.max_seq_len_k, meta.tokens_per_req) == (3, 6, None)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padding_row_of_width_zero(backend: Any) -> None:
    """1 leftover token over 3 padding rows: widths 1, 0, 0; a 0-width row repeats its offset."""
    meta = hand(backend, padded_tokens=7)
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3, 6, 7, 7, 7]
    assert meta.cache_seqlens.tolist() == [5, 6, 3, 1, 0, 0]
    assert meta.cu_seqlens_k.tolist() == [0, 5, 11, 14, 15, 15, 15]
    assert (meta.max_seq_len_q, meta.max_seq_len_k) == (3, 6)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_all_padding(backend: Any) -> None:
    """bs=0 in a bucket of 3 rows and 4 tokens: widths 2, 1, 1, no page but PAD_PAGE."""
    bufs = VerifyMetadataBuffers.allocate(3, max_pages=2)
    empty = torch.zeros(0, dtype=torch.int64)
    meta = build_ragged_verify_metadata_into(
        bufs,
        empty,
        empty,
        padded_tokens=4,
        paging=Paging(req_pool_indices=empty, req_to_token=torch.ones(2, 4, dtype=torch.int32)),
        num_tokens_per_req_cpu=[],
        seq_lens_cpu=[],
        backend=backend,
    )
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3, 4]
    assert meta.cache_seqlens.tolist() == [2, 1, 1]
    assert (meta.bs, meta.max_seq_len_q, meta.max_seq_len_k) == (0, 2, 2)
    assert meta.page_table is not None
    assert (meta.page_table == PAD_PAGE).all()


def test_bounds_need_the_mirrors() -> None:
    """max_seq_len_q needs the token mirror, max_seq_len_k both; a padding row may set them."""
    seq, ntok = torch.tensor([0, 1]), torch.tensor([1, 1])
    kw: dict[str, Any] = {"padded_tokens": 9}
    bare = build_ragged_verify_metadata_into(VerifyMetadataBuffers.allocate(3), seq, ntok, **kw)
    assert (bare.max_seq_len_q, bare.max_seq_len_k) == (None, None)
    tok_only = build_ragged_verify_metadata_into(
        VerifyMetadataBuffers.allocate(3), seq, ntok, num_tokens_per_req_cpu=[1, 1], **kw
    )
    assert (tok_only.max_seq_len_q, tok_only.max_seq_len_k) == (7, None)
    full = build_ragged_verify_metadata_into(
        VerifyMetadataBuffers.allocate(3),
        seq,
        ntok,
        seq_lens_cpu=[0, 1],
        num_tokens_per_req_cpu=[1, 1],
        **kw,
    )
    assert (full.max_seq_len_q, full.max_seq_len_k) == (7, 7)


def test_unchecked_on_device_follows_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the widths go unread (CUDA without validate), kernel and twin agree on SGLang's rule:
    with no padding row the last real row takes the leftover; past the bucket, padding gets 0."""
    monkeypatch.setattr(verify_inputs, "reads_values", lambda validate, *tensors: False)
    seq = torch.tensor([4, 2, 9])
    cases = [(3, torch.tensor([1, 2, 1]), 7), (5, torch.tensor([3, 3, 3]), 6)]
    results = []
    for padded_bs, ntok, padded_tokens in cases:
        for backend in ("torch", "triton"):
            bufs = VerifyMetadataBuffers.allocate(padded_bs)
            results.append(
                build_ragged_verify_metadata_into(
                    bufs, seq, ntok, padded_tokens=padded_tokens, backend=backend
                )
            )
    assert_same(results[0], results[1])
    assert_same(results[2], results[3])
    assert results[0].cu_seqlens_q.tolist() == [0, 1, 3, 7]
    assert results[2].cu_seqlens_q.tolist() == [0, 3, 6, 9, 9, 9]


def build(device: str, backend: Any, mirrors: bool) -> VerifyMetadata:
    """One paged ragged-graph build on ``device``."""
    seq = torch.tensor([5, 9, 2, 40], device=device)
    ntok = torch.tensor([1, 2, 3, 4], device=device)
    host: dict[str, Any] = {}
    if mirrors:
        host = {"seq_lens_cpu": [5, 9, 2, 40], "num_tokens_per_req_cpu": [1, 2, 3, 4]}
    return build_ragged_verify_metadata_into(
        VerifyMetadataBuffers.allocate(8, max_pages=8, device=device),
        seq,
        ntok,
        padded_tokens=16,
        paging=Paging(
            req_pool_indices=torch.tensor([3, 0, 2, 1], device=device),
            req_to_token=torch.arange(4 * 64, dtype=torch.int32, device=device).reshape(4, 64),
            page_size=8,
        ),
        backend=backend,
        **host,
    )


def test_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton path, page table and padding widths included, is exactly one kernel launch."""
    with counting_launches(monkeypatch) as launches:
        build("cpu", "triton", mirrors=True)
    assert len(launches) == 1


class _DeviceReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts host reads of tensors off the CPU (reads of the CPU mirrors are free)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type != "cpu":
            self.reads += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mirrors", [False, True])
def test_no_host_read_of_device_data(mirrors: bool) -> None:
    """On a non-CPU device nothing is read back; the host bounds come from the mirrors alone."""
    counter = _DeviceReads()
    with counter:
        meta = build("meta", "torch", mirrors)
    assert counter.reads == 0
    assert meta.cu_seqlens_q.device.type == "meta"
    assert (meta.max_seq_len_q, meta.max_seq_len_k) == ((4, 44) if mirrors else (None, None))


def test_the_mirror_alone_catches_a_batch_past_the_bucket() -> None:
    """Off the CPU, without validate, the token mirror still refuses widths past the bucket."""
    seq = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(
        InvalidConfig, match=r"num_tokens_per_req_cpu sums to 7 tokens, more than padded_tokens=6"
    ):
        build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4, device="meta"),
            seq,
            torch.ones(2, dtype=torch.int64, device="meta"),
            padded_tokens=6,
            num_tokens_per_req_cpu=[3, 4],
            backend="torch",
        )


SEQ = torch.tensor([3, 4])
NTOK = torch.tensor([1, 2])


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


ERRORS: list[tuple[str, Any, str]] = [
    (
        "fewer-tokens-than-rows",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4), SEQ, NTOK, padded_tokens=1
        ),
        r"padded_tokens=1 is less than bs=2; every real row verifies >= 1 token",
    ),
    (
        "padded-tokens-negative",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4), SEQ, NTOK, padded_tokens=-1
        ),
        r"padded_tokens=-1 must be >= 0",
    ),
    (
        "padded-tokens-float",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4), SEQ, NTOK, padded_tokens=loose(8.0)
        ),
        r"padded_tokens=8.0 must be an int >= 0",
    ),
    (
        "bucket-rows-too-few",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(1), SEQ, NTOK, padded_tokens=8
        ),
        r"bs=2 exceeds the buffers' padded_bs=1; pick the smallest captured bucket",
    ),
    (
        "empty-bucket-with-tokens",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(0), SEQ[:0], NTOK[:0], padded_tokens=2
        ),
        r"padded_tokens=2 leaves 2 tokens past the 0 real ones but padded_bs=bs=0",
    ),
    (
        "widths-rows",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4), SEQ, NTOK[:1], padded_tokens=8
        ),
        r"num_tokens_per_req has 1 rows; expected 2",
    ),
    (
        "buffers-type",
        lambda: build_ragged_verify_metadata_into(loose([]), SEQ, NTOK, padded_tokens=8),
        r"buffers=list; pass VerifyMetadataBuffers.allocate",
    ),
    (
        "buffers-missing-pages",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4),
            SEQ,
            NTOK,
            padded_tokens=8,
            paging=Paging(
                req_pool_indices=torch.tensor([0, 1]),
                req_to_token=torch.zeros(2, 8, dtype=torch.int32),
            ),
        ),
        r"buffers.page_table is None but paging was given",
    ),
    (
        "token-mirror-length",
        lambda: build_ragged_verify_metadata_into(
            VerifyMetadataBuffers.allocate(4),
            SEQ,
            NTOK,
            padded_tokens=8,
            num_tokens_per_req_cpu=[1],
        ),
        r"num_tokens_per_req_cpu has 1 entries; expected bs=2",
    ),
]


@pytest.mark.parametrize(("call", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_host_checks(call: Any, message: str) -> None:
    """Bad shapes and bucket sizes are refused with InvalidConfig naming the value and the fix."""
    with pytest.raises(InvalidConfig, match=message):
        call()


def test_padded_batch_description_is_checked() -> None:
    """VerifyBatch refuses padded_tokens without ragged widths and padding, and vice versa."""
    with pytest.raises(InvalidConfig, match=r"padded_tokens=4 is for the ragged graph form"):
        VerifyBatch(seq_lens=SEQ, tokens_per_req=2, padded_bs=3, padded_tokens=4)
    with pytest.raises(InvalidConfig, match=r"padded_bs=3 with num_tokens_per_req needs"):
        VerifyBatch(seq_lens=SEQ, num_tokens_per_req=NTOK, padded_bs=3)


def test_checker_catches_a_padding_row_that_keeps_t() -> None:
    """A builder that pads with the graph form's T (not the bucket's share) is caught by name."""
    batch = VerifyBatch(seq_lens=SEQ, num_tokens_per_req=NTOK, padded_bs=4, padded_tokens=4)
    meta = batch.build()
    wrong = torch.tensor([0, 1, 3, 5, 7], dtype=torch.int32)
    meta.buffers.cu_seqlens_q.copy_(wrong)
    with pytest.raises(ConformanceError, match=r"cu_seqlens_q steps by each row's tokens"):
        check_verify_metadata(meta, batch)


def test_failed_check_leaves_the_buffers_untouched() -> None:
    """A bucket too small for the real tokens is refused before anything is written."""
    buffers = VerifyMetadataBuffers.allocate(4)
    for tensor in (buffers.cu_seqlens_q, buffers.cache_seqlens, buffers.cu_seqlens_k):
        tensor.fill_(-7)
    with pytest.raises(InvalidConfig, match=r"num_tokens_per_req sums to 3 tokens"):
        build_ragged_verify_metadata_into(buffers, SEQ, NTOK, padded_tokens=2)
    assert (buffers.cache_seqlens == -7).all()
    assert (buffers.cu_seqlens_q == -7).all()
