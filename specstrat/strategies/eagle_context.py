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

import torch

from specstrat._head_attention import attend
from specstrat._ints import is_int
from specstrat.drafting import DraftAdmission, DraftStep, DraftTree, StepOutcome, TreeShape
from specstrat.errors import InternalError, InvalidConfig
from specstrat.models import ContextDraftHead
from specstrat.relay import RelayPayload
from specstrat.sampling import DraftChooser
from specstrat.strategies.disagg import EagleDraftInput
from specstrat.strategies.tree_expansion import TreeExpansion

__all__ = ["ContextHeadDrafter"]


@dataclass(frozen=False, slots=True)  # grows as the request commits
class _Rows:
    """One request's cached rows: ``k``, ``v [room, kv_heads, d]``, the first ``count``
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
        for name, value in (
            ("topk", topk),
            ("vocab_size", vocab_size),
            ("context_len", context_len),
        ):
            if not is_int(value) or value < 1:
                raise InvalidConfig(f"ContextHeadDrafter {name}={value!r} must be an int >= 1")
        if topk > vocab_size:
            raise InvalidConfig(
                f"ContextHeadDrafter topk={topk} exceeds vocab_size={vocab_size}; relay at most "
                "the vocabulary"
            )
        self.head, self.topk, self.vocab_size = head, topk, vocab_size
        self.context_len, self.target_tokens = context_len, target_tokens
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
            if slot not in self.rows:  # a request admitted without rows: they start here
                self.rows[slot] = _Rows(k=torch.empty(0), v=torch.empty(0), first=first[i])
        cached = [self.rows[s] for s in slots]
        start = torch.tensor([r.first + r.count for r in cached], device=dev)
        positions = start[:, None] + torch.arange(longest, device=dev)[None] + 1
        residual, q, k, v = self.head.layer_input(feats, ids, positions)
        for i, r in enumerate(cached):
            n = int(hidden[i].shape[0])
            self._reserve(slots[i], r, r.count + n, k)
            r.k[r.count : r.count + n], r.v[r.count : r.count + n] = k[i, :n], v[i, :n]
            r.count += n
        # Only each request's last row is read (the next draft's top-k): its query over every
        # cached row, the new ones included.
        last, at = counts - 1, torch.arange(bs, device=dev)
        keys, values, valid = self._cached(cached, k)
        attn = attend(q[at, last][:, None], keys, values, valid[:, None])
        logits, out = self.head.layer_output(residual[at, last][:, None], attn)
        top = torch.topk(logits[:, 0].softmax(-1), k=self.topk, dim=-1)
        return RelayPayload(topk_p=top.values, topk_index=top.indices, hidden_states=out[:, 0])

    def _reserve(self, slot: int, r: _Rows, need: int, like: torch.Tensor) -> None:
        """Room for ``need`` rows in ``r`` (shaped as ``like``'s rows), grown by doubling up to
        ``context_len``, so a short request holds little."""
        if need > self.context_len:
            raise InternalError(
                f"slot {slot} would cache {need} rows past context_len={self.context_len}; a "
                "bug in specstrat"
            )
        size = int(r.k.shape[0]) if r.k.dim() == 3 else 0
        if need <= size:
            return
        size = min(self.context_len, max(need, 2 * size, 64))
        k, v = like.new_empty(size, *like.shape[2:]), like.new_empty(size, *like.shape[2:])
        if r.count:
            k[: r.count], v[: r.count] = r.k[: r.count], r.v[: r.count]
        r.k, r.v = k, v

    def _cached(self, cached: list[_Rows], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The requests' cached keys and values ``[bs, L, kv_heads, d]`` (one request: views
        of its cache; more: copies padded to the longest) and where they hold rows ``[bs, L]``."""
        longest = max((r.count for r in cached), default=0)
        have = torch.tensor([r.count for r in cached], device=like.device)
        valid = torch.arange(longest, device=like.device)[None] < have[:, None]
        if len(cached) == 1 and longest:
            return cached[0].k[None, :longest], cached[0].v[None, :longest], valid
        keys = like.new_zeros(len(cached), longest, *like.shape[2:])
        values = like.new_zeros(len(cached), longest, *like.shape[2:])
        for i, r in enumerate(cached):
            if r.count:
                keys[i, : r.count], values[i, : r.count] = r.k[: r.count], r.v[: r.count]
        return keys, values, valid

    # -- the Drafter hooks ---------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, admission: DraftAdmission[EagleDraftInput]) -> RelayPayload:
        """After prefill: a row per prompt position, and the first draft token. PREBUILT: the
        builder relayed the first token (``draft_input``); the cache starts empty at the
        prompt's end."""
        prompt_hidden = admission.prompt_hidden
        if prompt_hidden is None:
            if admission.hidden is not None:
                raise InvalidConfig(
                    "ContextHeadDrafter.admit got a local prefill's hidden state but no "
                    "DraftAdmission.prompt_hidden; pass each prompt's hidden states at every "
                    "position ([prompt_len, H] per request), as the engine does"
                )
            for slot, n in zip(admission.slots, admission.seq_lens.tolist(), strict=True):
                self.rows.pop(slot, None)
                if admission.draft_input is not None:  # drafts from the relay at once
                    self.rows[slot] = _Rows(k=torch.empty(0), v=torch.empty(0), first=n)
            return _NOTHING
        bonus = admission.bonus_tokens
        payloads = []
        for i, slot in enumerate(admission.slots):  # one by one: bounded by one prompt's rows
            after = list(self.target_tokens(slot))[1:]  # the token after each prompt position
            if len(after) + 1 != prompt_hidden[i].shape[0]:
                raise InvalidConfig(
                    f"DraftAdmission.prompt_hidden[{i}] holds {prompt_hidden[i].shape[0]} rows "
                    f"but slot {slot}'s prompt has {len(after) + 1} tokens; pass one row per "
                    "prompt position"
                )
            tokens = torch.tensor(after, dtype=torch.int64, device=bonus.device)
            tokens = torch.cat([tokens, bonus[i : i + 1].to(torch.int64)])
            self.rows.pop(slot, None)  # a slot admitted again starts afresh
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
            raise InvalidConfig(
                "ContextHeadDrafter.commit needs StepOutcome.path_hidden ([bs, n + 1, H], the "
                "target's hidden states at each request's root and accepted nodes), which the "
                "engine sets; pass it when building a StepOutcome by hand"
            )
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
        return self._cached([self.rows.get(s, none) for s in step.slots], like)

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
