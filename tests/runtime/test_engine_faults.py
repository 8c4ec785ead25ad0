"""Every fault in a run ends in a named error, leaks nothing, and the engine refuses reuse;
every bad configuration is refused at construction; admission respects the KV budget."""

import threading
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
    InvalidConfig,
    RelayPayload,
    SpecAlgorithm,
    StrategyError,
    UnknownAlgorithm,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._disagg import PrefillWorker
from specstrat.strategies import (
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
    GreedyAcceptance,
    TopkTree,
)
from specstrat.testing import (
    FaultyAcceptance,
    FaultyDrafterFactory,
    FaultyFutureMapFactory,
    FaultySpeculationPolicy,
)

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = workload(6, seed=3)


TREE = TopkTree(topk=2, num_steps=3)  # a top-k tree: its KV must come back too


def drafting(method: str, fault: Any, after: int = 0, base: SpecAlgorithm[Any] = EAGLE) -> Any:
    """``base`` whose drafter's ``method`` fails on cue."""
    return replace(base, drafter=FaultyDrafterFactory(base.drafter, method, fault, after=after))


def accepting(fault: Any, after: int = 0) -> Any:
    """EAGLE whose acceptance rule fails on cue."""
    return replace(EAGLE, acceptance=FaultyAcceptance(EAGLE.acceptance, fault, after=after))


def relaying(method: str, fault: Any, after: int = 0) -> Any:
    """EAGLE whose relay's ``method`` fails on cue."""
    return replace(
        EAGLE, future_map=FaultyFutureMapFactory(EAGLE.future_map, method, fault, after=after)
    )


def choosing(fault: Any, after: int = 0, base: Any = None) -> Any:
    """EAGLE whose speculation policy's chooser fails on cue."""
    inner = base if base is not None else FixedSpeculationPolicy()
    policy = FaultySpeculationPolicy(inner, "choose_width", fault, after=after)
    return replace(EAGLE, speculation=policy)


def more_nodes(tree: DraftTree) -> DraftTree:
    return DraftTree.chain(torch.cat([tree.tokens, tree.tokens], dim=1))


def fewer_rows(tree: DraftTree) -> DraftTree:
    return DraftTree.chain(tree.tokens[1:])


def out_of_vocab(tree: DraftTree) -> DraftTree:
    return DraftTree.chain(tree.tokens + 300)


def branching(tree: DraftTree) -> DraftTree:
    parents = torch.full_like(tree.parents, -1)
    return DraftTree(tree.tokens, parents, tree.lengths)


def accept_all(answer: Acceptance) -> Acceptance:
    n = answer.accept_index.shape[1]
    index = torch.arange(n).expand_as(answer.accept_index).contiguous()
    return Acceptance(index, torch.full_like(answer.accept_lengths, n + 1), answer.bonus_tokens)


def skip_a_node(answer: Acceptance) -> Acceptance:
    index = torch.full_like(answer.accept_index, -1)
    index[:, 0] = 1  # node 1 without its parent node 0
    return Acceptance(index, torch.ones_like(answer.accept_lengths), answer.bonus_tokens)


def bonus_out_of_vocab(answer: Acceptance) -> Acceptance:
    return Acceptance(answer.accept_index, answer.accept_lengths, answer.bonus_tokens + 1000)


def float_lengths(answer: Acceptance) -> Acceptance:
    return Acceptance(answer.accept_index, answer.accept_lengths.double(), answer.bonus_tokens)


def wrong_rows(payload: RelayPayload) -> RelayPayload:
    return RelayPayload(bonus_tokens=torch.zeros(99, dtype=torch.int64))


def swapped_bonus(got: RelayPayload) -> RelayPayload:
    assert got.bonus_tokens is not None
    return replace(got, bonus_tokens=got.bonus_tokens.flip(0))


def bonus_plus(got: RelayPayload) -> RelayPayload:
    assert got.bonus_tokens is not None
    return replace(got, bonus_tokens=got.bonus_tokens + 1000)


def index_past_the_tree(answer: Acceptance) -> Acceptance:
    index = torch.where(answer.accept_index >= 0, answer.accept_index, 99)
    return Acceptance(index, answer.accept_lengths, answer.bonus_tokens)


