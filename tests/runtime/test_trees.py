"""Tree drafting and tree verification: EAGLE-2 top-k trees, tree attention, KV compaction."""

from dataclasses import replace
from typing import Any

import pytest
import torch

import specstrat
from specstrat import ConformanceError, InvalidConfig, SpecAlgorithm, StrategyError
from specstrat.drafting import SamplingParams, TreeShape, VerifyInputs
from specstrat.kernels import build_tree_verify_metadata
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._models.model import TinyLM
from specstrat.runtime._worker import ModelWorker, TreeTokens
from specstrat.strategies import (
    ChainTree,
    EagleHeadDrafterFactory,
    RejectionSamplingAcceptance,
    TopkTree,
)
from specstrat.testing import (
    FaultyDrafterFactory,
    check_lossless_in_distribution,
    check_tree_policy,
    run_conformance,
)
from tests.runtime.conftest import make_worker

REQUESTS = workload(6, seed=5)
TREE_ALGOS = [specstrat.EAGLE, specstrat.EAGLE3, specstrat.STANDALONE]


def run(algo: SpecAlgorithm[Any], models: EmbeddedModels, d: int, **config: Any) -> Engine:
    engine = Engine(algo, models, EngineConfig(context_len=512, num_draft_tokens=d, **config))
    engine.run(REQUESTS)
    return engine


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Plain greedy decoding of the workload."""
    return Engine(specstrat.NONE, models, EngineConfig(context_len=512)).run(REQUESTS)


def tree(algo: SpecAlgorithm[Any], topk: int, steps: int) -> SpecAlgorithm[Any]:
    return replace(algo, tree=TopkTree(topk=topk, num_steps=steps))


@pytest.mark.parametrize("algo", TREE_ALGOS, ids=lambda a: a.name)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_trees_are_lossless(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
) -> None:
    """A top-k tree (topk 3, 3 steps, budget 6) reproduces target-only greedy decoding."""
    engine = Engine(
        tree(algo, 3, 3), models, EngineConfig(context_len=512, num_draft_tokens=6, overlap=overlap)
    )
    assert engine.run(REQUESTS) == target_only


@pytest.mark.slow
@pytest.mark.parametrize("algo", TREE_ALGOS, ids=lambda a: a.name)
@pytest.mark.parametrize(("topk", "steps", "budget"), [(2, 3, 4), (4, 2, 8), (2, 7, 8), (4, 5, 16)])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_tree_matrix_is_lossless(
    algo: SpecAlgorithm[Any],
    topk: int,
    steps: int,
    budget: int,
    overlap: bool,
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
) -> None:
    """Every tree algorithm x topk 2..4 x budget 4..16 x mode equals target-only greedy."""
    engine = Engine(
        tree(algo, topk, steps),
        models,
        EngineConfig(context_len=512, num_draft_tokens=budget, overlap=overlap),
    )
    assert engine.run(REQUESTS) == target_only


@pytest.mark.parametrize("algo", TREE_ALGOS, ids=lambda a: a.name)
def test_topk_one_is_the_chain(algo: SpecAlgorithm[Any], models: EmbeddedModels) -> None:
    """TopkTree(topk=1) drafts exactly the chain: same outputs, same acceptance counts."""
    requests = workload(6, seed=5, sampling=SamplingParams(temperature=0.8, seed=3))
    outputs, stats = [], []
    for policy in (ChainTree(), TopkTree(topk=1, num_steps=3)):
        engine = Engine(replace(algo, tree=policy), models, EngineConfig(context_len=512))
        outputs.append(engine.run(requests))
        stats.append(engine.stats.accepted_by_position)
    assert outputs[0] == outputs[1]
    assert stats[0] == stats[1]


def test_a_tree_accepts_more_than_a_chain_of_the_same_budget(models: EmbeddedModels) -> None:
    """At a verify budget of 8, EAGLE's tree (topk 2, 7 steps) accepts more per step."""
    chain = run(specstrat.EAGLE, models, 8).stats.acceptance_length
    wide = run(tree(specstrat.EAGLE, 2, 7), models, 8).stats.acceptance_length
    assert wide > chain


