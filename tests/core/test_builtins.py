"""The built-in algorithms reproduce DESIGN.md §3's behaviour table, row by row."""

from typing import Any

import pytest

import specstrat
from specstrat import InvalidConfig, SpecAlgorithm
from specstrat.builtins import DSPARK_CONFIDENCE
from specstrat.strategies import (
    BlockDrafterFactory,
    DflashDisaggDraftBuilder,
    DsparkDisaggDraftBuilder,
    EagleDisaggDraftBuilder,
    NoDraftStateDisaggDraftBuilder,
)

# name: (verify on draft worker, T target - D, T draft worker - D, builder, topk, hidden, draft KV)
TABLE: dict[str, tuple[bool, int | None, int | None, type, bool, bool, bool]] = {
    "NONE": (False, None, None, NoDraftStateDisaggDraftBuilder, False, False, False),
    "EAGLE": (False, 0, 0, EagleDisaggDraftBuilder, True, True, True),
    "EAGLE3": (False, 0, 0, EagleDisaggDraftBuilder, True, True, True),
    "STANDALONE": (False, 0, 0, NoDraftStateDisaggDraftBuilder, True, False, True),
    "NGRAM": (False, 0, 0, NoDraftStateDisaggDraftBuilder, False, False, False),
    "DFLASH": (True, 0, 0, DflashDisaggDraftBuilder, False, False, True),
    "DSPARK": (True, 0, -1, DsparkDisaggDraftBuilder, False, False, True),
}


def test_table_covers_every_builtin_in_order() -> None:
    """The built-ins are exactly the table's rows, in its order."""
    assert [a.name for a in specstrat.BUILTINS] == list(TABLE)


@pytest.mark.parametrize("name", list(TABLE))
def test_builtin_row(name: str) -> None:
    """Each built-in's verify policy, builder and capabilities match its row of the table."""
    on_draft, t_off, draft_off, builder, topk, hidden, draft_kv = TABLE[name]
    algo: SpecAlgorithm[Any] = specstrat.get(name)
    assert algo.supports_target_verify_for_draft() is on_draft
    assert type(algo.disagg) is builder
    caps = algo.capabilities
    assert (caps.need_topk, caps.carries_draft_hidden_states, caps.has_draft_kv) == (
        topk,
        hidden,
        draft_kv,
    )
    if t_off is None:
        assert algo.is_none()
        assert not algo.is_speculative()
        with pytest.raises(InvalidConfig, match="is not speculative"):
            algo.get_num_tokens_per_req_for_target_verify(4, False)
        return
    assert algo.is_speculative()
    assert not algo.is_none()
    for d in range(2, 9):
        assert algo.get_num_tokens_per_req_for_target_verify(d, False) == d + t_off
        assert algo.get_num_tokens_per_req_for_target_verify(d, True) == d + (draft_off or 0)


def test_dspark_draft_worker_never_verifies_zero_tokens() -> None:
    """DSPARK at D=1 verifies one token on the draft worker (D-1 would be zero)."""
    assert specstrat.DSPARK.get_num_tokens_per_req_for_target_verify(1, True) == 1


def test_dspark_is_the_ragged_builtin() -> None:
    """Only DSPARK declares ragged verification among the built-ins (as in SGLang 0.5.23)."""
    ragged = [a.name for a in specstrat.BUILTINS if a.capabilities.supports_ragged_verify]
    assert ragged == ["DSPARK"]


def test_dflash_and_dspark_draft_blocks_on_the_draft_worker() -> None:
    """DFLASH and DSPARK use the block drafter, which declares draft-worker verify; only
    DSPARK cuts its blocks by confidence (its ragged row)."""
    dflash, dspark = specstrat.DFLASH.drafter, specstrat.DSPARK.drafter
    assert isinstance(dflash, BlockDrafterFactory)
    assert isinstance(dspark, BlockDrafterFactory)
    assert dflash.needs.draft_worker_verify
    assert dspark.needs.draft_worker_verify
    assert dflash.confidence_threshold is None
    assert dspark.confidence_threshold == DSPARK_CONFIDENCE
    others = [a for a in specstrat.BUILTINS if a.name not in ("DFLASH", "DSPARK")]
    assert not any(a.drafter.needs.draft_worker_verify for a in others)
