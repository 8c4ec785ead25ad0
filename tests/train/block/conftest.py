"""The block drafter's tests' fixtures: a tiny 4-layer learnable llama, a block drafter of 3
placeholders trained on its own greedy responses in seconds, saved, and attached."""

from pathlib import Path
from typing import Any

import pytest

from specstrat.hf import HFCausalLM, HFModels
from specstrat.train import (
    HeadConfig,
    TrainedDraftLM,
    attach_block,
    default_prompts,
    save_draft_lm,
    train_block_lm,
)
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT

SHORT = [p for p in default_prompts() if len(p) < 400]
TRAIN, HELD = SHORT[:48], SHORT[48:68]
CONFIG = HeadConfig(
    kind="block",
    layers=(0,),
    draft_vocab=128,
    max_new_tokens=32,
    epochs=10,
    batch_size=8,
    lr=3e-3,
    held_out=0.15,
    block=3,
)


def llama4(seed: int = 0) -> Any:
    """The tiny learnable llama with 4 decoder layers."""
    return tiny.model("llama", seed, initializer_range=LEARNABLE_INIT, num_hidden_layers=4)


@pytest.fixture(scope="module")
def target(tokenizer: Any) -> HFCausalLM:
    """The tiny 4-layer learnable llama, wrapped for the engine."""
    return HFCausalLM(llama4(), vocab_size=tiny.VOCAB, name="tiny-llama-4")


@pytest.fixture(scope="module")
def trained(target: HFCausalLM, tokenizer: Any) -> TrainedDraftLM:
    """A one-layer block drafter of 3 placeholders trained with CONFIG."""
    return train_block_lm(CONFIG, target, tokenizer, TRAIN, progress=False, source="pool")


@pytest.fixture(scope="module")
def block_file(trained: TrainedDraftLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained block drafter, saved."""
    return save_draft_lm(tmp_path_factory.mktemp("block") / "block.safetensors", trained)


@pytest.fixture(scope="module")
def models(target: HFCausalLM, tokenizer: Any, block_file: Path) -> HFModels:
    """The target with the saved block drafter attached."""
    return attach_block(HFModels(target=target, tokenizer=tokenizer), block_file)
