"""A head that attends over the context: its drafter's KV cache gives the drafts the unrolled
head gives offline (training-time test), the cache a request builds through prefill and verify
steps equals a second pass over its sequence, EAGLE, EAGLE3 and a tree run it greedy-lossless
in sync and overlap, and a PREBUILT request drafts from the positions generated after it."""

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specstrat
from specstrat import SpecAlgorithm
from specstrat.drafting import (
    GREEDY,
    Acceptance,
    DraftAdmission,
    DraftStep,
    DraftTree,
    StepOutcome,
)
from specstrat.errors import InternalError, InvalidConfig
from specstrat.hf import HFCausalLM, HFModels, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.strategies import ContextHeadDrafter, ForcedAcceptance, TopkTree
from specstrat.train import (
    Eagle3Config,
    Eagle3ContextDraftHead,
    Eagle3Head,
    TrainedHead,
    attach_head,
    capture_sequences,
    load_head,
    save_head,
    target_name,
    target_sha256,
)
from specstrat.train.unroll import unroll_context
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT
from tests.train.faults import assert_fault_leaks_nothing

V, H = 50, 32


@pytest.fixture(scope="module")
def head() -> Eagle3Head:
    """A random context head (GQA 4/2) over a 50-token vocabulary, 40 of them drafted."""
    torch.manual_seed(0)
    config = Eagle3Config(
        hidden_size=H,
        heads=4,
        kv_heads=2,
        head_dim=8,
        intermediate_size=64,
        rope_theta=10000.0,
        rms_eps=1e-6,
        vocab_size=V,
        layers=(0, 1),
        draft_vocab_size=40,
        context=True,
    )
    built = Eagle3Head(config, torch.randperm(V)[:40], torch.randn(V, H)).eval()
    for p in built.parameters():
        p.data.normal_(0, 0.3)
    return built


def _offline(
    head: Eagle3Head, feats: torch.Tensor, toks: torch.Tensor, first: int = 0
) -> list[torch.Tensor]:
    """Each step's greedy target ids for every anchor from ``first`` on, from the unrolled
    head."""
    d2t = head.get_buffer("d2t")
    rows = feats.shape[0]
    with torch.inference_mode():
        steps = unroll_context(
            head,
            feats[None],
            toks[None, 1 : rows + 1],
            torch.arange(rows)[None] + 1,
            3,
            lambda _i, logits: d2t[logits.argmax(-1)],
            torch.tensor([first]),
            rows - first,
        )
        return [d2t[logits[0].argmax(-1)] for logits in steps]


def _drafter(head: Eagle3Head, committed: list[int]) -> ContextHeadDrafter:
    draft_head = head.draft_head(V)
    assert isinstance(draft_head, Eagle3ContextDraftHead)
    return ContextHeadDrafter(
        draft_head, 4, V, context_len=64, target_tokens=lambda _slot: committed
    )


def _step(bonus: int, seq_len: int, payload: Any) -> DraftStep:
    return _steps([0], [bonus], [seq_len], payload)