def test_tree_is_lossless_disaggregated(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """A tree EAGLE prefilled in another process decodes target-only's tokens."""
    from specstrat.runtime._disagg import run_disaggregated

    config = EngineConfig(context_len=512, num_draft_tokens=6)
    result = run_disaggregated(tree(specstrat.EAGLE, 2, 4), REQUESTS, config, models=models)
    assert result.outputs == target_only


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topk": 0, "num_steps": 3}, r"TopkTree.topk=0 must be an int >= 1"),
        ({"topk": 2, "num_steps": 0}, r"TopkTree.num_steps=0 must be an int >= 1"),
        ({"topk": True, "num_steps": 3}, r"TopkTree.topk=True must be an int >= 1"),
    ],
)
def test_tree_policy_values_are_checked(kwargs: dict[str, Any], message: str) -> None:
    """A TopkTree with a bad topk or depth is refused, naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        TopkTree(**kwargs)


def test_a_budget_the_tree_cannot_fill_is_refused(models: EmbeddedModels) -> None:
    """Budget 8 with topk 2 and 2 steps (at most 6 nodes) is refused at engine start."""
    with pytest.raises(InvalidConfig, match=r"tokens_per_req=8 needs 7 draft nodes but topk=2"):
        Engine(tree(specstrat.EAGLE, 2, 2), models, EngineConfig(num_draft_tokens=8))


def test_tree_shape_values_are_checked() -> None:
    """TreeShape refuses a topk of 0 and a negative depth, naming them."""
    with pytest.raises(InvalidConfig, match=r"TreeShape.topk=0 must be an int >= 1"):
        TreeShape(topk=0, num_steps=1, tokens_per_req=2)
    with pytest.raises(InvalidConfig, match=r"TreeShape.num_steps=-1 must be an int >= 0"):
        TreeShape(topk=1, num_steps=-1, tokens_per_req=1)


def test_a_chain_only_drafter_refuses_a_tree(models: EmbeddedModels) -> None:
    """Prompt lookup drafts chains only: a topk-2 tree is refused at engine start."""
    with pytest.raises(
        InvalidConfig,
        match=r"NGRAM\.tree \(TopkTree\(topk=2, num_steps=3\)\) asks for topk=2, but "
        r"NGRAM\.drafter \(NgramDrafterFactory\) drafts chains only .*demo: drop --topk",
    ):
        Engine(tree(specstrat.NGRAM, 2, 3), models, EngineConfig())


def test_the_head_must_relay_enough_candidates(models: EmbeddedModels) -> None:
    """A tree topk above the head's relayed top-k is refused, naming both."""
    algo = replace(
        specstrat.EAGLE, drafter=EagleHeadDrafterFactory(topk=2), tree=TopkTree(topk=3, num_steps=2)
    )
    with pytest.raises(
        InvalidConfig,
        match=r"EAGLE\.drafter \(EagleHeadDrafterFactory\) refused this engine: the tree's "
        r"topk=3 exceeds the 2 candidates per node EagleHeadDrafterFactory\(topk=2\) relays; "
        r"use a tree with topk <= 2 .*drafter=EagleHeadDrafterFactory\(topk=3\)",
    ):
        Engine(algo, models, EngineConfig())


def test_a_policy_returning_the_wrong_budget_is_refused(models: EmbeddedModels) -> None:
    """A tree policy whose shape has another budget than T is named at engine start."""

    class Fixed:
        def tree_shape(self, tokens_per_req: int) -> TreeShape:
            return TreeShape(topk=2, num_steps=2, tokens_per_req=3)

    with pytest.raises(InvalidConfig, match=r"tree=Fixed.tree_shape\(4\) returned"):
        Engine(replace(specstrat.EAGLE, tree=Fixed()), models, EngineConfig())


# -- tree attention and KV compaction ----------------------------------------------------------

