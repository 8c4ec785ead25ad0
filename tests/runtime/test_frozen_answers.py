"""Hook answers cannot change after they are checked, and a bad relay value names its writer.

A hook that writes, after returning, into the tensors it returned or was handed leaves the
outputs equal to target-only (the engine copied each answer as it returned and hands hooks
copies it does not read back) or ends in a StrategyError naming the hook that wrote; a relay
field that comes back wrong names the hook that stashed it, not the relay.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

import specstrat
import specstrat.strategies
from specstrat import (
    EAGLE,
    NGRAM,
    Acceptance,
    DraftTree,
    EngineStateError,
    RelayError,
    RelayPayload,
    StrategyError,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._disagg import PrefillWorker
from specstrat.strategies import GreedyAcceptance, RingFutureMapFactory, TopkTree
from specstrat.testing import FaultyAcceptance, FaultyDrafterFactory

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = [replace(r, max_new_tokens=8) for r in workload(2, seed=3)]
TREE = TopkTree(topk=2, num_steps=3)
MODES = pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])


class Board:
    """What the hooks of one run returned, for a later hook to write into."""

    def __init__(self) -> None:
        self.trees: list[DraftTree] = []
        self.answers: list[Acceptance] = []

    def tree(self, tree: DraftTree) -> DraftTree:
        self.trees.append(tree)
        return tree

    def answer(self, answer: Acceptance) -> Acceptance:
        self.answers.append(answer)
        return answer


def scribbling(base: Any, propose: Callable[[DraftTree], Any], accept: Callable[..., Any]) -> Any:
    """``base`` whose drafter's proposals pass ``propose`` and whose rule's answers ``accept``."""
    return replace(
        base,
        drafter=FaultyDrafterFactory(base.drafter, "propose", propose),
        acceptance=FaultyAcceptance(base.acceptance, accept),
    )


def parents_rewritten_after_return() -> Any:
    """The drafter's tree gets other parents and lengths while the rule runs."""
    board = Board()

    def rewrite(answer: Acceptance) -> Acceptance:
        tree = board.trees[-1]
        tree.parents.fill_(-1)
        tree.lengths.zero_()
        return answer

    return replace(scribbling(EAGLE, board.tree, rewrite), tree=TREE)


def lengths_widened_after_return() -> Any:
    """The drafter's chain claims every node real, and its tokens change, after it returned."""
    board = Board()

    def widen(answer: Acceptance) -> Acceptance:
        board.trees[-1].lengths.fill_(board.trees[-1].num_nodes)
        board.trees[-1].tokens.fill_(7)
        return answer

    return scribbling(EAGLE, board.tree, widen)


def answer_rewritten_after_return() -> Any:
    """The rule's answer gets other bonus tokens and lengths when the drafter commits."""
    board = Board()

    def rewrite(payload: RelayPayload) -> RelayPayload:
        board.answers[-1].bonus_tokens.fill_(3)
        board.answers[-1].accept_lengths.zero_()
        return payload

    return replace(
        EAGLE,
        drafter=FaultyDrafterFactory(EAGLE.drafter, "commit", rewrite),
        acceptance=FaultyAcceptance(EAGLE.acceptance, board.answer),
    )


class ChainClaimingRule(GreedyAcceptance):
    """Rewrites the tree it is handed into a chain, then accepts the whole chain."""

    def accept(self, inputs: Any) -> Acceptance:
        drafts = inputs.drafts
        chain = torch.arange(drafts.num_nodes) - 1
        drafts.parents.copy_(chain.expand_as(drafts.parents))
        drafts.lengths.fill_(drafts.num_nodes)
        answer = GreedyAcceptance.accept(self, inputs)
        index = torch.arange(drafts.num_nodes).expand_as(drafts.parents).contiguous()
        return Acceptance(index, drafts.lengths.clone(), answer.bonus_tokens)


class FirstTokenOverwriter(specstrat.strategies.NgramDrafter):
    """An n-gram drafter that overwrites the first tokens it is admitted with."""

    def admit(self, admission: Any) -> RelayPayload:
        payload = super().admit(admission)
        admission.bonus_tokens.fill_(65)
        admission.seq_lens.zero_()
        return payload


