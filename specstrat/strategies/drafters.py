"""Built-in drafters: prompt lookup, a draft LM with its own KV, an EAGLE-style head, none.

Each ``*DrafterFactory`` is the frozen, picklable value an algorithm's ``drafter`` field holds;
the engine calls ``create_drafter`` once and gets the stateful ``*Drafter``, whose per-request
state is keyed by the request's target slot. The drafters reach models only through
:mod:`specstrat.models` Protocols, so they never import the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specstrat.drafting import (
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
)
from specstrat.errors import InvalidConfig
from specstrat.kernels.sampling import DRAW_DRAFT
from specstrat.models import DraftHead, DraftKV, LoadedModels
from specstrat.relay import RelayPayload
from specstrat.sampling import SamplingBatch, choose_tokens
from specstrat.strategies.disagg import EagleDraftInput

__all__ = [
    "DraftModelDrafter",
    "DraftModelDrafterFactory",
    "EagleHeadDrafter",
    "EagleHeadDrafterFactory",
    "NgramDrafter",
    "NgramDrafterFactory",
    "NoDrafter",
    "NoDrafterFactory",
]

_NOTHING = RelayPayload()


def _empty_tree(bs: int, device: torch.device) -> DraftTree:
    return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=device))


class _Chooser:
    """Picks each draft node's token: the argmax for greedy requests; for sampling ones a draw
    (index 2) from the drafter's distribution under the request's parameters, recorded as ``q``."""

    def __init__(self, step: DraftStep) -> None:
        self.sampled = any(not p.greedy for p in step.sampling)
        self.sampling = SamplingBatch.of(step.sampling, step.last_tokens.device)
        self.root = step.seq_lens.to(step.last_tokens.device)
        self.tokens: list[torch.Tensor] = []
        self.q: list[torch.Tensor] = []

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next node's token per request, from the drafter's logits ``[bs, V]``."""
        if not self.sampled:
            token = logits.argmax(-1)
        else:
            at = self.root + 1 + len(self.tokens)
            token, probs = choose_tokens(logits, self.sampling, at, DRAW_DRAFT)
            self.q.append(probs)
        self.tokens.append(token)
        return token

    def tree(self, device: torch.device, lengths: torch.Tensor | None = None) -> DraftTree:
        """The chain of picked tokens, with ``q`` when any request samples."""
        tokens = torch.stack(self.tokens, dim=1).to(device=device, dtype=torch.int64)
        q = torch.stack(self.q, dim=1).to(device) if self.q else None
        return DraftTree.chain(tokens, lengths=lengths, q=q)


# -- no drafting -------------------------------------------------------------------------------


class NoDrafter:
    """Proposes nothing: every step verifies only the last token (plain decoding)."""

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """Nothing to set up."""
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Nothing was kept."""

    def propose(self, step: DraftStep) -> DraftTree:
        """A tree of zero nodes per request."""
        return _empty_tree(len(step.slots), step.last_tokens.device)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Nothing to learn."""
        return _NOTHING


@dataclass(frozen=True, slots=True)
class NoDrafterFactory:
    """The drafter of the NONE algorithm (target-only decoding)."""

    @property
    def needs(self) -> DrafterNeeds:
        """Nothing."""
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> NoDrafter:
        """A drafter that proposes nothing."""
        return NoDrafter()

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels."""
        return _NOTHING


# -- prompt lookup -----------------------------------------------------------------------------


def _find(history: list[int], min_ngram: int, max_ngram: int, steps: int) -> list[int]:
    """The continuation of the latest earlier occurrence of the longest matching suffix."""
    if max(history) < 256:  # byte vocabulary: bytes.rfind searches in C
        text = bytes(history)
        for n in range(min(max_ngram, len(text) - 1), min_ngram - 1, -1):
            at = text.rfind(text[-n:], 0, len(text) - 1)
            if at >= 0 and at + n < len(text):
                return list(text[at + n : at + n + steps])
        return []
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        tail = history[-n:]
        for at in range(len(history) - n - 1, -1, -1):
            if history[at : at + n] == tail:
                return history[at + n : at + n + steps]
    return []


class NgramDrafter:
    """Prompt lookup over the request's committed tokens (read from the target's request pool)."""

    def __init__(
        self, min_ngram: int, max_ngram: int, target_tokens: Callable[[int], Sequence[int]]
    ) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.target_tokens = target_tokens

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """Nothing to set up: the history is the target's."""
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Nothing was kept."""

    def propose(self, step: DraftStep) -> DraftTree:
        """Looked-up continuations, each row padded with its last token; ``lengths`` = found."""
        steps = step.max_nodes
        rows, found = [], []
        for slot, last in zip(step.slots, step.last_tokens.tolist(), strict=True):
            history = [*self.target_tokens(slot), int(last)]
            got = _find(history, self.min_ngram, self.max_ngram, steps) if steps else []
            found.append(len(got))
            rows.append(got + [got[-1] if got else int(last)] * (steps - len(got)))
        dev = step.last_tokens.device
        tokens = torch.tensor(rows, dtype=torch.int64, device=dev).reshape(len(rows), steps)
        return DraftTree.chain(tokens, lengths=torch.tensor(found, dtype=torch.int64, device=dev))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Nothing to learn: the accepted tokens land in the target's request pool."""
        return _NOTHING