PARENTS = torch.tensor([[-1, -1, 0, 0, 2]])  # root -> {0, 1}; 0 -> {2, 3}; 2 -> {4}
TOKENS = [5, 9, 11, 13, 17, 19]  # the root, then nodes 0..4


def tree_layout() -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``[1, T]`` after a 4-token prompt, and the tree mask ``[1, T, T]``."""
    meta = build_tree_verify_metadata(PARENTS, torch.tensor([5]), torch.tensor([4]))
    return meta.positions.view(1, -1), meta.tree_mask


def tree_forward(worker: ModelWorker, mask: torch.Tensor) -> torch.Tensor:
    slot = worker.alloc_request()
    worker.forward(ForwardMode.EXTEND, [slot], [[1, 2, 3, 4]])
    positions, _ = tree_layout()
    logits, _ = worker.forward(
        ForwardMode.TARGET_VERIFY, [slot], [TOKENS], tree=TreeTokens(positions, mask)
    )
    worker.free_request(slot)
    return logits


def test_each_tree_node_sees_exactly_its_path(tiny: TinyLM) -> None:
    """A node's logits under the tree mask equal a plain forward of its root-to-node path."""
    worker = make_worker(tiny)
    _, mask = tree_layout()
    logits = tree_forward(worker, mask)
    paths = {0: [0], 1: [1], 2: [0, 2], 3: [0, 3], 4: [0, 2, 4]}
    for node, path in paths.items():
        slot = worker.alloc_request()
        chain = [1, 2, 3, 4, TOKENS[0], *(TOKENS[j + 1] for j in path)]
        want, _ = worker.forward(ForwardMode.EXTEND, [slot], [chain])
        worker.free_request(slot)
        torch.testing.assert_close(logits[node + 1], want[-1])


def test_attention_reads_the_tree_mask(tiny: TinyLM) -> None:
    """Letting node 1 see node 0 (one mask bit) changes node 1's logits."""
    worker = make_worker(tiny)
    _, mask = tree_layout()
    right = tree_forward(worker, mask)
    wrong_mask = mask.clone()
    wrong_mask[0, 2, 1] = True  # node 1 (row 2) sees node 0 (column 1), not its ancestor
    wrong = tree_forward(worker, wrong_mask)
    assert not torch.allclose(right[2], wrong[2])
    torch.testing.assert_close(right[1], wrong[1])


def test_keep_path_compacts_the_accepted_path(tiny: TinyLM) -> None:
    """keep_path copies the accepted nodes' keys, values and positions into the first tree
    indices, keeps the page table's row, and frees the others."""
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    worker.forward(ForwardMode.EXTEND, [slot], [[1, 2, 3, 10, 11, 12, 13]])
    row = worker.requests.req_to_token[slot]
    locs = row[:7].tolist()
    kv = worker.kv
    want_k, want_v = kv.k[:, [locs[5], locs[6]]].clone(), kv.v[:, [locs[5], locs[6]]].clone()
    free_before = kv.available
    worker.keep_path(slot, 3, [0, 2, 3])
    assert worker.cached([slot])[0] == 6
    assert row[:6].tolist() == locs[:6]
    torch.testing.assert_close(kv.k[:, [locs[4], locs[5]]], want_k)
    torch.testing.assert_close(kv.v[:, [locs[4], locs[5]]], want_v)
    assert kv.positions[[locs[4], locs[5]]].tolist() == [5, 6]
    assert kv.available == free_before + 1
    assert kv.alloc(1, owner=slot) == [locs[6]]


def test_keep_path_refuses_nodes_outside_the_cache(tiny: TinyLM) -> None:
    """A node offset past the cached tokens is refused, naming the call."""
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    worker.forward(ForwardMode.EXTEND, [slot], [[1, 2, 3]])
    with pytest.raises(
        InvalidConfig, match=r"keep_path\(slot=\d+, start=1, nodes=\[0, 5\]\) outside the 3"
    ):
        worker.keep_path(slot, 1, [0, 5])


# -- sampled tree acceptance --------------------------------------------------------------------


