"""What a hook's answer must satisfy before anything uses it: the contract, not the values.

The engine runs these on every answer of a drafter, an acceptance rule and a relay, and the
conformance kit (:mod:`specstrat.testing`) runs them on a user's strategy. Each check raises
:class:`~specstrat.errors.StrategyError` naming the algorithm, the hook and what was wrong.

Each check comes in two halves: one reads only what a tensor carries on the host anyway (type,
dtype, shape, device: no host sync), the other reads the small metadata a step needs on the
host in any case (a tree's tokens, parents and lengths; an accepted path and its bonus token)
from plain lists (:class:`HostTree`, :class:`HostAcceptance`). The engine copies those lists
once per answer and checks them; :func:`check_drafts` and :func:`check_acceptance` run both
halves for callers that hold tensors only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.drafting import Acceptance, DraftTree
from specstrat.errors import StrategyError
from specstrat.relay import RelayPayload

__all__ = [
    "HostAcceptance",
    "HostTree",
    "acceptance_looks_valid",
    "check_acceptance",
    "check_acceptance_host",
    "check_acceptance_shape",
    "check_drafts",
    "check_drafts_host",
    "check_drafts_shape",
    "check_payload",
    "check_q",
    "describe",
    "drafts_look_valid",
    "hook_error",
]


def describe(value: object) -> str:
    """A tensor's dtype and shape, or any other value's type name (for error messages)."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def hook_error(algorithm: str, hook: str, problem: str) -> StrategyError:
    """A StrategyError for ``algorithm.hook`` (e.g. ``EAGLE.drafter.propose``)."""
    return StrategyError(f"{algorithm}.{hook}: {problem}")


def check_payload(algorithm: str, hook: str, payload: object, bs: int) -> None:
    """``payload`` is a RelayPayload with one row per request (or no field at all)."""
    if not isinstance(payload, RelayPayload):
        raise hook_error(
            algorithm,
            hook,
            f"returned {type(payload).__name__}, not a RelayPayload "
            "(return RelayPayload() to relay nothing)",
        )
    if payload.present() and payload.num_rows != bs:
        raise hook_error(
            algorithm, hook, f"returned a payload of {payload.num_rows} rows for {bs} requests"
        )


@dataclass(frozen=True, slots=True)
class HostTree:
    """A draft tree's small metadata on the host: per request its tokens, parents, lengths."""

    tokens: list[list[int]]
    parents: list[list[int]]
    lengths: list[int]
    chain: bool | None = None  # whether every row is a chain, when read with the copy

    @classmethod
    def of(cls, tree: DraftTree) -> HostTree:
        """The host copy of ``tree``'s tokens, parents and lengths (three device reads)."""
        return cls(tree.tokens.tolist(), tree.parents.tolist(), tree.lengths.tolist())

    def is_chain(self) -> bool:
        """Whether every row is a chain (node ``j``'s parent is ``j - 1``)."""
        if self.chain is not None:
            return self.chain
        return all(row == list(range(-1, len(row) - 1)) for row in self.parents)

    def depth(self) -> int:
        """The deepest real node of any row (the root's children are at depth 1)."""
        deepest = 0
        for row, length in zip(self.parents, self.lengths, strict=True):
            depth = [0] * len(row)
            for j, parent in enumerate(row[:length]):
                depth[j] = 1 + (depth[parent] if parent >= 0 else 0)
            deepest = max(deepest, max(depth[:length], default=0))
        return deepest


@dataclass(frozen=True, slots=True)
class HostAcceptance:
    """An acceptance's answer on the host: per request the accepted path and the bonus token."""

    index: list[list[int]]
    counts: list[int]
    bonus: list[int]

    @classmethod
    def of(cls, acceptance: Acceptance) -> HostAcceptance:
        """The host copy of ``acceptance`` (three device reads)."""
        return cls(
            acceptance.accept_index.tolist(),
            acceptance.accept_lengths.tolist(),
            acceptance.bonus_tokens.tolist(),
        )

    @property
    def paths(self) -> list[list[int]]:
        """Each request's accepted node indices, root first."""
        return [row[:count] for row, count in zip(self.index, self.counts, strict=True)]


def _outside(values: list[int], vocab: int) -> list[int]:
    return [v for v in values if not 0 <= v < vocab][:5]


