"""Each tiny Hugging Face family through the engine against transformers itself: logits of every
forward mode against transformers' own forward, greedy outputs against its ``generate``."""

from collections.abc import Callable

import pytest
import torch

from specstrat import ModelSet
from specstrat.hf import HFCausalLM, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, ForwardMode, Request
from specstrat.runtime._worker import ModelWorker
from tests.hf import tiny
from tests.hf.conftest import DRIFT, FAMILIES


def reference_logits(lm: HFCausalLM, ids: tuple[int, ...]) -> torch.Tensor:
    """transformers' own forward of ``ids`` (its attention, its mask), tokenizer columns only."""
    with lm.reference() as model, torch.inference_mode():
        logits: torch.Tensor = model(torch.tensor([ids])).logits
    return logits[0, :, : lm.shape.vocab_size]


def assert_drift(got: torch.Tensor, want: torch.Tensor, scale: float) -> None:
    """``got`` equals ``want`` within ``DRIFT * scale`` (scale: the reference's max|logit|)."""
    torch.testing.assert_close(got, want, rtol=0, atol=DRIFT * scale)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_forward_mode_matches_transformers_forward(
    family: str, wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """EXTEND of a 24-token prompt (its hidden states: the base model's last, normalised), a
    5-token TARGET_VERIFY, a ragged verify beside a second request, in both orders, and a
    DECODE give transformers' forward's logits within DRIFT."""
    lm = wrapped(family)
    ref = reference_logits(lm, ids[:32])
    scale = float(ref.abs().max())
    worker = ModelWorker(lm, max_running_requests=2, context_len=64, max_total_tokens=128)
    a, b = worker.alloc_request(), worker.alloc_request()
    extend, hidden = worker.forward(ForwardMode.EXTEND, [a], [list(ids[:24])])
    assert extend.shape == (24, tiny.VOCAB)
    assert_drift(extend, ref[:24], scale)
    with lm.reference() as model, torch.inference_mode():
        final = model.base_model(torch.tensor([ids[:24]])).last_hidden_state[0]
    assert hidden.shape == (24, lm.shape.hidden_size)
    assert_drift(hidden, final, float(final.abs().max()))  # the final normalised hidden state
    verify, _ = worker.forward(ForwardMode.TARGET_VERIFY, [a], [list(ids[24:29])])
    assert_drift(verify, ref[24:29], scale)
    worker.rewind(a, 24)
    worker.forward(ForwardMode.EXTEND, [b], [list(ids[:10])])
    ragged, _ = worker.forward(ForwardMode.TARGET_VERIFY, [a, b], [list(ids[24:29]), [ids[10]]])
    assert_drift(ragged, torch.cat([ref[24:29], ref[10:11]]), scale)
    worker.rewind(a, 24)  # the slots in the other order: the view of the KV pool is reordered
    back, _ = worker.forward(ForwardMode.TARGET_VERIFY, [b, a], [[ids[11]], list(ids[24:29])])
    assert_drift(back, torch.cat([ref[11:12], ref[24:29]]), scale)
    decode, _ = worker.forward(ForwardMode.DECODE, [a], [[ids[29]]])
    assert_drift(decode, ref[29:30], scale)


def test_gemma2_window_and_softcaps_matter() -> None:
    """The gemma2 model's small sliding window and attention soft-cap change transformers'
    logits by far more than DRIFT, so matching it tests that both are honoured."""
    tok = tiny.tokenizer()
    prompt = torch.tensor([tok.encode("def wrap(text, width=70, **kwargs):\n    w = Text")])
    with torch.inference_mode():
        base = tiny.model("gemma2")(prompt).logits[0, -1]
        for change in ({"sliding_window": 4096}, {"attn_logit_softcapping": None}):
            other = tiny.model("gemma2", **change)(prompt).logits[0, -1]
            assert float((base - other).abs().max()) > 100 * DRIFT * float(base.abs().max())


@pytest.fixture(scope="module")
def requests(ids: tuple[int, ...]) -> list[Request]:
    """Three greedy requests of different prompt lengths (one longer than gemma2's window of 8)
    and outputs, no stop ids (no early stop: every position is compared)."""
    return [
        Request("long", ids[:30], 20),
        Request("short", ids[:5], 12),
        Request("one", ids[:1], 9),
    ]


@pytest.fixture(scope="module")
def generated(
    wrapped: Callable[[str], HFCausalLM], requests: list[Request]
) -> Callable[[str], dict[str, list[int]]]:
    """``generated(family)``: transformers' greedy generate of ``requests``, run once a family."""
    cache: dict[str, dict[str, list[int]]] = {}

    def get(family: str) -> dict[str, list[int]]:
        if family not in cache:
            cache[family] = generate_reference(wrapped(family), requests)
        return cache[family]

    return get


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", ["NONE", "NGRAM"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_outputs_equal_transformers_generate(
    family: str,
    algo: str,
    overlap: bool,
    wrapped: Callable[[str], HFCausalLM],
    generated: Callable[[str], dict[str, list[int]]],
    requests: list[Request],
) -> None:
    """Greedy NONE and NGRAM, sync and overlap, give transformers' generate token for token
    (no certified tie is needed on these models)."""
    lm = wrapped(family)
    reference = generated(family)
    config = EngineConfig(context_len=64, max_running_requests=2, overlap=overlap)
    outputs = Engine(algo, ModelSet(target=lm), config).run(requests)
    check = compare(lm, requests, outputs, reference)
    assert check.lossless, check.line()
    assert (check.ties, check.compared_tokens) == (0, 41)
    assert outputs == reference


@pytest.mark.parametrize("family", tiny.MORE_FAMILIES)
def test_more_families_equal_transformers_generate(
    family: str, requests: list[Request], ids: tuple[int, ...]
) -> None:
    """Ten more architectures (partial rotary, QK norms, per-layer windows, logit scaling,
    parallel blocks, OPT's offset positions and projected head input) give generate's greedy
    tokens under NGRAM with overlap; the hidden state is what the LM head reads."""
    lm = HFCausalLM(tiny.model(family), vocab_size=tiny.VOCAB, name=family)
    assert lm.shape.hidden_size == lm.model.get_output_embeddings().in_features
    config = EngineConfig(context_len=64, max_running_requests=2, overlap=True)
    outputs = Engine("NGRAM", ModelSet(target=lm), config).run(requests)
    check = compare(lm, requests, outputs, generate_reference(lm, requests))
    assert check.lossless, check.line()
    assert check.ties == 0
