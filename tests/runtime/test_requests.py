"""A request takes any sequence of token ids as its prompt and stores it as a tuple."""

from typing import Any

import pytest

from specstrat import InvalidConfig
from specstrat.runtime import Request

SEQUENCES: list[tuple[str, Any]] = [
    ("list", [1, 2, 3]),
    ("tuple", (1, 2, 3)),
    ("range", range(1, 4)),
]


@pytest.mark.parametrize(("case", "prompt"), SEQUENCES, ids=[c[0] for c in SEQUENCES])
def test_any_sequence_of_ints_is_a_prompt(case: str, prompt: Any) -> None:
    """A list, tuple or range of token ids is accepted and stored as the same tuple."""
    request = Request("a", prompt, 20)
    assert request.prompt == (1, 2, 3)
    assert isinstance(request.prompt, tuple)
    assert hash(request) == hash(Request("a", (1, 2, 3), 20))


def test_the_stored_prompt_does_not_follow_the_callers_list() -> None:
    """Changing the list after construction leaves the request's prompt as it was."""
    tokens = [1, 2, 3]
    request = Request("a", tokens, 20)
    tokens.append(4)
    assert request.prompt == (1, 2, 3)


BAD: list[tuple[str, Any, str]] = [
    ("text", "abc", r"prompt='abc' must be a non-empty sequence of token ids"),
    ("bytes", b"abc", r"prompt=b'abc' must be a non-empty sequence of token ids"),
    ("empty-list", [], r"prompt=\[\] must be a non-empty sequence"),
    ("an-int", 5, r"prompt=5 must be a non-empty sequence"),
    ("a-set", {1, 2}, r"prompt=\{1, 2\} must be a non-empty sequence"),
    ("negative", [1, -2], r"prompt has a bad token; token ids are ints >= 0"),
    ("a-float", [1, 2.0], r"prompt has a bad token"),
    ("a-bool", [True], r"prompt has a bad token"),
]


@pytest.mark.parametrize(("case", "prompt", "message"), BAD, ids=[c[0] for c in BAD])
def test_a_prompt_that_is_not_token_ids_is_refused(case: str, prompt: Any, message: str) -> None:
    """Text, bytes, empty or unordered containers and non-int tokens are InvalidConfig."""
    with pytest.raises(InvalidConfig, match=message):
        Request("a", prompt, 20)