def check_drafts_shape(
    algorithm: str,
    drafts: object,
    bs: int,
    max_nodes: int,
    vocab: int,
    device: torch.device | None = None,
) -> DraftTree:
    """``drafts`` is a DraftTree of ``bs`` rows, at most ``max_nodes`` nodes, ``q``'s last
    dimension the vocabulary, on ``device`` when one is given (no value is read)."""
    hook = "drafter.propose"
    if not isinstance(drafts, DraftTree):
        raise hook_error(algorithm, hook, f"returned {type(drafts).__name__}, not a DraftTree")
    if device is not None and drafts.tokens.device != device:
        message = (
            f"proposed a tree on {drafts.tokens.device}; the engine runs on "
            f"{device}: put its tensors there"
        )
        raise hook_error(algorithm, hook, message)
    if drafts.q is not None and drafts.q.shape[2] != vocab:
        message = f"q has {drafts.q.shape[2]} columns; the target's vocabulary has {vocab}"
        raise hook_error(algorithm, hook, message)
    if drafts.bs != bs:
        raise hook_error(algorithm, hook, f"proposed {drafts.bs} rows for {bs} requests")
    if drafts.num_nodes > max_nodes:
        raise hook_error(
            algorithm,
            hook,
            f"proposed {drafts.num_nodes} nodes per request; the target "
            f"verifies at most max_nodes={max_nodes} (T - 1)",
        )
    return drafts


def drafts_look_valid(tree: DraftTree, vocab: int) -> bool:
    """:func:`check_drafts_host`'s conditions as a few batched tensor operations (one read):
    when False, the host check names what is wrong."""
    n = tree.num_nodes
    column = torch.arange(n, device=tree.parents.device)
    lengths, parents, tokens = tree.lengths, tree.parents, tree.tokens
    ok = ((lengths >= 0) & (lengths <= n)).all()
    ok &= ((parents >= -1) & (parents < column)).all()
    ok &= ((tokens >= 0) & (tokens < vocab)).all()
    return bool(ok)


def acceptance_looks_valid(acceptance: Acceptance, tree: DraftTree, vocab: int) -> bool:
    """:func:`check_acceptance_host`'s conditions as batched tensor operations (one read):
    each row a root-to-node path of real nodes, -1 after it, and a bonus token in the
    vocabulary. When False, the host check names what is wrong."""
    index, counts, bonus = (
        acceptance.accept_index,
        acceptance.accept_lengths,
        acceptance.bonus_tokens,
    )
    bs, n = index.shape
    lengths, parents = tree.lengths.to(index.device), tree.parents.to(index.device)
    on_path = torch.arange(n, device=index.device) < counts[:, None]
    previous = torch.cat([index.new_full((bs, 1), -1), index[:, :-1]], dim=1)[:, :n]
    node = index.clamp(0, max(n - 1, 0))
    linked = parents.gather(1, node) == previous if n else on_path
    real = (index >= 0) & (index < lengths[:, None]) & linked
    ok = ((counts >= 0) & (counts <= lengths)).all()
    ok &= torch.where(on_path, real, index == -1).all()
    ok &= ((bonus >= 0) & (bonus < vocab)).all()
    return bool(ok)


def check_drafts_host(algorithm: str, tree: HostTree, vocab: int) -> None:
    """Lengths within the nodes, every parent before its child, tokens in the vocabulary."""
    hook = "drafter.propose"
    n = len(tree.parents[0]) if tree.parents else 0
    if any(not 0 <= length <= n for length in tree.lengths):
        message = (
            f"proposed lengths={tree.lengths}; each must lie in 0..{n} (the "
            "tree's nodes per request)"
        )
        raise hook_error(algorithm, hook, message)
    for row, parents in enumerate(tree.parents):
        if any(not -1 <= p < j for j, p in enumerate(parents)):
            message = (
                f"request {row}: parents={parents} break parent-before-child "
                "(node j's parent must lie in -1..j-1, -1 = the root)"
            )
            raise hook_error(algorithm, hook, message)
    bad = _outside([t for row in tree.tokens for t in row], vocab)
    if bad:
        raise hook_error(
            algorithm, hook, f"proposed token ids {bad} outside the vocabulary 0..{vocab - 1}"
        )


def check_q(algorithm: str, drafts: DraftTree, lengths: list[int]) -> None:
    """``q`` of every real node is a distribution that gives the node's token some mass."""
    hook = "drafter.propose"
    if drafts.q is None:
        return
    real = torch.arange(drafts.num_nodes)[None, :] < torch.tensor(lengths)[:, None]
    q = drafts.q[real].to(torch.float64)
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise hook_error(algorithm, hook, "q holds negative, NaN or infinite probabilities")
    sums = q.sum(-1)
    if bool(((sums - 1).abs() > 1e-3).any()):
        message = (
            f"q rows sum to {sums.min().item():.4g}..{sums.max().item():.4g}; "
            "each real node's q must be a probability distribution (sum 1)"
        )
        raise hook_error(algorithm, hook, message)
    at_token = q.gather(1, drafts.tokens[real][:, None]).squeeze(1)
    if bool((at_token <= 0).any()):
        message = (
            "q gives a drafted token no probability: q must be the "
            "distribution the token was drawn from"
        )
        raise hook_error(algorithm, hook, message)


