"""Drafters in order: per request and step, the first member drafter that proposes something
supplies that request's draft (:class:`FirstMatch`).

A lookup drafter wins where the output repeats the context (summaries, retrieval answers, code
edits) and proposes nothing elsewhere, where a trained head is the better guess:
``FirstMatch((NgramDrafterFactory(), EagleHeadDrafterFactory()))`` asks the lookup first and
the head only for the requests the lookup missed. Every member is admitted, committed and
released for every request, so a member that did not draft a step still learns what the
target accepted (its state never goes stale, as at a D = 1 step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import torch

from specstrat._hooks import user_location
from specstrat.drafting import (
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
)
from specstrat.errors import InvalidConfig, ModelShapeError, StrategyError
from specstrat.models import LoadedModels
from specstrat.protocols import Drafter, DrafterFactory
from specstrat.relay import RelayField, RelayPayload

__all__ = ["FirstMatch", "FirstMatchDrafter"]

_DraftT = TypeVar("_DraftT")
_R = TypeVar("_R")


def _merge_needs(needs: Sequence[DrafterNeeds]) -> DrafterNeeds:
    """What the members need together: any member's need is the composition's; trees only
    where every member drafts them (a tree policy's step goes to whichever member matches)."""
    return DrafterNeeds(
        target_hidden_states=any(n.target_hidden_states for n in needs),
        draft_head=any(n.draft_head for n in needs),
        draft_model=any(n.draft_model for n in needs),
        prefill_fields=frozenset().union(*(n.prefill_fields for n in needs)),
        trees=all(n.trees for n in needs),
        draft_worker_verify=any(n.draft_worker_verify for n in needs),
    )


def _member_call(index: int, member: object, method: str, fn: Callable[[], _R]) -> _R:
    """``fn()``, with what it raised named by the member's position and type (the engine then
    names the algorithm's hook around it). A model's shape fault passes unchanged; a member's
    configuration refusal stays an InvalidConfig."""
    try:
        return fn()
    except ModelShapeError:
        raise
    except InvalidConfig as exc:  # a member refusing the configuration: still a refusal
        raise InvalidConfig(f"FirstMatch member {index} ({type(member).__name__}): {exc}") from exc
    except Exception as exc:
        raise RuntimeError(
            f"FirstMatch member {index} ({type(member).__name__}).{method} raised "
            f"{type(exc).__name__}: {exc}{user_location(exc)}"
        ) from exc


def _merge_payloads(payloads: Sequence[RelayPayload], members: Sequence[object]) -> RelayPayload:
    """The members' relay fields together; two members relaying one field is a fault."""
    fields: dict[RelayField, torch.Tensor] = {}
    owner: dict[RelayField, int] = {}
    for index, payload in enumerate(payloads):
        for name, tensor in payload.present().items():
            if name in fields:
                raise StrategyError(
                    f"FirstMatch members {owner[name]} ({type(members[owner[name]]).__name__}) "
                    f"and {index} ({type(members[index]).__name__}) both relay {name}; compose "
                    "members whose relay fields differ"
                )
            fields[name], owner[name] = tensor, index
    return RelayPayload(**fields)


def _rows(payload: RelayPayload, index: torch.Tensor) -> RelayPayload:
    """The payload's rows at ``index``."""
    fields = {name: tensor[index.to(tensor.device)] for name, tensor in payload.present().items()}
    return RelayPayload(**fields)


def _substep(step: DraftStep, rows: list[int]) -> DraftStep:
    """The step for the requests at ``rows`` only."""
    index = torch.tensor(rows, dtype=torch.int64, device=step.bonus_tokens.device)
    return DraftStep(
        slots=tuple(step.slots[i] for i in rows),
        bonus_tokens=step.bonus_tokens[index],
        seq_lens=step.seq_lens[index.to(step.seq_lens.device)],
        payload=_rows(step.payload, index),
        max_nodes=step.max_nodes,
        sampling=tuple(step.sampling[i] for i in rows) if step.sampling else (),
        tree=step.tree,
    )


def _matched(tree: DraftTree, min_confidence: float | None) -> list[bool]:
    """Which rows of a member's tree propose something: real nodes, and (with a threshold and
    a confidence) a first node at least that confident."""
    found = tree.lengths > 0
    if min_confidence is not None and tree.confidence is not None and tree.num_nodes:
        found &= tree.confidence[:, 0] >= min_confidence
    return [bool(x) for x in found.tolist()]


class FirstMatchDrafter(Generic[_DraftT]):
    """The members' drafters, asked in order for the requests no earlier member matched."""

    def __init__(self, members: Sequence[Drafter[_DraftT]], min_confidence: float | None) -> None:
        self.members, self.min_confidence = tuple(members), min_confidence

    def admit(self, admission: DraftAdmission[_DraftT]) -> RelayPayload:
        """Every member takes on the requests; their relay fields together."""
        return _merge_payloads(
            [
                _member_call(i, m, "admit", partial(m.admit, admission))
                for i, m in enumerate(self.members)
            ],
            self.members,
        )

    def release(self, slots: Sequence[int]) -> None:
        """Every member forgets the requests (each one, even after another member raised)."""
        failure: Exception | None = None
        for i, member in enumerate(self.members):
            try:
                _member_call(i, member, "release", partial(member.release, slots))
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def propose(self, step: DraftStep) -> DraftTree:
        """Per request, the first member's row that proposes something; a request no member
        matched proposes nothing."""
        bs, width, dev = len(step.slots), step.max_nodes, step.bonus_tokens.device
        tokens = step.bonus_tokens[:, None].expand(bs, width).clone()
        parents = (torch.arange(width, device=dev) - 1).expand(bs, width).clone()
        lengths = torch.zeros(bs, dtype=torch.int64, device=dev)
        picked: list[tuple[list[int], list[int], DraftTree]] = []
        pending = list(range(bs))
        for i, member in enumerate(self.members):
            if not pending or not width:
                break
            sub = _substep(step, pending)
            tree = _member_call(i, member, "propose", partial(member.propose, sub))
            if not isinstance(tree, DraftTree) or tree.bs != len(pending):
                rows_given = f"{tree.bs} rows" if isinstance(tree, DraftTree) else "no tree"
                raise RuntimeError(
                    f"FirstMatch member {i} ({type(member).__name__}).propose returned "
                    f"{type(tree).__name__} ({rows_given}) for {len(pending)} requests; return "
                    "a DraftTree with one row per request of step.slots"
                )
            if tree.num_nodes > width:
                raise RuntimeError(
                    f"FirstMatch member {i} ({type(member).__name__}).propose proposed "
                    f"{tree.num_nodes} nodes per request; the step verifies at most "
                    f"max_nodes={width}"
                )
            hit = _matched(tree, self.min_confidence)
            rows = [r for r, h in zip(pending, hit, strict=True) if h]
            if rows:
                own = [j for j, h in enumerate(hit) if h]
                picked.append((rows, own, tree))
                at = torch.tensor(rows, dtype=torch.int64, device=dev)
                mine = torch.tensor(own, dtype=torch.int64, device=tree.tokens.device)
                n = tree.num_nodes
                tokens[at, :n] = tree.tokens[mine, :n].to(dev)
                parents[at, :n] = tree.parents[mine, :n].to(dev)
                lengths[at] = tree.lengths[mine].clamp(max=n).to(dev)
            pending = [r for r, h in zip(pending, hit, strict=True) if not h]
        return DraftTree(tokens, parents, lengths, q=_merged_q(picked, tokens, width))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Every member learns the accepted paths and bonus tokens of every request."""
        return _merge_payloads(
            [
                _member_call(i, m, "commit", partial(m.commit, outcome))
                for i, m in enumerate(self.members)
            ],
            self.members,
        )


def _merged_q(
    picked: Sequence[tuple[list[int], list[int], DraftTree]], tokens: torch.Tensor, width: int
) -> torch.Tensor | None:
    """The draft distributions of the merged tree: a sampling member's ``q`` for its rows, a
    point mass on the token for a deterministic member's rows and for filler; ``None`` when no
    matched member sampled. ``picked``: per member, the merged rows it supplied, the rows of
    its own tree they came from, and that tree."""
    sampled = [tree.q for _, _, tree in picked if tree.q is not None]
    if not sampled:
        return None
    vocab, dtype, dev = sampled[0].shape[2], sampled[0].dtype, tokens.device
    q = torch.zeros(tokens.shape[0], width, vocab, dtype=dtype, device=dev)
    q.scatter_(2, tokens[:, :, None], 1.0)
    for rows, own, tree in picked:
        if tree.q is not None:
            at = torch.tensor(rows, dtype=torch.int64, device=dev)
            mine = torch.tensor(own, dtype=torch.int64, device=tree.q.device)
            q[at, : tree.num_nodes] = tree.q[mine].to(dev, dtype)
    return q


@dataclass(frozen=True, slots=True, init=False)
class FirstMatch(Generic[_DraftT]):
    """Drafter factories asked in order: per request and step, the first member whose draft
    has a real node (and, with ``min_confidence``, whose first node's confidence reaches it,
    for members that report confidence) supplies that request's draft.

    ``needs`` is the members' needs together (trees only where every member drafts trees);
    two members may not relay the same field. A member that raises is named by its position
    (0 first) and type.
    """

    members: tuple[DrafterFactory[_DraftT], ...]
    min_confidence: float | None

    def __init__(
        self,
        members: Sequence[DrafterFactory[_DraftT]],
        *,
        min_confidence: float | None = None,
    ) -> None:
        members = tuple(members)
        if len(members) < 2:
            raise InvalidConfig(
                f"FirstMatch got {len(members)} member(s); compose at least two drafter "
                "factories, e.g. FirstMatch((NgramDrafterFactory(), EagleHeadDrafterFactory()))"
            )
        for i, member in enumerate(members):
            if not isinstance(member, DrafterFactory):
                raise InvalidConfig(
                    f"FirstMatch member {i} is a {type(member).__name__}, not a DrafterFactory "
                    "(needs, create_drafter, prefill_payload); pass factories such as "
                    "NgramDrafterFactory()"
                )
        if min_confidence is not None and (
            isinstance(min_confidence, bool)
            or not isinstance(min_confidence, int | float)
            or not 0.0 <= min_confidence <= 1.0
        ):
            raise InvalidConfig(
                f"FirstMatch min_confidence={min_confidence!r} must be a number in [0, 1] or "
                "None (no threshold)"
            )
        prefill = [m.needs.prefill_fields for m in members]
        for i, fields in enumerate(prefill):
            for j in range(i):
                if shared := fields & prefill[j]:
                    raise InvalidConfig(
                        f"FirstMatch members {j} ({type(members[j]).__name__}) and {i} "
                        f"({type(members[i]).__name__}) both relay {sorted(shared)}; compose "
                        "members whose relay fields differ"
                    )
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "min_confidence", min_confidence)

    @property
    def needs(self) -> DrafterNeeds:
        """The members' needs together."""
        return _merge_needs([m.needs for m in self.members])

    def create_drafter(self, context: DrafterContext) -> FirstMatchDrafter[_DraftT]:
        """Each member's drafter, in order."""
        drafters = [
            _member_call(i, m, "create_drafter", partial(m.create_drafter, context))
            for i, m in enumerate(self.members)
        ]
        return FirstMatchDrafter(drafters, self.min_confidence)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Every member's prefill fields together."""
        return _merge_payloads(
            [
                _member_call(
                    i,
                    m,
                    "prefill_payload",
                    partial(m.prefill_payload, models, bonus_tokens, hidden),
                )
                for i, m in enumerate(self.members)
            ],
            self.members,
        )