def test_sampled_tree_acceptance_keeps_the_target_distribution() -> None:
    """Over many seeds, the first token after a two-child tree follows p (chi-square)."""
    vocab, rows = 6, 6000
    logits = torch.log(torch.tensor([0.3, 0.25, 0.2, 0.1, 0.1, 0.05], dtype=torch.float64))
    inputs = VerifyInputs(
        drafts=specstrat.DraftTree(
            torch.tensor([[0, 1, 2]]).expand(rows, 3).contiguous(),
            torch.tensor([[-1, -1, 0]]).expand(rows, 3).contiguous(),
            torch.full((rows,), 3, dtype=torch.int64),
        ),
        logits=logits.expand(rows, 4, vocab).contiguous(),
        positions=torch.zeros(rows, dtype=torch.int64),
        sampling=tuple(SamplingParams(temperature=1.0, seed=s) for s in range(rows)),
    )
    out = RejectionSamplingAcceptance().accept(inputs)
    node = out.accept_index[:, 0].clamp(min=0)[:, None]
    drafted = inputs.drafts.tokens.gather(1, node).squeeze(1)
    first = torch.where(out.accept_lengths > 0, drafted, out.bonus_tokens)
    counts = torch.bincount(first, minlength=vocab).double()
    expected = logits.exp() * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # chi-square, 5 degrees of freedom, p = 0.001


@pytest.mark.slow
def test_sampled_trees_are_lossless_in_distribution(models: EmbeddedModels) -> None:
    """EAGLE with a top-k tree samples the target's joint distribution of two tokens."""
    check_lossless_in_distribution(
        tree(specstrat.EAGLE, 2, 3), temperature=0.8, num_samples=2000, models=models
    )


# -- what a hostile user found -------------------------------------------------------------------


def test_a_draft_trees_kv_is_reserved_at_submit(models: EmbeddedModels) -> None:
    """A request that fits only without the draft LM's tree columns is refused at submit."""
    algo = tree(specstrat.STANDALONE, 4, 3)  # 4 * (3 - 1) = 8 draft-KV columns past the root
    engine = Engine(algo, models, EngineConfig(context_len=64, num_draft_tokens=4))
    request = specstrat.runtime.Request("r", tuple(range(30)), 20)
    with pytest.raises(
        InvalidConfig, match=r"\+ 2\*T \+ tree columns \(16\) = 66 exceeds context_len=64"
    ):
        engine.submit(request)


def test_a_short_tree_is_padded_and_verified(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """A tree with fewer nodes than the budget is padded with filler and stays lossless."""

    def drop_last(drafts: specstrat.DraftTree) -> specstrat.DraftTree:
        n = drafts.num_nodes - 1
        return specstrat.DraftTree(
            drafts.tokens[:, :n], drafts.parents[:, :n], drafts.lengths.clamp(max=n)
        )

    short = FaultyDrafterFactory(specstrat.EAGLE.drafter, "propose", drop_last)
    algo = replace(specstrat.EAGLE, drafter=short, tree=TopkTree(topk=3, num_steps=3))
    for runner in (True, False):
        config = EngineConfig(context_len=512, num_draft_tokens=6, use_graph_runner=runner)
        assert Engine(algo, models, config).run(REQUESTS) == target_only


def test_a_chain_row_samples_alike_alone_and_beside_a_tree() -> None:
    """A seeded row whose tree is a chain gets the same answer alone or batched with a tree."""
    vocab, n = 8, 3
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, n + 1, vocab, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (2, n), generator=gen)
    parents = torch.tensor([[-1, 0, 1], [-1, -1, 0]])  # row 0 a chain, row 1 branching
    other = SamplingParams(temperature=1.0, seed=5)
    rule = RejectionSamplingAcceptance()

    def accept(rows: int, seed: int) -> tuple[list[int], int, int]:
        sampling = (SamplingParams(temperature=1.0, seed=seed), other)[:rows]
        drafts = specstrat.DraftTree(tokens[:rows], parents[:rows], torch.full((rows,), n))
        out = rule.accept(
            VerifyInputs(
                drafts=drafts,
                logits=logits[:rows],
                positions=torch.zeros(rows, dtype=torch.int64),
                sampling=sampling,
            )
        )
        return out.accept_index[0].tolist(), int(out.accept_lengths[0]), int(out.bonus_tokens[0])

    for seed in range(40):
        assert accept(1, seed) == accept(2, seed)