def on_meta(tree: DraftTree) -> DraftTree:
    return DraftTree.chain(tree.tokens.to("meta"))


def q_too_narrow(tree: DraftTree) -> DraftTree:
    q = torch.ones(tree.bs, tree.num_nodes, 7, dtype=torch.float64)
    return DraftTree.chain(tree.tokens, lengths=tree.lengths, q=q)


FAULTS: list[tuple[str, Callable[[], Any], str]] = [
    (
        "resolve-swapped-bonus",
        lambda: relaying("resolve", swapped_bonus),
        r"EAGLE\.future_map\.resolve: returned bonus token \d+ for slot \d+, but \d+ was stashed",
    ),
    (
        "resolve-bonus-out-of-vocab",
        lambda: relaying("resolve", bonus_plus),
        r"EAGLE\.future_map\.resolve: returned bonus token \d+ for slot",
    ),
    (
        "accept-index-past-the-tree",
        lambda: accepting(index_past_the_tree),
        r"accept_index=\[.*99.*\] holds node indices outside -1\.\.2",
    ),
    (
        "propose-on-another-device",
        lambda: drafting("propose", on_meta),
        r"proposed a tree on meta; the engine runs on cpu",
    ),
    (
        "propose-q-too-narrow",
        lambda: drafting("propose", q_too_narrow),
        r"q has 7 columns; the target's vocabulary has 256",
    ),
    (
        "propose-raises",
        lambda: drafting("propose", RuntimeError("boom")),
        r"EAGLE\.drafter\.propose: raised RuntimeError: boom",
    ),
    (
        "propose-raises-later",
        lambda: drafting("propose", AttributeError("late"), after=5),
        r"EAGLE\.drafter\.propose: raised AttributeError: late",
    ),
    (
        "commit-raises",
        lambda: drafting("commit", ValueError("bad")),
        r"EAGLE\.drafter\.commit: raised ValueError: bad",
    ),
    (
        "admit-raises",
        lambda: drafting("admit", KeyError("k")),
        r"EAGLE\.drafter\.admit: raised KeyError",
    ),
    (
        "release-raises",
        lambda: drafting("release", RuntimeError("gone")),
        r"EAGLE\.drafter\.release: raised RuntimeError: gone",
    ),
    (
        "draft-lm-propose-raises",
        lambda: drafting("propose", RuntimeError("x"), 2, specstrat.STANDALONE),
        r"STANDALONE\.drafter\.propose: raised RuntimeError: x",
    ),
    (
        "tree-commit-raises-later",
        lambda: replace(drafting("commit", RuntimeError("t"), 3, specstrat.STANDALONE), tree=TREE),
        r"STANDALONE\.drafter\.commit: raised RuntimeError: t",
    ),
    (
        "tree-accept-raises-later",
        lambda: replace(accepting(ZeroDivisionError("z"), 3), tree=TREE),
        r"EAGLE\.acceptance\.accept: raised ZeroDivisionError: z",
    ),
    (
        "accept-raises",
        lambda: accepting(ZeroDivisionError("div")),
        r"EAGLE\.acceptance\.accept: raised ZeroDivisionError: div",
    ),
    (
        "stash-raises",
        lambda: relaying("stash", RuntimeError("relay"), after=3),
        r"EAGLE\.future_map\.stash: raised RuntimeError: relay",
    ),
    (
        "publish-raises",
        lambda: relaying("publish", RuntimeError("pub"), after=2),
        r"EAGLE\.future_map\.publish: raised RuntimeError: pub",
    ),
    (
        "resolve-raises",
        lambda: relaying("resolve", RuntimeError("res"), after=1),
        r"EAGLE\.future_map\.resolve: raised RuntimeError: res",
    ),
    (
        "resolve-wrong-type",
        lambda: relaying("resolve", lambda got: {"bonus": 1}),
        r"EAGLE\.future_map\.resolve: returned dict, not a RelayPayload",
    ),
    (
        "resolve-stale-lengths",
        lambda: relaying("resolve", lambda got: replace(got, seq_lens=got.seq_lens + 1)),
        r"EAGLE\.future_map\.resolve: returned seq_lens=.* but the slot table holds",
    ),
    (
        "propose-not-a-tree",
        lambda: drafting("propose", lambda got: [1, 2, 3]),
        r"EAGLE\.drafter\.propose: returned list, not a DraftTree",
    ),
    (
        "propose-too-many-nodes",
        lambda: drafting("propose", more_nodes),
        r"proposed 6 nodes per request; the target verifies at most max_nodes=3",
    ),
    (
        "propose-wrong-rows",
        lambda: drafting("propose", fewer_rows),
        r"EAGLE\.drafter\.propose: proposed \d+ rows for \d+ requests",
    ),
    (
        "propose-out-of-vocab",
        lambda: drafting("propose", out_of_vocab),
        r"proposed token ids \[\d+.*\] outside the vocabulary 0\.\.255",
    ),
    (
        "propose-branching-tree",
        lambda: drafting("propose", branching),
        r"proposed a tree that is not a chain, but tree=ChainTree asks for a chain",
    ),
    (
        "accept-too-long",
        lambda: accepting(accept_all),
        r"EAGLE\.acceptance\.accept: request 0 accepted 4 drafts but 3 were proposed",
    ),
    (
        "accept-not-a-path",
        lambda: accepting(skip_a_node),
        r"accept_index=\[1, -1, -1\] with accept_lengths=1 is not a root-to-node path",
    ),
    (
        "accept-bonus-out-of-vocab",
        lambda: accepting(bonus_out_of_vocab),
        r"bonus tokens \[\d+.*\] outside the vocabulary 0\.\.255",
    ),
    (
        "accept-wrong-dtype",
        lambda: accepting(float_lengths),
        r"accept_lengths is torch.float64 \(\d+,\); expected torch.int64",
    ),
    (
        "accept-not-acceptance",
        lambda: accepting(lambda got: (1, 2)),
        r"EAGLE\.acceptance\.accept: returned tuple, not an Acceptance",
    ),
    (
        "commit-wrong-rows",
        lambda: drafting("commit", wrong_rows),
        r"EAGLE\.drafter\.commit: returned a payload of 99 rows for \d+ requests",
    ),
    (
        "admit-not-a-payload",
        lambda: drafting("admit", lambda got: None),
        r"EAGLE\.drafter\.admit: returned NoneType, not a RelayPayload",
    ),
    (
        "policy-raises-later",
        lambda: choosing(RuntimeError("pick"), after=2),
        r"EAGLE\.speculation\.choose_width: raised RuntimeError: pick",
    ),
    (
        "policy-returns-garbage",
        lambda: choosing(lambda got: "wide"),
        (
            r"EAGLE\.speculation\.choose_width: "
            r"speculation=FaultySpeculationPolicy answered D='wide' \(str\)"
        ),
    ),
    (
        "tree-policy-outside-candidates-later",
        lambda: replace(
            choosing(lambda got: got + 1, after=3, base=GoodputSpeculationPolicy()), tree=TREE
        ),
        (
            r"answered D=[2-5] \(int\) for a batch of \d+; answer "
            r"an int among the declared candidates \[1, 2, 3, 4\]"
        ),
    ),
]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize(("case", "make", "message"), FAULTS, ids=[c[0] for c in FAULTS])
def test_a_failing_hook_is_named_leaks_nothing_and_closes_the_engine(
    case: str, make: Callable[[], Any], message: str, overlap: bool, models: EmbeddedModels
) -> None:
    """A hook that raises or breaks its contract ends the run with a StrategyError naming the
    algorithm, hook and method; every slot and KV index is free; the engine refuses reuse."""
    engine = Engine(make(), models, replace(CONFIG, overlap=overlap))
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(StrategyError, match=message):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"run: this engine was closed after a failed run"):
        engine.run([Request("again", (65, 66), 4)])
    with pytest.raises(EngineStateError, match=r"submit: this engine was closed"):
        engine.submit(Request("later", (65, 66), 4))


