"""The EAGLE-style head's drafter: chains ``(hidden, token) -> (token', hidden')`` from the
target's hidden state, relaying the first draft token's top-k and the head's hidden state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat._ints import is_int
from specstrat.drafting import (
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
    TreeShape,
)
from specstrat.errors import InvalidConfig
from specstrat.models import ContextDraftHead, DraftHead, LoadedModels
from specstrat.relay import RelayPayload
from specstrat.sampling import DraftChooser
from specstrat.strategies.disagg import EagleDraftInput
from specstrat.strategies.eagle_context import ContextHeadDrafter
from specstrat.strategies.tree_expansion import TreeExpansion

__all__ = ["EagleHeadDrafter", "EagleHeadDrafterFactory"]

_NOTHING = RelayPayload()


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
            return _first_token(self.head, admission.hidden, admission.bonus_tokens, self.topk)
        if admission.draft_input is not None:
            self.ready.update(admission.slots)
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Forget whether the requests had draft state."""
        self.ready.difference_update(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        """The relayed first token, then ``max_nodes - 1`` more from the head alone."""
        bs, steps, dev = len(step.slots), step.max_nodes, step.bonus_tokens.device
        relay = step.payload
        if not steps or not bs:
            return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=dev))
        if relay.topk_index is None or relay.topk_p is None or relay.hidden_states is None:
            filler = step.bonus_tokens[:, None].expand(bs, steps).contiguous()  # no state yet
            return DraftTree.chain(filler, lengths=torch.zeros(bs, dtype=torch.int64, device=dev))
        ready = torch.tensor([s in self.ready for s in step.slots], device=dev)
        lengths = torch.where(ready, steps, 0).to(torch.int64)
        if not step.shape.is_chain:
            first = relay.topk_p.clamp(min=1e-30).log()
            return self._tree(step.shape, first, relay.topk_index, relay.hidden_states, lengths)
        chooser = DraftChooser(step)
        # The first node from the relayed top-k: its log-probabilities, -inf outside the top-k.
        first = torch.full((bs, self.vocab_size), float("-inf"), dtype=relay.topk_p.dtype)
        first = first.to(dev).scatter(1, relay.topk_index, relay.topk_p.clamp(min=1e-30).log())
        token, hidden = chooser.pick(first), relay.hidden_states
        with torch.inference_mode():
            for _ in range(steps - 1):
                logits, hidden = self.head(hidden, token)
                token = chooser.pick(logits)
        return chooser.tree(dev, lengths=lengths)

    def _tree(
        self,
        shape: TreeShape,
        first: torch.Tensor,
        bonus_tokens: torch.Tensor,
        hidden_states: torch.Tensor,
        lengths: torch.Tensor,
    ) -> DraftTree:
        """EAGLE-2's top-k tree: the relayed top-k (``first`` log-probabilities of
        ``bonus_tokens``) first, then the head expands each kept node from its parent's
        predicted hidden state."""
        k, bs = shape.topk, first.shape[0]
        expansion = TreeExpansion(shape)
        expansion.start(first, bonus_tokens)
        hidden = hidden_states[:, None].expand(bs, k, -1)
        with torch.inference_mode():
            for _ in range(shape.num_steps - 1):
                logits, new_hidden = self.head(
                    hidden.reshape(bs * k, -1), expansion.frontier.reshape(-1)
                )
                parent = expansion.expand(logits.log_softmax(-1).view(bs, k, -1))
                new_hidden = new_hidden.view(bs, k, -1)
                hidden = new_hidden.gather(
                    1, parent[:, :, None].expand(-1, -1, new_hidden.shape[2])
                )
        return expansion.tree(lengths)

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
        if not is_int(self.topk) or self.topk < 1:
            raise InvalidConfig(f"topk={self.topk!r} must be an int >= 1")

    @property
    def needs(self) -> DrafterNeeds:
        """The target's hidden states and the head; the prefill side sends the first top-k."""
        return DrafterNeeds(
            target_hidden_states=True,
            draft_head=True,
            prefill_fields=frozenset({"topk_p", "topk_index", "hidden_states"}),
            trees=True,
        )

    def _head(self, models: LoadedModels) -> DraftHead:
        if models.head is None:
            raise InvalidConfig(
                "EagleHeadDrafterFactory needs a draft head but models.head is None; load one "
                "(EmbeddedModels.load(), ModelSet(target=..., head=...), or for a Hugging Face "
                "model specstrat.train.attach_head(models, 'head.safetensors'); the CLI's "
                "--head FILE, a head `specstrat train` wrote)"
            )
        return models.head

    def create_drafter(self, context: DrafterContext) -> EagleHeadDrafter | ContextHeadDrafter:
        """A head drafter over the loaded head (a :class:`ContextHeadDrafter` with its own KV
        cache for a :class:`~specstrat.models.ContextDraftHead`); a tree's ``topk`` must fit
        the relayed top-k."""
        if context.tree is not None and context.tree.topk > self.topk:
            raise InvalidConfig(
                f"the tree's topk={context.tree.topk} exceeds the {self.topk} candidates per "
                f"node EagleHeadDrafterFactory(topk={self.topk}) relays; use a tree with topk <= "
                f"{self.topk} (demo: --topk {self.topk}), or compose the algorithm with "
                f"drafter=EagleHeadDrafterFactory(topk={context.tree.topk})"
            )
        vocab = context.models.target.shape.vocab_size
        if self.topk > vocab:
            raise InvalidConfig(
                f"EagleHeadDrafterFactory(topk={self.topk}) exceeds the target's vocabulary of "
                f"{vocab} tokens; use topk <= {vocab}"
            )
        head = self._head(context.models)
        if isinstance(head, ContextDraftHead):
            return ContextHeadDrafter(
                head,
                self.topk,
                vocab,
                context_len=context.context_len,
                target_tokens=context.target_tokens,
            )
        return EagleHeadDrafter(head, self.topk, vocab)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """The first draft token's top-k and the head's hidden state, as EAGLE sends them."""
        return _first_token(self._head(models), hidden, bonus_tokens, self.topk)
