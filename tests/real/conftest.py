"""Fixtures the SmolLM2 modules share: two code-editing requests and transformers' greedy
reference for them, for whichever ``smollm2`` models the module loads (with or without a head)."""

from __future__ import annotations

import pytest

from specstrat.hf import HFModels, generate_reference
from specstrat.hf.hf_demo import code_requests
from specstrat.runtime import Request


@pytest.fixture(scope="module")
def requests(smollm2: HFModels) -> list[Request]:
    """Two code-editing requests through the chat template, 24 new tokens each."""
    return code_requests(smollm2, 2, 24)


@pytest.fixture(scope="module")
def reference(smollm2: HFModels, requests: list[Request]) -> dict[str, list[int]]:
    """transformers' greedy generate on the same requests."""
    return generate_reference(smollm2.target, requests)
