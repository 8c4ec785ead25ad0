"""Sampling end to end: seeded requests are batch-invariant, rejection sampling is lossless in
distribution (and biased rules are caught), typical acceptance says it is lossy."""

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specstrat
from specstrat import (
    EAGLE,
    NGRAM,
    STANDALONE,
    ConformanceError,
    InvalidConfig,
    SamplingParams,
    SpecAlgorithm,
    TypicalAcceptance,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request
from specstrat.runtime.demo import workload
from specstrat.runtime.disagg import run_disaggregated
from specstrat.testing import check_acceptance_rule, check_lossless_in_distribution
from tests.runtime.biased import ACCEPT_ALL, NO_RESIDUAL

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
    [{"temperature": 0.7}, {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.9},
     {"temperature": 0.7, "top_k": 20}],
    ids=["t0.7", "t1.0", "t1.0-top_p0.9", "t0.7-top_k20"],
)  # fmt: skip
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", [EAGLE, STANDALONE, NGRAM], ids=lambda a: a.name)
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
    check_acceptance_rule(specstrat.RejectionSamplingAcceptance())


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