def check_drafts(
    algorithm: str,
    drafts: object,
    bs: int,
    max_nodes: int,
    vocab: int,
    device: torch.device | None = None,
) -> HostTree:
    """Both halves for a tree: :func:`check_drafts_shape`, then :func:`check_drafts_host` on
    its host copy (and ``q`` when it is on the CPU, where reading it is free); the copy."""
    tree = check_drafts_shape(algorithm, drafts, bs, max_nodes, vocab, device)
    host = HostTree.of(tree)
    check_drafts_host(algorithm, host, vocab)
    if tree.q is not None and tree.q.device.type == "cpu":
        check_q(algorithm, tree, host.lengths)
    return host


def check_acceptance_shape(
    algorithm: str, acceptance: object, bs: int, n: int, device: torch.device | None = None
) -> Acceptance:
    """``acceptance`` is an Acceptance of int64 ``[bs, n]``, ``[bs]``, ``[bs]`` tensors, on
    ``device`` when one is given (no value is read)."""
    hook = "acceptance.accept"
    if not isinstance(acceptance, Acceptance):
        raise hook_error(
            algorithm, hook, f"returned {type(acceptance).__name__}, not an Acceptance"
        )
    shapes = {
        "accept_index": (acceptance.accept_index, (bs, n)),
        "accept_lengths": (acceptance.accept_lengths, (bs,)),
        "bonus_tokens": (acceptance.bonus_tokens, (bs,)),
    }
    for name, (tensor, shape) in shapes.items():
        if (
            not isinstance(tensor, torch.Tensor)
            or tensor.dtype != torch.int64
            or tuple(tensor.shape) != shape
        ):
            got = describe(tensor)
            raise hook_error(algorithm, hook, f"{name} is {got}; expected torch.int64 {shape}")
        if device is not None and tensor.device != device:
            message = (
                f"answered {name} on {tensor.device}; the engine runs on "
                f"{device}: put the answer's tensors there"
            )
            raise hook_error(algorithm, hook, message)
    return acceptance


def check_acceptance_host(
    algorithm: str, answer: HostAcceptance, tree: HostTree, vocab: int
) -> None:
    """Per request a root-to-node path within the tree's real nodes (-1 after it), and a bonus
    token in the vocabulary."""
    hook = "acceptance.accept"
    n = len(tree.parents[0]) if tree.parents else 0
    for row, (count, real) in enumerate(zip(answer.counts, tree.lengths, strict=True)):
        if not 0 <= count <= real:
            raise hook_error(
                algorithm, hook, f"request {row} accepted {count} drafts but {real} were proposed"
            )
    for row, index in enumerate(answer.index):
        if any(not -1 <= j < n for j in index):
            message = f"request {row}: accept_index={index} holds node indices outside -1..{n - 1}"
            raise hook_error(algorithm, hook, message)
    for row, index in enumerate(answer.index):
        count, parents, real = answer.counts[row], tree.parents[row], tree.lengths[row]
        path, rest = index[:count], index[count:]
        previous = [-1, *path][: len(path)]
        pairs = zip(path, previous, strict=True)
        on_tree = all(0 <= j < real and parents[j] == p for j, p in pairs)
        if not on_tree or any(j != -1 for j in rest):
            raise hook_error(
                algorithm,
                hook,
                f"request {row}: accept_index={index} with accept_lengths={count} is not a "
                f"root-to-node path of the draft tree (parents={parents}, real nodes={real}; "
                "-1 after the path)",
            )
    bad = _outside(answer.bonus, vocab)
    if bad:
        raise hook_error(
            algorithm, hook, f"bonus tokens {bad} outside the vocabulary 0..{vocab - 1}"
        )


def check_acceptance(
    algorithm: str,
    acceptance: object,
    drafts: DraftTree,
    vocab: int,
    device: torch.device | None = None,
) -> HostAcceptance:
    """Both halves for an answer to ``drafts``: :func:`check_acceptance_shape`, then
    :func:`check_acceptance_host` on the host copies; the answer's copy."""
    answer = check_acceptance_shape(algorithm, acceptance, drafts.bs, drafts.num_nodes, device)
    host = HostAcceptance.of(answer)
    check_acceptance_host(algorithm, host, HostTree.of(drafts), vocab)
    return host
