"""Hook answers, frozen when they return: checked on a copy, and only the copy used after.

A drafter or an acceptance rule may keep references to the tensors it returned, or to the ones
it was handed, and write into them later. So each answer is copied on its own device the
moment it returns (``Tensor.clone``: no host sync), its contract is checked on the copy, and
the step uses the copy alone from then on. What a hook is handed is likewise a copy the engine
does not read back.

Why clones and not ``Tensor._version`` checks: a model's outputs are inference tensors (the
worker runs the model under ``torch.inference_mode``), and inference tensors keep no version
counter, so a later write into a ``q`` or a hidden state could not be told. The copies are of
small metadata (tokens, parents, lengths, paths: ``[bs, n]`` ints) plus the drafter's ``q``
where it has one; ``bench/step_syncs.py`` measures what they cost per step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import torch

from specstrat.contracts import (
    HostAcceptance,
    HostTree,
    acceptance_looks_valid,
    check_acceptance_host,
    check_acceptance_shape,
    check_drafts_host,
    check_drafts_shape,
    check_payload,
    check_q,
    drafts_look_valid,
)
from specstrat.drafting import Acceptance, DraftTree
from specstrat.errors import InternalError
from specstrat.relay import RelayPayload

__all__ = [
    "copy_acceptance",
    "copy_payload",
    "copy_tree",
    "frozen_acceptance",
    "frozen_drafts",
    "frozen_payload",
]

_T = TypeVar("_T")

#: Up to this many tree nodes in a step (roots included), answers are checked on the host lists
#: (a few Python comparisons); above it, by batched tensor operations whose cost barely grows
#: with the batch.
_HOST_CHECK_NODES = 256


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.clone()


def _unchecked(cls: type[_T], **values: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` holding ``values``, without its
    ``__post_init__``: for copies of an instance whose values were checked already (a
    DraftTree re-checks its values on CPU tensors, host syncs the copy does not need)."""
    obj = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(obj, name, value)
    return obj


def copy_tree(tree: DraftTree) -> DraftTree:
    """A copy of ``tree`` that no later in-place write into ``tree``'s tensors reaches."""
    return _unchecked(
        DraftTree,
        tokens=tree.tokens.clone(),
        parents=tree.parents.clone(),
        lengths=tree.lengths.clone(),
        q=_clone(tree.q),
        confidence=_clone(tree.confidence),
    )


def copy_acceptance(acceptance: Acceptance) -> Acceptance:
    """A copy of ``acceptance`` that no later in-place write into its tensors reaches."""
    return Acceptance(
        acceptance.accept_index.clone(),
        acceptance.accept_lengths.clone(),
        acceptance.bonus_tokens.clone(),
    )


def copy_payload(payload: RelayPayload) -> RelayPayload:
    """A copy of every field of ``payload``."""
    return RelayPayload(**{name: t.clone() for name, t in payload.present().items()})


def frozen_drafts(
    algorithm: str,
    answer: object,
    *,
    bs: int,
    max_nodes: int,
    vocab: int,
    device: torch.device,
) -> tuple[DraftTree, HostTree]:
    """A drafter's proposal, copied, checked on the copy; the copy and its host metadata."""
    tree = copy_tree(check_drafts_shape(algorithm, answer, bs, max_nodes, vocab, device))
    host = HostTree.of(tree)
    if tree.bs * (tree.num_nodes + 1) <= _HOST_CHECK_NODES:  # a few Python comparisons win
        check_drafts_host(algorithm, host, vocab)
    else:
        host = replace(host, chain=tree.is_chain())
        if not drafts_look_valid(tree, vocab):
            check_drafts_host(algorithm, host, vocab)  # names what is wrong
            raise InternalError(f"{algorithm}: the batched and host draft checks disagree")
    if tree.q is not None and tree.q.device.type == "cpu":  # free to read there only
        check_q(algorithm, tree, host.lengths)
    return tree, host


def frozen_acceptance(
    algorithm: str,
    answer: object,
    drafts: DraftTree,
    tree: HostTree,
    *,
    vocab: int,
    device: torch.device,
) -> tuple[Acceptance, HostAcceptance]:
    """An acceptance rule's answer to ``drafts`` (the step's copy, whose host values are
    ``tree``), copied, checked on the copy against the tree as the drafter proposed it,
    whatever the rule did to the tree it was handed; the copy and its host values."""
    checked = check_acceptance_shape(algorithm, answer, drafts.bs, drafts.num_nodes, device)
    acceptance = copy_acceptance(checked)
    host = HostAcceptance.of(acceptance)
    if drafts.bs * (drafts.num_nodes + 1) <= _HOST_CHECK_NODES:
        check_acceptance_host(algorithm, host, tree, vocab)
    elif not acceptance_looks_valid(acceptance, drafts, vocab):
        check_acceptance_host(algorithm, host, tree, vocab)  # names what is wrong
        raise InternalError(f"{algorithm}: the batched and host acceptance checks disagree")
    return acceptance, host


def frozen_payload(algorithm: str, hook: str, answer: object, bs: int) -> RelayPayload:
    """A relay payload a hook returned (``drafter.admit``/``commit``, ``future_map.resolve``),
    checked and copied."""
    check_payload(algorithm, hook, answer, bs)
    assert isinstance(answer, RelayPayload)  # check_payload raised otherwise
    return copy_payload(answer)
