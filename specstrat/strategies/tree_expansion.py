"""EAGLE-2's top-k tree expansion, shared by the tree-drafting drafters.

Step 1 takes the ``topk`` most likely tokens after the root. Each further step expands every node of
the frontier (the ``topk`` nodes kept at the previous depth) by its ``topk`` most likely children,
scores each child by cumulative log-probability (its parent's score plus its own log-probability)
and keeps the ``topk`` best as the next frontier. Every expanded node is a candidate:
``topk + (num_steps - 1) * topk**2`` in all. The tree proposed is the ``tokens_per_req - 1`` (T - 1)
best candidates by score (ties: lower index first), in candidate order, so parents come before
children; a child never scores above its parent, so the kept set holds every kept node's ancestors.
"""

from __future__ import annotations

import torch

from specstrat.drafting import DraftTree, TreeShape

__all__ = ["TreeExpansion"]


class TreeExpansion:
    """The candidates of one step's expansion for a batch, and the tree they make.

    ``start(log_probs)`` takes the root's next-token log-probabilities ``[bs, V]`` (or
    ``[bs, k]`` with ``tokens``); each ``expand(log_probs)`` the frontier's ``[bs, topk, V]``
    and returns, per new frontier node, the frontier position of its parent (for drafters that
    carry state along a node: a hidden state, a KV column).
    """

    def __init__(self, shape: TreeShape) -> None:
        self.shape = shape
        self.tokens: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.parents: list[torch.Tensor] = []
        self.frontier = torch.empty(0)  # [bs, topk] tokens of the frontier
        self.frontier_score = torch.empty(0)
        self.frontier_index = torch.empty(0)  # candidate index of each frontier node
        self.count = 0

    def start(self, log_probs: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        """The first ``topk`` nodes, under the root."""
        k = self.shape.topk
        if tokens is None:
            top = log_probs.topk(k, dim=-1)
            scores, tokens = top.values, top.indices
        else:
            scores, tokens = log_probs[:, :k], tokens[:, :k]
        bs = tokens.shape[0]
        index = torch.arange(k, device=tokens.device).expand(bs, k)
        self._add(tokens, scores.to(torch.float64), torch.full_like(tokens, -1))
        self.frontier, self.frontier_score, self.frontier_index = tokens, scores, index

    def expand(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Children of the frontier from its ``[bs, topk, V]`` log-probabilities; the new
        frontier's parents as frontier positions ``[bs, topk]``."""
        k = self.shape.topk
        bs = log_probs.shape[0]
        top = log_probs.topk(k, dim=-1)  # [bs, k parents, k children]
        scores = (self.frontier_score.to(torch.float64)[:, :, None] + top.values).reshape(bs, -1)
        tokens = top.indices.reshape(bs, -1)
        parents = self.frontier_index[:, :, None].expand(bs, k, k).reshape(bs, -1)
        base = self.count
        self._add(tokens, scores, parents)
        keep = scores.topk(k, dim=-1, sorted=True).indices  # [bs, k] positions among k * k
        self.frontier = tokens.gather(1, keep)
        self.frontier_score = scores.gather(1, keep)
        self.frontier_index = base + keep
        return keep // k

    def _add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor) -> None:
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.append(parents)
        self.count += tokens.shape[1]

    def tree(self, lengths: torch.Tensor) -> DraftTree:
        """The ``T - 1`` best candidates (``shape.max_nodes``) as a :class:`DraftTree`."""
        n = self.shape.max_nodes
        tokens = torch.cat(self.tokens, dim=1)
        scores = torch.cat(self.scores, dim=1)
        parents = torch.cat(self.parents, dim=1)
        bs, count = tokens.shape
        order = torch.argsort(-scores, dim=1, stable=True)[:, :n]
        chosen = order.sort(dim=1).values  # candidate order: parents first
        where = torch.full((bs, count), -1, dtype=torch.int64, device=tokens.device)
        where.scatter_(1, chosen, torch.arange(n, device=tokens.device).expand(bs, n))
        up = parents.gather(1, chosen)
        new_parents = torch.where(up < 0, -1, where.gather(1, up.clamp(min=0)))
        return DraftTree(tokens.gather(1, chosen).to(torch.int64), new_parents, lengths)
