"""specstrat's built-in rows against SGLang 0.5.23's enum, read from the package at test time.

For every algorithm both have, every hook answers as SGLang's enum member does, D = 2..8 and
both worker kinds. Two documented differences:

* DSPARK at D = 1: SGLang's draft worker verifies ``D - 1 = 0`` tokens; specstrat's contract is
  ``1 <= T <= D + 1``, so it answers 1.
* NONE (plain decoding): SGLang's enum answers ``has_draft_kv() = True`` (``not is_ngram()``)
  and a TARGET_VERIFY width of D; specstrat's NONE has no draft KV and refuses a verify width
  (InvalidConfig). SGLang's KV sizing returns 1 for no speculative algorithm before it asks
  ``has_draft_kv``.
"""

from typing import Any

import pytest

from specstrat import BUILTINS, NONE, InvalidConfig, SpecAlgorithm
from specstrat.integrations.sglang import CHECKED_DRAFT_TOKENS, load_sglang
from tests.integrations.sglang_standins import HAVE_SGLANG

FLAGS = ("has_draft_kv", "need_topk", "carries_draft_hidden_states", "supports_ragged_verify")


def shared_builtins() -> list[SpecAlgorithm[Any]]:
    """specstrat's built-ins that SGLang's enum also has (by name)."""
    if not HAVE_SGLANG:
        return list(BUILTINS)  # the autouse fixture skips each, saying why
    members = load_sglang().algorithm_enum.__members__
    return [algo for algo in BUILTINS if algo.name in members]


def sglang_member(algo: SpecAlgorithm[Any]) -> Any:
    """SGLang's enum member with ``algo``'s name."""
    return load_sglang().algorithm_enum[algo.name]


def test_every_speculative_builtin_has_an_sglang_member() -> None:
    """All seven built-ins exist in SGLang (it also has UNO and FROZEN_KV_MTP, which specstrat
    lacks)."""
    assert [a.name for a in shared_builtins()] == [a.name for a in BUILTINS]


@pytest.mark.parametrize(
    "algo", [a for a in shared_builtins() if a.is_speculative()], ids=lambda a: a.name
)
def test_speculative_builtins_answer_as_sglangs_enum(algo: SpecAlgorithm[Any]) -> None:
    """Verify policy (D = 2..8, both workers) and every capability flag agree with SGLang."""
    member = sglang_member(algo)
    assert member.is_speculative() is algo.is_speculative()
    assert member.supports_target_verify_for_draft() is algo.supports_target_verify_for_draft()
    for flag in FLAGS:
        assert getattr(member, flag)() is getattr(algo.capabilities, flag), flag
    for d in CHECKED_DRAFT_TOKENS:
        for draft in (False, True):
            ours = algo.get_num_tokens_per_req_for_target_verify(d, draft)
            assert member.get_num_tokens_per_req_for_target_verify(d, draft) == ours, (d, draft)


@pytest.mark.parametrize(
    "algo", [a for a in shared_builtins() if a.is_speculative()], ids=lambda a: a.name
)
def test_at_one_draft_token_only_dsparks_draft_worker_differs(algo: SpecAlgorithm[Any]) -> None:
    """D = 1: SGLang's DSPARK draft worker answers 0 tokens, below specstrat's T >= 1."""
    member = sglang_member(algo)
    for draft in (False, True):
        theirs = member.get_num_tokens_per_req_for_target_verify(1, draft)
        ours = algo.get_num_tokens_per_req_for_target_verify(1, draft)
        if algo.name == "DSPARK" and draft:
            assert (theirs, ours) == (0, 1)
        else:
            assert theirs == ours


def test_none_agrees_where_sglang_reads_it_and_differs_as_documented() -> None:
    """NONE: same identity and flags, except SGLang's has_draft_kv and verify width."""
    member = sglang_member(NONE)
    assert member.is_none() is NONE.is_none() is True
    assert member.supports_target_verify_for_draft() is NONE.supports_target_verify_for_draft()
    for flag in ("need_topk", "carries_draft_hidden_states", "supports_ragged_verify"):
        assert getattr(member, flag)() is getattr(NONE.capabilities, flag), flag
    assert (member.has_draft_kv(), NONE.capabilities.has_draft_kv) == (True, False)
    assert member.get_num_tokens_per_req_for_target_verify(4, False) == 4
    with pytest.raises(InvalidConfig, match=r"algorithm NONE is not speculative"):
        NONE.get_num_tokens_per_req_for_target_verify(4, False)
