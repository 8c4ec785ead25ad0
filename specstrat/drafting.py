"""What drafters and acceptance rules exchange with the engine: draft trees, verify inputs,
accepted paths, and the context a drafter is created with.

A draft is always a **tree** per request: node ``j`` holds a token and the index of its parent
(``-1``: the root, i.e. the bonus token, not yet in the target's KV). A chain is
the tree whose parents are ``j - 1``. Rows may be ragged: ``lengths[i]`` nodes of row ``i`` are
real, the rest is filler that no acceptance rule may accept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.models import BlockKV, CausalLM, DraftKV, LoadedModels
from specstrat.params import GREEDY as GREEDY
from specstrat.params import MIN_TEMPERATURE as MIN_TEMPERATURE
from specstrat.params import SamplingParams as SamplingParams
from specstrat.relay import RelayField, RelayPayload

__all__ = [
    "GREEDY",
    "MIN_TEMPERATURE",
    "Acceptance",
    "ChainTree",
    "DraftAdmission",
    "DraftStep",
    "DraftTree",
    "DrafterContext",
    "DrafterNeeds",
    "SamplingParams",
    "StepOutcome",
    "TreeShape",
    "VerifyInputs",
    "checked_tokens_per_req",
]

_DraftT_co = TypeVar("_DraftT_co", covariant=True)


def _int_tensor(name: str, value: object, shape: tuple[int, ...] | None, rank: int) -> None:
    if not isinstance(value, torch.Tensor):
        raise InvalidConfig(f"{name}={type(value).__name__}; pass an int64 torch.Tensor")
    if value.dtype != torch.int64 or value.dim() != rank:
        raise InvalidConfig(
            f"{name} is {value.dtype} of shape {tuple(value.shape)}; it must be a rank-{rank} "
            "torch.int64 tensor"
        )
    if shape is not None and tuple(value.shape) != shape:
        raise InvalidConfig(f"{name}.shape={tuple(value.shape)}; expected {shape}")


def checked_tokens_per_req(owner: str, tokens_per_req: object) -> int:
    """``tokens_per_req`` (T, root included) as given to ``owner``, refused unless an int >= 1."""
    if not is_int(tokens_per_req) or tokens_per_req < 1:
        raise InvalidConfig(f"{owner}: tokens_per_req={tokens_per_req!r} must be an int >= 1")
    return tokens_per_req


def _tree_capacity(topk: int, num_steps: int) -> int:
    """Nodes a top-k expansion of ``num_steps`` steps can offer: ``topk`` at the first step,
    then ``topk`` children of each of the ``topk`` kept nodes per further step."""
    return 0 if num_steps == 0 else topk + (num_steps - 1) * topk * topk


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeShape:
    """The draft tree a step may propose, named as SGLang's server arguments.

    ``topk`` (``speculative_eagle_topk``): children expanded per kept node, and nodes kept per
    depth; ``num_steps`` (``speculative_num_steps``): expansion steps, i.e. the tree's depth;
    ``tokens_per_req`` (T): what the target verifies per request, the root plus the
    ``tokens_per_req - 1`` best nodes by cumulative log-probability. ``topk = 1`` is a chain
    (:meth:`chain`).
    """

    topk: int
    num_steps: int
    tokens_per_req: int

    def __post_init__(self) -> None:
        for name, least in (("topk", 1), ("num_steps", 0), ("tokens_per_req", 1)):
            value = getattr(self, name)
            if not is_int(value) or value < least:
                raise InvalidConfig(f"TreeShape.{name}={value!r} must be an int >= {least}")
        t = self.tokens_per_req
        if self.num_steps > t - 1:
            raise InvalidConfig(
                f"num_steps={self.num_steps} is deeper than tokens_per_req={t} can verify "
                f"(depth <= {t - 1}); lower num_steps or raise tokens_per_req"
            )
        capacity = _tree_capacity(self.topk, self.num_steps)
        if t - 1 > capacity:
            raise InvalidConfig(
                f"tokens_per_req={t} needs {t - 1} draft nodes but topk={self.topk}, "
                f"num_steps={self.num_steps} expand at most {capacity}; lower tokens_per_req or "
                "raise topk/num_steps"
            )

    @classmethod
    def chain(cls, tokens_per_req: int) -> TreeShape:
        """A chain of ``tokens_per_req - 1`` nodes: topk 1, that many steps."""
        t = checked_tokens_per_req("TreeShape.chain", tokens_per_req)
        return cls(topk=1, num_steps=t - 1, tokens_per_req=t)

    @property
    def max_nodes(self) -> int:
        """Draft nodes per request the target verifies (the root excluded)."""
        return self.tokens_per_req - 1

    @property
    def is_chain(self) -> bool:
        """Whether the shape is a chain (topk 1)."""
        return self.topk == 1


@dataclass(frozen=True, slots=True)
class ChainTree:
    """The tree policy of a chain: topk 1, ``T - 1`` steps (every drafter can draft it); the
    default of :class:`~specstrat.algorithm.SpecAlgorithm`."""

    def tree_shape(self, tokens_per_req: int) -> TreeShape:
        """``TreeShape.chain(tokens_per_req)``."""
        return TreeShape.chain(checked_tokens_per_req("ChainTree.tree_shape", tokens_per_req))


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A drafter's proposal: ``n`` nodes per request, as a tree under the bonus token.

    ``tokens`` ``[bs, n]`` int64 token ids; ``parents`` ``[bs, n]`` int64 with
    ``-1 <= parents[i, j] < j`` (parents come before children; -1 is the root); ``lengths``
    ``[bs]`` int64 real nodes per row (the rest is filler). ``q`` ``[bs, n, V]``: the draft
    distribution each node's token was drawn from, where the drafter has one (``None``: a
    deterministic drafter). ``confidence`` ``[bs, n]``: the drafter's per-node confidence, if any.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    lengths: torch.Tensor
    q: torch.Tensor | None = None
    confidence: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _int_tensor("DraftTree.tokens", self.tokens, None, 2)
        bs, n = self.tokens.shape
        _int_tensor("DraftTree.parents", self.parents, (bs, n), 2)
        _int_tensor("DraftTree.lengths", self.lengths, (bs,), 1)
        if self.q is not None and (
            not isinstance(self.q, torch.Tensor)
            or self.q.dim() != 3
            or tuple(self.q.shape[:2]) != (bs, n)
            or not self.q.dtype.is_floating_point
        ):
            raise InvalidConfig(f"DraftTree.q must be a float tensor [bs={bs}, n={n}, vocab]")
        if self.confidence is not None and (
            not isinstance(self.confidence, torch.Tensor)
            or tuple(self.confidence.shape) != (bs, n)
            or not self.confidence.dtype.is_floating_point
        ):
            raise InvalidConfig(f"DraftTree.confidence must be a float tensor [bs={bs}, n={n}]")
        if self.tokens.device.type != "cpu" or not bs or not n:
            return  # on a GPU these value checks would be host syncs: CPU trees only
        if bool((self.lengths < 0).any()) or bool((self.lengths > n).any()):
            raise InvalidConfig(f"DraftTree.lengths={self.lengths.tolist()} must lie in 0..{n}")
        column = torch.arange(n, device=self.parents.device)
        if bool((self.parents < -1).any()) or bool((self.parents >= column).any()):
            raise InvalidConfig(
                f"DraftTree.parents={self.parents.tolist()}: node j's parent must lie in "
                "-1..j-1 (parents before children, -1 = the root)"
            )

    @classmethod
    def chain(
        cls,
        tokens: torch.Tensor,
        *,
        lengths: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        confidence: torch.Tensor | None = None,
    ) -> DraftTree:
        """A chain per request: node ``j``'s parent is ``j - 1``; every row full by default."""
        _int_tensor("tokens", tokens, None, 2)
        bs, n = tokens.shape
        parents = (torch.arange(n, device=tokens.device) - 1).expand(bs, n).contiguous()
        if lengths is None:
            lengths = torch.full((bs,), n, dtype=torch.int64, device=tokens.device)
        return cls(tokens, parents, lengths, q, confidence)

    @property
    def bs(self) -> int:
        """Requests in the tree."""
        return int(self.tokens.shape[0])

    @property
    def num_nodes(self) -> int:
        """Nodes per request, filler included."""
        return int(self.tokens.shape[1])

    def is_chain(self) -> bool:
        """Whether every row is a chain (node ``j``'s parent is ``j - 1``)."""
        chain = torch.arange(self.num_nodes, device=self.parents.device) - 1
        return bool((self.parents == chain).all())


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyInputs:
    """What an acceptance rule decides from, for one verify step.

    ``logits`` ``[bs, n + 1, V]``: the target's logits at the root (index 0, predicting the
    token after the last verified one) and at each draft node ``j`` (index ``j + 1``, predicting
    the token after node ``j``). Entries of nodes past ``drafts.lengths`` were not computed
    (unspecified). ``positions`` ``[bs]``: absolute position of each root token.
    ``sampling``: one :class:`SamplingParams` per request.
    """

    drafts: DraftTree
    logits: torch.Tensor
    positions: torch.Tensor
    sampling: tuple[SamplingParams, ...]