def test_a_failing_builder_is_named(models: EmbeddedModels) -> None:
    """A disagg builder that raises on PREBUILT admission is a StrategyError naming it."""

    class Broken(specstrat.strategies.EagleDisaggDraftBuilder):
        def build_disagg_draft_input(self, *args: Any) -> Any:
            raise RuntimeError("no state")

    algo = replace(EAGLE, disagg=Broken())
    engine = Engine(algo, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    prefill = PrefillWorker(EAGLE, models, context_len=512, batch_size=2)
    engine.submit_prebuilt(prefill.prefill(REQUESTS[:2]))
    with pytest.raises(
        StrategyError, match=r"EAGLE\.disagg\.build_disagg_draft_input: raised RuntimeError"
    ):
        engine.run()
    assert (engine.free_slots, engine.free_kv_tokens) == before


def test_a_failing_drafter_factory_is_named(models: EmbeddedModels) -> None:
    """A drafter factory that raises is reported at engine construction, naming it."""
    with pytest.raises(StrategyError, match=r"EAGLE\.drafter\.create_drafter: raised OSError"):
        Engine(drafting("create_drafter", OSError("disk")), models, CONFIG)


def test_an_interrupt_in_overlap_mode_leaks_nothing(models: EmbeddedModels) -> None:
    """Ctrl-C inside a step on the forward thread propagates; slots and KV come back and the
    engine refuses reuse instead of continuing from a half-done step."""
    engine = Engine(
        drafting("propose", KeyboardInterrupt("ctrl-c"), after=4),
        models,
        replace(CONFIG, overlap=True),
    )
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(KeyboardInterrupt, match=r"ctrl-c"):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"closed after a failed run \(KeyboardInterrupt"):
        engine.run()


