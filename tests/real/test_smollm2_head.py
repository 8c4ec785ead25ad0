"""A draft head trained on SmolLM2-135M-Instruct in a one-minute smoke run (``make test-real``):
EAGLE, EAGLE3 and an EAGLE tree run it greedy-lossless against transformers' ``generate`` in
sync, overlap and disaggregated runs. The head is weak (a minute of CPU); what it must be is
lossless and refused for another model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from specstrat import EAGLE, EAGLE3, SpecAlgorithm
from specstrat.hf import HFModels, compare, generate_reference, load
from specstrat.hf.hf_demo import code_requests
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import TopkTree
from specstrat.train import HeadConfig, attach_head, default_prompts, save_head, train_head

pytestmark = pytest.mark.real

TREE = replace(EAGLE, name="EAGLE_TREE", tree=TopkTree(topk=2, num_steps=3))
ALGOS: list[SpecAlgorithm[Any]] = [EAGLE, EAGLE3, TREE]
CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=4)
SMOKE = HeadConfig(
    draft_vocab=2048, budget_seconds=60.0, epochs=None, max_new_tokens=24, batch_size=4
)


@pytest.fixture(scope="module")
def head_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A head trained for one minute on SmolLM2's responses to 24 pool prompts, saved."""
    torch.set_num_threads(2)
    models = load(smollm2_path())
    trained = train_head(SMOKE, models.target, models.tokenizer, default_prompts()[:24])
    return save_head(tmp_path_factory.mktemp("head") / "smollm2.safetensors", trained)


@pytest.fixture(scope="module")
def smollm2(head_file: Path) -> HFModels:
    """SmolLM2 with the head attached."""
    return attach_head(load(smollm2_path()), head_file)


@pytest.fixture(scope="module")
def requests(smollm2: HFModels) -> list[Request]:
    """Two code-editing requests through the chat template, 24 new tokens each."""
    return code_requests(smollm2, 2, 24)


@pytest.fixture(scope="module")
def reference(smollm2: HFModels, requests: list[Request]) -> dict[str, list[int]]:
    """transformers' greedy generate on the same requests."""
    return generate_reference(smollm2.target, requests)


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
