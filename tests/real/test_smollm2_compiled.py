"""SmolLM2 with its forward compiled (``HFCausalLM.compile``, ``make test-real``): target-only and
NGRAM stay lossless against transformers' ``generate`` with the graphs serving decodes and
4-token verifies, in sync and overlap runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from specstrat import NGRAM, NONE, SpecAlgorithm
from specstrat.hf import HFModels, compare, load
from specstrat.hf import compiled_forward as cf
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request

pytestmark = pytest.mark.real

CONFIG = EngineConfig(num_draft_tokens=4, context_len=512, max_running_requests=1)


@pytest.fixture(scope="module")
def smollm2() -> HFModels:
    """SmolLM2 compiled for forwards of 1 and 4 tokens (a decode and a verify at D 4, bs 1)."""
    models = load(smollm2_path())
    models.target.compile([1, 4])
    return models


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", [NONE, NGRAM], ids=["NONE", "NGRAM"])
def test_compiled_smollm2_is_lossless_against_generate(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    smollm2: HFModels,
    requests: list[Request],
    reference: dict[str, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy outputs equal transformers' generate (or certified ties), and the graphs served
    forwards of the compiled counts."""
    served: list[int] = []
    call = cf.CompiledForward.__call__

    def spy(self: cf.CompiledForward, tokens: Any, *args: Any) -> Any:
        served.append(int(tokens.shape[0]))
        return call(self, tokens, *args)

    monkeypatch.setattr(cf.CompiledForward, "__call__", spy)
    engine = Engine(algo, smollm2, replace(CONFIG, overlap=overlap))
    check = compare(smollm2.target, requests, engine.run(requests), reference)
    assert check.lossless, check.line()
    assert served
    assert set(served) <= {1, 4}