def test_a_second_run_returns_only_its_own_outputs(models: EmbeddedModels) -> None:
    """run() returns the requests of that run; an engine runs many workloads correctly."""
    engine = Engine(NGRAM, models, CONFIG)
    first = engine.run(REQUESTS[:3])
    second = engine.run(REQUESTS[3:])
    assert set(first) == {"req-0", "req-1", "req-2"}
    assert set(second) == {"req-3", "req-4", "req-5"}
    assert {**first, **second} == Engine("NONE", models, CONFIG).run(REQUESTS)


def test_a_concurrent_run_is_refused(models: EmbeddedModels) -> None:
    """While a run is in progress, run() and submit() from another thread are refused with a
    named error, and the first run finishes with the right outputs."""
    entered, release = threading.Event(), threading.Event()

    def hold(tree: DraftTree) -> DraftTree:
        entered.set()
        release.wait(timeout=120)
        return tree

    engine = Engine(drafting("propose", hold, base=NGRAM), models, CONFIG)
    results: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: results.update(engine.run(REQUESTS[:2])))
    worker.start()
    assert entered.wait(timeout=120)
    try:
        with pytest.raises(EngineStateError, match=r"run\(\) is in progress on another thread"):
            engine.run(REQUESTS[2:])
        with pytest.raises(EngineStateError, match=r"submit: run\(\) is in progress"):
            engine.submit(REQUESTS[3])
    finally:
        release.set()
        worker.join(timeout=120)
    assert results == Engine("NONE", models, CONFIG).run(REQUESTS[:2])


def test_admission_waits_for_kv_instead_of_failing(models: EmbeddedModels) -> None:
    """A KV pool that holds about two requests at a time still runs the whole workload, in
    turn, to the same outputs; nothing fails mid-run for lack of KV."""
    tight = replace(CONFIG, max_total_tokens=450)
    want = Engine("NONE", models, CONFIG).run(REQUESTS)
    engine = Engine(EAGLE, models, tight)
    assert engine.run(REQUESTS) == want
    assert engine.free_kv_tokens == 450  # EAGLE runs the target alone: all of it free again


def test_a_request_larger_than_the_kv_pool_is_refused_at_submit(models: EmbeddedModels) -> None:
    """A request that could never fit the pool is refused at submit, naming max_total_tokens."""
    engine = Engine(EAGLE, models, replace(CONFIG, max_total_tokens=100))
    with pytest.raises(InvalidConfig, match=r"needs 128 KV indices > max_total_tokens=100"):
        engine.submit(Request("big", (65,) * 60, 60))


CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("d-zero", {"num_draft_tokens": 0}, r"num_draft_tokens=0 must be an int >= 1"),
    ("d-bool", {"num_draft_tokens": True}, r"num_draft_tokens=True must be an int >= 1"),
    ("mrr-negative", {"max_running_requests": -2}, r"max_running_requests=-2 must be an int"),
    ("context-str", {"context_len": "big"}, r"context_len='big' must be an int >= 1"),
    ("chunk-float", {"chunked_prefill_size": 1.5}, r"chunked_prefill_size=1.5 must be an int"),
    ("kv-zero", {"max_total_tokens": 0}, r"max_total_tokens=0 must be an int >= 1, or None"),
    ("kv-negative", {"max_total_tokens": -5}, r"max_total_tokens=-5 must be an int >= 1"),
    ("overlap-str", {"overlap": "no"}, r"EngineConfig.overlap='no' must be True or False"),
    ("graph-int", {"use_graph_runner": 1}, r"use_graph_runner=1 must be True or False"),
    ("ragged-none", {"ragged_verify": None}, r"ragged_verify=None must be True or False"),
    ("buckets-empty", {"graph_buckets": ()}, r"graph_buckets=\(\) must be a non-empty tuple"),
    ("buckets-zero", {"graph_buckets": (0, 4)}, r"graph_buckets=\(0, 4\) must be a non-empty"),
    ("buckets-list", {"graph_buckets": [1, 2]}, r"graph_buckets=\[1, 2\] must be a non-empty"),
]


@pytest.mark.parametrize(("case", "kw", "message"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_engine_config_refuses_bad_values(case: str, kw: dict[str, Any], message: str) -> None:
    """Every EngineConfig field is type- and range-checked at construction."""
    with pytest.raises(InvalidConfig, match=message):
        EngineConfig(**kw)


class ImpurePolicy(specstrat.strategies.OffsetVerifyPolicy):
    calls = 0

    def get_num_tokens_per_req_for_target_verify(self, d: int, is_draft_worker: bool) -> int:
        ImpurePolicy.calls += 1
        return 1 + ImpurePolicy.calls % 2


ENGINES: list[tuple[str, Callable[[EmbeddedModels], Any], type[Exception], str]] = [
    ("unknown-name", lambda m: Engine("NOPE", m), UnknownAlgorithm, r"NOPE"),
    (
        "not-an-algorithm",
        lambda m: Engine(42, m),  # type: ignore[arg-type]
        InvalidConfig,
        r"algo=42 \(int\); pass a SpecAlgorithm or a registered name",
    ),
    (
        "models-none",
        lambda m: Engine(EAGLE, None),  # type: ignore[arg-type]
        InvalidConfig,
        r"models=NoneType; pass EmbeddedModels.load\(\) or specstrat.ModelSet",
    ),
    (
        "config-dict",
        lambda m: Engine(EAGLE, m, {"overlap": True}),  # type: ignore[arg-type]
        InvalidConfig,
        r"config=\{'overlap': True\}; pass a specstrat.runtime.EngineConfig",
    ),
    (
        "d-too-wide",
        lambda m: Engine(EAGLE, m, EngineConfig(num_draft_tokens=300, context_len=512)),
        InvalidConfig,
        r"num_draft_tokens=300 verifies T=300 tokens per request, which leaves no room",
    ),
    (
        "impure-policy",
        lambda m: Engine(replace(EAGLE, target_verify=ImpurePolicy()), m),
        StrategyError,
        r"EAGLE\.target_verify\.get_num_tokens_per_req_for_target_verify: "
        r"target_verify=ImpurePolicy answered T=1 for the target worker when asked again, after "
        r"T=2 for the same num_draft_tokens; the policy must be pure",
    ),
    (
        "kv-absurd",
        lambda m: Engine(EAGLE, m, EngineConfig(max_total_tokens=10**12)),
        InvalidConfig,
        r"max_total_tokens=1000000000000 needs [\d.]+ GiB of KV cache",
    ),
    (
        "context-past-positions",
        lambda m: Engine(EAGLE, m, EngineConfig(context_len=4096)),
        InvalidConfig,
        r"context_len=4096 exceeds the model's max_positions=1024",
    ),
]


@pytest.mark.parametrize(("case", "make", "error", "message"), ENGINES, ids=[c[0] for c in ENGINES])
def test_engine_refuses_bad_arguments(
    case: str,
    make: Callable[[EmbeddedModels], Any],
    error: type[Exception],
    message: str,
    models: EmbeddedModels,
) -> None:
    """Engine arguments are checked at construction, each with an error naming the value."""
    with pytest.raises(error, match=message):
        make(models)


def test_engine_accepts_a_registered_name(models: EmbeddedModels) -> None:
    """Engine('eagle', ...) runs the registered algorithm of that name."""
    engine = Engine("eagle", models, CONFIG)
    assert engine.algo is EAGLE


def test_hooks_writing_into_the_engines_tensors_change_no_token(models: EmbeddedModels) -> None:
    """A drafter or rule that scribbles on tensors it was given, after answering, cannot
    change the output: the engine copied what it needs when each answer was checked."""

    class Scribbler(specstrat.strategies.NgramDrafter):
        def propose(self, step: Any) -> DraftTree:
            tree = super().propose(step)
            step.bonus_tokens.zero_()
            step.seq_lens.add_(1)
            return tree

        def commit(self, outcome: Any) -> RelayPayload:
            outcome.acceptance.bonus_tokens.zero_()
            outcome.acceptance.accept_lengths.zero_()
            return super().commit(outcome)

    class ScribblerFactory(specstrat.strategies.NgramDrafterFactory):
        def create_drafter(self, context: Any) -> Scribbler:
            return Scribbler(self.min_ngram, self.max_ngram, context.target_tokens)

    class ScribblingRule(GreedyAcceptance):
        def accept(self, inputs: Any) -> Acceptance:
            answer = GreedyAcceptance.accept(self, inputs)
            inputs.drafts.tokens.fill_(65)
            return answer

    algo = replace(NGRAM, drafter=ScribblerFactory(), acceptance=ScribblingRule())
    for overlap in (False, True):
        config = replace(CONFIG, overlap=overlap)
        assert Engine(algo, models, config).run(REQUESTS) == Engine("NONE", models, config).run(
            REQUESTS
        )


RUN_ARGUMENTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "bare-request",
        {"requests": Request("one", (65,), 2)},
        r"requests=Request; pass a list of Requests",
    ),
    ("progress-not-callable", {"progress": 42}, r"progress=42 is not callable"),
    ("source-not-callable", {"source": "x"}, r"source='x' is not callable"),
    ("trace-a-path", {"trace": "trace.jsonl"}, r"trace='trace.jsonl'; pass an open text stream"),
]


