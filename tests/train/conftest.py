"""Shared fixtures for the head trainer's tests: the tiny tokenizer and a tiny random llama whose
greedy generations are learnable, on one CPU thread."""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.hf import tiny

#: The tiny llama's weight scale for these tests. At tiny's default 0.4 a random model's greedy
#: continuation is chaotic (measured: a token's most frequent successor covers 23% of the
#: transitions of 60 responses, and no head learns it from 1.5k positions); at 0.05 greedy
#: responses fall into context-dependent loops (54%), which a head can learn in seconds.
LEARNABLE_INIT = 0.05


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """The tests here run torch on one CPU thread (tiny matmuls; two threads spin against each
    other on a loaded 2-core machine), restored after the package."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny byte-level BPE tokenizer with its chat template."""
    return tiny.tokenizer()


@pytest.fixture(scope="session")
def llama() -> Any:
    """A tiny random llama (2 layers, width 64, head 400 wide) with learnable generations."""
    return tiny.model("llama", initializer_range=LEARNABLE_INIT)


@pytest.fixture(scope="session")
def engine_llama() -> Any:
    """The same tiny llama (its own copy) wrapped for specstrat's engine, which generates and
    captures in one pass."""
    from specstrat.hf import HFCausalLM

    built = tiny.model("llama", initializer_range=LEARNABLE_INIT)
    return HFCausalLM(built, vocab_size=tiny.VOCAB, name="tiny-llama")


def save_untrained_head(llama: Any, layers: Sequence[int], directory: Path) -> Path:
    """An untrained (seeded) head for ``llama`` fusing ``layers``, saved in ``directory``:
    losslessness needs no training."""
    from specstrat.train import Eagle3Head, TrainedHead, save_head, target_name, target_sha256

    torch.manual_seed(0)
    head = Eagle3Head.from_target(llama, layers=tuple(layers), d2t=torch.arange(200))
    trained = TrainedHead(
        head=head,
        target=target_name(llama),
        target_sha256=target_sha256(llama),
        data_size=0,
        data_source="none",
        steps=0,
        final_loss=float("nan"),
        tau=float("nan"),
    )
    return save_head(directory / "head.safetensors", trained)
