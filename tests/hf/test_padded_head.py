"""A padded LM head (wider than the tokenizer): its extra logits are sliced off, so no id past
the tokenizer's vocabulary is ever drafted, accepted or sampled."""

from dataclasses import replace

import pytest
import torch

from specstrat import ModelSet, SamplingParams
from specstrat.hf import HFCausalLM, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, ForwardMode, Request
from specstrat.runtime._worker import ModelWorker
from tests.hf import tiny
from tests.hf.conftest import DRIFT


@pytest.fixture(scope="module")
def padded() -> HFCausalLM:
    """A llama model whose LM head's 16 padding columns carry a bias of 1000 (they would win
    every argmax and take all sampled mass), wrapped over the tokenizer's vocabulary."""
    model = tiny.model("llama")
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[tiny.VOCAB :] = 1000.0
    model.set_output_embeddings(head)
    return HFCausalLM(model, vocab_size=tiny.VOCAB)


def test_the_shape_and_logits_are_the_tokenizers_vocabulary(
    padded: HFCausalLM, ids: tuple[int, ...]
) -> None:
    """shape.vocab_size is the tokenizer's; every forward returns that many logit columns,
    equal to the LM head's first columns, while the full head's argmax is a padding id."""
    assert (padded.head_width, padded.shape.vocab_size) == (tiny.VOCAB + 16, tiny.VOCAB)
    worker = ModelWorker(padded, max_running_requests=1, context_len=32, max_total_tokens=32)
    logits, _ = worker.forward(ForwardMode.EXTEND, [worker.alloc_request()], [list(ids[:9])])
    with padded.reference() as model, torch.inference_mode():
        full = model(torch.tensor([ids[:9]])).logits[0]
    assert logits.shape == (9, tiny.VOCAB)
    assert bool((full.argmax(-1) >= tiny.VOCAB).all())  # unsliced, padding would win
    kept = full[:, : tiny.VOCAB]
    torch.testing.assert_close(logits, kept, rtol=0, atol=DRIFT * float(kept.abs().max()))


@pytest.mark.parametrize(
    "sampling",
    [None, SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=2.0, seed=4)],
    ids=["greedy", "t1", "t2"],
)
@pytest.mark.parametrize("algo", ["NONE", "NGRAM"])
def test_no_id_past_the_tokenizer_is_produced(
    algo: str, sampling: SamplingParams | None, padded: HFCausalLM, ids: tuple[int, ...]
) -> None:
    """Greedy and sampled runs (NONE, NGRAM drafting from the prompt) emit only tokenizer ids;
    greedy equals transformers' generate with the padding ids suppressed."""
    requests = [Request(f"r{i}", ids[: 5 + 9 * i], 12) for i in range(3)]
    if sampling is not None:
        requests = [replace(r, sampling=sampling) for r in requests]
    outputs = Engine(algo, ModelSet(target=padded), EngineConfig(context_len=64)).run(requests)
    assert all(0 <= t < tiny.VOCAB for out in outputs.values() for t in out)
    assert all(len(out) == 12 for out in outputs.values())
    if sampling is None:
        check = compare(padded, requests, outputs, generate_reference(padded, requests))
        assert check.lossless, check.line()
