"""Text and chat in, text out: requests built with a Hugging Face tokenizer, outputs decoded."""

from __future__ import annotations

from typing import Any

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.runtime import Request

__all__ = ["chat_request", "decode", "stop_token_ids", "text_request"]


def stop_token_ids(tokenizer: Any, stop: tuple[str, ...]) -> frozenset[int]:
    """The stop strings that are one token each, as ids (a longer one cannot end generation on a
    token; :func:`decode` cuts the text before it)."""
    if isinstance(stop, str):
        raise InvalidConfig(f"stop={stop!r} is a string; pass a tuple of strings, e.g. ({stop!r},)")
    ids = set()
    for s in stop:
        encoded = tokenizer.encode(s, add_special_tokens=False)
        if len(encoded) == 1:
            ids.add(int(encoded[0]))
    return frozenset(ids)


def text_request(
    tokenizer: Any,
    rid: str,
    text: str,
    max_new_tokens: int,
    *,
    eos: frozenset[int] = frozenset(),
    stop: tuple[str, ...] = (),
    sampling: SamplingParams = GREEDY,
) -> Request:
    """A request whose prompt is ``text`` tokenised as is (the tokenizer's own special tokens,
    such as a BOS, included); it stops at ``eos`` and at one-token ``stop`` strings."""
    if not isinstance(text, str) or not text:
        raise InvalidConfig(f"request {rid!r}: text={text!r} must be a non-empty string")
    ids = tokenizer.encode(text)
    return _request(tokenizer, rid, ids, max_new_tokens, eos, stop, sampling)


def chat_request(
    tokenizer: Any,
    rid: str,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    *,
    eos: frozenset[int] = frozenset(),
    stop: tuple[str, ...] = (),
    sampling: SamplingParams = GREEDY,
) -> Request:
    """A request from chat ``messages`` (``[{"role": "user", "content": ...}, ...]``) through the
    tokenizer's chat template, with the generation prompt added."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidConfig(
            f"request {rid!r}: the tokenizer has no chat template; pass text= instead"
        )
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise InvalidConfig(
            f"request {rid!r}: messages={messages!r}; pass a non-empty list of "
            "{'role': str, 'content': str} dicts, e.g. [{'role': 'user', 'content': 'Hi'}]"
        )
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # the template's own refusals (jinja2's TemplateError, ...)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidConfig(
            f"request {rid!r}: the tokenizer's chat template refused messages with roles "
            f"{[m['role'] for m in messages]} ({type(exc).__name__}: {reason}); use the roles "
            "and order the model's template expects, or pass text= instead"
        ) from exc
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return _request(tokenizer, rid, ids, max_new_tokens, eos, stop, sampling)


def _request(
    tokenizer: Any,
    rid: str,
    ids: Any,
    max_new_tokens: int,
    eos: frozenset[int],
    stop: tuple[str, ...],
    sampling: SamplingParams,
) -> Request:
    """The request both builders make: the ids as ints, stopping at ``eos`` and the one-token
    ``stop`` strings."""
    stops = eos | stop_token_ids(tokenizer, stop)
    return Request(rid, tuple(int(t) for t in ids), max_new_tokens, stops, sampling)


def decode(tokenizer: Any, ids: list[int], *, stop: tuple[str, ...] = ()) -> str:
    """``ids`` as text, special tokens dropped, cut before the first of the ``stop`` strings."""
    if isinstance(stop, str):
        raise InvalidConfig(f"stop={stop!r} is a string; pass a tuple of strings, e.g. ({stop!r},)")
    text: str = tokenizer.decode(ids, skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return text[: min(cuts)] if cuts else text
