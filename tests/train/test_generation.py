"""Capture during generation: the engine's own forwards give the rows a second pass would (less
the one past the response), for greedy and sampled responses, on any fused layers; a bare
transformers model falls back to the second pass; bad layers, a soft-capped target and a
recorder that lost a request are refused by name."""

from typing import Any

import pytest
import torch

from specstrat.drafting import DraftAdmission
from specstrat.errors import EngineStateError, InternalError, InvalidConfig
from specstrat.train import GenerationCapturer, capture_sequences, generate, generate_captured
from specstrat.train._recording import RecordingDrafter, recorded_sequence
from tests.hf import tiny

PROMPTS = ["Tell me a story.", "List three colours.", "Say hi."]


def _second_pass(model: Any, gens: Any, layers: tuple[int, ...]) -> Any:
    return capture_sequences(model, gens, layers=layers, vocab_size=tiny.VOCAB)


@pytest.mark.parametrize("layers", [(0, 1, 1), (0, 1), (1, 0)])
def test_capture_while_generating_gives_the_second_pass_rows(
    engine_llama: Any, llama: Any, tokenizer: Any, layers: tuple[int, ...]
) -> None:
    """Greedy responses equal transformers'; each row's tokens, start and greedy choice equal
    the second pass's, features and LM head input agree to float16, minus the last row."""
    gens, rows = generate_captured(
        engine_llama, tokenizer, PROMPTS, layers=layers, max_new_tokens=10
    )
    reference = generate(llama, tokenizer, PROMPTS, max_new_tokens=10)
    assert [g.tokens.tolist() for g in gens] == [g.tokens.tolist() for g in reference]
    for ours, theirs in zip(rows, _second_pass(llama, gens, layers), strict=True):
        n = ours.tokens.numel()
        assert n == theirs.tokens.numel() - 1
        assert ours.start == theirs.start
        assert ours.tokens.tolist() == theirs.tokens[:n].tolist()
        assert ours.greedy.tolist() == theirs.greedy[:n].tolist()
        assert ours.features.shape == (n, len(layers) * 64)
        torch.testing.assert_close(ours.features, theirs.features[:n], atol=2e-3, rtol=1e-2)
        torch.testing.assert_close(ours.final, theirs.final[:n], atol=2e-3, rtol=1e-2)


def test_prompt_rows_are_the_second_pass_rows_from_the_first_position(
    engine_llama: Any, llama: Any, tokenizer: Any
) -> None:
    """With prompt_rows, each sequence starts at position 0 and its context is the prompt's
    rows but the last; the rows equal a second pass's from the first position (minus the
    last)."""
    capturer = GenerationCapturer(
        engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=8, prompt_rows=True
    )
    gens, rows = capturer.capture(PROMPTS)
    second = capture_sequences(llama, gens, layers=(0, 1), vocab_size=tiny.VOCAB, prompt_rows=True)
    for g, ours, theirs in zip(gens, rows, second, strict=True):
        n = ours.tokens.numel()
        assert (ours.start, ours.context, theirs.context) == (0, g.prompt_len - 1, g.prompt_len - 1)
        assert n == g.tokens.numel() - 1 == theirs.tokens.numel() - 1
        assert ours.tokens.tolist() == theirs.tokens[:n].tolist()
        torch.testing.assert_close(ours.features, theirs.features[:n], atol=2e-3, rtol=1e-2)


def test_sampled_capture_keeps_the_sampled_tokens_and_the_greedy_choice(
    engine_llama: Any, tokenizer: Any
) -> None:
    """Sampled responses are generate's with the same seed; greedy is the target's argmax."""
    gens, rows = generate_captured(
        engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=10, temperature=1.0
    )
    same = generate(engine_llama, tokenizer, PROMPTS, max_new_tokens=10, temperature=1.0)
    assert [g.tokens.tolist() for g in gens] == [g.tokens.tolist() for g in same]
    for g, seq in zip(gens, rows, strict=True):
        assert seq.tokens.tolist() == g.tokens[g.prompt_len - 1 : -1].tolist()
        with engine_llama.reference() as lm, torch.inference_mode():
            logits = lm(input_ids=g.tokens[None]).logits[0, g.prompt_len - 1 : -1]
        assert seq.greedy.tolist() == logits[:, : tiny.VOCAB].argmax(-1).tolist()


