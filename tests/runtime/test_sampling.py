"""Sampling end to end: seeded requests are batch-invariant, rejection sampling is lossless in
distribution (and biased rules are caught), typical acceptance says it is lossy."""

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specstrat
import specstrat.strategies
from specstrat import (
    EAGLE,
    NGRAM,
    STANDALONE,
    ConformanceError,
    DraftTree,
    InvalidConfig,
    SamplingParams,
    SpecAlgorithm,
    StrategyError,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import TypicalAcceptance
from specstrat.testing import (
    FaultyDrafterFactory,
    check_acceptance_rule,
    check_lossless_in_distribution,
)
from tests.runtime.biased import ACCEPT_ALL, NO_RESIDUAL
from tests.typing.first_match import LOOKUP_THEN_HEAD

CONFIG = EngineConfig(context_len=512, max_running_requests=8)


def sampled(requests: list[Request], temperature: float, **kw: Any) -> list[Request]:
    """The requests with sampling parameters, seed = index."""
    return [
        replace(r, sampling=SamplingParams(temperature=temperature, seed=i, **kw))
        for i, r in enumerate(requests)
    ]


POOL = sampled(workload(12, seed=21), 0.9, top_p=0.95)


@settings(max_examples=8, deadline=None)
@given(
    algo=st.sampled_from([EAGLE, NGRAM, STANDALONE]),
    picked=st.lists(st.integers(0, 11), min_size=1, max_size=6, unique=True),
    overlap=st.booleans(),
    d=st.integers(1, 5),
)
def test_a_seeded_request_gives_the_same_tokens_in_any_batch(
    algo: SpecAlgorithm[Any], picked: list[int], overlap: bool, d: int, models: EmbeddedModels
) -> None:
    """A seeded request's tokens depend on its seed and prompt only: alone, or in any batch,
    sync or overlap, they are the same."""
    config = replace(CONFIG, num_draft_tokens=d)
    alone = Engine(algo, models, config).run([POOL[picked[0]]])
    batch = Engine(algo, models, replace(config, overlap=overlap)).run([POOL[i] for i in picked])
    assert batch[POOL[picked[0]].rid] == alone[POOL[picked[0]].rid]


def test_sampling_actually_samples(models: EmbeddedModels) -> None:
    """Different seeds give different continuations; at temperature 0 the seed changes nothing."""
    request = workload(1, seed=4)[0]

    def run(params: SamplingParams) -> list[int]:
        return Engine(EAGLE, models, CONFIG).run([replace(request, sampling=params)])[request.rid]

    assert len({tuple(run(SamplingParams(temperature=1.0, seed=s))) for s in range(3)}) > 1
    assert run(SamplingParams(seed=1)) == run(SamplingParams(seed=2))


@pytest.mark.parametrize("algo", [EAGLE, STANDALONE], ids=lambda a: a.name)
def test_rejection_sampling_is_lossless_in_distribution(
    algo: SpecAlgorithm[Any], models: EmbeddedModels
) -> None:
    """The built-in rule passes the chi-square check on the first two tokens at temperature 1."""
    report = check_lossless_in_distribution(algo, temperature=1.0, num_samples=2000, models=models)
    assert report.p_value >= report.significance
    assert report.acceptance_length > 1.0  # speculation really ran


@pytest.mark.parametrize(
    "rule", [ACCEPT_ALL, NO_RESIDUAL], ids=["accepts-every-draft", "never-uses-the-residual"]
)
def test_biased_rules_fail_the_check(rule: Any, models: EmbeddedModels) -> None:
    """A rule that accepts every draft, or samples from p instead of the residual after a
    rejection, fails the check with its statistic."""
    algo = replace(EAGLE, name="BIASED", acceptance=rule)
    with pytest.raises(
        ConformanceError, match=r"BIASED is not lossless in distribution .* chi-square=\d+"
    ):
        check_lossless_in_distribution(algo, temperature=1.0, num_samples=2000, models=models)


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7},
        {"temperature": 1.0},
        {"temperature": 1.0, "top_p": 0.9},
        {"temperature": 0.7, "top_k": 20},
    ],
    ids=["t0.7", "t1.0", "t1.0-top_p0.9", "t0.7-top_k20"],
)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", [EAGLE, STANDALONE, NGRAM, LOOKUP_THEN_HEAD], ids=lambda a: a.name)
def test_lossless_in_distribution_matrix(
    algo: SpecAlgorithm[Any], overlap: bool, params: dict[str, Any], models: EmbeddedModels
) -> None:
    """Every built-in drafter with rejection sampling, at 0.7 and 1.0, with top-p and top-k."""
    check_lossless_in_distribution(algo, models=models, overlap=overlap, **params)


def test_typical_acceptance_says_it_is_lossy(models: EmbeddedModels) -> None:
    """TypicalAcceptance reports lossless=False, passes the path contract, and runs."""
    rule = TypicalAcceptance()
    assert rule.lossless is False
    check_acceptance_rule(rule)
    algo = replace(EAGLE, name="TYPICAL", acceptance=rule)
    assert algo.lossless is False
    outputs = Engine(algo, models, CONFIG).run(sampled(workload(3, seed=2), 0.8))
    assert len(outputs) == 3
    with pytest.raises(InvalidConfig, match=r"posterior_alpha=0 must be a number in \(0, 1\]"):
        TypicalAcceptance(posterior_alpha=0)


