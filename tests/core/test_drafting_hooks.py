"""The drafting hooks' types and rules: DraftTree, GreedyAcceptance, the migration message,
drafter needs against capabilities, and the conformance runners failing bad strategies."""

from dataclasses import replace
from typing import Any

import pytest
import torch

import specstrat
from specstrat import (
    EAGLE,
    NGRAM,
    Acceptance,
    ConformanceError,
    DrafterNeeds,
    DraftTree,
    InvalidConfig,
    InvalidStrategy,
    SamplingParams,
    VerifyInputs,
)
from specstrat.strategies import (
    BlockDrafterFactory,
    EagleHeadDrafterFactory,
    GreedyAcceptance,
    NoDrafterFactory,
)
from specstrat.testing import (
    FaultyAcceptance,
    FaultyDrafterFactory,
    check_acceptance_rule,
    check_drafter,
)


def inputs(drafts: DraftTree, choices: list[list[int]], vocab: int = 8) -> VerifyInputs:
    """Logits whose argmax at root/node j is ``choices[i][j]``."""
    logits = torch.zeros(drafts.bs, drafts.num_nodes + 1, vocab, dtype=torch.float64)
    logits.scatter_(2, torch.tensor(choices)[:, :, None], 1.0)
    return VerifyInputs(
        drafts=drafts,
        logits=logits,
        positions=torch.zeros(drafts.bs, dtype=torch.int64),
        sampling=(specstrat.GREEDY,) * drafts.bs,
    )


def test_greedy_accepts_the_longest_matching_chain_prefix() -> None:
    """A chain is accepted up to its first mismatch; the bonus is the target's next choice."""
    drafts = DraftTree.chain(torch.tensor([[3, 4, 5], [3, 4, 5]]))
    got = GreedyAcceptance().accept(inputs(drafts, [[3, 4, 6, 7], [2, 4, 5, 1]]))
    assert got.accept_lengths.tolist() == [2, 0]
    assert got.accept_index.tolist() == [[0, 1, -1], [-1, -1, -1]]
    assert got.bonus_tokens.tolist() == [6, 2]


def test_greedy_walks_a_tree_and_respects_lengths() -> None:
    """In a tree the first child holding the target's choice is followed; nodes past a row's
    length are never accepted, even when they match."""
    tree = DraftTree(
        torch.tensor([[1, 2, 5, 6], [1, 2, 5, 6]]),
        torch.tensor([[-1, -1, 1, 2], [-1, -1, 1, 2]]),
        torch.tensor([4, 2]),
    )
    got = GreedyAcceptance().accept(inputs(tree, [[2, 0, 5, 6, 7], [2, 0, 5, 6, 7]]))
    assert got.accept_index.tolist() == [[1, 2, 3, -1], [1, -1, -1, -1]]
    assert got.accept_lengths.tolist() == [3, 1]
    assert got.bonus_tokens.tolist() == [7, 5]


