"""The reference check: the drift that justifies TIE_EPSILON, certified ties and mismatches on
scripted outputs, and transformers' generate run without the model's own generation defaults."""

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specstrat.hf import TIE_EPSILON, HFCausalLM, certified_tie, compare, generate_reference
from specstrat.runtime import ForwardMode, Request
from specstrat.runtime._worker import ModelWorker
from tests.hf import tiny
from tests.hf.conftest import DRIFT, FAMILIES


def test_tie_epsilon_sits_well_above_the_measured_drift() -> None:
    """TIE_EPSILON is at least 5x the drift bound the families are held to (itself 4.5x the
    worst drift measured), so a certified tie is a gap drift can flip, not a real difference."""
    assert 5 * DRIFT <= TIE_EPSILON


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batched_verify_and_one_token_decodes_drift_below_the_bound(
    family: str, wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """An 8-token TARGET_VERIFY and the same 8 tokens as DECODE steps give logits within
    DRIFT * max|logit| of each other in float32 (the drift TIE_EPSILON absorbs)."""
    lm = wrapped(family)
    worker = ModelWorker(lm, max_running_requests=1, context_len=64, max_total_tokens=64)
    slot = worker.alloc_request()
    worker.forward(ForwardMode.EXTEND, [slot], [list(ids[:11])])
    verify, _ = worker.forward(ForwardMode.TARGET_VERIFY, [slot], [list(ids[11:19])])
    worker.rewind(slot, 11)
    decode = torch.cat([worker.forward(ForwardMode.DECODE, [slot], [[t]])[0] for t in ids[11:19]])
    drift = float((verify - decode).abs().max()) / float(verify.abs().max())
    assert drift <= DRIFT


@pytest.fixture(scope="module")
def tied(ids: tuple[int, ...]) -> tuple[HFCausalLM, int, int, int]:
    """A llama model whose LM head row for token ``b`` copies the row of ``a``, its greedy
    first token after ``ids[:8]`` (an exact tie), and ``low``, the least likely token there."""
    model = tiny.model("llama")
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    with lm.reference(), torch.inference_mode():
        logits = model(torch.tensor([ids[:8]])).logits[0, -1, : tiny.VOCAB]
        a, low = int(logits.argmax()), int(logits.argmin())
        b = (a + 1) % tiny.VOCAB
        head = model.get_output_embeddings().weight
        head[b] = head[a]
    return lm, a, b, low


def test_certified_tie_holds_for_equal_logits_and_fails_for_a_gap(
    tied: tuple[HFCausalLM, int, int, int], ids: tuple[int, ...]
) -> None:
    """Two tokens whose logits are equal and top are a tie; the top and the least likely token
    are not, nor is a pair where only one is near the top."""
    lm, a, b, low = tied
    context = ids[:8]
    assert certified_tie(lm, context, a, b)
    assert certified_tie(lm, context, b, a)
    assert not certified_tie(lm, context, a, low)
    assert not certified_tie(lm, context, low, a)


def scripted(
    tied: tuple[HFCausalLM, int, int, int], ids: tuple[int, ...]
) -> tuple[HFCausalLM, list[Request], dict[str, list[int]]]:
    """Two requests (the tied prompt, a second prompt) and transformers' outputs for them."""
    lm = tied[0]
    requests = [Request("tied", ids[:8], 6), Request("other", ids[:3], 5)]
    return lm, requests, generate_reference(lm, requests)


def test_compare_certifies_a_tie_and_skips_the_rest_of_that_request(
    tied: tuple[HFCausalLM, int, int, int], ids: tuple[int, ...]
) -> None:
    """A run that takes the other of two tied tokens at position 0 is lossless with one tie; the
    rest of that request (which then differs freely) is not compared."""
    lm, requests, reference = scripted(tied, ids)
    _, a, b, _ = tied
    assert reference["tied"][0] == a
    outputs = {"tied": [b, 1, 2, 3, 4, 5], "other": reference["other"]}
    check = compare(lm, requests, outputs, reference)
    assert check.lossless
    assert (check.ties, check.compared_tokens, check.mismatches) == (1, 5, ())
    assert check.line() == "identical over 2 requests, 5 tokens, 1 certified tie(s)"


@pytest.mark.parametrize(
    ("edit", "mismatch"),
    [
        (
            lambda ref, low: {"other": [*ref["other"][:2], low, *ref["other"][3:]]},
            r"other: position 2: \d+ vs \d+",
        ),
        (lambda ref, low: {"other": ref["other"][:3]}, r"other: 3 tokens vs the reference's 5"),
        (lambda ref, low: {"other": [*ref["other"], 7]}, r"other: 6 tokens vs the reference's 5"),
        (lambda ref, low: {"other": []}, r"other: 0 tokens vs the reference's 5"),
    ],
    ids=["real-mismatch", "short", "long", "missing"],
)
def test_compare_reports_a_real_mismatch_or_a_length_difference(
    edit: Callable[[dict[str, list[int]], int], dict[str, list[int]]],
    mismatch: str,
    tied: tuple[HFCausalLM, int, int, int],
    ids: tuple[int, ...],
) -> None:
    """A token far below the top, a shorter, longer or missing output: not lossless, named."""
    lm, requests, reference = scripted(tied, ids)
    low = tied[3]
    if reference["other"][2] == low:
        pytest.fail("the scripted mismatch must differ from the reference")
    outputs = {"tied": reference["tied"], **edit(reference, low)}
    check = compare(lm, requests, outputs, reference)
    assert not check.lossless
    assert check.ties == 0
    assert len(check.mismatches) == 1
    assert re.fullmatch(mismatch, check.mismatches[0]), check.mismatches
    assert check.line().startswith("DIFFERENT over 2 requests")


def test_generate_reference_ignores_the_models_generation_defaults(
    ids: tuple[int, ...],
) -> None:
    """A model whose generation config has EOS ids and a repetition penalty still gets plain
    greedy decoding to max_new_tokens for a request with no stop ids (what the engine does)."""
    model: Any = tiny.model("gemma2")
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    request = Request("r", ids[:12], 10)
    plain = generate_reference(lm, [request])["r"]
    model.generation_config.eos_token_id = [plain[1]]
    model.generation_config.repetition_penalty = 5.0
    assert generate_reference(lm, [request])["r"] == plain
    assert len(plain) == 10
    assert model.generation_config.repetition_penalty == 5.0  # put back after the run
