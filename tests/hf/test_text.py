"""Text and chat in, text out: requests from text or chat messages with the model's tokenizer,
stop at EOS and one-token stop strings, decoding that drops special tokens and cuts at stop
strings; the misuses a user would try are refused by name."""

from typing import Any

import pytest

from specstrat import InvalidConfig, ModelSet
from specstrat.hf import HFCausalLM, HFModels, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig
from tests.hf import tiny
from tests.hf.conftest import TEXT


@pytest.fixture(scope="module")
def models(tokenizer: Any) -> HFModels:
    """The tiny llama with the tiny tokenizer (EOS id 0, a chat template)."""
    lm = HFCausalLM(tiny.model("llama"), vocab_size=len(tokenizer), name="llama")
    return HFModels(target=lm, tokenizer=tokenizer, eos_token_ids=frozenset({0}))


NEWLINE = "\n"  # one token in the tiny tokenizer
MULTI = "return w"  # several tokens


def test_a_text_request_is_the_tokenised_text_stopping_at_eos(models: HFModels) -> None:
    """request(text=) holds the tokenizer's ids of the text and stops at the EOS ids, plus a
    one-token stop string; a multi-token stop string adds no id; stop_at_eos=False drops EOS."""
    tok = models.tokenizer
    request = models.request("r", 9, text=TEXT, stop=(NEWLINE, MULTI))
    assert request.prompt == tuple(tok.encode(TEXT))
    assert len(tok.encode(NEWLINE, add_special_tokens=False)) == 1
    assert len(tok.encode(MULTI, add_special_tokens=False)) > 1
    newline = tok.encode(NEWLINE, add_special_tokens=False)[0]
    assert request.stop_token_ids == frozenset({0, newline})
    assert models.request("r", 9, text=TEXT, stop_at_eos=False).stop_token_ids == frozenset()


def test_a_chat_request_goes_through_the_chat_template(models: HFModels) -> None:
    """request(messages=) is the chat template's rendering with the generation prompt added."""
    messages = [
        {"role": "system", "content": "Wrap text."},
        {"role": "user", "content": "def wrap(text):"},
    ]
    request = models.request("c", 5, messages=messages)
    rendered = "<|system|>Wrap text.\n<|user|>def wrap(text):\n<|assistant|>"
    assert request.prompt == tuple(models.tokenizer.encode(rendered))
    assert models.tokenizer.decode(list(request.prompt)) == rendered
    assert request.stop_token_ids == frozenset({0})


@pytest.mark.parametrize(
    ("ids", "stop", "text"),
    [
        ("def wrap(text):\n    return w", (), "def wrap(text):\n    return w"),
        ("def wrap(text):\n    return w", (NEWLINE,), "def wrap(text):"),
        ("def wrap(text):\n    return w", ("return", "(", ""), "def wrap"),
        ("def wrap(text):\n    return w", ("absent",), "def wrap(text):\n    return w"),
        ("<eos>def<eos> wrap<eos>", (), "def wrap"),
    ],
    ids=["plain", "newline", "first-of-several", "absent", "special-dropped"],
)
def test_decode_drops_special_tokens_and_cuts_at_the_first_stop_string(
    ids: str, stop: tuple[str, ...], text: str, models: HFModels
) -> None:
    """decode() drops special tokens (EOS) and cuts before the earliest stop string found; an
    empty stop string is ignored."""
    assert models.decode(models.tokenizer.encode(ids), stop=stop) == text


