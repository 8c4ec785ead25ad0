"""The EAGLE-style drafter for a head that attends over the context through its own KV cache.

Each committed position ``p`` of a request is one row of the head's cache: the target's hidden
state at ``p`` with the token at ``p + 1``, at rotary position ``p + 1``. Admission adds a row
per prompt position (the last one paired with the bonus token), each commit one per position
it committed (the root and the accepted nodes, :attr:`StepOutcome.path_hidden`); the last row's
output is the next step's first draft token, relayed as its top-k with the head's hidden
state. ``propose`` continues from the relay: draft ``i`` attends to every cached row and to the
drafts on its own path, a chain or EAGLE-2's top-k tree alike. Rows of drafts are never cached;
the target's hidden states replace them once verified.

A request admitted PREBUILT (disaggregation) has no prompt rows on this side: its cache starts
at its first decode step, so it drafts from the positions generated here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specstrat.drafting import DraftAdmission, DraftStep, DraftTree, StepOutcome, TreeShape
from specstrat.errors import InternalError
from specstrat.models import DraftHead
from specstrat.relay import RelayPayload
from specstrat.sampling import DraftChooser
from specstrat.strategies._head_attention import attend
from specstrat.strategies.disagg import EagleDraftInput
from specstrat.strategies.tree_expansion import TreeExpansion

__all__ = ["ContextDraftHead", "ContextHeadDrafter"]


@runtime_checkable
class ContextDraftHead(DraftHead, Protocol):
    """A draft head that attends over the context: its decoder layer in two halves around the
    attention, which the drafter computes over the head's KV cache.

    Guarantees: ``layer_input`` returns the residual ``[B, T, H]`` and the rotated
    ``q [B, T, heads, d]``, ``k`` and ``v [B, T, kv_heads, d]`` for inputs ``[B, T, W]``
    (target features or the head's own hidden states), ``tokens [B, T]`` and ``positions
    [B, T]``; ``layer_output`` turns the residual and the attention ``[B, T, heads * d]`` into
    logits ``[B, T, V]`` and the head's hidden states ``[B, T, H]``.
    """

    def layer_input(
        self, features_or_hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The residual and the rotated ``q``, ``k``, ``v`` of each row."""
        ...

    def layer_output(
        self, residual: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the head's hidden state of each row."""
        ...


@dataclass(slots=True)
class _Rows:
    """One request's cached rows: ``k``, ``v [capacity, kv_heads, d]``, the first ``count``
    filled, row ``r`` standing for committed position ``first + r``."""

    k: torch.Tensor
    v: torch.Tensor
    first: int
    count: int = 0


_NOTHING = RelayPayload()


class ContextHeadDrafter:
    """Drafts with a :class:`ContextDraftHead` over each request's cached rows (see the module
    docstring); relays ``topk`` candidates for the first draft token."""

    def __init__(
        self,
        head: ContextDraftHead,
        topk: int,
        vocab_size: int,
        *,
        context_len: int,
        target_tokens: Callable[[int], Sequence[int]],
    ) -> None:
        self.head, self.topk, self.vocab_size = head, topk, vocab_size
        self.capacity, self.target_tokens = context_len, target_tokens
        self.rows: dict[int, _Rows] = {}

    # -- the cache ---------------------------------------------------------------------------

    def _extend(
        self,
        slots: Sequence[int],
        hidden: Sequence[torch.Tensor],
        tokens: Sequence[torch.Tensor],
        first: Sequence[int],
    ) -> RelayPayload:
        """Rows for ``hidden[i] [n_i, W]`` (target hidden states at positions ``first[i] ..``)
        and ``tokens[i] [n_i]`` (the token after each), appended to each slot's cache; the last
        row's top-k and hidden state."""
        bs, longest = len(slots), max(int(h.shape[0]) for h in hidden)
        dev = hidden[0].device
        feats = hidden[0].new_zeros(bs, longest, hidden[0].shape[-1])
        ids = torch.zeros(bs, longest, dtype=torch.int64, device=dev)
        counts = torch.tensor([int(h.shape[0]) for h in hidden], device=dev)
        for i, (h, t) in enumerate(zip(hidden, tokens, strict=True)):
            feats[i, : h.shape[0]], ids[i, : h.shape[0]] = h, t.to(dev)
        for i, slot in enumerate(slots):
            if slot not in self.rows:
                self.rows[slot] = _Rows(k=torch.empty(0), v=torch.empty(0), first=first[i])
        cached = [self.rows[s] for s in slots]
        start = torch.tensor([r.first + r.count for r in cached], device=dev)
        positions = start[:, None] + torch.arange(longest, device=dev)[None] + 1
        residual, q, k, v = self.head.layer_input(feats, ids, positions)
        for r in cached:
            if r.k.dim() != 3:  # the first rows: the cache takes their shape
                r.k = k.new_zeros(self.capacity, *k.shape[2:])
                r.v = v.new_zeros(self.capacity, *v.shape[2:])
        old = max(r.count for r in cached)
        keys = torch.cat([self._gather(cached, old, "k", k), k], dim=1)
        values = torch.cat([self._gather(cached, old, "v", v), v], dim=1)
        have = torch.tensor([r.count for r in cached], device=dev)
        col = torch.arange(old + longest, device=dev)
        row = torch.arange(longest, device=dev)
        old_ok = (col[None, None, :] < have[:, None, None]) & (col < old)[None, None]
        new_ok = ((col - old)[None, None, :] <= row[None, :, None]) & (col >= old)[None, None]
        mask = old_ok | new_ok  # [bs, T, old + T]; each row sees itself at least
        logits, out = self.head.layer_output(residual, attend(q, keys, values, mask))
        for i, r in enumerate(cached):
            n = int(hidden[i].shape[0])
            if r.count + n > self.capacity:
                raise InternalError(
                    f"slot {slots[i]} would cache {r.count + n} rows past context_len="
                    f"{self.capacity}; a bug in specstrat"
                )
            r.k[r.count : r.count + n], r.v[r.count : r.count + n] = k[i, :n], v[i, :n]
            r.count += n
        last, at = counts - 1, torch.arange(bs, device=dev)
        top = torch.topk(logits[at, last].softmax(-1), k=self.topk, dim=-1)
        return RelayPayload(topk_p=top.values, topk_index=top.indices, hidden_states=out[at, last])

    def _gather(self, cached: list[_Rows], n: int, name: str, like: torch.Tensor) -> torch.Tensor:
        """The slots' first ``n`` cached keys or values ``[bs, n, kv_heads, d]``, zeros past
        each slot's rows."""
        if len(cached) == 1 and cached[0].count == n > 0:  # one request: a view, no copy
            return getattr(cached[0], name)[None, :n]
        out = like.new_zeros(len(cached), n, *like.shape[2:])
        for i, r in enumerate(cached):
            if r.count:
                out[i, : r.count] = getattr(r, name)[: r.count]
        return out

    # -- the Drafter hooks ---------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, admission: DraftAdmission[EagleDraftInput]) -> RelayPayload:
        """After prefill: a row per prompt position, and the first draft token. PREBUILT: the
        builder relayed the first token (``draft_input``); the cache starts empty at the
        prompt's end."""
        prompt_hidden = admission.prompt_hidden
        if prompt_hidden is None:
            if admission.draft_input is not None:
                for slot, n in zip(admission.slots, admission.seq_lens.tolist(), strict=True):
                    self.rows[slot] = _Rows(k=torch.empty(0), v=torch.empty(0), first=n)
            return _NOTHING
        bonus = admission.bonus_tokens
        payloads = []
        for i, slot in enumerate(admission.slots):  # one by one: a prompt's rows attend P x P
            after = list(self.target_tokens(slot))[1:]  # the token after each prompt position
            tokens = torch.tensor(after, dtype=torch.int64, device=bonus.device)
            tokens = torch.cat([tokens, bonus[i : i + 1].to(torch.int64)])
            payloads.append(self._extend([slot], [prompt_hidden[i]], [tokens], [0]))
        return RelayPayload(
            topk_p=torch.cat([p.topk_p for p in payloads if p.topk_p is not None]),
            topk_index=torch.cat([p.topk_index for p in payloads if p.topk_index is not None]),
            hidden_states=torch.cat(
                [p.hidden_states for p in payloads if p.hidden_states is not None]
            ),
        )

    def release(self, slots: Sequence[int]) -> None:
        """Drop the requests' cached rows."""
        for slot in slots:
            self.rows.pop(slot, None)

    @torch.inference_mode()
    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """A row per committed position (root and accepted nodes), and the next first token."""
        if outcome.path_hidden is None:
            raise InternalError("StepOutcome.path_hidden is None; the engine always sets it")
        acceptance, step = outcome.acceptance, outcome.step
        counts = acceptance.accept_lengths.tolist()
        lengths = step.seq_lens.tolist()
        hidden, tokens = [], []
        for i, count in enumerate(counts):
            index = acceptance.accept_index[i, :count]
            accepted = outcome.drafts.tokens[i].to(index.device)[index]
            tokens.append(torch.cat([accepted, acceptance.bonus_tokens[i : i + 1]]))
            hidden.append(outcome.path_hidden[i, : count + 1])
        return self._extend(step.slots, hidden, tokens, lengths)

    @torch.inference_mode()
    def propose(self, step: DraftStep) -> DraftTree:
        """The relayed first token, then the head over the cache and each node's own path."""
        bs, dev = len(step.slots), step.bonus_tokens.device
        relay = step.payload
        if not step.max_nodes or not bs:
            return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=dev))
        ready = [s in self.rows for s in step.slots]
        if relay.topk_index is None or relay.topk_p is None or relay.hidden_states is None:
            filler = step.bonus_tokens[:, None].expand(bs, step.max_nodes).contiguous()
            return DraftTree.chain(filler, lengths=torch.zeros(bs, dtype=torch.int64, device=dev))
        lengths = torch.tensor(ready, device=dev).to(torch.int64) * step.max_nodes
        for slot, length in zip(step.slots, step.seq_lens.tolist(), strict=True):
            r = self.rows.get(slot)
            if r is not None and r.first + r.count != length:
                raise InternalError(
                    f"the head's cache of slot {slot} ends at position {r.first + r.count} but "
                    f"the slot committed {length} tokens; a bug in specstrat"
                )
        shape = step.shape
        if shape.is_chain:
            return self._chain(step, relay, lengths)
        return self._tree(step, shape, relay, lengths)

    def _context(self, step: DraftStep, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each request's cached keys, values ``[bs, L, kv_heads, d]`` and where they are."""
        none = _Rows(k=torch.empty(0), v=torch.empty(0), first=0)
        cached = [self.rows.get(s, none) for s in step.slots]
        n = max(r.count for r in cached)
        keys, values = self._gather(cached, n, "k", like), self._gather(cached, n, "v", like)
        have = torch.tensor([r.count for r in cached], device=like.device)
        return keys, values, torch.arange(n, device=like.device)[None] < have[:, None]

    def _chain(self, step: DraftStep, relay: RelayPayload, lengths: torch.Tensor) -> DraftTree:
        assert relay.topk_p is not None  # propose checked all three
        assert relay.topk_index is not None
        assert relay.hidden_states is not None
        bs, dev = len(step.slots), step.bonus_tokens.device
        chooser = DraftChooser(step)
        first = torch.full((bs, self.vocab_size), float("-inf"), dtype=relay.topk_p.dtype)
        first = first.to(dev).scatter(1, relay.topk_index, relay.topk_p.clamp(min=1e-30).log())
        token = chooser.pick(first)
        hidden = relay.hidden_states[:, None]
        walk = _Walk(self, step)
        for depth in range(1, step.max_nodes):
            logits, hidden = walk.step(hidden, token[:, None], depth, parents=None)
            token = chooser.pick(logits[:, 0])
        return chooser.tree(dev, lengths=lengths)

    def _tree(
        self, step: DraftStep, shape: TreeShape, relay: RelayPayload, lengths: torch.Tensor
    ) -> DraftTree:
        """EAGLE-2's top-k tree: each kept node expanded from its parent's hidden state, over
        the cache and its own path."""
        assert relay.topk_p is not None  # propose checked all three
        assert relay.topk_index is not None
        assert relay.hidden_states is not None
        k, bs = shape.topk, len(step.slots)
        expansion = TreeExpansion(shape)
        expansion.start(relay.topk_p.clamp(min=1e-30).log(), relay.topk_index)
        hidden = relay.hidden_states[:, None].expand(bs, k, -1)
        walk = _Walk(self, step)
        parents = None
        for depth in range(1, shape.num_steps):
            logits, hidden = walk.step(hidden, expansion.frontier, depth, parents)
            parents = expansion.expand(logits.log_softmax(-1))
            hidden = hidden.gather(1, parents[:, :, None].expand(-1, -1, hidden.shape[2]))
        return expansion.tree(lengths)


class _Walk:
    """One step's descent: the context read once, each frontier node's path of keys and values
    carried from its parent."""

    def __init__(self, drafter: ContextHeadDrafter, step: DraftStep) -> None:
        self.head, self.drafted, self.drafter = drafter.head, step, drafter
        self.context: tuple[torch.Tensor, ...] | None = None
        self.path_k: torch.Tensor | None = None
        self.path_v: torch.Tensor | None = None

    def step(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        depth: int,
        parents: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden ``[bs, F, ..]`` of the frontier's ``F`` nodes at ``depth``
        (tokens ``[bs, F]``, inputs ``[bs, F, W]``); ``parents [bs, F]``: each node's parent
        among the previous frontier (``None``: the same index)."""
        bs, width = tokens.shape
        seq = self.drafted.seq_lens.to(tokens.device)
        positions = (seq + depth)[:, None].expand(bs, width)
        residual, q, k, v = self.head.layer_input(hidden, tokens, positions)
        if self.context is None:
            self.context = self.drafter._context(self.drafted, k)
        keys, values, valid = self.context
        if self.path_k is None or self.path_v is None:
            path_k, path_v = k[:, :, None], v[:, :, None]
        else:
            if parents is not None:
                index = parents[:, :, None, None, None].expand(-1, -1, *self.path_k.shape[2:])
                self.path_k, self.path_v = (
                    self.path_k.gather(1, index),
                    self.path_v.gather(1, index),
                )
            path_k = torch.cat([self.path_k, k[:, :, None]], dim=2)
            path_v = torch.cat([self.path_v, v[:, :, None]], dim=2)
        self.path_k, self.path_v = path_k, path_v
        mask = valid[:, None].expand(bs, width, valid.shape[1])
        return self.head.layer_output(residual, attend(q, keys, values, mask, path_k, path_v))
