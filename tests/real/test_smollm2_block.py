"""SmolLM2-135M-Instruct with the block drafter the package ships (``make test-real``): DFLASH
and DSPARK pick it with no flag, it is bound to SmolLM2's weights and small, keeps both greedy-
lossless against transformers' ``generate`` in sync, overlap and disaggregated runs, and still
agrees with the target as well as its metadata says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specstrat import DFLASH, DSPARK, SpecAlgorithm
from specstrat.hf import HFModels, compare, load
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._disagg import run_disaggregated
from specstrat.train import (
    attach_block,
    block_agreement,
    block_for,
    block_lm_metadata,
    capture_sequences,
    default_prompts,
    generate,
    load_block_lm,
    raw_model,
    shipped_draft,
    shipped_head,
)
from specstrat.train.capture import draft_data

pytestmark = pytest.mark.real

ALGOS: list[SpecAlgorithm[Any]] = [DFLASH, DSPARK]
CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=4)
#: How far below its recorded tau the shipped drafter may measure on 16 held-out prompts.
TAU_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def block_file() -> Path:
    """The shipped block drafter, as the CLI picks it for DFLASH on smollm2 with no --block."""
    picked = block_for("smollm2", None, [DFLASH])
    assert picked is not None, "the package ships no block drafter for smollm2"
    return Path(picked)


@pytest.fixture(scope="module")
def smollm2(block_file: Path) -> HFModels:
    """SmolLM2 with the shipped block drafter attached."""
    return attach_block(load(smollm2_path()), block_file)


def test_the_shipped_drafter_is_small_and_bound_to_smollm2(block_file: Path) -> None:
    """The file is at most 20 MB, every shipped file together under 60 MB; it says what made
    it, and its hash matches SmolLM2's weights."""
    others = [f for f in (shipped_head("smollm2"), shipped_draft("smollm2")) if f is not None]
    assert block_file.stat().st_size <= 20 * 2**20
    assert block_file.stat().st_size + sum(f.stat().st_size for f in others) < 60 * 2**20
    meta = block_lm_metadata(block_file)
    assert meta["command"].startswith("specstrat train --kind block --model smollm2")
    assert int(meta["data_size"]) > 0
    assert int(meta["steps"]) > 0
    trained = load_block_lm(block_file, load(smollm2_path()).target)  # refused on a mismatch
    assert trained.target_sha256 == meta["target_sha256"]


def test_the_shipped_drafter_agrees_as_its_metadata_says(
    smollm2: HFModels, block_file: Path
) -> None:
    """On 16 held-out pool prompts the drafter's offline tau is its recorded tau, within
    0.25."""
    trained = load_block_lm(block_file, smollm2.target)
    pool = default_prompts()
    held = pool[len(pool) - round(0.1 * len(pool)) :][:16]
    gens = generate(smollm2.target, smollm2.tokenizer, held, max_new_tokens=64)
    vocab = smollm2.target.shape.vocab_size
    d2t = trained.draft.get_buffer("d2t")
    with raw_model(smollm2.target) as lm:
        seqs = capture_sequences(lm, gens, layers=(0, 1), vocab_size=vocab, prompt_rows=True)
        data = draft_data(lm, seqs, layers=(0, 1), d2t=d2t)
    measured = block_agreement(trained.draft, data)["tau"]
    assert measured >= trained.tau - TAU_TOLERANCE, (measured, trained.tau)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_block_drafting_is_lossless(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """DFLASH and DSPARK with the trained block drafter give generate's greedy tokens, their
    draft worker running TARGET_VERIFY."""
    engine = Engine(algo, smollm2, replace(CONFIG, overlap=overlap))
    check = compare(smollm2.target, requests, engine.run(requests), reference)
    assert check.lossless, check.line()
    assert engine.stats.draft_worker_verify_forwards > 0
    if algo is DFLASH:
        assert sum(engine.stats.accepted_by_position) > 0


@pytest.mark.parametrize("algo", ALGOS, ids=[a.name for a in ALGOS])
def test_block_drafting_is_lossless_disaggregated(
    algo: SpecAlgorithm[Any],
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
) -> None:
    """Prefilled in a second process that loads SmolLM2 and attaches the same block drafter;
    the decode side rebuilds the draft KV from the prompt."""
    loader = HFLoader(smollm2.source, "float32", smollm2.attach)
    result = run_disaggregated(algo, requests, CONFIG, models=smollm2, loader=loader, timeout=300)
    assert result.rejected == []
    check = compare(smollm2.target, requests, result.outputs, reference)
    assert check.lossless, check.line()
