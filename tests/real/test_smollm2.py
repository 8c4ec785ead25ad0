"""SmolLM2-135M-Instruct end to end (``make test-real``): the GGUF conversion and its cache, and
every algorithm that runs without trained weights lossless against transformers' ``generate``
in sync, overlap and disaggregated runs. Two requests of the code-editing workload, 24 new
tokens each, keep this to minutes on 2 cores."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from specstrat import NGRAM, NONE, SpecAlgorithm
from specstrat.cli import main
from specstrat.hf import (
    NGRAM_RAGGED,
    HFModels,
    ReferenceCheck,
    cache_dir,
    compare,
    load,
)
from specstrat.hf.algorithms import early_exit_algorithm
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import TopkTree

pytestmark = pytest.mark.real

EARLY_EXIT_TREE = replace(
    early_exit_algorithm(8), name="EARLY_EXIT_8_TREE", tree=TopkTree(topk=2, num_steps=3)
)
ALGOS: list[SpecAlgorithm[Any]] = [
    NONE,
    NGRAM,
    NGRAM_RAGGED,
    early_exit_algorithm(8),
    EARLY_EXIT_TREE,
]
CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=4)


@pytest.fixture(scope="module")
def smollm2() -> HFModels:
    """SmolLM2 loaded once (converted into the fresh cache `make test-real` points at)."""
    return load(smollm2_path())


def _check(
    smollm2: HFModels,
    requests: list[Request],
    out: dict[str, list[int]],
    reference: dict[str, list[int]],
) -> ReferenceCheck:
    check = compare(smollm2.target, requests, out, reference)
    assert check.lossless, check.line()
    return check


def test_the_conversion_is_cached(smollm2: HFModels) -> None:
    """The GGUF file's converted weights and tokenizer are in the cache; a second load reads
    them (the cached files are not rewritten) and gives the same model."""
    cached = next((cache_dir() / "models").glob("SmolLM2-135M-Instruct.Q4_1-*"))
    stamp = (cached / "config.json").stat().st_mtime_ns
    again = load(smollm2_path())
    assert (cached / "config.json").stat().st_mtime_ns == stamp
    assert again.target.shape == smollm2.target.shape
    shape = smollm2.target.shape
    assert (shape.layers, shape.heads, shape.kv_heads, shape.vocab_size) == (30, 9, 3, 49152)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_lossless_against_generate(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """Each algorithm's greedy output equals transformers' generate (or certified ties)."""
    engine = Engine(algo, smollm2, replace(CONFIG, overlap=overlap))
    _check(smollm2, requests, engine.run(requests), reference)


@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_lossless_disaggregated(
    algo: SpecAlgorithm[Any],
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """Prefilled in a second process that loads SmolLM2 itself, decoded here: still lossless."""
    result = run_disaggregated(
        algo, requests, CONFIG, models=smollm2, loader=HFLoader(smollm2.source), timeout=300
    )
    _check(smollm2, requests, result.outputs, reference)


def test_early_exit_accepts_more_with_depth(smollm2: HFModels, requests: list[Request]) -> None:
    """Early exit at 4 layers accepts less than at 24 (a model not trained for early exit)."""
    lengths = []
    for layer in (4, 24):
        engine = Engine(early_exit_algorithm(layer), smollm2, CONFIG)
        engine.run(requests)
        lengths.append(engine.stats.acceptance_length)
    assert 1.0 <= lengths[0] < lengths[1]


def test_demo_on_smollm2(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat demo --model smollm2 --algo NGRAM` is lossless against target-only and
    transformers' generate."""
    argv = ["demo", "--model", "smollm2", "--algo", "NGRAM", "--requests", "2"]
    assert main([*argv, "--max-new-tokens", "16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lossless"] is True
    assert "transformers generate: identical" in summary["lossless_check"]
