"""Acceptance rules: which drafts the target accepts, and the bonus token after them.

``GreedyAcceptance`` (lossless for greedy decoding), ``RejectionSamplingAcceptance`` (lossless in
distribution under each request's sampling parameters; greedy rows take the greedy answer) and
``TypicalAcceptance`` (Medusa's, lossy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.drafting import Acceptance, DraftTree, VerifyInputs
from specstrat.errors import InvalidConfig
from specstrat.kernels import Backend
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE, rejection_sample, sample_from, uniform
from specstrat.sampling import SamplingBatch, choose_tokens

__all__ = ["GreedyAcceptance", "RejectionSamplingAcceptance", "TypicalAcceptance"]


@dataclass(frozen=True, slots=True)
class GreedyAcceptance:
    """The longest root-to-node path whose every token is the target's argmax; lossless.

    From the root, the target's greedy choice at the current node is looked up among the
    node's real children; the first child (lowest index) holding it is accepted and the walk
    goes on from there. The bonus token is the target's greedy choice at the last accepted node,
    so the output is token for token target-only greedy decoding (for a chain: the longest
    matching prefix, plus one). Sampling parameters are not read: lossless for temperature 0.
    """

    @property
    def lossless(self) -> bool:
        """Greedy acceptance reproduces target-only greedy output exactly."""
        return True

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """Walk the tree along the target's argmax, one depth per iteration (at most ``n``)."""
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        dev = drafts.tokens.device
        greedy = inputs.logits.argmax(dim=-1)  # [bs, n + 1]: choice at the root and each node
        real = torch.arange(n, device=dev)[None, :] < drafts.lengths[:, None]
        current = torch.full((bs,), -1, dtype=torch.int64, device=dev)
        index = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
        lengths = torch.zeros(bs, dtype=torch.int64, device=dev)
        alive = torch.ones(bs, dtype=torch.bool, device=dev)
        for depth in range(n):
            choice = greedy.gather(1, (current + 1)[:, None])
            match = (
                real
                & alive[:, None]
                & (drafts.parents == current[:, None])
                & (drafts.tokens == choice)
            )
            alive = match.any(dim=1)
            first = match.to(torch.int64).argmax(dim=1)  # lowest matching child
            current = torch.where(alive, first, current)
            index[:, depth] = torch.where(alive, first, index[:, depth])
            lengths += alive.to(torch.int64)
        bonus = greedy.gather(1, (current + 1)[:, None]).squeeze(1)
        return Acceptance(index, lengths, bonus)