def test_the_drafter_drafts_what_the_unrolled_head_predicts(head: Eagle3Head) -> None:
    """After a 5-token prompt, and after a step that accepted 2 drafts, the drafter's chain
    equals the offline unroll's greedy chain at the same anchor, and its relayed top-1
    probability equals the unroll's."""
    torch.manual_seed(1)
    feats, toks = torch.randn(12, 2 * H), torch.randint(0, V, (13,))
    want = _offline(head, feats, toks)
    for ours, theirs in zip(_offline(head, feats, toks, first=4), want, strict=True):
        assert ours.tolist() == theirs[4:].tolist()  # rows before the first anchor: keys only
    drafter = _drafter(head, toks[:5].tolist())
    admitted = drafter.admit(
        DraftAdmission(
            slots=(0,),
            bonus_tokens=toks[5:6],
            seq_lens=torch.tensor([5]),
            hidden=feats[4:5],
            draft_input=None,
            sampling=(GREEDY,),
            prompt_hidden=(feats[:5],),
        )
    )
    step = _step(int(toks[5]), 5, admitted)
    assert drafter.propose(step).tokens[0].tolist() == [int(w[4]) for w in want]
    outcome = StepOutcome(
        step=step,
        drafts=DraftTree.chain(toks[None, 6:9]),
        acceptance=Acceptance(
            accept_index=torch.tensor([[0, 1, -1]]),
            accept_lengths=torch.tensor([2]),
            bonus_tokens=toks[8:9],
        ),
        hidden=feats[7:8],
        path_hidden=feats[None, 5:8],
    )
    committed = drafter.commit(outcome)
    assert drafter.propose(_step(int(toks[8]), 8, committed)).tokens[0].tolist() == [
        int(w[7]) for w in want
    ]


def test_a_prebuilt_request_drafts_from_an_empty_cache_and_a_mismatch_is_named(
    head: Eagle3Head,
) -> None:
    """A PREBUILT admission with draft state drafts its first step from the relay alone; a cache
    that disagrees with the slot's length is an InternalError naming the slot."""
    drafter = _drafter(head, [1, 2, 3])
    payload = head.draft_head(V)(torch.randn(1, 2 * H), torch.tensor([4]))
    admission: DraftAdmission[Any] = DraftAdmission(
        slots=(0,),
        bonus_tokens=torch.tensor([4]),
        seq_lens=torch.tensor([3]),
        hidden=None,
        draft_input=object(),
        sampling=(GREEDY,),
    )
    assert not drafter.admit(admission).present()
    relay = specstrat.relay.RelayPayload(
        topk_p=payload[0].softmax(-1).topk(4).values,
        topk_index=payload[0].softmax(-1).topk(4).indices,
        hidden_states=payload[1],
    )
    tree = drafter.propose(_step(4, 3, relay))
    assert tree.lengths.tolist() == [3]
    with pytest.raises(InternalError, match=r"the head's cache of slot 0 ends at position 3"):
        drafter.propose(_step(4, 4, relay))


@pytest.fixture(scope="module")
def own_llama() -> Any:
    """This module's tiny llama (wrapping switches its attention to the engine's)."""
    return tiny.model("llama", initializer_range=LEARNABLE_INIT)


@pytest.fixture(scope="module")
def models(own_llama: Any, tmp_path_factory: pytest.TempPathFactory) -> HFModels:
    """The tiny llama with an untrained (seeded) context head attached."""
    torch.manual_seed(0)
    fresh = Eagle3Head.from_target(own_llama, layers=(0, 1), d2t=torch.arange(200), context=True)
    trained = TrainedHead(
        head=fresh,
        target=target_name(own_llama),
        target_sha256=target_sha256(own_llama),
        data_size=0,
        data_source="none",
        steps=0,
        final_loss=float("nan"),
        tau=float("nan"),
    )
    path = save_head(tmp_path_factory.mktemp("head") / "context.safetensors", trained)
    assert load_head(path, own_llama).head.config.context
    plain = HFModels(
        target=HFCausalLM(own_llama, vocab_size=tiny.VOCAB), tokenizer=tiny.tokenizer()
    )
    return attach_head(plain, Path(path))


ALGOS: dict[str, SpecAlgorithm[Any]] = {
    "eagle": specstrat.EAGLE,
    "eagle3": specstrat.EAGLE3,
    "tree": replace(specstrat.EAGLE, tree=TopkTree(topk=2, num_steps=3)),
}


def _requests(models: HFModels) -> list[Request]:
    ids = models.tokenizer("def wrap(text, width=70):\n    return text")["input_ids"]
    return [Request("a", ids[:12], 12), Request("b", ids[:5], 9)]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("name", sorted(ALGOS))