def test_a_run_from_text_stops_at_a_one_token_stop_string_and_decodes(models: HFModels) -> None:
    """A text request with a one-token stop string ends at that token's first occurrence, as
    transformers' generate does with it as EOS; decode(stop=) cuts the text before it, while a
    newline the model only emits merged into wider tokens never stops the run on a token."""
    lm, tok = models.target, models.tokenizer
    engine = Engine("NGRAM", ModelSet(target=lm), EngineConfig(context_len=80))
    free = engine.run([models.request("r", 30, text=TEXT[:20], stop=(NEWLINE,))])["r"]
    assert len(free) == 30  # "\n" is one token, but this model emits it merged with spaces
    assert NEWLINE in tok.decode(free)
    at = next(
        i
        for i in range(2, len(free))
        if free[i] not in free[:i]
        and tok.encode(tok.decode([free[i]]), add_special_tokens=False) == [free[i]]
    )
    stop = tok.decode([free[at]])
    request = models.request("r", 30, text=TEXT[:20], stop=(stop,))
    out = Engine("NGRAM", ModelSet(target=lm), EngineConfig(context_len=80)).run([request])["r"]
    assert out == free[: at + 1]
    check = compare(lm, [request], {"r": out}, generate_reference(lm, [request]))
    assert check.lossless, check.line()
    assert models.decode(out, stop=(stop,)) == tok.decode(free[:at], skip_special_tokens=True)


REFUSALS: list[tuple[dict[str, Any], str]] = [
    (
        {"text": "x", "messages": [{"role": "user", "content": "x"}]},
        r"request 'r': pass exactly one of text= and messages=",
    ),
    ({}, r"request 'r': pass exactly one of text= and messages="),
    ({"text": ""}, r"request 'r': text='' must be a non-empty string"),
    (
        {"text": "x", "stop": "\n"},
        r"stop='\\n' is a string; pass a tuple of strings, e\.g\. \('\\n',\)",
    ),
    (
        {"messages": "hello"},
        r"request 'r': messages='hello'; pass a non-empty list of \{'role': str, 'content'",
    ),
    ({"messages": [{"role": "user"}]}, r"messages=\[\{'role': 'user'\}\]; pass a non-empty"),
    ({"messages": []}, r"request 'r': messages=\[\]; pass a non-empty list of \{'role'"),
    ({"messages": [{"content": "x"}]}, r"messages=\[\{'content': 'x'\}\]; pass a non-empty"),
]


@pytest.mark.parametrize(("kw", "message"), REFUSALS, ids=lambda v: None)
def test_misused_requests_are_refused_by_name(
    kw: dict[str, Any], message: str, models: HFModels
) -> None:
    """Both or neither of text and messages, empty text, stop as a bare string and malformed
    messages are InvalidConfig errors saying what to pass."""
    with pytest.raises(InvalidConfig, match=message):
        models.request("r", 4, **kw)


def test_decode_refuses_stop_as_a_bare_string(models: HFModels) -> None:
    """decode(stop="\\n") would cut at each character of the string: refused, as in request."""
    with pytest.raises(InvalidConfig, match=r"stop='\\n' is a string; pass a tuple of strings"):
        models.decode([1, 2], stop="\n")  # type: ignore[arg-type]


def test_a_template_that_refuses_the_messages_is_named() -> None:
    """A chat template that raises (as templates do for roles out of order) is an InvalidConfig
    naming the request and the roles, with the template's reason."""
    tok = tiny.tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate user/assistant') }}"
    models = HFModels(target=HFCausalLM(tiny.model("llama"), vocab_size=len(tok)), tokenizer=tok)
    with pytest.raises(
        InvalidConfig,
        match=r"request 'r': the tokenizer's chat template refused messages with roles "
        r"\['user', 'user'\] \(TemplateError: roles must alternate",
    ):
        models.request("r", 4, messages=[{"role": "user", "content": "x"}] * 2)


def test_chat_without_a_template_is_refused() -> None:
    """A tokenizer with no chat template refuses messages= and says to pass text= instead."""
    tok = tiny.tokenizer()
    tok.chat_template = None
    lm = HFCausalLM(tiny.model("llama"), vocab_size=len(tok))
    models = HFModels(target=lm, tokenizer=tok)
    with pytest.raises(InvalidConfig, match=r"the tokenizer has no chat template; pass text="):
        models.request("r", 4, messages=[{"role": "user", "content": "x"}])