class FirstTokenOverwriterFactory(specstrat.strategies.NgramDrafterFactory):
    def create_drafter(self, context: Any) -> FirstTokenOverwriter:
        return FirstTokenOverwriter(self.min_ngram, self.max_ngram, context.target_tokens)


UNCHANGED: list[tuple[str, Callable[[], Any]]] = [
    ("tree-parents-and-lengths-after-return", parents_rewritten_after_return),
    ("chain-lengths-and-tokens-after-return", lengths_widened_after_return),
    ("acceptance-after-return", answer_rewritten_after_return),
    ("admission-first-tokens", lambda: replace(NGRAM, drafter=FirstTokenOverwriterFactory())),
]


@MODES
@pytest.mark.parametrize(("case", "make"), UNCHANGED, ids=[c[0] for c in UNCHANGED])
def test_writes_after_return_change_no_output(
    case: str, make: Callable[[], Any], overlap: bool, models: EmbeddedModels
) -> None:
    """In-place writes into a returned tree, a returned acceptance or the admission's first
    tokens leave every output equal to target-only."""
    config = replace(CONFIG, overlap=overlap)
    want = Engine("NONE", models, config).run(REQUESTS)
    assert Engine(make(), models, config).run(REQUESTS) == want


def broken_after_construction(field: str) -> Callable[[DraftTree], DraftTree]:
    """A proposal whose ``field`` is broken after the DraftTree checked it."""

    def broken(tree: DraftTree) -> DraftTree:
        if field == "parents":
            tree.parents[:, -1] = tree.num_nodes  # a child before its parent
        else:
            tree.lengths.fill_(tree.num_nodes + 2)
        return tree

    return broken


NAMED: list[tuple[str, Callable[[], Any], str]] = [
    (
        "parents-broken-before-return",
        lambda: replace(
            EAGLE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter, "propose", broken_after_construction("parents")
            ),
        ),
        r"EAGLE\.drafter\.propose: request 0: parents=\[.*\] break parent-before-child",
    ),
    (
        "tree-parents-broken-before-return",
        lambda: replace(
            EAGLE,
            tree=TREE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter, "propose", broken_after_construction("parents")
            ),
        ),
        r"EAGLE\.drafter\.propose: request 0: parents=\[.*\] break parent-before-child",
    ),
    (
        "lengths-broken-before-return",
        lambda: replace(
            EAGLE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter, "propose", broken_after_construction("lengths")
            ),
        ),
        r"EAGLE\.drafter\.propose: proposed lengths=\[5, .*\]; each must lie in 0\.\.3",
    ),
    (
        "rule-rewrites-the-tree-it-was-handed",
        lambda: replace(EAGLE, tree=TREE, acceptance=ChainClaimingRule()),
        r"EAGLE\.acceptance\.accept: request \d+: accept_index=\[.*\] with accept_lengths=\d+ is "
        r"not a root-to-node path of the draft tree",
    ),
    (
        "commit-relays-seq-lens",
        lambda: replace(
            EAGLE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter,
                "commit",
                lambda p: replace(p, seq_lens=torch.zeros(p.num_rows, dtype=torch.int64)),
            ),
        ),
        r"EAGLE\.drafter\.commit: relayed seq_lens=\[0, .*\] for slots .* but the slot table holds",
    ),
    (
        "admit-relays-seq-lens",
        lambda: replace(
            EAGLE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter, "admit", lambda p: replace(p, seq_lens=p.topk_index[:, 0] + 1000)
            ),
        ),
        r"EAGLE\.drafter\.admit: relayed seq_lens=\[\d+.*\] for slots",
    ),
    (
        "commit-narrows-topk",
        lambda: replace(
            EAGLE,
            drafter=FaultyDrafterFactory(
                EAGLE.drafter,
                "commit",
                lambda p: replace(p, topk_p=p.topk_p[:, :2], topk_index=p.topk_index[:, :2]),
            ),
        ),
        r"EAGLE\.drafter\.commit: relayed topk_p that future_map\.stash refused \(topk_p is "
        r"torch\.float\d+ with row shape \(2,\) but the relay holds .* \(4,\)",
    ),
]