BAD_TREES: list[tuple[str, Any, str]] = [
    ("float-tokens", lambda: DraftTree.chain(torch.ones(2, 3)), r"tokens is torch.float32"),
    (
        "parent-after-child",
        lambda: DraftTree(
            torch.ones(1, 2, dtype=torch.int64), torch.tensor([[-1, 1]]), torch.tensor([2])
        ),
        r"node j's parent must lie in -1\.\.j-1",
    ),
    (
        "parent-below-root",
        lambda: DraftTree(
            torch.ones(1, 2, dtype=torch.int64), torch.tensor([[-2, 0]]), torch.tensor([2])
        ),
        r"node j's parent must lie in -1\.\.j-1",
    ),
    (
        "length-too-long",
        lambda: DraftTree.chain(torch.ones(2, 3, dtype=torch.int64), lengths=torch.tensor([1, 4])),
        r"lengths=\[1, 4\] must lie in 0\.\.3",
    ),
    (
        "length-shape",
        lambda: DraftTree.chain(torch.ones(2, 3, dtype=torch.int64), lengths=torch.tensor([1])),
        r"lengths.shape=\(1,\); expected \(2,\)",
    ),
    (
        "q-shape",
        lambda: DraftTree.chain(torch.ones(2, 3, dtype=torch.int64), q=torch.ones(2, 3)),
        r"q must be a float tensor \[bs=2, n=3, vocab\]",
    ),
    (
        "confidence-shape",
        lambda: DraftTree.chain(torch.ones(2, 3, dtype=torch.int64), confidence=torch.ones(3)),
        r"confidence must be a float tensor \[bs=2, n=3\]",
    ),
    (
        "sampling-temperature",
        lambda: SamplingParams(temperature=-1.0),
        r"temperature=-1.0 must be a finite number >= 0",
    ),
    ("sampling-top-p", lambda: SamplingParams(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (
        "sampling-top-k",
        lambda: SamplingParams(top_k=-1),
        r"top_k=-1 must be an int in 0\.\.2\*\*63-1",
    ),
]


@pytest.mark.parametrize(("case", "make", "message"), BAD_TREES, ids=[c[0] for c in BAD_TREES])
def test_bad_draft_values_are_refused(case: str, make: Any, message: str) -> None:
    """DraftTree and SamplingParams refuse malformed values, naming them."""
    with pytest.raises(InvalidConfig, match=message):
        make()


def test_a_drafter_needing_hidden_states_needs_the_capability() -> None:
    """An EAGLE-head drafter in an algorithm that does not carry hidden states is refused,
    naming both sides."""
    with pytest.raises(
        InvalidStrategy,
        match=(
            r"drafter=EagleHeadDrafterFactory needs target_hidden_states "
            r"but capabilities\.carries_draft_hidden_states=False"
        ),
    ):
        replace(NGRAM, name="BAD", drafter=EagleHeadDrafterFactory())  # type: ignore[arg-type]


def test_a_block_drafter_needs_draft_kv_and_draft_worker_verify() -> None:
    """The block drafter needs a draft KV (capability) and a policy that allows TARGET_VERIFY on
    the draft worker; each missing side is named."""
    with pytest.raises(
        InvalidStrategy,
        match=r"drafter=BlockDrafterFactory needs draft_model but capabilities\.has_draft_kv=False",
    ):
        replace(NGRAM, name="BAD", drafter=BlockDrafterFactory())
    with pytest.raises(
        InvalidStrategy,
        match=r"BAD: drafter=BlockDrafterFactory needs draft_worker_verify .* is False",
    ):
        replace(specstrat.STANDALONE, name="BAD", drafter=BlockDrafterFactory())
    assert DrafterNeeds().draft_worker_verify is False


def test_an_acceptance_rule_without_lossless_is_refused() -> None:
    """An acceptance rule whose lossless is not a bool is refused at construction."""

    class NoClaim:
        lossless = "maybe"

        def accept(self, inputs: VerifyInputs) -> Acceptance:
            raise NotImplementedError

    with pytest.raises(InvalidStrategy, match=r"acceptance=NoClaim\.lossless is 'maybe'"):
        replace(NGRAM, acceptance=NoClaim())  # type: ignore[arg-type]


def test_every_builtin_hook_passes_its_runner() -> None:
    """Built-in drafters and the greedy rule pass the same runners users run."""
    check_acceptance_rule(GreedyAcceptance())
    for algo in specstrat.BUILTINS:
        check_drafter(algo.drafter, capabilities=algo.capabilities)
    check_drafter(NoDrafterFactory())


def test_check_acceptance_rule_fails_a_rule_that_accepts_everything() -> None:
    """A rule that accepts every draft claims losslessness falsely: the runner names it."""

    def everything(got: Acceptance) -> Acceptance:
        n = got.accept_index.shape[1]
        index = torch.arange(n).expand_as(got.accept_index).contiguous()
        return Acceptance(index, torch.full_like(got.accept_lengths, n), got.bonus_tokens)

    with pytest.raises(ConformanceError, match=r"root-to-node path|accepts what greedy decoding"):
        check_acceptance_rule(FaultyAcceptance(GreedyAcceptance(), everything))


def test_check_acceptance_rule_fails_a_rule_that_raises() -> None:
    """A rule that raises is reported with the exception."""
    with pytest.raises(ConformanceError, match=r"raised RuntimeError: no"):
        check_acceptance_rule(FaultyAcceptance(GreedyAcceptance(), RuntimeError("no")))


def test_check_drafter_fails_a_drafter_proposing_outside_the_vocabulary() -> None:
    """A drafter whose proposals leave the vocabulary fails its runner, naming the tokens."""

    def wild(tree: DraftTree) -> DraftTree:
        return DraftTree.chain(tree.tokens + 1000, lengths=tree.lengths)

    bad = FaultyDrafterFactory(EAGLE.drafter, "propose", wild)
    with pytest.raises(ConformanceError, match=r"outside the vocabulary 0\.\.255"):
        check_drafter(bad, capabilities=EAGLE.capabilities)


def test_check_drafter_fails_a_prefill_payload_missing_fields() -> None:
    """A prefill payload that lacks what needs.prefill_fields declares fails the runner."""
    bad = FaultyDrafterFactory(
        EAGLE.drafter, "prefill_payload", lambda got: specstrat.RelayPayload()
    )
    with pytest.raises(
        ConformanceError, match=r"prefill_payload returns exactly needs\.prefill_fields"
    ):
        check_drafter(bad, capabilities=EAGLE.capabilities)
