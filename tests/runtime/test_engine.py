"""The plain scheduler: lossless speculation for every algorithm, overlap == sync, bad requests."""

from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specstrat
from specstrat import (
    EAGLE,
    NGRAM,
    Capabilities,
    InvalidConfig,
    RelayError,
    SpecAlgorithm,
    StrategyError,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, ForwardMode, Request, workload
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._worker import ModelWorker
from specstrat.strategies import (
    NgramDrafterFactory,
    NoDrafterFactory,
    OffsetVerifyPolicy,
    RingFutureMapFactory,
)
from tests.runtime.custom_algos import NGRAM_RAGGED
from tests.typing.first_match import LOOKUP_THEN_HEAD
from tests.typing.readme_drafter import BIGRAM
from tests.typing.readme_example import MY_EAGLE

REQUESTS = workload(6, seed=3)  # request 3 stops at its first newline


def run(
    algo: SpecAlgorithm[Any], models: EmbeddedModels, requests: list[Request] = REQUESTS, **kw: Any
) -> dict[str, list[int]]:
    """Outputs of one engine run."""
    config = EngineConfig(**{"context_len": 512, "max_running_requests": 8, **kw})
    return Engine(algo, models, config).run(requests)


def short_ngram() -> SpecAlgorithm[None]:
    """A custom algorithm whose target verifies D - 1 tokens (T != D), without ragged verify."""
    return replace(
        NGRAM,
        name="SHORT_NGRAM",
        capabilities=Capabilities(),
        target_verify=OffsetVerifyPolicy(target_offset=-1),
    )


ALGOS = [*specstrat.BUILTINS[1:], MY_EAGLE, BIGRAM, NGRAM_RAGGED, short_ngram(), LOOKUP_THEN_HEAD]


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Plain greedy decoding of the shared workload: what every algorithm must reproduce."""
    return run(specstrat.NONE, models)


@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: a.name)
def test_lossless_for_every_algorithm(
    algo: SpecAlgorithm[Any], models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """Speculative output equals target-only greedy output token for token (D = 4, sync)."""
    assert run(algo, models) == target_only


@pytest.mark.parametrize("algo", [EAGLE, NGRAM, specstrat.DSPARK], ids=lambda a: a.name)
def test_overlap_and_one_draft_token(
    algo: SpecAlgorithm[Any], models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """Overlap mode, and D = 1 (nothing to draft where T = D), reproduce target-only output."""
    assert run(algo, models, overlap=True) == target_only
    assert run(algo, models, num_draft_tokens=1) == target_only


@pytest.mark.slow
@pytest.mark.parametrize("stops", [True, False], ids=["stops", "no-stops"])
@pytest.mark.parametrize("d", [1, 4])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: a.name)
def test_lossless_matrix(
    algo: SpecAlgorithm[Any], overlap: bool, d: int, stops: bool, models: EmbeddedModels
) -> None:
    """Every algorithm x mode x D x stop tokens: identical to target-only greedy decoding."""
    requests = workload(8, seed=5, stops=stops)
    want = run(specstrat.NONE, models, requests)
    assert run(algo, models, requests, overlap=overlap, num_draft_tokens=d) == want


def test_ragged_verify_runs_only_found_drafts(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """Prompt lookup with ragged verify verifies only the tokens it found: fewer target
    tokens than the uniform rows (T each, or the roots alone where nobody drafted), same
    output."""
    runs = {}
    for ragged in (True, False):
        config = EngineConfig(context_len=512, max_running_requests=8, ragged_verify=ragged)
        engine = Engine(NGRAM_RAGGED, models, config)
        assert engine.run(REQUESTS) == target_only
        runs[ragged] = engine.stats
    full = runs[False].verified_requests * 4  # T = D = 4 tokens per request per verify
    assert runs[True].verify_forward_tokens < runs[False].verify_forward_tokens <= full


def test_a_step_in_which_nobody_drafted_costs_a_decode(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """A drafter that never proposes, at D = 4 without ragged verify: every verify runs the
    roots alone (one token a request, a DECODE), and the output is target-only's."""
    silent = replace(NGRAM, name="SILENT", drafter=NoDrafterFactory(), capabilities=Capabilities())
    for overlap in (False, True):
        config = EngineConfig(context_len=512, max_running_requests=4, overlap=overlap)
        engine = Engine(silent, models, config)
        assert engine.run(REQUESTS) == target_only
        assert engine.stats.verified_requests > 0
        assert engine.stats.verify_forward_tokens == engine.stats.verified_requests


def test_ngram_sizes_are_checked() -> None:
    """A prompt-lookup drafter with min_ngram outside 1..max_ngram is refused, naming both."""
    with pytest.raises(InvalidConfig, match=r"min_ngram=3, max_ngram=2: need 1 <= min_ngram"):
        NgramDrafterFactory(min_ngram=3, max_ngram=2)
    with pytest.raises(InvalidConfig, match=r"min_ngram=0, max_ngram=4"):
        NgramDrafterFactory(min_ngram=0)


def test_ragged_verify_needs_the_capability(models: EmbeddedModels) -> None:
    """Prompt lookup without ``supports_ragged_verify`` verifies every row full width (T = D - 1
    = 3), but for steps in which nobody drafted, which run the roots alone (1): never 2."""
    engine = Engine(short_ngram(), models, EngineConfig(context_len=512))
    engine.run(REQUESTS)
    stats = engine.stats
    full = stats.verified_requests * 3
    assert stats.verify_forward_tokens <= full
    assert (full - stats.verify_forward_tokens) % 2 == 0  # each root-only row is 2 fewer


def test_every_request_gets_its_tokens_and_everything_is_returned(
    models: EmbeddedModels,
) -> None:
    """Each request produces max_new_tokens tokens (or stops at its stop token), and every
    request slot and KV index of every model comes back."""
    engine = Engine(specstrat.STANDALONE, models, EngineConfig(context_len=512))
    before = (engine.free_slots, engine.free_kv_tokens)
    outputs = engine.run(REQUESTS)
    for request in REQUESTS:
        out = outputs[request.rid]
        if request.stop_token_ids:
            assert out[-1] in request.stop_token_ids or len(out) == request.max_new_tokens
            assert not set(out[:-1]) & request.stop_token_ids
        else:
            assert len(out) == request.max_new_tokens
    assert (engine.free_slots, engine.free_kv_tokens) == before


@settings(max_examples=6, deadline=None)
@given(
    prompts=st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=10),
    d=st.integers(1, 6),
    lengths=st.lists(st.integers(1, 40), min_size=10, max_size=10),
    algo=st.sampled_from([NGRAM, EAGLE, specstrat.DSPARK, short_ngram()]),
    overlap=st.booleans(),
)
def test_lossless_property(
    prompts: list[bytes],
    d: int,
    lengths: list[int],
    algo: SpecAlgorithm[Any],
    overlap: bool,
    models: EmbeddedModels,
) -> None:
    """Any prompts, D and batch mix (more requests than slots): speculation is lossless."""
    requests = [Request(f"p{i}", tuple(p), lengths[i]) for i, p in enumerate(prompts)]
    want = run(specstrat.NONE, models, requests, max_running_requests=4)
    got = run(algo, models, requests, max_running_requests=4, num_draft_tokens=d, overlap=overlap)
    assert got == want