def test_a_bare_transformers_model_is_captured_by_a_second_pass(llama: Any, tokenizer: Any) -> None:
    """Without the engine the rows are the second pass's, the extra last row included."""
    gens, rows = generate_captured(llama, tokenizer, PROMPTS[:1], layers=(0, 1), max_new_tokens=6)
    (theirs,) = _second_pass(llama, gens, (0, 1))
    assert rows[0].tokens.tolist() == theirs.tokens.tolist()
    assert torch.equal(rows[0].features, theirs.features)


def test_capture_while_generating_refuses_a_layer_past_the_model(
    engine_llama: Any, tokenizer: Any
) -> None:
    """A fused layer the target does not have is refused before anything is generated."""
    with pytest.raises(InvalidConfig, match=r"layers=\(0, 5\).*default_layers\(2\)"):
        generate_captured(engine_llama, tokenizer, PROMPTS, layers=(0, 5), max_new_tokens=4)


def test_capture_while_generating_refuses_a_scaled_lm_head(
    engine_llama: Any, tokenizer: Any
) -> None:
    """A target whose logits are not its LM head's output is refused before generating."""
    head = engine_llama.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, _a, out: out * 2.0)
    try:
        with pytest.raises(InvalidConfig, match=r"logits differ from its LM head's output"):
            generate_captured(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=4)
    finally:
        hook.remove()


def test_the_recorder_refuses_a_prebuilt_admission() -> None:
    """A PREBUILT admission carries no hidden state to record: refused, naming the fix."""
    recorder = RecordingDrafter(context=None, done=[], prompt_rows=False)  # type: ignore[arg-type]
    admission: DraftAdmission[object] = DraftAdmission(
        slots=(0,),
        bonus_tokens=torch.tensor([1]),
        seq_lens=torch.tensor([3]),
        hidden=None,
        draft_input=None,
    )
    with pytest.raises(EngineStateError, match=r"needs a local prefill.*not disaggregated"):
        recorder.admit(admission)


def test_a_response_the_recorder_missed_is_a_named_error(engine_llama: Any, tokenizer: Any) -> None:
    """Rows that cannot be matched to a generated response end the capture, naming the counts."""
    (gen,) = generate(engine_llama, tokenizer, PROMPTS[:1], max_new_tokens=3)
    head = engine_llama.model.get_output_embeddings()
    with pytest.raises(InternalError, match=r"holds 0 rows for a response of 3 tokens"):
        recorded_sequence(gen, {}, (0, 1), 2, head, tiny.VOCAB)


def test_sampled_generation_is_seeded(llama: Any, tokenizer: Any) -> None:
    """Sampling at a temperature with one seed repeats; greedy responses stop at max tokens."""
    prompts = ["Say something.", "Say more."]
    a = generate(llama, tokenizer, prompts, max_new_tokens=6, temperature=1.0, seed=3)
    b = generate(llama, tokenizer, prompts, max_new_tokens=6, temperature=1.0, seed=3)
    assert [g.tokens.tolist() for g in a] == [g.tokens.tolist() for g in b]
    greedy = generate(llama, tokenizer, prompts, max_new_tokens=6)
    assert all(g.tokens.numel() - g.prompt_len <= 6 for g in greedy)