def test_a_context_head_drafts_greedy_lossless(name: str, overlap: bool, models: HFModels) -> None:
    """EAGLE, EAGLE3 and an EAGLE top-k tree with a context head give transformers' greedy
    generate token for token, in sync and overlap (chunked prefill of 4 tokens a forward)."""
    requests = _requests(models)
    config = EngineConfig(context_len=64, overlap=overlap, chunked_prefill_size=4)
    outputs = Engine(ALGOS[name], models, config).run(requests)
    check = compare(models.target, requests, outputs, generate_reference(models.target, requests))
    assert check.lossless, check.line()
    assert check.compared_tokens == 21


@pytest.mark.parametrize("name", ["eagle", "tree"])
def test_the_cache_equals_a_second_pass_over_the_sequence(
    name: str, models: HFModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every draft accepted (forced), the keys a request cached through its prefill and
    its verify steps equal the head's keys over a second pass of the target on the sequence."""
    kept: dict[int, torch.Tensor] = {}
    release = ContextHeadDrafter.release

    def snapshot(self: ContextHeadDrafter, slots: Any) -> None:
        for slot in slots:
            rows = self.rows[slot]
            kept[len(kept)] = rows.k[: rows.count].clone()
        release(self, slots)

    monkeypatch.setattr(ContextHeadDrafter, "release", snapshot)
    algo = replace(ALGOS[name], acceptance=ForcedAcceptance(rate=1.0))
    requests = _requests(models)[:1]
    config = EngineConfig(context_len=64, chunked_prefill_size=5)  # the prompt in 3 forwards
    outputs = Engine(algo, models, config).run(requests)
    sequence = [*requests[0].prompt, *outputs["a"]]
    head = models.head
    assert isinstance(head, Eagle3ContextDraftHead)
    (seq,) = capture_sequences(
        models.target,
        [specstrat.train.Generation(tokens=torch.tensor(sequence), prompt_len=2)],
        layers=(0, 1),
        vocab_size=tiny.VOCAB,
        prompt_rows=True,
    )
    rows = len(sequence) - 1  # the last step may commit past max_new_tokens: its rows too
    assert kept[0].shape[0] >= rows
    with torch.inference_mode():
        _, _, k, _ = head.layer_input(
            seq.features[None, :rows].float(),
            torch.tensor(sequence[1 : rows + 1])[None],
            torch.arange(rows)[None] + 1,
        )
    # The second pass's features are stored in float16: keys agree to about 1e-3.
    torch.testing.assert_close(kept[0][:rows], k[0], atol=2e-3, rtol=2e-3)


def test_a_tree_node_attends_to_its_own_path_only(head: Eagle3Head) -> None:
    """Two frontier nodes whose children swap parents give each child the logits a chain along
    its own path gives (the path's keys follow the parent, siblings are never seen)."""
    from specstrat.strategies.eagle_context import _Walk

    torch.manual_seed(2)
    feats, toks = torch.randn(6, 2 * H), torch.randint(0, V, (7,))
    drafter = _drafter(head, toks[:6].tolist())
    admitted = drafter.admit(
        DraftAdmission(
            slots=(0,),
            bonus_tokens=toks[6:7],
            seq_lens=torch.tensor([6]),
            hidden=feats[5:6],
            draft_input=None,
            sampling=(GREEDY,),
            prompt_hidden=(feats,),
        )
    )
    assert admitted.hidden_states is not None
    step = _step(int(toks[6]), 6, admitted)
    start = admitted.hidden_states[:, None]
    with torch.inference_mode():
        tree = _Walk(drafter, step)
        _, hidden = tree.step(start.expand(1, 2, -1), torch.tensor([[3, 7]]), 1, None)
        swapped = torch.tensor([[1, 0]])
        logits, _ = tree.step(hidden[:, [1, 0]], torch.tensor([[11, 13]]), 2, swapped)
        for node, (first, second) in enumerate([(7, 11), (3, 13)]):
            chain = _Walk(drafter, step)
            _, h = chain.step(start, torch.tensor([[first]]), 1, None)
            want, _ = chain.step(h, torch.tensor([[second]]), 2, None)
            torch.testing.assert_close(logits[0, node], want[0, 0])


def _admission(
    slots: list[int], bonus: list[int], feats: list[torch.Tensor]
) -> DraftAdmission[Any]:
    return DraftAdmission(
        slots=tuple(slots),
        bonus_tokens=torch.tensor(bonus),
        seq_lens=torch.tensor([f.shape[0] for f in feats]),
        hidden=torch.stack([f[-1] for f in feats]),
        draft_input=None,
        sampling=(GREEDY,) * len(slots),
        prompt_hidden=tuple(feats),
    )


def _steps(slots: list[int], bonus: list[int], lens: list[int], payload: Any) -> DraftStep:
    return DraftStep(
        slots=tuple(slots),
        bonus_tokens=torch.tensor(bonus),
        seq_lens=torch.tensor(lens),
        payload=payload,
        max_nodes=3,
        sampling=(GREEDY,) * len(slots),
    )


def test_a_batch_drafts_what_each_request_drafts_alone(head: Eagle3Head) -> None:
    """Three requests of 3, 7 and 5 prompt tokens that accept 0, 2 and 1 drafts get, batched,
    the chains each gets alone, before and after the step; a released slot admitted again
    starts afresh."""
    torch.manual_seed(3)
    lens, slots, accepted = [3, 7, 5], [4, 0, 2], [0, 2, 1]
    seqs = [torch.randint(0, V, (20,)) for _ in lens]
    feats = [torch.randn(20, 2 * H) for _ in lens]
    table = {s: seqs[i][: lens[i]].tolist() for i, s in enumerate(slots)}
    draft_head = head.draft_head(V)
    assert isinstance(draft_head, Eagle3ContextDraftHead)

    def drafter() -> ContextHeadDrafter:
        return ContextHeadDrafter(draft_head, 4, V, context_len=64, target_tokens=table.__getitem__)

    batch, alone = drafter(), [drafter() for _ in slots]
    bonus = [int(seqs[i][lens[i]]) for i in range(3)]
    prompts = [feats[i][: lens[i]] for i in range(3)]
    payload = batch.admit(_admission(slots, bonus, prompts))
    own = [
        d.admit(_admission([s], [bonus[i]], [prompts[i]]))
        for i, (d, s) in enumerate(zip(alone, slots, strict=True))
    ]
    tree = batch.propose(_steps(slots, bonus, lens, payload))
    for i, s in enumerate(slots):
        want = alone[i].propose(_steps([s], [bonus[i]], [lens[i]], own[i]))
        assert tree.tokens[i].tolist() == want.tokens[0].tolist()
    drafts = torch.stack([seqs[i][lens[i] + 1 : lens[i] + 4] for i in range(3)])
    index = torch.tensor([[0, 1, -1][:a] + [-1] * (3 - a) for a in accepted])
    after = [int(seqs[i][lens[i] + 1 + accepted[i]]) for i in range(3)]
    path = torch.zeros(3, 3, 2 * H)
    for i, a in enumerate(accepted):
        path[i, : a + 1] = feats[i][lens[i] : lens[i] + a + 1]

    def outcome(rows: list[int], step: DraftStep) -> StepOutcome:
        return StepOutcome(
            step=step,
            drafts=DraftTree.chain(drafts[rows]),
            acceptance=Acceptance(
                accept_index=index[rows],
                accept_lengths=torch.tensor(accepted)[rows],
                bonus_tokens=torch.tensor(after)[rows],
            ),
            hidden=path[rows, 0],
            path_hidden=path[rows],
        )

    payload = batch.commit(outcome([0, 1, 2], _steps(slots, bonus, lens, payload)))
    own = [
        d.commit(outcome([i], _steps([slots[i]], [bonus[i]], [lens[i]], own[i])))
        for i, d in enumerate(alone)
    ]
    grown = [lens[i] + 1 + accepted[i] for i in range(3)]
    tree = batch.propose(_steps(slots, after, grown, payload))
    for i, s in enumerate(slots):
        want = alone[i].propose(_steps([s], [after[i]], [grown[i]], own[i]))
        assert tree.tokens[i].tolist() == want.tokens[0].tolist()
    batch.release([0])
    table[0] = seqs[1][:2].tolist()
    again = batch.admit(_admission([0], [int(seqs[1][2])], [feats[1][:2]]))
    fresh = drafter().admit(_admission([0], [int(seqs[1][2])], [feats[1][:2]]))
    assert again.hidden_states is not None
    assert fresh.hidden_states is not None
    torch.testing.assert_close(again.hidden_states, fresh.hidden_states)
    assert (batch.rows[0].first, batch.rows[0].count) == (0, 2)


def test_the_drafter_refuses_what_it_cannot_draft_from(head: Eagle3Head) -> None:
    """A local admission without prompt_hidden, prompt rows that do not match the prompt, a
    commit without path_hidden and bad settings are refused naming the field and the fix."""
    drafter = _drafter(head, [1, 2, 3])
    no_rows = replace(_admission([0], [4], [torch.randn(3, 2 * H)]), prompt_hidden=None)
    with pytest.raises(InvalidConfig, match=r"no DraftAdmission\.prompt_hidden; pass each prompt"):
        drafter.admit(no_rows)
    with pytest.raises(InvalidConfig, match=r"prompt_hidden\[0\] holds 2 rows but slot 0's prompt"):
        drafter.admit(_admission([0], [4], [torch.randn(2, 2 * H)]))
    payload = drafter.admit(_admission([0], [4], [torch.randn(3, 2 * H)]))
    step = _steps([0], [4], [3], payload)
    bare = StepOutcome(
        step=step,
        drafts=DraftTree.chain(torch.tensor([[5, 6, 7]])),
        acceptance=Acceptance(
            accept_index=torch.tensor([[-1, -1, -1]]),
            accept_lengths=torch.tensor([0]),
            bonus_tokens=torch.tensor([5]),
        ),
        hidden=torch.randn(1, 2 * H),
    )
    with pytest.raises(InvalidConfig, match=r"commit needs StepOutcome\.path_hidden"):
        drafter.commit(bare)
    draft_head = head.draft_head(V)
    assert isinstance(draft_head, Eagle3ContextDraftHead)
    with pytest.raises(InvalidConfig, match=r"ContextHeadDrafter context_len=0 must be an int"):
        ContextHeadDrafter(draft_head, 4, V, context_len=0, target_tokens=lambda _s: [])
    with pytest.raises(InvalidConfig, match=r"topk=60 exceeds vocab_size=50"):
        ContextHeadDrafter(draft_head, 60, V, context_len=8, target_tokens=lambda _s: [])


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_context_head_failing_mid_run_leaks_nothing(
    overlap: bool, models: HFModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context drafter that raises on its third commit ends the run naming the error, frees
    every slot and KV index, and a fresh engine on the same models is greedy-lossless."""
    calls = [0]
    commit = ContextHeadDrafter.commit

    def failing(self: ContextHeadDrafter, outcome: StepOutcome) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("context fault injected")
        return commit(self, outcome)

    @contextlib.contextmanager
    def injected() -> Iterator[None]:
        with monkeypatch.context() as patch:
            patch.setattr(ContextHeadDrafter, "commit", failing)
            yield

    config = EngineConfig(context_len=64, overlap=overlap)
    assert_fault_leaks_nothing(
        specstrat.EAGLE,
        models,
        _requests(models),
        config,
        "context fault injected",
        injected=injected(),
    )
