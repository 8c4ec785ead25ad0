"""The uniform builders' widths are keyword-only; the old positional form still works, warned."""

import pytest
import torch

from specstrat.kernels import (
    VerifyMetadataBuffers,
    build_verify_metadata,
    build_verify_metadata_into,
)

SEQ = torch.tensor([3, 5, 9])


def test_the_positional_total_is_deprecated_but_builds_the_same_metadata() -> None:
    """build_verify_metadata(seq, 6) warns and equals build_verify_metadata(seq, num_tokens=6)."""
    want = build_verify_metadata(SEQ, num_tokens=6)
    with pytest.warns(DeprecationWarning, match=r"passing num_tokens positionally is deprecated"):
        got = build_verify_metadata(SEQ, 6)  # type: ignore[call-arg]
    assert torch.equal(got.cu_seqlens_q, want.cu_seqlens_q)
    assert torch.equal(got.cache_seqlens, want.cache_seqlens)
    assert got.max_seq_len_q == want.max_seq_len_q == 2


def test_the_positional_width_of_the_graph_form_is_deprecated_but_works() -> None:
    """build_verify_metadata_into(bufs, seq, 2) warns and writes what tokens_per_req=2 writes."""
    want = build_verify_metadata_into(VerifyMetadataBuffers.allocate(4), SEQ, tokens_per_req=2)
    with pytest.warns(DeprecationWarning, match=r"pass tokens_per_req=2 by keyword"):
        got = build_verify_metadata_into(VerifyMetadataBuffers.allocate(4), SEQ, 2)  # type: ignore[call-arg]
    assert torch.equal(got.cu_seqlens_q, want.cu_seqlens_q)
    assert got.max_seq_len_q == 2


def test_a_width_given_twice_is_a_type_error() -> None:
    """A positional width plus the keyword is refused as Python refuses a repeated argument."""
    with pytest.raises(TypeError, match=r"positional argument"):
        build_verify_metadata(SEQ, 6, num_tokens=6)  # type: ignore[misc]


def test_the_keyword_form_does_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    """Passing the widths by keyword emits no warning."""
    build_verify_metadata(SEQ, num_tokens=3)
    build_verify_metadata_into(VerifyMetadataBuffers.allocate(3), SEQ, tokens_per_req=1)
    assert not recwarn.list
