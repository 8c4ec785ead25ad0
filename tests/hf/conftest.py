"""Shared fixtures for the Hugging Face adapter's tests: the tiny tokenizer, wrapped tiny models
of each family (built once per session), a fixed prompt from the tokenizer's training text."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from specstrat.hf import HFCausalLM
from tests.hf import tiny

FAMILIES = tiny.FAMILIES

#: Engine logits vs transformers' forward, and a batched verify vs one-token decodes, relative to
#: max|logit| (float32). Measured over 216 configurations (6 families x seeds 0-2 x prefix
#: 3/11/24/40 x verify width 2/5/8, torch on 1 and on 2 threads): EXTEND at most 1.9e-6,
#: TARGET_VERIFY 3.8e-6, DECODE 3.9e-6, verify vs decode 4.5e-6 (qwen2); 2e-5 leaves 4.5x
#: headroom for another CPU's summation order, and TIE_EPSILON (1e-4) is 5x above it.
DRIFT = 2e-5

#: Text from the tokenizer's training file (textwrap's source), 55 tokens: prompts are cut from it.
TEXT = (
    "def wrap(text, width=70, **kwargs):\n"
    "    w = TextWrapper(width=width, **kwargs)\n"
    "    return w.wrap(text)\n"
)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny byte-level BPE tokenizer (``tiny.VOCAB`` ids, ``<eos>`` = 0, a chat template)."""
    return tiny.tokenizer()


@pytest.fixture(scope="session")
def ids(tokenizer: Any) -> tuple[int, ...]:
    """``TEXT`` as token ids."""
    return tuple(tokenizer.encode(TEXT))


@pytest.fixture(scope="session")
def wrapped() -> Callable[[str], HFCausalLM]:
    """``wrapped(family)``: the tiny ``family`` model (seed 0) as an :class:`HFCausalLM` over the
    tokenizer's vocabulary, built once per session (the engine keeps no state in it)."""
    cache: dict[str, HFCausalLM] = {}

    def get(family: str) -> HFCausalLM:
        if family not in cache:
            cache[family] = HFCausalLM(tiny.model(family), vocab_size=tiny.VOCAB, name=family)
        return cache[family]

    return get


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """The tests here run torch on one CPU thread (module fixtures included), restored after
    the package: the tiny models' matmuls are microseconds of work, and on a loaded 2-core
    machine two OpenMP threads spin against each other (test_families took 38 s with 2 threads,
    8 s with 1, at load average 3.5)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
