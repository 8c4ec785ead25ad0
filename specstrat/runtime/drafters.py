"""Drafters: who proposes the ``T - 1`` tokens that TARGET_VERIFY checks.

The engine picks one from the algorithm's *capabilities*, never its name
(:func:`drafter_for`): an algorithm that carries the target's hidden states drafts with the
EAGLE-style head; one with a draft KV cache drafts with the draft LM; any other speculative
algorithm drafts by prompt lookup (n-grams). Drafters keep their per-request state keyed by the
request's pool slot and are only called from the engine's forward thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig
from specstrat.relay import RelayPayload
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.model import EagleHead, TinyLM
from specstrat.runtime.worker import ModelWorker

__all__ = [
    "DraftModelDrafter",
    "Drafter",
    "Drafts",
    "EagleHeadDrafter",
    "NgramDrafter",
    "StepInputs",
    "drafter_for",
]

TOPK = 4  # top-k the EAGLE head relays for its first draft token


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What a decode step starts from, per running request (resolved from the relay)."""

    slots: list[int]
    last: torch.Tensor  # [bs] the verified token not yet in the target's KV
    seq_lens: list[int]  # target KV length per request
    relay: RelayPayload  # everything else the previous step stashed


@dataclass(frozen=True, slots=True)
class Drafts:
    """A drafter's proposal: ``tokens`` is ``[bs, steps]``; only the first ``lengths[i]`` of row
    ``i`` were really found, the rest is filler (``None``: every row is ``steps`` long). An
    engine that verifies ragged batches runs only the found ones through the target."""

    tokens: torch.Tensor
    lengths: list[int] | None = None


class Drafter(Protocol):
    """Proposes draft tokens and keeps whatever state that takes."""

    def admit(
        self,
        slots: list[int],
        prompts: list[list[int]],
        first: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> RelayPayload:
        """New requests after prefill: ``first`` tokens and the target's last hidden states
        (``None`` for PREBUILT admission, where the disaggregation builder relayed the state)."""
        ...

    def draft(self, inputs: StepInputs, steps: int) -> Drafts:
        """``[bs, steps]`` draft tokens following ``inputs.last``."""
        ...

    def accept(
        self,
        inputs: StepInputs,
        drafts: torch.Tensor,
        accepted: list[int],
        bonus: torch.Tensor,
        hidden: torch.Tensor,
    ) -> RelayPayload:
        """After verification: ``accepted[i]`` drafts kept, then ``bonus[i]``; ``hidden[i]`` is
        the target's hidden state where ``bonus[i]`` was chosen. Returns fields to relay."""
        ...

    def release(self, slot: int) -> None:
        """Forget a finished request."""
        ...


@dataclass
class _History:
    """Committed tokens (prompt + output) per slot."""

    tokens: dict[int, list[int]] = field(default_factory=dict)

    def admit(self, slots: list[int], prompts: list[list[int]], first: torch.Tensor) -> None:
        for slot, prompt, token in zip(slots, prompts, first.tolist(), strict=True):
            self.tokens[slot] = [*prompt, int(token)]

    def extend(
        self, slots: list[int], drafts: torch.Tensor, accepted: list[int], bonus: torch.Tensor
    ) -> None:
        rows = drafts.tolist()
        for slot, row, a, b in zip(slots, rows, accepted, bonus.tolist(), strict=True):
            self.tokens[slot].extend([*row[:a], int(b)])


class NgramDrafter:
    """Prompt lookup: continue the latest earlier occurrence of the request's last n-gram.

    Tries n-grams of ``max_ngram`` down to ``min_ngram`` bytes (a single byte recurs everywhere
    and predicts little: with ragged verify, proposing nothing is cheaper). Rows are padded to ``steps`` with repeats
    of their last token and report how many tokens were found, so a ragged verify checks only
    those (a uniform verify checks the filler too, at no cost to correctness).
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidConfig(
                f"n-gram sizes min_ngram={min_ngram}, max_ngram={max_ngram}: need "
                "1 <= min_ngram <= max_ngram"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.history = _History()

    def admit(
        self,
        slots: list[int],
        prompts: list[list[int]],
        first: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> RelayPayload:
        """Remember each request's tokens."""
        self.history.admit(slots, prompts, first)
        return RelayPayload()

    def _lookup(self, tokens: list[int], steps: int) -> list[int]:
        text = bytes(tokens)  # byte-level vocabulary: rfind does the search in C
        for n in range(min(self.max_ngram, len(text) - 1), self.min_ngram - 1, -1):
            at = text.rfind(text[-n:], 0, len(text) - 1)
            if at >= 0:
                found = list(text[at + n : at + n + steps])
                if found:
                    return found
        return []

    def draft(self, inputs: StepInputs, steps: int) -> Drafts:
        """Looked-up continuations, ``[bs, steps]``, with the number found per row."""
        found = [self._lookup(self.history.tokens[s], steps) for s in inputs.slots]
        rows = [
            f + [f[-1] if f else self.history.tokens[s][-1]] * (steps - len(f))
            for f, s in zip(found, inputs.slots, strict=True)
        ]
        tokens = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), steps)
        return Drafts(tokens, [len(f) for f in found])

    def accept(
        self,
        inputs: StepInputs,
        drafts: torch.Tensor,
        accepted: list[int],
        bonus: torch.Tensor,
        hidden: torch.Tensor,
    ) -> RelayPayload:
        """Extend the history with what was verified."""
        self.history.extend(inputs.slots, drafts, accepted, bonus)
        return RelayPayload()

    def release(self, slot: int) -> None:
        """Drop the request's history."""
        self.history.tokens.pop(slot, None)