@pytest.mark.parametrize(
    ("case", "kw", "message"), RUN_ARGUMENTS, ids=[c[0] for c in RUN_ARGUMENTS]
)
def test_bad_run_arguments_leave_the_engine_usable(
    case: str, kw: dict[str, Any], message: str, models: EmbeddedModels
) -> None:
    """run()'s arguments are checked before anything runs; the engine stays usable."""
    engine = Engine(NGRAM, models, CONFIG)
    args = {"requests": REQUESTS[:2], **kw}
    with pytest.raises(InvalidConfig, match=message):
        engine.run(**args)
    assert engine.run(REQUESTS[:2]) == Engine("NONE", models, CONFIG).run(REQUESTS[:2])


def test_a_closed_or_binary_trace_is_refused_up_front(
    models: EmbeddedModels, tmp_path: Any
) -> None:
    """A closed file or a binary stream as trace is an InvalidConfig before the run starts."""
    engine = Engine(NGRAM, models, CONFIG)
    closed = (tmp_path / "closed.jsonl").open("w")
    closed.close()
    with pytest.raises(InvalidConfig, match=r"pass an open text stream"):
        engine.run(REQUESTS[:1], trace=closed)
    with (
        (tmp_path / "binary.jsonl").open("wb") as binary,
        pytest.raises(InvalidConfig, match=r"does not take text .* open it in text mode"),
    ):
        engine.run(REQUESTS[:1], trace=binary)
    assert engine.run(REQUESTS[:1])


def test_run_from_inside_a_hook_is_refused(models: EmbeddedModels) -> None:
    """Calling run() again from a callback of the same run is a named error, not a deadlock."""
    engine = Engine(NGRAM, models, CONFIG)

    def progress(done: int, total: int) -> None:
        engine.run([])

    with pytest.raises(EngineStateError, match=r"already in progress on this thread"):
        engine.run(REQUESTS[:1], progress=progress)
