"""Shared runtime fixtures: a tiny random model for worker tests, the embedded models for runs."""

import pytest
import torch

from specstrat.models import CausalLM
from specstrat.runtime import EmbeddedModels
from specstrat.runtime._models.model import ModelConfig, TinyLM
from specstrat.runtime._worker import ModelWorker

TINY = ModelConfig(dim=32, layers=2, heads=2, mlp=64, max_positions=128)


@pytest.fixture(scope="session")
def models() -> EmbeddedModels:
    """The embedded models shipped in the package, in float64."""
    return EmbeddedModels.load()


@pytest.fixture
def tiny() -> TinyLM:
    """A small randomly initialised float64 model (its outputs are arbitrary but fixed)."""
    torch.manual_seed(0)
    return TinyLM(TINY).double().eval()


def make_worker(model: CausalLM, *, tokens: int = 600, requests: int = 8) -> ModelWorker:
    """A worker over ``model`` with a small request pool and KV cache."""
    return ModelWorker(
        model,
        max_running_requests=requests,
        context_len=model.shape.max_positions,
        max_total_tokens=tokens,
    )
