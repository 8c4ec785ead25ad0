"""The default layer rule, the draft vocabulary (most frequent first, ties by id), seeded
generation and the captured features' shapes."""

from typing import Any

import pytest
import torch

from specstrat.errors import InvalidConfig
from specstrat.train import capture, default_layers, draft_vocab, generate, token_counts
from tests.hf import tiny


@pytest.mark.parametrize(
    ("layers", "picked"), [(1, (0, 0, 0)), (2, (0, 1, 1)), (4, (1, 2, 2)), (30, (1, 15, 28))]
)
def test_default_layers_clamp_low_middle_high(layers: int, picked: tuple[int, int, int]) -> None:
    """(1, L // 2, L - 2), clamped into the model's layers and sorted."""
    assert default_layers(layers) == picked


def test_draft_vocab_takes_the_most_frequent_ids_ties_by_id() -> None:
    """The n most frequent ids, most frequent first; equal counts keep the smaller id first."""
    counts = torch.tensor([5, 0, 7, 5, 1, 7])
    assert draft_vocab(counts, 4).tolist() == [2, 5, 0, 3]
    assert draft_vocab(counts, 6).dtype == torch.int64


@pytest.mark.parametrize(
    ("counts", "n", "match"),
    [
        (torch.tensor([1, 2]), 3, r"n=3 must be an int in \[1, 2\]"),
        (torch.tensor([1, 2]), 0, r"n=0 must be"),
        (torch.tensor([[1, 2]]), 1, r"shape \(1, 2\)"),
        (torch.tensor([1.0, 2.0]), 1, r"dtype torch.float32"),
    ],
)
def test_draft_vocab_refuses_bad_input(counts: torch.Tensor, n: int, match: str) -> None:
    """A size outside the vocabulary or counts that are not 1-D integers are refused."""
    with pytest.raises(InvalidConfig, match=match):
        draft_vocab(counts, n)


def test_capture_keeps_the_response_rows(llama: Any, tokenizer: Any) -> None:
    """Rows start at the last prompt token; features are k*H wide, the LM head input gives the
    target's logits on the draft vocabulary and the greedy token is the next token."""
    gens = generate(llama, tokenizer, ["Tell me a story."], max_new_tokens=8)
    d2t = draft_vocab(token_counts(gens, tiny.VOCAB), 16)
    data = capture(llama, gens, layers=(0, 1, 1), d2t=d2t, vocab_size=tiny.VOCAB)
    (seq,) = data.sequences
    rows = gens[0].tokens.numel() - gens[0].prompt_len + 1
    assert seq.features.shape == (rows, 3 * 64)
    assert seq.final.shape == (rows, 64)
    assert seq.features.dtype == torch.float16
    with torch.inference_mode():
        logits = llama(input_ids=gens[0].tokens[None]).logits[0, gens[0].prompt_len - 1 :]
    torch.testing.assert_close(data.target_logits(seq.final), logits[:, d2t], atol=2e-2, rtol=2e-2)
    assert seq.tokens.tolist() == gens[0].tokens[gens[0].prompt_len - 1 :].tolist()
    assert seq.greedy[:-1].tolist() == seq.tokens[1:].tolist()
    assert data.positions == rows


def test_capture_refuses_a_layer_past_the_model(llama: Any, tokenizer: Any) -> None:
    """A fused layer the target does not have is refused with the default rule's answer."""
    gens = generate(llama, tokenizer, ["Hi."], max_new_tokens=2)
    with pytest.raises(InvalidConfig, match=r"layers=\(0, 5\).*default_layers\(2\)"):
        capture(llama, gens, layers=(0, 5), d2t=torch.arange(4), vocab_size=tiny.VOCAB)


def test_capture_refuses_logits_that_are_not_the_lm_heads_output(
    llama: Any, tokenizer: Any
) -> None:
    """A target that scales its LM head's output is refused: recomputed logits would differ."""
    gens = generate(llama, tokenizer, ["Hi."], max_new_tokens=2)
    hook = llama.get_output_embeddings().register_forward_hook(lambda _m, _a, out: out * 2.0)
    try:
        with pytest.raises(InvalidConfig, match=r"logits differ from its LM head's output"):
            capture(llama, gens, layers=(0, 1), d2t=torch.arange(4), vocab_size=tiny.VOCAB)
    finally:
        hook.remove()
