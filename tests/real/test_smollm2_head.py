"""SmolLM2-135M-Instruct with the draft head the package ships (``make test-real``): it loads with
no flag, is bound to SmolLM2's weights, keeps EAGLE, EAGLE3 and an EAGLE tree greedy-lossless
against transformers' ``generate`` in sync, overlap and disaggregated runs, and still agrees with
the target as well as its metadata says (the README's train block, in test_readme_real, trains
one from the CLI)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specstrat import EAGLE, EAGLE3, SpecAlgorithm
from specstrat.hf import HFModels, compare, load
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import TopkTree
from specstrat.train import (
    attach_head,
    capture,
    default_prompts,
    evaluate,
    generate,
    head_for,
    head_metadata,
    load_head,
    shipped_head,
)

pytestmark = pytest.mark.real

TREE = replace(EAGLE, name="EAGLE_TREE", tree=TopkTree(topk=2, num_steps=3))
ALGOS: list[SpecAlgorithm[Any]] = [EAGLE, EAGLE3, TREE]
CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=4)
#: How far below its recorded tau the shipped head may measure on 16 held-out prompts.
TAU_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def head_file() -> Path:
    """The shipped head, as the CLI picks it for an EAGLE run on smollm2 with no --head."""
    picked = head_for("smollm2", None, [EAGLE])
    assert picked is not None, "the package ships no head for smollm2 (specstrat/train/heads/)"
    return Path(picked)


@pytest.fixture(scope="module")
def smollm2(head_file: Path) -> HFModels:
    """SmolLM2 with the shipped head attached."""
    return attach_head(load(smollm2_path()), head_file)


def test_the_shipped_head_is_small_and_bound_to_smollm2(head_file: Path) -> None:
    """The file is at most 30 MB and says what made it; its hash matches SmolLM2's weights."""
    assert head_file == shipped_head("smollm2")
    assert head_file.stat().st_size <= 30 * 2**20
    meta = head_metadata(head_file)
    assert meta["command"].startswith("specstrat train --model smollm2")
    assert int(meta["data_size"]) > 0
    assert int(meta["steps"]) > 0
    trained = load_head(head_file, load(smollm2_path()).target)  # refused on a hash mismatch
    assert trained.target_sha256 == meta["target_sha256"]


def test_the_shipped_head_agrees_as_its_metadata_says(smollm2: HFModels, head_file: Path) -> None:
    """On 16 held-out pool prompts the head's offline tau is its recorded tau, within 0.25."""
    trained = load_head(head_file, smollm2.target)
    pool = default_prompts()
    held = pool[len(pool) - round(0.1 * len(pool)) :][:16]
    gens = generate(smollm2.target, smollm2.tokenizer, held, max_new_tokens=64)
    vocab = smollm2.target.shape.vocab_size
    data = capture(smollm2.target, gens, layers=trained.layers, d2t=trained.d2t, vocab_size=vocab)
    measured = evaluate(trained.head, data)["tau"]
    assert measured >= trained.tau - TAU_TOLERANCE, (measured, trained.tau)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_the_head_is_lossless(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """Each EAGLE form with the trained head gives generate's greedy tokens."""
    engine = Engine(algo, smollm2, replace(CONFIG, overlap=overlap))
    check = compare(smollm2.target, requests, engine.run(requests), reference)
    assert check.lossless, check.line()


def test_the_head_is_lossless_disaggregated(
    smollm2: HFModels, requests: list[Request], reference: dict[str, list[int]]
) -> None:
    """Prefilled in a second process that loads SmolLM2 and attaches the same head."""
    loader = HFLoader(smollm2.source, "float32", smollm2.attach)
    result = run_disaggregated(EAGLE, requests, CONFIG, models=smollm2, loader=loader, timeout=300)
    assert result.rejected == []
    check = compare(smollm2.target, requests, result.outputs, reference)
    assert check.lossless, check.line()
