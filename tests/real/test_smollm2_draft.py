"""SmolLM2-135M-Instruct with the draft LM the package ships (``make test-real``): STANDALONE
picks it with no flag, it is bound to SmolLM2's weights and small, keeps STANDALONE (chain and
tree) greedy-lossless against transformers' ``generate`` in sync, overlap and disaggregated
runs, and still agrees with the target as well as its metadata says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specstrat import STANDALONE, SpecAlgorithm
from specstrat.hf import HFModels, compare, load
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import TopkTree
from specstrat.train import (
    attach_draft,
    capture_sequences,
    default_prompts,
    draft_agreement,
    draft_for,
    draft_lm_metadata,
    generate,
    load_draft_lm,
    raw_model,
    shipped_draft,
    shipped_head,
)
from specstrat.train.capture import draft_data

pytestmark = pytest.mark.real

TREE = replace(STANDALONE, name="STANDALONE_TREE", tree=TopkTree(topk=2, num_steps=3))
ALGOS: list[SpecAlgorithm[Any]] = [STANDALONE, TREE]
CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=4)
#: How far below its recorded tau the shipped draft may measure on 16 held-out prompts.
TAU_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def draft_file() -> Path:
    """The shipped draft LM, as the CLI picks it for STANDALONE on smollm2 with no --draft."""
    picked = draft_for("smollm2", None, [STANDALONE])
    assert picked is not None, "the package ships no draft LM for smollm2 (specstrat/train/heads/)"
    return Path(picked)


@pytest.fixture(scope="module")
def smollm2(draft_file: Path) -> HFModels:
    """SmolLM2 with the shipped draft LM attached."""
    return attach_draft(load(smollm2_path()), draft_file)


def test_the_shipped_draft_is_small_and_bound_to_smollm2(draft_file: Path) -> None:
    """The file is at most 30 MB, the shipped weights together under 60 MB; it says what made
    it, and its hash matches SmolLM2's weights."""
    assert draft_file == shipped_draft("smollm2")
    head = shipped_head("smollm2")
    assert draft_file.stat().st_size <= 30 * 2**20
    assert draft_file.stat().st_size + (head.stat().st_size if head else 0) < 60 * 2**20
    meta = draft_lm_metadata(draft_file)
    assert meta["command"].startswith("specstrat train --kind draft-lm --model smollm2")
    assert int(meta["data_size"]) > 0
    assert int(meta["steps"]) > 0
    trained = load_draft_lm(draft_file, load(smollm2_path()).target)  # refused on a mismatch
    assert trained.target_sha256 == meta["target_sha256"]


def test_the_shipped_draft_agrees_as_its_metadata_says(smollm2: HFModels, draft_file: Path) -> None:
    """On 16 held-out pool prompts the draft's offline tau is its recorded tau, within 0.25."""
    trained = load_draft_lm(draft_file, smollm2.target)
    pool = default_prompts()
    held = pool[len(pool) - round(0.1 * len(pool)) :][:16]
    gens = generate(smollm2.target, smollm2.tokenizer, held, max_new_tokens=64)
    vocab = smollm2.target.shape.vocab_size
    d2t = trained.draft.get_buffer("d2t")
    with raw_model(smollm2.target) as lm:
        seqs = capture_sequences(lm, gens, layers=(0, 1), vocab_size=vocab, prompt_rows=True)
        data = draft_data(lm, seqs, layers=(0, 1), d2t=d2t)
    measured = draft_agreement(trained.draft, data)["tau"]
    assert measured >= trained.tau - TAU_TOLERANCE, (measured, trained.tau)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_standalone_is_lossless(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """STANDALONE with the distilled draft, chain and tree, gives generate's greedy tokens."""
    engine = Engine(algo, smollm2, replace(CONFIG, overlap=overlap))
    check = compare(smollm2.target, requests, engine.run(requests), reference)
    assert check.lossless, check.line()
    assert sum(engine.stats.accepted_by_position) > 0


def test_standalone_is_lossless_disaggregated(
    smollm2: HFModels, requests: list[Request], reference: dict[str, list[int]]
) -> None:
    """Prefilled in a second process that loads SmolLM2 and attaches the same draft LM."""
    loader = HFLoader(smollm2.source, "float32", smollm2.attach)
    result = run_disaggregated(
        STANDALONE, requests, CONFIG, models=smollm2, loader=loader, timeout=300
    )
    assert result.rejected == []
    check = compare(smollm2.target, requests, result.outputs, reference)
    assert check.lossless, check.line()