def test_rejection_sampling_passes_the_path_contract() -> None:
    """The built-in rule passes check_acceptance_rule (greedy at temperature 0)."""
    check_acceptance_rule(specstrat.strategies.RejectionSamplingAcceptance())


def test_sampled_disaggregation_equals_one_process(models: EmbeddedModels) -> None:
    """Sampling parameters and seeds travel with the transfer: prefill in another process gives
    the very same sampled tokens as one process."""
    requests = sampled(workload(6, seed=11), 0.8, top_k=40)
    single = Engine(EAGLE, models, CONFIG).run(requests)
    result = run_disaggregated(EAGLE, requests, CONFIG, models=models, batch_size=4, timeout=120)
    assert result.outputs == single


def test_a_request_needs_sampling_params() -> None:
    """Request(sampling=...) must be a SamplingParams."""
    with pytest.raises(InvalidConfig, match=r"sampling=0\.7; pass specstrat\.SamplingParams"):
        Request("r", (1, 2), 4, sampling=0.7)  # type: ignore[arg-type]


BAD_PARAMS: list[tuple[str, dict[str, Any], str]] = [
    ("temperature-subnormal", {"temperature": 1e-320}, r"temperature=1e-320 is below 1e-05; use 0"),
    (
        "seed-too-big",
        {"seed": 2**64},
        r"seed=18446744073709551616 must be an int in 0\.\.2\*\*63-1",
    ),
    ("top-k-too-big", {"top_k": 2**63}, r"top_k=9223372036854775808 must be an int in 0\.\.2"),
    ("seed-negative", {"seed": -1}, r"seed=-1 must be an int in 0\.\.2\*\*63-1"),
]


@pytest.mark.parametrize(("case", "kw", "message"), BAD_PARAMS, ids=[c[0] for c in BAD_PARAMS])
def test_sampling_params_refuse_values_that_would_break_later(
    case: str, kw: dict[str, Any], message: str
) -> None:
    """Temperatures that overflow the logits and seeds or top-k past int64 are refused."""
    with pytest.raises(InvalidConfig, match=message):
        SamplingParams(**kw)


def nan_q(tree: DraftTree) -> DraftTree:
    assert tree.q is not None
    return replace(tree, q=tree.q * float("nan"))


def q_without_the_token(tree: DraftTree) -> DraftTree:
    assert tree.q is not None
    q = tree.q.clone()
    q.scatter_(2, tree.tokens[:, :, None], 0.0)
    return replace(tree, q=q / q.sum(-1, keepdim=True))


def q_half_mass(tree: DraftTree) -> DraftTree:
    assert tree.q is not None
    return replace(tree, q=tree.q * 0.5)


BAD_Q: list[tuple[str, Any, str]] = [
    ("nan", nan_q, r"q holds negative, NaN or infinite probabilities"),
    ("no-mass-at-token", q_without_the_token, r"q gives a drafted token no probability"),
    ("half-mass", q_half_mass, r"q rows sum to 0\.5.*must be a probability distribution"),
]


@pytest.mark.parametrize(("case", "corrupt", "message"), BAD_Q, ids=[c[0] for c in BAD_Q])
def test_a_drafters_q_must_be_a_distribution_over_its_token(
    case: str, corrupt: Any, message: str, models: EmbeddedModels
) -> None:
    """A q with NaN, without mass at the drafted token, or not summing to 1 is a StrategyError
    naming the drafter, not silently wrong tokens."""
    algo = replace(EAGLE, drafter=FaultyDrafterFactory(EAGLE.drafter, "propose", corrupt))
    with pytest.raises(StrategyError, match=r"EAGLE\.drafter\.propose: " + message):
        Engine(algo, models, CONFIG).run(sampled(workload(2, seed=3), 1.0))


CHECKER_ARGS: list[tuple[str, dict[str, Any], str]] = [
    (
        "prompt-out-of-vocab",
        {"prompt": (1, 2, 256)},
        r"prompt=\(1, 2, 256\) must be a non-empty tuple of token ids in 0\.\.255",
    ),
    ("prompt-empty", {"prompt": ()}, r"prompt=\(\) must be a non-empty tuple"),
    (
        "significance-str",
        {"significance": "0.1"},
        r"significance='0\.1' must be a number in \(0, 1\)",
    ),
    ("seed-too-big", {"seed": 2**64}, r"seed=18446744073709551616 must be an int"),
    (
        "too-few-samples",
        {"temperature": 20.0, "num_samples": 100},
        r"num_samples=100 is too few for this distribution",
    ),
]


@pytest.mark.parametrize(("case", "kw", "message"), CHECKER_ARGS, ids=[c[0] for c in CHECKER_ARGS])
def test_the_checker_refuses_arguments_it_cannot_use(
    case: str, kw: dict[str, Any], message: str, models: EmbeddedModels
) -> None:
    """Bad checker arguments, or too few samples to bin, are named errors, never a pass."""
    args: dict[str, Any] = {"temperature": 1.0, **kw}
    with pytest.raises(InvalidConfig, match=message):
        check_lossless_in_distribution(EAGLE, models=models, **args)


def test_an_unknown_kernel_backend_is_refused_at_construction() -> None:
    """RejectionSamplingAcceptance(backend=...) is checked when the rule is built."""
    with pytest.raises(InvalidConfig, match=r"backend='bogus' is not one of"):
        specstrat.strategies.RejectionSamplingAcceptance(backend="bogus")  # type: ignore[arg-type]