def _first_chain(drafts: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request, the chain of first children from the root: node indices ``[bs, n]``
    (``-1`` past its end) and its length; a chain is its own first chain."""
    bs, n = drafts.tokens.shape
    dev = drafts.tokens.device
    if drafts.is_chain():
        return torch.arange(n, device=dev).expand(bs, n).contiguous(), drafts.lengths
    real = torch.arange(n, device=dev)[None, :] < drafts.lengths[:, None]
    nodes = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
    current = torch.full((bs,), -1, dtype=torch.int64, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    length = torch.zeros(bs, dtype=torch.int64, device=dev)
    for depth in range(n):
        children = real & alive[:, None] & (drafts.parents == current[:, None])
        alive = children.any(dim=1)
        first = children.to(torch.int64).argmax(dim=1)
        current = torch.where(alive, first, current)
        nodes[:, depth] = torch.where(alive, first, nodes[:, depth])
        length += alive.to(torch.int64)
    return nodes, length


def _chain_rows(drafts: DraftTree) -> torch.Tensor:
    """``[bs]``: rows whose every node's parent is the node before it."""
    chain = torch.arange(drafts.num_nodes, device=drafts.parents.device) - 1
    return (drafts.parents == chain).all(dim=1)


def _logits_along(logits: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """The target's logits at the root and at each chain node, ``[bs, n + 1, V]``."""
    root = torch.zeros(nodes.shape[0], 1, dtype=torch.int64, device=nodes.device)
    rows = torch.cat([root, nodes.clamp(min=0) + 1], dim=1)
    return logits.gather(1, rows[:, :, None].expand(-1, -1, logits.shape[2]))


@dataclass(frozen=True, slots=True)
class _Chain:
    """One verify step seen along each request's first chain: its nodes and length, their
    tokens, the target's logits at the root and each node, and ``p`` after sampling."""

    nodes: torch.Tensor
    length: torch.Tensor
    tokens: torch.Tensor
    logits: torch.Tensor
    p: torch.Tensor

    @classmethod
    def of(cls, inputs: VerifyInputs, sampling: SamplingBatch) -> _Chain:
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        nodes, length = _first_chain(drafts)
        logits = _logits_along(inputs.logits, nodes)
        p = sampling.repeat(n + 1).probs(logits.reshape(bs * (n + 1), -1)).reshape(bs, n + 1, -1)
        return cls(nodes, length, drafts.tokens.gather(1, nodes.clamp(min=0)), logits, p)


def _along(nodes: torch.Tensor, length: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """The first ``accepted`` nodes of each chain, ``-1`` after."""
    cols = torch.arange(nodes.shape[1], device=nodes.device)[None, :]
    return torch.where(cols < accepted[:, None], nodes, -1)


#: Draw indices of tree acceptance: node ``j``'s accept/reject decision uses draw
#: ``_DRAW_NODE + j``.
_DRAW_NODE = 8


def _tree_sample(
    inputs: VerifyInputs, sampling: SamplingBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-draft recursive rejection sampling over a tree (SpecInfer), each node a
    deterministic proposal: path ``[bs, n]``, its length and the bonus token.

    At the current node the target's distribution ``r`` (after sampling parameters) is offered
    its children in index order: child ``x`` is accepted with probability ``r(x)``; on
    rejection ``r`` loses ``x`` and is renormalised. With no child accepted the bonus is drawn
    from what is left of ``r``. Sequential rejection of one-hot proposals leaves ``r``'s
    distribution intact, so every token keeps the target's distribution whatever the tree.
    """
    drafts = inputs.drafts
    bs, n = drafts.tokens.shape
    dev = drafts.tokens.device
    p = sampling.repeat(n + 1).probs(inputs.logits.reshape(bs * (n + 1), -1)).reshape(bs, n + 1, -1)
    rows = torch.arange(bs, device=dev)
    real = torch.arange(n, device=dev)[None, :] < drafts.lengths[:, None]
    current = torch.full((bs,), -1, dtype=torch.int64, device=dev)
    path = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
    length = torch.zeros(bs, dtype=torch.int64, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    bonus = torch.full((bs,), -1, dtype=torch.int64, device=dev)
    for depth in range(n + 1):
        residual = p[rows, current + 1].clone()
        taken = torch.zeros(bs, dtype=torch.bool, device=dev)
        for j in range(n):
            offered = alive & ~taken & real[:, j] & (drafts.parents[:, j] == current)
            x = drafts.tokens[:, j]
            share = residual[rows, x] / residual.sum(-1).clamp(min=1e-300)
            u = uniform(sampling.seed, inputs.positions + 1 + depth, _DRAW_NODE + j)
            ok = offered & (u < share)
            residual[rows, x] = torch.where(offered & ~ok, 0.0, residual[rows, x])
            col = min(depth, n - 1)  # at depth n no node is left to accept
            path[:, col] = torch.where(ok, j, path[:, col])
            current = torch.where(ok, j, current)
            taken |= ok
        ended = alive & ~taken
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, p[rows, current + 1], residual)
        drawn = sample_from(
            residual, uniform(sampling.seed, inputs.positions + 1 + depth, DRAW_SAMPLE)
        )
        bonus = torch.where(ended, drawn, bonus)
        length += taken.to(torch.int64)
        alive &= taken
        if not bool(alive.any()):
            break
    return path, length, bonus


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectionSamplingAcceptance:
    """Speculative sampling: lossless in distribution under each request's sampling parameters.

    Along each request's chain, draft token ``x`` is accepted with probability
    ``min(1, p(x) / q(x))``; at the first rejection the token is drawn from the normalised
    residual ``max(0, p - q)``; after a fully accepted chain the bonus token is drawn from ``p``.
    ``p`` and ``q`` are after temperature, top-k and top-p; a drafter that gives no ``q`` is
    deterministic (``q`` one-hot). One launch of
    :func:`~specstrat.kernels.rejection_sampling.rejection_sample` for the batch; its random numbers
    depend on the request's seed and the token's position only. A tree that is not a chain is
    accepted by multi-draft recursive rejection sampling (SpecInfer), each child a one-hot
    proposal offered in index order (lossless whatever the tree; ``q`` is not read there).
    Requests with temperature 0 take the greedy answer (:class:`GreedyAcceptance`, over the
    whole tree), so greedy output is unchanged.
    """

    backend: Backend = "auto"

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "triton", "torch"):
            raise InvalidConfig(f"backend={self.backend!r} is not one of 'auto', 'triton', 'torch'")

    @property
    def lossless(self) -> bool:
        """Rejection sampling keeps the target's distribution."""
        return True

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """Accepted paths and bonus tokens, sampled rows and greedy rows alike."""
        drafts = inputs.drafts
        greedy = GreedyAcceptance().accept(inputs)
        sampling = SamplingBatch.of(inputs.sampling, drafts.tokens.device)
        if bool(sampling.greedy.all()):
            return greedy
        take_greedy = sampling.greedy
        if not drafts.is_chain():  # each row by its own tree: a chain row samples as a chain
            chain_rows = _chain_rows(drafts)
            path, accepted, bonus = _tree_sample(inputs, sampling)
            if bool(chain_rows.any()):
                chained = self._chains(inputs, sampling)
                path = torch.where(chain_rows[:, None], chained.accept_index, path)
                accepted = torch.where(chain_rows, chained.accept_lengths, accepted)
                bonus = torch.where(chain_rows, chained.bonus_tokens, bonus)
            return Acceptance(
                torch.where(take_greedy[:, None], greedy.accept_index, path),
                torch.where(take_greedy, greedy.accept_lengths, accepted),
                torch.where(take_greedy, greedy.bonus_tokens, bonus),
            )
        chained = self._chains(inputs, sampling)
        return Acceptance(
            torch.where(take_greedy[:, None], greedy.accept_index, chained.accept_index),
            torch.where(take_greedy, greedy.accept_lengths, chained.accept_lengths),
            torch.where(take_greedy, greedy.bonus_tokens, chained.bonus_tokens),
        )

    def _chains(self, inputs: VerifyInputs, sampling: SamplingBatch) -> Acceptance:
        """Rejection sampling along each row's chain (its first children), one launch."""
        drafts = inputs.drafts
        chain = _Chain.of(inputs, sampling)
        q = None
        if drafts.q is not None:
            at = chain.nodes.clamp(min=0)[:, :, None].expand(-1, -1, drafts.q.shape[2])
            q = drafts.q.gather(1, at)
        accepted, bonus = rejection_sample(
            chain.p,
            chain.tokens,
            chain.length,
            sampling.seed,
            inputs.positions,
            q,
            backend=self.backend,
        )
        return Acceptance(_along(chain.nodes, chain.length, accepted), accepted, bonus)


@dataclass(frozen=True, slots=True, kw_only=True)
class TypicalAcceptance:
    """Typical acceptance (Medusa): lossy, it does not keep the target's distribution.

    Along each request's chain (first children), draft token ``x`` is accepted while
    ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``, ``p`` the target's
    distribution after temperature/top-k/top-p and ``H`` its entropy; the bonus token is then
    sampled from ``p`` (greedy at temperature 0).
    """

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def __post_init__(self) -> None:
        for name in ("posterior_threshold", "posterior_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise InvalidConfig(f"{name}={value!r} must be a number in (0, 1]")

    @property
    def lossless(self) -> bool:
        """Typical acceptance trades the target's distribution for longer acceptance."""
        return False

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """The longest typical prefix of each chain, then a sampled bonus token."""
        bs, n = inputs.drafts.tokens.shape
        sampling = SamplingBatch.of(inputs.sampling, inputs.drafts.tokens.device)
        chain = _Chain.of(inputs, sampling)
        p, nodes, length, logits = chain.p, chain.nodes, chain.length, chain.logits
        entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)  # [bs, n + 1]
        bar = torch.clamp(self.posterior_alpha * torch.exp(-entropy), max=self.posterior_threshold)
        px = p[:, :n].gather(2, chain.tokens[:, :, None]).squeeze(2)
        real = torch.arange(n, device=p.device)[None, :] < length[:, None]
        typical = (px > bar[:, :n]) & real
        accepted = typical.to(torch.int64).cumprod(dim=1).sum(dim=1)
        rows = torch.arange(bs, device=p.device)
        at = logits[rows, accepted]
        bonus, _ = choose_tokens(at, sampling, inputs.positions + 1 + accepted, DRAW_SAMPLE)
        return Acceptance(_along(nodes, length, accepted), accepted, bonus)