@dataclass(frozen=True, slots=True, kw_only=True)
class NgramDrafterFactory:
    """Prompt lookup: continue the latest earlier occurrence of the request's last n-gram.

    Tries n-grams of ``max_ngram`` down to ``min_ngram`` tokens (a single token recurs
    everywhere and predicts little; with ragged verify, proposing nothing is cheaper). Reports
    per row how many tokens it found, so a ragged verify runs only those.
    """

    min_ngram: int = 2
    max_ngram: int = 4

    def __post_init__(self) -> None:
        for value in (self.min_ngram, self.max_ngram):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidConfig(f"n-gram size {value!r} must be an int")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InvalidConfig(
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}: need "
                "1 <= min_ngram <= max_ngram"
            )

    @property
    def needs(self) -> DrafterNeeds:
        """Only the target's committed tokens."""
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> NgramDrafter:
        """A lookup drafter reading the engine's request pool."""
        return NgramDrafter(self.min_ngram, self.max_ngram, context.target_tokens)

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the prompt does anyway."""
        return _NOTHING


# -- a draft LM --------------------------------------------------------------------------------


class DraftModelDrafter:
    """A small LM with its own KV drafts greedily, one token per forward.

    Its KV holds a prefix of the committed tokens; each proposal first catches up on the
    committed tokens it lacks plus the last verified one (from length 0 after admission, local
    or PREBUILT alike: the draft KV never travels), then decodes. After verification its KV is
    rewound to the drafts the target accepted.
    """

    def __init__(self, runner: DraftKV, target_tokens: Callable[[int], Sequence[int]]) -> None:
        self.runner = runner
        self.target_tokens = target_tokens
        self.own: dict[int, int] = {}

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """A draft-KV slot per request (filled at the first proposal)."""
        fresh = self.runner.alloc(len(admission.slots))
        self.own.update(zip(admission.slots, fresh, strict=True))
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Free the requests' draft KV."""
        mine = [self.own.pop(s) for s in slots if s in self.own]
        if mine:
            self.runner.free(mine)

    def propose(self, step: DraftStep) -> DraftTree:
        """``max_nodes`` greedy tokens from the draft LM (none when T = 1)."""
        bs, steps, dev = len(step.slots), step.max_nodes, step.last_tokens.device
        if not steps or not bs:
            return _empty_tree(bs, dev)
        own = [self.own[s] for s in step.slots]
        have = self.runner.lengths(own)
        catch_up = [
            [*self.target_tokens(slot)[length:], int(last)]
            for slot, length, last in zip(step.slots, have, step.last_tokens.tolist(), strict=True)
        ]
        logits, _ = self.runner.extend(own, catch_up)
        ends = torch.tensor([len(c) for c in catch_up], device=logits.device).cumsum(0) - 1
        chooser = _Chooser(step)
        token = chooser.pick(logits[ends])
        for _ in range(steps - 1):
            logits, _ = self.runner.extend(own, [[t] for t in token.tolist()])
            token = chooser.pick(logits)
        return chooser.tree(dev)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Keep the draft KV of accepted drafts only (drafting fed all but the last draft)."""
        steps = outcome.drafts.num_nodes
        if steps:
            accepted = outcome.acceptance.accept_lengths.tolist()
            seq_lens = outcome.step.seq_lens.tolist()
            for slot, a, n in zip(outcome.step.slots, accepted, seq_lens, strict=True):
                self.runner.rewind(self.own[slot], n + 1 + min(int(a), steps - 1))
        return _NOTHING


@dataclass(frozen=True, slots=True)
class DraftModelDrafterFactory:
    """Drafts with the loaded draft LM (``models.draft``) in a KV cache of its own."""

    @property
    def needs(self) -> DrafterNeeds:
        """A draft LM with its own KV."""
        return DrafterNeeds(draft_model=True)

    def create_drafter(self, context: DrafterContext) -> DraftModelDrafter:
        """A drafter over a KV runner the engine makes for the draft LM."""
        draft = context.models.draft
        if draft is None:
            raise InvalidConfig(
                "DraftModelDrafterFactory needs a draft LM but models.draft is None; load "
                "one (EmbeddedModels.load(), or ModelSet(target=..., draft=...))"
            )
        return DraftModelDrafter(context.new_kv_runner(draft), context.target_tokens)

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the decode side rebuilds the draft KV from the prompt."""
        return _NOTHING


