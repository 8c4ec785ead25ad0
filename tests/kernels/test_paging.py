"""Paging: the page-table inputs of the metadata builders, checked when built, frozen after."""

import dataclasses
from typing import Any

import pytest
import torch

from specstrat import InvalidConfig
from specstrat.kernels import Paging, VerifyMetadataBuffers, build_verify_metadata

RPI = torch.tensor([1, 2])
RTT = torch.zeros(4, 32, dtype=torch.int32)


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


def test_max_pages_rounds_the_context_up_to_whole_pages() -> None:
    """max_pages is ceil(req_to_token.shape[1] / page_size), enough for static buffers."""
    assert Paging(req_pool_indices=RPI, req_to_token=RTT).max_pages == 32
    assert Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=7).max_pages == 5
    narrow = torch.zeros(4, 1, dtype=torch.int64)
    assert Paging(req_pool_indices=RPI, req_to_token=narrow, page_size=16).max_pages == 1


def test_is_frozen_slotted_and_keyword_only() -> None:
    """Fields cannot be reassigned or added, and the two tensors are passed by name only."""
    paging = Paging(req_pool_indices=RPI, req_to_token=RTT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        paging.page_size = 2  # type: ignore[misc]
    assert not hasattr(paging, "__dict__")
    with pytest.raises(TypeError, match=r"positional argument"):
        Paging(RPI, RTT)  # type: ignore[call-arg]


def test_the_paged_build_equals_the_page_table_definition() -> None:
    """A build with a Paging writes page_table[i, p] = req_to_token[rpi[i], p * P] // P."""
    rtt = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)
    paging = Paging(req_pool_indices=torch.tensor([3, 0]), req_to_token=rtt, page_size=4)
    meta = build_verify_metadata(torch.tensor([5, 1]), num_tokens=4, paging=paging)
    assert meta.page_table is not None
    assert meta.page_table.tolist() == [[12, 13, 0, 0], [0, 0, 0, 0]]
    assert meta.page_size == 4
    assert build_verify_metadata(torch.tensor([5, 1]), num_tokens=4).page_table is None


def test_max_pages_sizes_graph_buffers() -> None:
    """Buffers allocated with paging.max_pages columns take any batch req_to_token holds."""
    paging = Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=8)
    buffers = VerifyMetadataBuffers.allocate(4, max_pages=paging.max_pages)
    assert buffers.page_table is not None
    assert buffers.page_table.shape == (4, paging.max_pages)


ERRORS: list[tuple[str, Any, str]] = [
    (
        "rtt-float",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT.float()),
        r"req_to_token.dtype=torch.float32 must be torch.int32 or torch.int64",
    ),
    (
        "rpi-float",
        lambda: Paging(req_pool_indices=RPI.double(), req_to_token=RTT),
        r"req_pool_indices.dtype=torch.float64 must be torch.int32 or torch.int64",
    ),
    (
        "rpi-bool",
        lambda: Paging(req_pool_indices=RPI > 1, req_to_token=RTT),
        r"req_pool_indices.dtype=torch.bool must be torch.int32 or torch.int64",
    ),
    (
        "rtt-rank",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT[0]),
        r"req_to_token.shape=\(32,\) must have rank 2",
    ),
    (
        "rpi-rank",
        lambda: Paging(req_pool_indices=RPI[None], req_to_token=RTT),
        r"req_pool_indices.shape=\(1, 2\) must have rank 1",
    ),
    (
        "rtt-not-tensor",
        lambda: Paging(req_pool_indices=RPI, req_to_token=loose([[0, 1]])),
        r"req_to_token=list must be a torch.Tensor",
    ),
    (
        "rtt-noncontig",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT.t()),
        r"req_to_token is not contiguous; pass req_to_token.contiguous\(\)",
    ),
    (
        "rtt-empty",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT[:, :0]),
        r"req_to_token.shape=\(4, 0\) is empty; size it \[pool, ctx\]",
    ),
    (
        "rtt-no-rows",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT[:0]),
        r"req_to_token.shape=\(0, 32\) is empty",
    ),
    (
        "devices-differ",
        lambda: Paging(req_pool_indices=RPI.to("meta"), req_to_token=RTT),
        r"req_pool_indices.device=meta differs from cpu; put every input on one device",
    ),
    (
        "page-size-zero",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=0),
        r"page_size=0 must be >= 1",
    ),
    (
        "page-size-bool",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=loose(True)),
        r"page_size=True must be an int >= 1",
    ),
    (
        "page-size-float",
        lambda: Paging(req_pool_indices=RPI, req_to_token=RTT, page_size=loose(16.0)),
        r"page_size=16.0 must be an int >= 1",
    ),
]


@pytest.mark.parametrize(("call", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_paging_is_refused_when_built(call: Any, message: str) -> None:
    """A Paging with a bad dtype, shape, device or page size is an InvalidConfig naming it."""
    with pytest.raises(InvalidConfig, match=message):
        call()
