"""Adaptive speculation, the full matrix (slow): every built-in algorithm under every built-in
policy stays lossless in sync and overlap, EAGLE and NGRAM under every policy disaggregated,
and sampling stays in distribution."""

from dataclasses import replace
from typing import Any

import pytest

import specstrat
from specstrat import SpecAlgorithm
from specstrat.protocols import SpeculationPolicy
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import (
    BatchScheduleSpeculationPolicy,
    EmaLadderSpeculationPolicy,
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
    TopkTree,
)
from specstrat.testing import ScriptedSpeculationPolicy, check_lossless_in_distribution

pytestmark = pytest.mark.slow

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(8, seed=5, stops=True)
POLICIES: dict[str, SpeculationPolicy] = {
    "fixed": FixedSpeculationPolicy(),
    # SGLang's rule and alpha with a short warm-up and interval and one ladder through D = 1, so
    # this short workload moves between rungs (SGLang's defaults barely leave D = 4 here).
    "ema": EmaLadderSpeculationPolicy(ladders=((1, (1, 2, 4), 0.0),), warmup=2, interval=2),
    "schedule": BatchScheduleSpeculationPolicy(schedule=((3, 4), (6, 2))),  # D = 1 above 6
    "goodput": GoodputSpeculationPolicy(),
    "scripted": ScriptedSpeculationPolicy((1, 4, 1, 1, 2, 3, 1, 4, 2)),
}
TREE = TopkTree(topk=2, num_steps=3)
ALGOS = [
    *specstrat.BUILTINS[1:],
    replace(specstrat.EAGLE, name="EAGLE_TREE", tree=TREE),  # a top-k tree, cut per lane
]


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Plain greedy decoding of the matrix's workload."""
    return Engine(specstrat.NONE, models, CONFIG).run(REQUESTS)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("policy", list(POLICIES), ids=str)
@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: a.name)
def test_every_algorithm_under_every_policy(
    algo: SpecAlgorithm[Any],
    policy: str,
    overlap: bool,
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
) -> None:
    """Greedy output equals target-only token for token, whatever D each step chose."""
    engine = Engine(
        replace(algo, speculation=POLICIES[policy]), models, replace(CONFIG, overlap=overlap)
    )
    assert engine.run(REQUESTS) == target_only
    if policy in ("schedule", "scripted"):
        assert len(engine.stats.width_histogram) > 1, engine.stats.width_histogram
        assert 1 in engine.stats.width_histogram  # the run passed through k = 0


@pytest.mark.parametrize("policy", list(POLICIES), ids=str)
@pytest.mark.parametrize("algo", [specstrat.EAGLE, specstrat.NGRAM], ids=lambda a: a.name)
def test_disaggregated_under_every_policy(
    algo: SpecAlgorithm[Any], policy: str, models: EmbeddedModels
) -> None:
    """Prefill in another process, decode here under the policy: target-only output."""
    requests = workload(6, seed=11, stops=True)
    want = Engine(specstrat.NONE, models, CONFIG).run(requests)
    spec = replace(algo, speculation=POLICIES[policy])
    result = run_disaggregated(
        spec,
        requests,
        replace(CONFIG, overlap=policy == "scripted"),
        models=models,
        batch_size=4,
        timeout=120.0,
    )
    assert result.outputs == want
    assert result.rejected == []


@pytest.mark.parametrize("policy", ["schedule", "scripted"])
@pytest.mark.parametrize("algo", [specstrat.EAGLE, specstrat.DSPARK], ids=lambda a: a.name)
def test_sampling_stays_in_distribution(
    algo: SpecAlgorithm[Any], policy: str, models: EmbeddedModels
) -> None:
    """Rejection sampling under a changing D keeps the target's joint distribution of the
    first two tokens (the check raises ConformanceError when it does not)."""
    chosen = ScriptedSpeculationPolicy((3, 1, 4)) if policy == "scripted" else POLICIES[policy]
    report = check_lossless_in_distribution(
        replace(algo, speculation=chosen), temperature=1.0, num_samples=2000, models=models
    )
    assert report.p_value >= 1e-3