def test_topk_beyond_the_vocabulary_is_refused_at_start(models: EmbeddedModels) -> None:
    """A tree or relayed top-k wider than the vocabulary is an InvalidConfig at engine start."""
    with pytest.raises(InvalidConfig, match=r"tree topk=300 exceeds the draft LM's vocabulary"):
        Engine(tree(specstrat.STANDALONE, 300, 1), models, EngineConfig(num_draft_tokens=2))
    wide = replace(specstrat.EAGLE, drafter=EagleHeadDrafterFactory(topk=300))
    with pytest.raises(InvalidConfig, match=r"topk=300\) exceeds the target's vocabulary of 256"):
        Engine(wide, models, EngineConfig())


def test_steps_deeper_than_the_budget_are_refused(models: EmbeddedModels) -> None:
    """num_steps past num_draft_tokens - 1 can verify nothing more: refused, naming both."""
    with pytest.raises(
        InvalidConfig,
        match=r"EAGLE\.tree \(TopkTree\(topk=2, num_steps=5\)\) cannot shape T=4 tokens per "
        r"request, what EAGLE\.target_verify \(OffsetVerifyPolicy\) verifies for "
        r"num_draft_tokens=4: num_steps=5 is deeper than tokens_per_req=4 .*; raise "
        r"num_draft_tokens to 6 \(--draft-tokens 6\) or pick a tree that fits T=4",
    ):
        Engine(tree(specstrat.EAGLE, 2, 5), models, EngineConfig(num_draft_tokens=4))
    Engine(tree(specstrat.EAGLE, 2, 5), models, EngineConfig(num_draft_tokens=6))  # the fix


def test_a_tree_on_an_algorithm_that_drafts_nothing_says_so(models: EmbeddedModels) -> None:
    """NONE with a tree is refused for what it is (no speculation), not for a budget of 1."""
    with pytest.raises(
        InvalidConfig,
        match=r"NONE\.tree \(TopkTree\(topk=2, num_steps=3\)\) asks for a draft tree, but "
        r"NONE does not speculate: it verifies T=1 token per request and drafts nothing; use "
        r"tree=ChainTree\(\) with it \(demo: drop --topk and --steps\)",
    ):
        Engine(tree(specstrat.NONE, 2, 3), models, EngineConfig(num_draft_tokens=4))


def test_a_tree_deeper_than_the_policy_is_refused(models: EmbeddedModels) -> None:
    """A drafter proposing a tree deeper than num_steps ends the run naming the hook."""

    def deepen(drafts: specstrat.DraftTree) -> specstrat.DraftTree:
        parents = torch.arange(drafts.num_nodes) - 1
        parents[1] = -1  # a branch at the root, then a long chain
        return specstrat.DraftTree(
            drafts.tokens, parents.expand_as(drafts.parents).clone(), drafts.lengths
        )

    deep = FaultyDrafterFactory(specstrat.EAGLE.drafter, "propose", deepen)
    algo = replace(specstrat.EAGLE, drafter=deep, tree=TopkTree(topk=3, num_steps=2))
    engine = Engine(algo, models, EngineConfig(context_len=512, num_draft_tokens=6))
    with pytest.raises(StrategyError, match=r"proposed a tree 4 nodes deep, but tree=TopkTree"):
        engine.run(REQUESTS)