def test_reused_slots_duplicates_and_one_token_responses_are_captured(
    engine_llama: Any, tokenizer: Any
) -> None:
    """One request at a time (each slot reused), a prompt twice and one-token responses: every
    response gets its own rows, one per token, equal for the equal prompts."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    for new in (1, 6):
        gens, rows = generate_captured(
            engine_llama, tokenizer, prompts, layers=(0, 1), max_new_tokens=new, batch=1
        )
        assert [s.tokens.numel() for s in rows] == [g.tokens.numel() - g.prompt_len for g in gens]
        assert torch.equal(rows[0].features, rows[2].features)
        assert not torch.equal(rows[0].features, rows[1].features)


def test_no_prompts_generate_nothing(engine_llama: Any, tokenizer: Any) -> None:
    """An empty prompt list (an empty held-out share) gives no generations and no rows."""
    assert generate_captured(engine_llama, tokenizer, [], layers=(0, 1), max_new_tokens=4) == (
        (),
        (),
    )
    assert generate(engine_llama, tokenizer, [], max_new_tokens=4) == ()


def test_a_fault_mid_generation_leaves_the_next_capture_exact(
    engine_llama: Any, tokenizer: Any
) -> None:
    """A forward that fails on the fourth call ends the capture with its error; the next
    capture on the same model gives exactly the rows of a run that never failed."""
    clean = generate_captured(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=6)
    calls = [0]

    def fail_fourth(_module: Any, _args: Any, _out: Any) -> None:
        calls[0] += 1
        if calls[0] == 4:
            raise RuntimeError("injected fault")

    layer = engine_llama.model.model.layers[0]
    hook = layer.register_forward_hook(fail_fourth)
    try:
        with pytest.raises(RuntimeError, match=r"injected fault"):
            generate_captured(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=6)
    finally:
        hook.remove()
    again = generate_captured(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=6)
    assert [g.tokens.tolist() for g in again[0]] == [g.tokens.tolist() for g in clean[0]]
    for ours, theirs in zip(again[1], clean[1], strict=True):
        assert torch.equal(ours.features, theirs.features)
        assert ours.greedy.tolist() == theirs.greedy.tolist()


def test_one_capturer_reserves_one_engine_for_every_batch(
    engine_llama: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches captured by one GenerationCapturer share one engine (its KV reserved once) and
    give what generate_captured gives each batch alone, the same prompt twice included."""
    import specstrat.runtime

    made: list[object] = []
    real = specstrat.runtime.Engine

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    alone = generate_captured(engine_llama, tokenizer, PROMPTS[:1], layers=(0, 1), max_new_tokens=6)
    monkeypatch.setattr(specstrat.runtime, "Engine", counting)
    capturer = GenerationCapturer(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=6)
    first = capturer.capture(PROMPTS[:1])
    again = capturer.capture(PROMPTS[:1])
    rest = capturer.capture(PROMPTS[1:], temperature=1.0, seed=3)
    assert len(made) == 1
    for gens, rows in (first, again):
        assert [g.tokens.tolist() for g in gens] == [g.tokens.tolist() for g in alone[0]]
        assert torch.equal(rows[0].features, alone[1][0].features)
    assert len(rest[0]) == len(rest[1]) == 2


def test_a_capturer_refuses_a_prompt_longer_than_it_was_sized_for(
    engine_llama: Any, tokenizer: Any
) -> None:
    """A prompt past the capturer's sizing is refused by name, naming how to size it."""
    capturer = GenerationCapturer(engine_llama, tokenizer, ["Hi."], layers=(0, 1), max_new_tokens=4)
    with pytest.raises(InvalidConfig, match=r"context_len=\d+, past the \d+ the capturer was"):
        capturer.capture(["Tell me a very long story about " * 8])


def test_a_capturer_built_with_no_prompts_refuses_to_capture(
    engine_llama: Any, tokenizer: Any
) -> None:
    """An engine-backed capturer sized for no prompts names how to build it instead."""
    capturer = GenerationCapturer(engine_llama, tokenizer, [], layers=(0, 1), max_new_tokens=4)
    assert capturer.capture([]) == ((), ())
    with pytest.raises(InvalidConfig, match=r"built with no prompts, so it has no engine for"):
        capturer.capture(["Hi."])


def test_a_capture_that_fails_mid_run_leaves_the_next_one_correct(
    engine_llama: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault after the engine ran keeps no rows for later: the next capture equals a fresh
    capturer's, row for row."""
    capturer = GenerationCapturer(engine_llama, tokenizer, PROMPTS, layers=(0, 1), max_new_tokens=6)
    assert capturer._engine is not None
    engine = capturer._engine.engine
    real = engine.run

    def faulty(requests: Any) -> Any:
        real(requests)
        raise RuntimeError("a fault after the batch ran")

    monkeypatch.setattr(engine, "run", faulty)
    with pytest.raises(RuntimeError, match="a fault after the batch ran"):
        capturer.capture(PROMPTS[:2])
    monkeypatch.setattr(engine, "run", real)
    assert capturer._engine.recorder.done == []
    gens, rows = capturer.capture(PROMPTS[:2])
    fresh = generate_captured(engine_llama, tokenizer, PROMPTS[:2], layers=(0, 1), max_new_tokens=6)
    assert [g.tokens.tolist() for g in gens] == [g.tokens.tolist() for g in fresh[0]]
    for ours, theirs in zip(rows, fresh[1], strict=True):
        assert torch.equal(ours.features, theirs.features)
