"""The batched answer checks agree with the host checks on any tree and any answer, so a large
batch is refused exactly when a small one would be."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specstrat import Acceptance, DraftTree, StrategyError
from specstrat.contracts import (
    HostAcceptance,
    HostTree,
    acceptance_looks_valid,
    check_acceptance_host,
    check_drafts_host,
    drafts_look_valid,
)

VOCAB = 8


@st.composite
def trees_and_answers(draw: st.DrawFn) -> tuple[DraftTree, Acceptance]:
    """A small tree (parents may be wrong) and an answer that may or may not be a path."""
    bs, n = draw(st.integers(1, 4)), draw(st.integers(0, 4))
    parents = [[draw(st.integers(-2, max(j, 0))) for j in range(n)] for _ in range(bs)]
    tokens = [[draw(st.integers(-1, VOCAB)) for _ in range(n)] for _ in range(bs)]
    lengths = [draw(st.integers(-1, n + 1)) for _ in range(bs)]
    index = [[draw(st.integers(-2, n)) for _ in range(n)] for _ in range(bs)]
    counts = [draw(st.integers(-1, n + 1)) for _ in range(bs)]
    bonus = [draw(st.integers(-1, VOCAB)) for _ in range(bs)]

    def t(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64).reshape(bs, n)

    tree = object.__new__(DraftTree)  # unchecked: the checks under test must catch it
    for name, value in (
        ("tokens", t(tokens)),
        ("parents", t(parents)),
        ("lengths", torch.tensor(lengths)),
        ("q", None),
        ("confidence", None),
    ):
        object.__setattr__(tree, name, value)
    answer = Acceptance(t(index), torch.tensor(counts), torch.tensor(bonus))
    return tree, answer


def _host_accepts(fn: object, *args: object) -> bool:
    try:
        fn(*args)  # type: ignore[operator]
    except StrategyError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(trees_and_answers())
def test_batched_draft_check_agrees_with_the_host_check(case: tuple[DraftTree, Acceptance]) -> None:
    """drafts_look_valid is True exactly when check_drafts_host passes."""
    tree, _ = case
    host = HostTree.of(tree)
    assert drafts_look_valid(tree, VOCAB) == _host_accepts(check_drafts_host, "A", host, VOCAB)


@settings(max_examples=300, deadline=None)
@given(trees_and_answers())
def test_batched_acceptance_check_agrees_with_the_host_check(
    case: tuple[DraftTree, Acceptance],
) -> None:
    """acceptance_looks_valid is True exactly when check_acceptance_host passes (for trees the
    drafts check let through)."""
    tree, answer = case
    if not drafts_look_valid(tree, VOCAB):
        return
    host, accepted = HostTree.of(tree), HostAcceptance.of(answer)
    want = _host_accepts(check_acceptance_host, "A", accepted, host, VOCAB)
    assert acceptance_looks_valid(answer, tree, VOCAB) == want


def test_a_wrong_answer_in_a_large_batch_names_the_request() -> None:
    """Past the host-check size the batched check finds the bad row and the host check names
    it, as for a small batch."""
    from specstrat.runtime._answers import frozen_acceptance

    bs, n = 100, 3
    tree = DraftTree.chain(torch.ones(bs, n, dtype=torch.int64))
    index = torch.tensor([0, 1, -1]).expand(bs, n).clone()
    index[17] = torch.tensor([0, 2, -1])  # skips node 1: not a path
    answer = Acceptance(index, torch.full((bs,), 2), torch.zeros(bs, dtype=torch.int64))
    with pytest.raises(StrategyError, match=r"A.acceptance.accept: request 17: accept_index="):
        frozen_acceptance(
            "A", answer, tree, HostTree.of(tree), vocab=VOCAB, device=tree.tokens.device
        )