class DraftModelDrafter:
    """A small LM with its own KV cache drafts greedily, one token per forward.

    Its KV holds a prefix of the committed tokens; each draft starts with a DRAFT_EXTEND that
    catches up on the verified tokens it lacks (the bonus token at least), then DECODEs. After
    verification its KV is rewound to the drafts the target accepted.
    """

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self.history = _History()
        self.slot_of: dict[int, int] = {}

    def admit(
        self,
        slots: list[int],
        prompts: list[list[int]],
        first: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> RelayPayload:
        """Prefill the draft model on each prompt."""
        self.history.admit(slots, prompts, first)
        own = [self.worker.alloc_request() for _ in slots]
        self.slot_of.update(zip(slots, own, strict=True))
        self.worker.forward(ForwardMode.DRAFT_EXTEND, own, prompts)
        return RelayPayload()

    def draft(self, inputs: StepInputs, steps: int) -> Drafts:
        """``steps`` greedy tokens from the draft LM."""
        own = [self.slot_of[s] for s in inputs.slots]
        catch_up = [
            self.history.tokens[s][self.worker.length(o) :]
            for s, o in zip(inputs.slots, own, strict=True)
        ]
        logits, _ = self.worker.forward(ForwardMode.DRAFT_EXTEND, own, catch_up)
        ends = torch.tensor([len(c) for c in catch_up]).cumsum(0) - 1
        token = logits[ends].argmax(-1)
        out = [token]
        for _ in range(steps - 1):
            logits, _ = self.worker.forward(ForwardMode.DECODE, own, [[t] for t in token.tolist()])
            token = logits.argmax(-1)
            out.append(token)
        return Drafts(torch.stack(out, dim=1))

    def accept(
        self,
        inputs: StepInputs,
        drafts: torch.Tensor,
        accepted: list[int],
        bonus: torch.Tensor,
        hidden: torch.Tensor,
    ) -> RelayPayload:
        """Keep the draft KV of accepted drafts only (T = 1 drafts nothing: nothing to drop)."""
        steps = drafts.shape[1]
        for slot, a in zip(inputs.slots, accepted, strict=True):
            committed = len(self.history.tokens[slot])
            if steps:  # drafting left committed + steps - 1 positions in the draft KV
                self.worker.rewind(self.slot_of[slot], committed + min(a, steps - 1))
        self.history.extend(inputs.slots, drafts, accepted, bonus)
        return RelayPayload()

    def release(self, slot: int) -> None:
        """Free the request's draft KV."""
        self.history.tokens.pop(slot, None)
        own = self.slot_of.pop(slot, None)
        if own is not None:
            self.worker.free_request(own)


class EagleHeadDrafter:
    """The EAGLE-style head chains (hidden, token) -> next token from the target's hidden state.

    At the end of each step (and after prefill) it drafts the first token from the target's
    hidden state at the accepted position and relays that token's top-k and the head's hidden
    state (``topk_p``, ``topk_index``, ``hidden_states``); the next step continues the chain
    from there, so the target's hidden states cross steps only through the relay.
    """

    def __init__(self, target: TinyLM, head: EagleHead) -> None:
        self.target = target
        self.head = head

    def _first(self, hidden: torch.Tensor, tokens: torch.Tensor) -> RelayPayload:
        with torch.inference_mode():
            logits, new_hidden = self.head(hidden, tokens, self.target)
            top = torch.topk(logits.softmax(-1), k=TOPK, dim=-1)
        return RelayPayload(topk_p=top.values, topk_index=top.indices, hidden_states=new_hidden)

    def admit(
        self,
        slots: list[int],
        prompts: list[list[int]],
        first: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> RelayPayload:
        """Draft the first token of each new request (PREBUILT: already relayed)."""
        return RelayPayload() if hidden is None else self._first(hidden, first)

    def draft(self, inputs: StepInputs, steps: int) -> Drafts:
        """The relayed first token, then ``steps - 1`` more from the head alone."""
        relay = inputs.relay
        if relay.topk_index is None or relay.hidden_states is None:
            raise InvalidConfig("EAGLE drafting needs topk_index and hidden_states in the relay")
        token, hidden = relay.topk_index[:, 0], relay.hidden_states
        out = [token]
        with torch.inference_mode():
            for _ in range(steps - 1):
                logits, hidden = self.head(hidden, token, self.target)
                token = logits.argmax(-1)
                out.append(token)
        return Drafts(torch.stack(out, dim=1))

    def accept(
        self,
        inputs: StepInputs,
        drafts: torch.Tensor,
        accepted: list[int],
        bonus: torch.Tensor,
        hidden: torch.Tensor,
    ) -> RelayPayload:
        """Draft the next step's first token from the target's hidden state and the bonus."""
        return self._first(hidden, bonus)

    def release(self, slot: int) -> None:
        """Nothing is kept per request outside the relay."""


def drafter_for(
    algo: SpecAlgorithm[Any],
    target: TinyLM,
    *,
    draft_worker: ModelWorker | None,
    eagle_head: EagleHead | None,
) -> Drafter | None:
    """The drafter the algorithm's capabilities call for (``None`` for plain decoding)."""
    caps = algo.capabilities
    if not caps.speculative:
        return None
    if caps.carries_draft_hidden_states:
        if eagle_head is None:
            raise InvalidConfig(f"{algo.name} carries hidden states but no EAGLE head was loaded")
        return EagleHeadDrafter(target, eagle_head)
    if caps.has_draft_kv:
        if draft_worker is None:
            raise InvalidConfig(f"{algo.name} has a draft KV but no draft model was loaded")
        return DraftModelDrafter(draft_worker)
    return NgramDrafter()
