"""What ``specstrat bench`` decodes: the code-editing prompts or Spec-Bench's questions.

A workload is named by a spec string: ``code`` (the code-editing prompts of
:mod:`specstrat.hf.code_workload`, one category) or ``spec-bench:PATH[:CATEGORY,...]``: Spec-Bench's
``question.jsonl`` (github.com/hemingkx/Spec-Bench, ``data/spec_bench/question.jsonl``,
Apache-2.0; read from ``PATH``, never copied), the first turn of each question. Its categories
are the file's 13 plus ``mt_bench``, the 80 MT-Bench questions (the file's first eight
categories) as one, as Spec-Bench's tables group them; by default one row each for
:data:`SPEC_BENCH_ROWS`. ``requests`` prompts are taken per category: round robin over the
file categories a row holds, each in file order.

Prompts become requests through :class:`PromptEncoder`: a Hugging Face model's chat template
(:class:`ChatEncoder`), or bytes for the embedded byte models (:class:`ByteEncoder`: no chat
template, left-truncated to fit the context).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.hf.code_workload import code_prompts
from specstrat.runtime import Request

__all__ = [
    "MT_BENCH_CATEGORIES",
    "SPEC_BENCH_ROWS",
    "ByteEncoder",
    "ChatEncoder",
    "Prompt",
    "PromptEncoder",
    "WorkloadSpec",
    "encode_all",
    "load_prompts",
    "parse_workload",
]

#: The file categories of MT-Bench's 80 questions (ids 81-160), Spec-Bench's first task.
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
#: Spec-Bench's six tasks, the rows of its tables, in its order.
SPEC_BENCH_ROWS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_SPEC_BENCH = "spec-bench:"
_FORMS = "'code' or 'spec-bench:PATH[:CATEGORY,...]'"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A parsed ``--workload``: ``kind`` ``code`` or ``spec-bench``, the file's ``path`` and
    the chosen ``categories`` (empty: :data:`SPEC_BENCH_ROWS`)."""

    kind: str
    path: Path | None = None
    categories: tuple[str, ...] = ()

    def text(self) -> str:
        """The spec as written on the command line."""
        if self.kind == "code":
            return "code"
        cats = f":{','.join(self.categories)}" if self.categories else ""
        return f"{_SPEC_BENCH}{self.path}{cats}"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: its request id, its category (a table row) and its text."""

    rid: str
    category: str
    text: str


def parse_workload(spec: str) -> WorkloadSpec:
    """``code`` or ``spec-bench:PATH[:CATEGORY,...]``; anything else is an InvalidConfig
    naming the value and the forms."""
    if spec == "code":
        return WorkloadSpec("code")
    if not spec.startswith(_SPEC_BENCH) or spec == _SPEC_BENCH:
        raise InvalidConfig(f"workload={spec!r} is not a workload; pass {_FORMS}")
    rest = spec[len(_SPEC_BENCH) :]
    path, sep, cats = rest.rpartition(":")
    if not sep or "/" in cats or cats.endswith(".jsonl"):  # no category list: all of it a path
        path, cats = rest, ""
    categories = tuple(c.strip() for c in cats.split(",")) if cats else ()
    if any(not c for c in categories):
        raise InvalidConfig(
            f"workload={spec!r} has an empty category; list them as CATEGORY,CATEGORY"
        )
    return WorkloadSpec("spec-bench", Path(path), categories)


def load_prompts(spec: WorkloadSpec, per_category: int) -> list[Prompt]:
    """The workload's prompts, ``per_category`` of each category (for ``code``: of the one)."""
    if spec.kind == "code":
        return [Prompt(rid, "code", text) for rid, text in code_prompts(per_category)]
    assert spec.path is not None  # parse_workload sets it for spec-bench
    rows = _read_spec_bench(spec.path)
    known = sorted({row["category"] for row in rows} | {"mt_bench"})
    out: list[Prompt] = []
    for name in spec.categories or SPEC_BENCH_ROWS:
        members = MT_BENCH_CATEGORIES if name == "mt_bench" else (name,)
        if name not in known:
            raise InvalidConfig(
                f"category {name!r} is not in {spec.path}; pick from {', '.join(known)}"
            )
        queues = [[r for r in rows if r["category"] == m] for m in members]
        picked: list[dict[str, Any]] = []
        while len(picked) < per_category and any(queues):
            for queue in queues:  # round robin over the row's file categories
                if queue and len(picked) < per_category:
                    picked.append(queue.pop(0))
        out.extend(
            Prompt(f"{name}-{row['question_id']}", name, str(row["turns"][0])) for row in picked
        )
    return out