def test_draft_trees_run_no_target_verify_on_the_draft_worker(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STANDALONE's policy refuses TARGET_VERIFY on the draft worker; its tree forwards obey."""
    engine = Engine(tree(specstrat.STANDALONE, 2, 3), models, EngineConfig(num_draft_tokens=4))
    modes: list[ForwardMode] = []
    forward = ModelWorker.forward

    def spy(worker: ModelWorker, mode: ForwardMode, *args: Any, **kwargs: Any) -> Any:
        if worker.model is models.draft:
            modes.append(mode)
        return forward(worker, mode, *args, **kwargs)

    monkeypatch.setattr(ModelWorker, "forward", spy)
    engine.run(REQUESTS[:2])
    assert ForwardMode.DRAFT_EXTEND in modes
    assert ForwardMode.TARGET_VERIFY not in modes


def test_conformance_runs_the_algorithms_tree() -> None:
    """specstrat's conformance kit fails a chain-only drafter under a top-k tree."""
    results = {r.name: r for r in run_conformance(tree(specstrat.NGRAM, 2, 3))}
    assert results["tree"].passed
    assert not results["drafter"].passed
    assert "drafts chains only" in results["drafter"].message


def test_a_raising_tree_policy_fails_conformance() -> None:
    """check_tree_policy names a policy that raises something other than InvalidConfig."""

    class Boom:
        def tree_shape(self, tokens_per_req: int) -> TreeShape:
            raise RuntimeError("boom")

    with pytest.raises(ConformanceError, match=r"TreePolicy Boom broke .* raised RuntimeError"):
        check_tree_policy(Boom())


def test_replay_tree_refuses_mismatched_inputs(models: EmbeddedModels) -> None:
    """The graph runner's tree replay names a token count or parents shape it cannot verify."""
    worker = ModelWorker(
        models.target, max_running_requests=16, context_len=512, max_total_tokens=16 * 512
    )
    runner = GraphRunner(worker, tree(specstrat.EAGLE, 2, 3), 4)
    tokens = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(InvalidConfig, match=r"parents \(1, 2\); this runner verifies T=4"):
        runner.replay_tree([1], tokens, torch.full((1, 2), -1), torch.tensor([2]))
    with pytest.raises(InvalidConfig, match=r"bs=99 exceeds the largest bucket 16"):
        runner.replay_tree(
            list(range(99)),
            torch.zeros(99, 4, dtype=torch.int64),
            torch.full((99, 3), -1),
            torch.full((99,), 3),
        )


def test_a_step_whose_tree_budget_disagrees_is_refused() -> None:
    """DraftStep refuses a tree shape whose budget is not max_nodes + 1."""
    with pytest.raises(InvalidConfig, match=r"tokens_per_req=4 but max_nodes=2"):
        specstrat.DraftStep(
            slots=(1,),
            bonus_tokens=torch.tensor([5]),
            seq_lens=torch.tensor([3]),
            payload=specstrat.RelayPayload(),
            max_nodes=2,
            sampling=(SamplingParams(),),
            tree=TreeShape(topk=2, num_steps=3, tokens_per_req=4),
        )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda t: TreeShape.chain(max(t - 1, 1)), r"tree_shape\(2\) .* returned TreeShape"),
        (lambda t: "wide", r"tree_shape\(1\) .* returned 'wide'"),
        (lambda t: TreeShape(topk=2, num_steps=t + 1, tokens_per_req=t), r"refused every one"),
    ],
)
def test_check_tree_policy_names_a_bad_answer(answer: Any, message: str) -> None:
    """A policy answering another budget, a non-shape, or refusing every budget fails the kit."""

    class Policy:
        def tree_shape(self, tokens_per_req: int) -> TreeShape:
            result: TreeShape = answer(tokens_per_req)
            return result

    with pytest.raises(ConformanceError, match=message):
        check_tree_policy(Policy())


def test_check_tree_policy_names_an_impure_policy() -> None:
    """A policy that answers differently on a second call fails the kit, naming both answers."""

    class Flaky:
        calls = 0

        def tree_shape(self, tokens_per_req: int) -> TreeShape:
            Flaky.calls += 1
            return TreeShape.chain(tokens_per_req) if Flaky.calls % 2 else "chain"  # type: ignore[return-value]

    with pytest.raises(ConformanceError, match=r"answered TreeShape\(.*\), then 'chain'"):
        check_tree_policy(Flaky())
