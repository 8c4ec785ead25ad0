"""next_token_logits: a model's logits after each prompt, as the engine's prefill computes them."""

from typing import Any

import pytest
import torch

from specstrat import InvalidConfig
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, next_token_logits

PROMPTS = [(100, 101, 102), (65,), tuple(b"def parse(text):\n")]


def test_one_row_per_prompt_whose_argmax_is_the_engines_first_token(
    models: EmbeddedModels,
) -> None:
    """Each row is the logits after its prompt: greedy target-only decoding starts with its
    argmax, whatever the batch the prompt is scored in."""
    logits = next_token_logits(models.target, PROMPTS)
    assert logits.shape == (len(PROMPTS), models.target.shape.vocab_size)
    engine = Engine("NONE", models, EngineConfig(context_len=64))
    outputs = engine.run([Request(f"r{i}", p, 1) for i, p in enumerate(PROMPTS)])
    assert [outputs[f"r{i}"][0] for i in range(len(PROMPTS))] == logits.argmax(-1).tolist()
    for i, prompt in enumerate(PROMPTS):
        alone = next_token_logits(models.target, [prompt])
        torch.testing.assert_close(alone[0], logits[i])  # batching moves only float rounding


BAD: list[tuple[str, Any, str]] = [
    ("no-prompts", [], r"prompts=\[\] must be a non-empty sequence of prompts"),
    ("text", "abc", r"prompts='abc' must be a non-empty sequence of prompts"),
    ("empty-prompt", [(1, 2), ()], r"prompts\[1\]=\(\) must be a non-empty sequence"),
    ("outside-vocab", [(1, 256)], r"prompts\[0\]=\(1, 256\) .* token ids in 0\.\.255"),
    ("not-ints", [(1.5,)], r"prompts\[0\]=\(1\.5,\) must be a non-empty sequence of token ids"),
]


@pytest.mark.parametrize(("case", "prompts", "match"), BAD, ids=[c[0] for c in BAD])
def test_bad_prompts_are_refused_by_name(
    models: EmbeddedModels, case: str, prompts: Any, match: str
) -> None:
    """An empty list, an empty prompt or a token outside the vocabulary is an InvalidConfig
    naming the prompt."""
    with pytest.raises(InvalidConfig, match=match):
        next_token_logits(models.target, prompts)