@dataclass(frozen=True, slots=True)
class Acceptance:
    """An acceptance rule's answer: per request, the accepted path and the bonus token.

    ``accept_index`` ``[bs, n]`` int64: node indices of the accepted path from the root down,
    ``-1`` after the path ends; ``accept_lengths`` ``[bs]``: accepted drafts per request;
    ``bonus_tokens`` ``[bs]``: the token chosen after the path (from the target).
    """

    accept_index: torch.Tensor
    accept_lengths: torch.Tensor
    bonus_tokens: torch.Tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftStep:
    """What a drafter proposes from, for the running requests of one step.

    ``slots`` are the requests' slots (request-pool rows); ``bonus_tokens`` each request's
    bonus token, its next input, not yet in the target's KV (resolved from the relay);
    ``seq_lens`` the sequence lengths (committed tokens, from the slot table, their one
    owner), which are also the bonus tokens' absolute positions;
    ``payload`` what the drafter's last ``commit`` or ``admit`` stashed in the relay;
    ``max_nodes`` the most nodes per request the target verifies (T - 1); ``sampling`` each
    request's parameters (a drafter that samples draws node ``j`` with draw index 2 at
    position ``seq_lens + 1 + j``, see :mod:`specstrat.sampling`); ``tree`` the shape the
    algorithm's tree policy answered (the engine always passes it; ``None`` reads as a chain
    of ``max_nodes``, see :attr:`shape`).
    """

    slots: tuple[int, ...]
    bonus_tokens: torch.Tensor
    seq_lens: torch.Tensor
    payload: RelayPayload
    max_nodes: int
    sampling: tuple[SamplingParams, ...]
    tree: TreeShape | None = None

    def __post_init__(self) -> None:
        if self.tree is not None and self.tree.max_nodes != self.max_nodes:
            raise InvalidConfig(
                f"DraftStep.tree has tokens_per_req={self.tree.tokens_per_req} but "
                f"max_nodes={self.max_nodes}; the tree's budget is max_nodes + 1"
            )

    @property
    def shape(self) -> TreeShape:
        """The tree this step may propose (a chain of ``max_nodes`` unless the policy says)."""
        return self.tree if self.tree is not None else TreeShape.chain(self.max_nodes + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """What verification decided, for the drafter to learn from (``Drafter.commit``).

    ``hidden`` ``[bs, H]``: the target's hidden state where each bonus token was chosen;
    ``path_hidden`` ``[bs, n + 1, H]``: the target's hidden states at each request's root and
    accepted nodes, in path order (row ``accept_lengths[i]`` is ``hidden[i]``; zeros after
    it), one per position the step committed, for a drafter that keeps state per position (a
    head's own KV cache). ``None`` where the step was not built by the engine.
    """

    step: DraftStep
    drafts: DraftTree
    acceptance: Acceptance
    hidden: torch.Tensor
    path_hidden: torch.Tensor | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftAdmission(Generic[_DraftT_co]):
    """New requests for a drafter, after a local prefill or a PREBUILT admission.

    ``bonus_tokens`` ``[bs]``: each request's first generated token, its next input (not yet
    in the KV); ``sampling``: each request's parameters; ``seq_lens``: prompt lengths;
    ``hidden`` ``[bs, H]``: the target's hidden state at each prompt's last position (``None``
    on PREBUILT admission); ``prompt_hidden``: after a local prefill, each prompt's hidden
    states ``[prompt_len, H]`` at every position (its last row is ``hidden``'s), for a drafter
    that keeps state per position (``None`` on PREBUILT admission); ``draft_input``: what the
    algorithm's disagg builder returned for a
    PREBUILT batch (``None`` after a local prefill, or when the builder had nothing: the first
    step then decodes plainly from ``bonus_tokens``).
    """

    slots: tuple[int, ...]
    bonus_tokens: torch.Tensor
    seq_lens: torch.Tensor
    hidden: torch.Tensor | None
    draft_input: _DraftT_co | None
    sampling: tuple[SamplingParams, ...] = ()
    prompt_hidden: tuple[torch.Tensor, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterNeeds:
    """What a drafter needs from the engine and the algorithm, declared, checked at construction.

    ``target_hidden_states``: reads the target's hidden states (the algorithm must carry them);
    ``draft_head``: runs ``models.head``, a draft head over those hidden states (a loader may
    attach a trained head for it, as ``specstrat demo`` does for SmolLM2's shipped head);
    ``draft_model``: runs the draft LM with its own KV (``has_draft_kv``); ``prefill_fields``:
    the relay fields the prefill side of disaggregation must send for it (``topk_*`` need
    ``need_topk``, ``hidden_states`` need ``carries_draft_hidden_states``); ``trees``: drafts
    the trees a tree policy with ``topk > 1`` asks for (else the engine refuses such a policy);
    ``draft_worker_verify``: runs TARGET_VERIFY forwards on the draft worker
    (``DrafterContext.new_block_runner``; the algorithm's ``target_verify`` policy must answer
    ``supports_target_verify_for_draft() == True``).
    """

    target_hidden_states: bool = False
    draft_head: bool = False
    draft_model: bool = False
    prefill_fields: frozenset[RelayField] = frozenset()
    trees: bool = False
    draft_worker_verify: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterContext:
    """What the engine hands a drafter factory: the models it loaded and the services it runs.

    ``new_kv_runner(model)`` gives a model its own request pool and KV cache (a draft LM), a
    :class:`~specstrat.models.DraftKV`: take one draft row per request with
    ``alloc_for(admission.slots)`` in ``admit``, read them with ``rows_for(step.slots)``, free
    them with ``free_for(slots)`` in ``release``; the engine's slot table records them, and frees
    whatever a released slot still holds. ``target_tokens(slot)`` the committed tokens in the
    target's KV for a request (the slot table owns them); ``num_draft_tokens`` is D; ``device``
    where the models run; ``tree`` the shape every step may propose (from the algorithm's tree
    policy; ``None``: a chain).
    ``new_block_runner(model)`` is ``new_kv_runner`` plus a draft-worker TARGET_VERIFY forward of
    ``T_draft = get_num_tokens_per_req_for_target_verify(D, True)`` tokens per request (it raises
    :class:`~specstrat.errors.InvalidConfig` when the policy refuses draft-worker verify);
    ``verify_tokens_per_req`` is ``T_target``, what the target verifies per request
    (``max_nodes + 1`` of every step). Both are ``None`` where the engine offers neither.
    """

    models: LoadedModels
    new_kv_runner: Callable[[CausalLM], DraftKV]
    target_tokens: Callable[[int], Sequence[int]]
    num_draft_tokens: int
    max_running_requests: int
    context_len: int
    device: torch.device
    tree: TreeShape | None = None
    new_block_runner: Callable[[CausalLM], BlockKV] | None = None
    verify_tokens_per_req: int | None = None