@MODES
@pytest.mark.parametrize(("case", "make", "message"), NAMED, ids=[c[0] for c in NAMED])
def test_bad_values_name_the_hook_that_wrote_them(
    case: str, make: Callable[[], Any], message: str, overlap: bool, models: EmbeddedModels
) -> None:
    """A tree broken after construction, a rule that rewrites the tree it was handed, and a
    relay field stashed wrong are StrategyErrors naming the hook that wrote the value; nothing
    leaks and the engine refuses reuse."""
    engine = Engine(make(), models, replace(CONFIG, overlap=overlap))
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(StrategyError, match=message):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"run: this engine was closed after a failed run"):
        engine.run([Request("again", (65, 66), 4)])


def test_a_refused_relay_write_carries_its_field_and_writer() -> None:
    """A payload the relay refuses is a RelayError whose attributes name the field, the hook
    that wrote it and the algorithm (no message parsing needed to blame it)."""
    narrow = FaultyDrafterFactory(
        EAGLE.drafter,
        "commit",
        lambda p: replace(p, topk_p=p.topk_p[:, :2], topk_index=p.topk_index[:, :2]),
    )
    engine = Engine(replace(EAGLE, drafter=narrow), EmbeddedModels.load(), CONFIG)
    with pytest.raises(RelayError, match=r"EAGLE\.drafter\.commit: relayed topk_p") as caught:
        engine.run(REQUESTS)
    error = caught.value
    assert (error.field, error.writer, error.algorithm) == ("topk_p", "drafter.commit", "EAGLE")
    assert isinstance(error, StrategyError)


class SilentBuilder(specstrat.strategies.EagleDisaggDraftBuilder):
    """Builds EAGLE's draft input but writes nothing into the future map it is given."""

    def build_disagg_draft_input(self, batch: Any, last_tokens: Any, future_map: Any) -> Any:
        return super().build_disagg_draft_input(batch, last_tokens, None)


BUILDERS: list[tuple[str, Any, str]] = [
    (
        "slot-relay",
        specstrat.strategies.SlotFutureMapFactory(),
        r"EAGLE\.disagg\.build_disagg_draft_input: relayed no bonus_tokens for slots \[\d+, \d+\]",
    ),
    (
        "ring-relay",
        RingFutureMapFactory(),
        r"EAGLE\.disagg\.build_disagg_draft_input: the relay holds nothing usable for slots",
    ),
]


@MODES
@pytest.mark.parametrize(("case", "relay", "message"), BUILDERS, ids=[c[0] for c in BUILDERS])
def test_a_builder_that_relays_nothing_is_named(
    case: str, relay: Any, message: str, overlap: bool, models: EmbeddedModels
) -> None:
    """A disagg builder that stashes nothing is named at the first resolve, not the relay."""
    algo = replace(EAGLE, disagg=SilentBuilder(), future_map=relay)
    engine = Engine(algo, models, replace(CONFIG, overlap=overlap))
    before = (engine.free_slots, engine.free_kv_tokens)
    prefill = PrefillWorker(EAGLE, models, context_len=512, batch_size=2)
    engine.submit_prebuilt(prefill.prefill(REQUESTS[:2]))
    with pytest.raises(StrategyError, match=message):
        engine.run()
    assert (engine.free_slots, engine.free_kv_tokens) == before


class OverwritingBuilder(specstrat.strategies.EagleDisaggDraftBuilder):
    """EAGLE's builder, which then overwrites the last tokens and lengths it was handed."""

    def build_disagg_draft_input(self, batch: Any, last_tokens: Any, future_map: Any) -> Any:
        built = super().build_disagg_draft_input(batch, last_tokens, future_map)
        last_tokens.fill_(66)
        batch.seq_lens.zero_()
        return built


@MODES
def test_a_builder_writing_into_its_inputs_changes_no_output(
    overlap: bool, models: EmbeddedModels
) -> None:
    """A builder that overwrites last_tokens and seq_lens after relaying them changes nothing."""
    config = replace(CONFIG, overlap=overlap)
    want = Engine("NONE", models, config).run(REQUESTS[:2])
    engine = Engine(replace(EAGLE, disagg=OverwritingBuilder()), models, config)
    prefill = PrefillWorker(EAGLE, models, context_len=512, batch_size=2)
    engine.submit_prebuilt(prefill.prefill(REQUESTS[:2]))
    assert engine.run() == want