def _read_spec_bench(path: Path) -> list[dict[str, Any]]:
    """The questions of a Spec-Bench ``question.jsonl``, each checked for the fields used."""
    hint = (
        "pass the path of Spec-Bench's data/spec_bench/question.jsonl "
        "(github.com/hemingkx/Spec-Bench)"
    )
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidConfig(f"spec-bench path {path}: {exc.strerror or exc}; {hint}") from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidConfig(f"{path}:{number} is not JSON ({exc.msg}); {hint}") from exc
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or "category" not in row:
            raise InvalidConfig(
                f"{path}:{number} has no 'category' and 'turns' (a question of Spec-Bench); {hint}"
            )
        row.setdefault("question_id", number)
        rows.append(row)
    if not rows:
        raise InvalidConfig(f"spec-bench path {path} holds no questions; {hint}")
    return rows


class PromptEncoder(Protocol):
    """Turns a prompt into a request for one model."""

    @property
    def note(self) -> str:
        """How prompts were encoded, for the output (empty when there is nothing to say)."""
        ...

    def encode(
        self, prompt: Prompt, max_new_tokens: int, sampling: SamplingParams, stops: bool
    ) -> Request:
        """The request for ``prompt``; ``stops``: whether it may stop before its budget."""
        ...


@dataclass(frozen=True, slots=True)
class ChatEncoder:
    """A Hugging Face model's requests: the prompt as the user's turn through the tokenizer's
    chat template (plain text without one), stopping at EOS when ``stops``."""

    models: Any  # specstrat.hf.HFModels (imported lazily: transformers is optional)

    @property
    def note(self) -> str:
        """Nothing to say: prompts go through the chat template as they are."""
        return ""

    def encode(
        self, prompt: Prompt, max_new_tokens: int, sampling: SamplingParams, stops: bool
    ) -> Request:
        """The prompt as one user turn."""
        chat = getattr(self.models.tokenizer, "chat_template", None) is not None
        kind = {"messages": [{"role": "user", "content": prompt.text}]} if chat else {}
        text = {} if chat else {"text": prompt.text}
        return self.models.request(  # type: ignore[no-any-return]
            prompt.rid, max_new_tokens, stop_at_eos=stops, sampling=sampling, **kind, **text
        )


@dataclass(frozen=True, slots=True)
class ByteEncoder:
    """The embedded byte models' requests: UTF-8 bytes, no chat template, the prompt's last
    ``room(max_new_tokens)`` bytes kept (left-truncated) so prompt, output and a step's
    reservation fit ``context_len``; no stop tokens (the byte models have no EOS)."""

    context_len: int
    margin: int

    @property
    def note(self) -> str:
        """What the embedded models get instead of the chat template."""
        return (
            "embedded byte models: prompts byte-encoded, no chat template, left-truncated to "
            f"fit context_len={self.context_len}"
        )

    def encode(
        self, prompt: Prompt, max_new_tokens: int, sampling: SamplingParams, stops: bool
    ) -> Request:
        """The prompt's bytes, left-truncated."""
        room = self.context_len - max_new_tokens - self.margin
        if room < 1:
            raise InvalidConfig(
                f"max_new_tokens={max_new_tokens} (--max-new-tokens) leaves no room for a "
                f"prompt in context_len={self.context_len} (--context-len), where a step "
                f"reserves {self.margin} tokens for the widest --draft-tokens; lower "
                "--max-new-tokens or --draft-tokens, or pass --context-len "
                f"{max_new_tokens + self.margin + 1} or more"
            )
        data = prompt.text.encode("utf-8")[-room:]
        return Request(prompt.rid, tuple(data), max_new_tokens, sampling=sampling)


def encode_all(
    encoder: PromptEncoder,
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    sampling: SamplingParams = GREEDY,
    *,
    stops: bool = True,
) -> list[Request]:
    """Every prompt's request; request ``i`` samples with seed ``sampling.seed + i``."""
    return [
        encoder.encode(
            p, max_new_tokens, replace(sampling, seed=(sampling.seed + i) % 2**63), stops
        )
        for i, p in enumerate(prompts)
    ]