def test_bad_requests_are_refused_without_disturbing_others(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """Empty prompts, prompts longer than the context, max_new_tokens <= 0 and tokens outside the
    vocabulary are refused; the requests already submitted run as if nothing happened."""
    engine = Engine(NGRAM, models, EngineConfig(context_len=512))
    for request in REQUESTS:
        engine.submit(request)
    with pytest.raises(InvalidConfig, match=r"request 'empty': prompt=\(\) must be a non-empty"):
        engine.submit(Request("empty", (), 4))
    with pytest.raises(
        InvalidConfig, match=r"request 'zero': max_new_tokens=0 must be an int >= 1"
    ):
        engine.submit(Request("zero", (1, 2), 0))
    with pytest.raises(
        InvalidConfig,
        match=(
            r"request 'long': prompt \(600\) \+ max_new_tokens "
            r"\(4\) \+ 2\*T \(8\) = 612 exceeds context_len=512"
        ),
    ):
        engine.submit(Request("long", (65,) * 600, 4))
    with pytest.raises(InvalidConfig, match=r"request id 'req-0' was already submitted"):
        engine.submit(REQUESTS[0])
    with pytest.raises(InvalidConfig, match=r"prompt token 300 is outside the target's vocabulary"):
        engine.submit(Request("wide", (300,), 4))
    assert engine.run() == target_only


def test_ring_relay_runs_lossless_and_refuses_when_too_small(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """A ring sized by the engines' formula relays correctly; one too small refuses, never
    aliases."""

    def with_ring(ring: RingFutureMapFactory) -> SpecAlgorithm[None]:
        return replace(NGRAM, name="RING_NGRAM", future_map=ring)

    assert run(with_ring(RingFutureMapFactory()), models) == target_only
    with pytest.raises(
        StrategyError, match=r"RING_NGRAM.future_map.publish: raised RelayError: ring future map"
    ) as caught:
        run(with_ring(RingFutureMapFactory(capacity=3)), models)
    assert isinstance(caught.value, RelayError)
    assert isinstance(caught.value.__cause__, RelayError)
    # The relay's own refusal: no writer to blame, the algorithm named by the engine.
    assert (caught.value.writer, caught.value.algorithm) == (None, "RING_NGRAM")


def test_graph_replay_equals_eager_for_every_bucket(models: EmbeddedModels) -> None:
    """TARGET_VERIFY through each bucket's static buffers equals the eager forward."""
    for bs in (1, 2, 3, 4, 8, 13, 16):
        eager_worker, graph_worker = (_target_worker(models) for _ in range(2))
        graphs = GraphRunner(graph_worker, EAGLE, 4)
        prompts = [list(r.prompt) for r in workload(bs, seed=bs)]
        tokens = torch.randint(0, 256, (bs, 4), generator=torch.Generator().manual_seed(bs))
        results = []
        for worker in (eager_worker, graph_worker):
            slots = [worker.alloc_request() for _ in range(bs)]
            worker.forward(ForwardMode.EXTEND, slots, prompts)
            results.append(slots)
        e_slots, g_slots = results
        eager, _ = eager_worker.forward(ForwardMode.TARGET_VERIFY, e_slots, tokens.tolist())
        replayed, _ = graphs.replay(g_slots, tokens)
        torch.testing.assert_close(replayed, eager, rtol=1e-12, atol=1e-12)
        assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


def _target_worker(models: EmbeddedModels) -> ModelWorker:
    """A worker over the embedded target, sized as an engine with context 512 sizes it."""
    return ModelWorker(
        models.target, max_running_requests=16, context_len=512, max_total_tokens=16 * 512
    )


def test_draft_worker_verify_follows_the_policy(models: EmbeddedModels) -> None:
    """A draft worker may run TARGET_VERIFY only when the policy allows it; T follows it."""
    worker = _target_worker(models)
    runner = GraphRunner(worker, specstrat.DSPARK, 4, is_draft_worker=True)
    assert runner.tokens_per_req == 3
    with pytest.raises(
        InvalidConfig, match=r"algorithm EAGLE does not allow TARGET_VERIFY on the draft worker"
    ):
        GraphRunner(worker, EAGLE, 4, is_draft_worker=True)