# -- an EAGLE-style head -----------------------------------------------------------------------


def _first_token(
    head: DraftHead, hidden: torch.Tensor, tokens: torch.Tensor, topk: int
) -> RelayPayload:
    """The head's top-k for the token after ``tokens``, and its predicted hidden state."""
    with torch.inference_mode():
        logits, new_hidden = head(hidden, tokens)
        top = torch.topk(logits.softmax(-1), k=topk, dim=-1)
    return RelayPayload(topk_p=top.values, topk_index=top.indices, hidden_states=new_hidden)


class EagleHeadDrafter:
    """Chains the head ``(hidden, token) -> (token', hidden')`` from the target's hidden state.

    After prefill, and after each verify (``commit``), it drafts the next step's first token
    from the target's hidden state where the bonus token was chosen and relays its top-k and
    the head's hidden state; ``propose`` continues the chain from the relay, so the target's
    hidden states cross steps only through the relay. A request admitted without draft state
    (a PREBUILT batch whose builder returned ``None``) proposes nothing on its first step.
    """

    def __init__(self, head: DraftHead, topk: int, vocab_size: int) -> None:
        self.head, self.topk, self.vocab_size = head, topk, vocab_size
        self.ready: set[int] = set()

    def admit(self, admission: DraftAdmission[EagleDraftInput]) -> RelayPayload:
        """After prefill: the first draft token from the target's hidden state. PREBUILT: the
        builder relayed it (``draft_input``), or there is none yet."""
        if admission.hidden is not None:
            self.ready.update(admission.slots)
            return _first_token(self.head, admission.hidden, admission.first_tokens, self.topk)
        if admission.draft_input is not None:
            self.ready.update(admission.slots)
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Forget whether the requests had draft state."""
        self.ready.difference_update(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        """The relayed first token, then ``max_nodes - 1`` more from the head alone."""
        bs, steps, dev = len(step.slots), step.max_nodes, step.last_tokens.device
        relay = step.relay
        if not steps or not bs:
            return _empty_tree(bs, dev)
        if relay.topk_index is None or relay.topk_p is None or relay.hidden_states is None:
            filler = step.last_tokens[:, None].expand(bs, steps).contiguous()  # no state yet
            return DraftTree.chain(filler, lengths=torch.zeros(bs, dtype=torch.int64, device=dev))
        chooser = _Chooser(step)
        # The first node from the relayed top-k: its log-probabilities, -inf outside the top-k.
        first = torch.full((bs, self.vocab_size), float("-inf"), dtype=relay.topk_p.dtype)
        first = first.to(dev).scatter(1, relay.topk_index, relay.topk_p.clamp(min=1e-30).log())
        token, hidden = chooser.pick(first), relay.hidden_states
        with torch.inference_mode():
            for _ in range(steps - 1):
                logits, hidden = self.head(hidden, token)
                token = chooser.pick(logits)
        ready = torch.tensor([s in self.ready for s in step.slots], device=dev)
        return chooser.tree(dev, lengths=torch.where(ready, steps, 0).to(torch.int64))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """The next step's first draft token, from the target's hidden state at the bonus."""
        self.ready.update(outcome.step.slots)
        bonus = outcome.acceptance.bonus_tokens
        return _first_token(self.head, outcome.hidden, bonus, self.topk)


@dataclass(frozen=True, slots=True, kw_only=True)
class EagleHeadDrafterFactory:
    """Drafts with the loaded EAGLE-style head (``models.head``); relays ``topk`` candidates."""

    topk: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise InvalidConfig(f"topk={self.topk!r} must be an int >= 1")

    @property
    def needs(self) -> DrafterNeeds:
        """The target's hidden states and the head; the prefill side sends the first top-k."""
        return DrafterNeeds(
            target_hidden_states=True,
            prefill_fields=frozenset({"topk_p", "topk_index", "hidden_states"}),
        )

    def _head(self, models: LoadedModels) -> DraftHead:
        if models.head is None:
            raise InvalidConfig(
                "EagleHeadDrafterFactory needs a draft head but models.head is None; load one "
                "(EmbeddedModels.load(), or ModelSet(target=..., head=...))"
            )
        return models.head

    def create_drafter(self, context: DrafterContext) -> EagleHeadDrafter:
        """A head drafter over the loaded head."""
        vocab = context.models.target.shape.vocab_size
        return EagleHeadDrafter(self._head(context.models), self.topk, vocab)

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """The first draft token's top-k and the head's hidden state, as EAGLE sends them."""
        return _first_token(self._head(models), hidden, first_tokens, self.topk)
