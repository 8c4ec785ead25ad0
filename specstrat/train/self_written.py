"""Prompts the target writes itself, so a head trains on requests phrased unlike any template.

A pool built from templates teaches a head the responses to those templates: on SmolLM2 the
shipped head agreed with the target at the first draft position 0.54 of the time on held-out
prompts of the default pool and 0.28 on Spec-Bench. :func:`self_written_prompts` asks the
target, sampling, to write the prompts instead, in two kinds:

- **requests**: "Write one question that a nurse might ask about tides. Write only the
  question." The target's answer, cleaned (:func:`clean_request`), is the prompt;
- **documents**: a news report, an encyclopedia paragraph, a story or a few sentences in
  German, each about a subject drawn from word lists here. The document, cleaned
  (:func:`clean_document`), goes into a task around it: summarise it, answer from it, extract
  from it, translate it, give it a headline.

Every word list and template is a constant of this module (a test checks them against
Spec-Bench), the asks are drawn from them by a seeded generator (:func:`writing_asks`), and the
target's text is its own, so the prompts are license-clean and made with nothing downloaded.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.train.generation import generate

__all__ = [
    "WritingAsk",
    "clean_document",
    "clean_request",
    "given_source",
    "self_written_prompts",
    "writing_asks",
    "written_source",
]

_WHO = (
    *("a student", "a curious child", "a retired teacher", "a nurse", "a shop owner"),
    *("a traveller", "a software engineer", "a historian", "a parent", "a farmer"),
    *("a journalist", "a painter", "a lawyer", "a football coach", "a new employee"),
    *("a grandmother", "a chemist", "a city planner", "a musician", "a cook"),
)

_SUBJECTS = (
    *("ancient Egypt", "the Roman Empire", "the Industrial Revolution", "the Cold War"),
    *("world geography", "rivers and lakes", "the solar system", "human memory", "sleep"),
    *("healthy eating", "personal savings", "renting a flat", "job interviews", "music theory"),
    *("classical painting", "modern architecture", "poetry", "famous novels", "film history"),
    *("the ocean", "rainforests", "climate change", "electric cars", "smartphones"),
    *("the internet", "vaccines", "the human heart", "genetics", "chemistry in the kitchen"),
    *("probability", "geometry", "prime numbers", "logic puzzles", "chess openings"),
    *("philosophy of mind", "ethics at work", "world religions", "Greek mythology"),
    *("learning a language", "public speaking", "raising children", "pets", "gardening"),
    *("sports training", "the Olympic games", "elections", "taxes", "small businesses"),
    *("tourism in Japan", "cities of Europe", "mountains", "deserts", "weather forecasts"),
    *("friendship", "moving to a new country", "volunteering", "museums", "board games"),
)

_EVENTS = (
    *("a town opening a new public library", "a storm closing schools for two days"),
    *("a local team winning a regional final", "a new bridge opening across a river"),
    *("a museum finding a lost painting in its basement", "a bakery chain recalling bread"),
    *("a heatwave breaking a city's temperature record", "a city making its buses free"),
    *("scientists describing a new species of frog", "a school robotics contest"),
    *("a music festival celebrating its fiftieth year", "a hospital opening a new wing"),
    *("a factory closing after sixty years", "a marathon drawing record crowds"),
    *("a council voting on a new cycle lane", "a rare comet visible for one week"),
    *("a power cut across a region", "a village saving its last shop"),
    *("a company moving to a four-day week", "a flood damaging farmland"),
)

_REQUESTS = (
    "Write one question that {who} might ask about {subject}. Write only the question.",
    "Write a request that {who} might send to an AI assistant about {subject}. Write only "
    "the request.",
    "Write a task involving {subject} that {who} might ask a helpful assistant to do. Write "
    "only the task.",
    "Write a hard question about {subject} that needs careful reasoning to answer. Write only "
    "the question.",
)

_DOCUMENTS = (
    ("Write a short news report, about 150 words, about {event}.", "article"),
    ("Write an encyclopedia paragraph of about 120 words about {subject}.", "text"),
    ("Write a short story of about 150 words about {who} and {subject}.", "story"),
    ("Write three sentences in German about {subject}.", "german"),
)

_TASKS = {
    "article": (
        "Summarize the following news article in two sentences.\n\n{doc}",
        "Article:\n{doc}\n\nWhat happened, where, and who was involved? Answer from the article.",
        "Write a headline and a one-line summary for this report:\n\n{doc}",
        "{doc}\n\nList every name, place and number in the article above.",
    ),
    "text": (
        "Read the text below and answer: what are its two most important facts?\n\n{doc}",
        "{doc}\n\nExplain the text above to a ten-year-old.",
        "Text:\n{doc}\n\nWrite three quiz questions about this text, with their answers.",
    ),
    "story": (
        "Continue this story with one more paragraph:\n\n{doc}",
        "{doc}\n\nWho is the main character of this story, and what do they want?",
        "Rewrite the following story in a more formal style.\n\n{doc}",
    ),
    "german": ("Translate the following text from German into English:\n\n{doc}",),
}


@dataclass(frozen=True, slots=True)
class WritingAsk:
    """One thing the target is asked to write: ``ask`` (the prompt it answers), ``kind``
    (``"request"`` or a document kind: ``"article"``, ``"text"``, ``"story"``, ``"german"``) and
    ``task``: the template (a ``{doc}`` slot) the cleaned document goes into, ``"{doc}"`` for a
    request, whose cleaned text is the prompt itself."""

    ask: str
    kind: str
    task: str

    def __post_init__(self) -> None:
        kinds = ("request", *_TASKS)
        if self.kind not in kinds:
            raise InvalidConfig(
                f"WritingAsk.kind={self.kind!r} must be one of {', '.join(map(repr, kinds))}"
            )
        if "{doc}" not in self.task:
            raise InvalidConfig(
                f"WritingAsk.task={self.task!r} has no {{doc}} slot for the written text; "
                'put "{doc}" where it goes ("{doc}" alone for a request)'
            )

    def prompt(self, written: str) -> str | None:
        """The prompt made of the target's ``written`` answer to :attr:`ask`, or ``None`` when
        cleaning leaves nothing usable."""
        clean = clean_request(written) if self.kind == "request" else clean_document(written)
        return None if clean is None else self.task.replace("{doc}", clean)


def writing_asks(count: int, seed: int = 0) -> tuple[WritingAsk, ...]:
    """``count`` asks drawn by ``random.Random(seed)``: requests and documents in turn (a
    request, then a document, ...), each with its word-list slots and its task drawn."""
    if not is_int(count) or count < 0:
        raise InvalidConfig(f"count={count!r} must be an int >= 0")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        slots = {"who": rng.choice(_WHO), "subject": rng.choice(_SUBJECTS)}
        slots["event"] = rng.choice(_EVENTS)
        if i % 2 == 0:
            out.append(WritingAsk(rng.choice(_REQUESTS).format(**slots), "request", "{doc}"))
        else:
            template, kind = rng.choice(_DOCUMENTS)
            out.append(WritingAsk(template.format(**slots), kind, rng.choice(_TASKS[kind])))
    return tuple(out)


_QUOTED = re.compile(r"[\"“]([^\"”]{12,400}\?)[\"”]")
_LEAD = re.compile(r"^(?:\*\*)?(?:question|request|task|instruction)\s*:\s*(?:\*\*)?\s*", re.I)


def clean_request(text: str) -> str | None:
    """The request in the target's answer: a quoted question when the answer holds one, else
    the first paragraph without a "Question:"-style label or surrounding quotes; ``None`` when
    it has fewer than 4 words or more than 600 characters."""
    quoted = _QUOTED.search(text)
    if quoted is not None:
        request = quoted.group(1)
    else:
        first = next((p for p in text.strip().split("\n\n") if p.strip()), "")
        request = _LEAD.sub("", " ".join(first.split())).strip("\"'“”* ")
    if len(request.split()) < 4 or len(request) > 600:
        return None
    return request


def clean_document(text: str, *, max_chars: int = 1400) -> str | None:
    """The target's document cut after its last whole sentence within ``max_chars`` (a reply
    cut off by its token limit ends mid-sentence), paragraphs kept; ``None`` when it has no
    sentence end there or fewer than 15 words remain."""
    body = text.strip()[:max_chars]
    ends = [m.end() for m in re.finditer(r"[.!?][\"”']?(?=\s|$)", body)]
    if not ends:
        return None
    body = body[: ends[-1]]
    body = "\n\n".join(" ".join(p.split()) for p in body.split("\n\n") if p.strip())
    return body if len(body.split()) >= 15 else None


def self_written_prompts(
    model: Any,
    tokenizer: Any,
    count: int,
    *,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 160,
    deadline: float | None = None,
) -> tuple[str, ...]:
    """Prompts ``model`` writes itself (see the module docstring): its sampled answers (at
    ``temperature``, up to ``max_new_tokens`` tokens each) to :func:`writing_asks` ``(count,
    seed)``, made into prompts by :meth:`WritingAsk.prompt`; distinct, in the asks' order,
    answers that clean to nothing dropped, so at most ``count``. Generation stops early, keeping
    what it has, once ``time.monotonic()`` passes ``deadline``."""
    asks = writing_asks(count, seed)
    gens = generate(
        model,
        tokenizer,
        [a.ask for a in asks],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        deadline=deadline,
    )
    texts = (tokenizer.decode(g.tokens[g.prompt_len :], skip_special_tokens=True) for g in gens)
    made = (a.prompt(t) for a, t in zip(asks, texts, strict=False))
    return tuple(dict.fromkeys(p for p in made if p is not None))


#: Between a run's prompt source and the count of prompts the target wrote for it.
_WRITTEN = " + prompts written by the target: "


def written_source(source: str, count: int) -> str:
    """The data source of a run whose prompts ``source`` were joined by ``count`` prompts the
    target wrote (what the head file's ``data_source`` records)."""
    return f"{source}{_WRITTEN}{count}"


def given_source(source: str) -> str:
    """The prompts' own source in a data source :func:`written_source` may have extended (what
    ``--resume`` compares with the run's prompts)."""
    return source.split(_WRITTEN, 1)[0]
