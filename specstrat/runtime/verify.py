"""One verify entry: the target's logits at the root and every draft node of a step.

The verify row of a request is the last verified token followed by its draft nodes, ``T`` tokens
wide (filler pads a drafter's short rows). It runs through the graph runner's buckets when the
batch fits one, eagerly otherwise, or, for an algorithm that allows ragged verify, only over
each request's real nodes (ragged metadata). A draft that is not a chain is verified as a tree:
every node at position ``seq_len + depth``, attending to the prefix, its ancestors and itself.
"""

from __future__ import annotations

import torch

from specstrat.drafting import DraftTree
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.graph_runner import GraphRunner
from specstrat.runtime.worker import ModelWorker, TreeTokens

__all__ = ["VerifyResult", "Verifier", "tree_layout"]

VerifyResult = tuple[torch.Tensor, torch.Tensor, int]


class Verifier:
    """TARGET_VERIFY (or DECODE when ``T = 1``) for a batch of draft trees."""

    def __init__(
        self,
        worker: ModelWorker,
        tokens_per_req: int,
        *,
        graph_runner: GraphRunner | None,
        ragged: bool,
    ) -> None:
        self.worker = worker
        self.tokens_per_req = tokens_per_req
        self.graph_runner = graph_runner
        self.ragged = ragged

    def verify(self, slots: list[int], last: torch.Tensor, drafts: DraftTree) -> VerifyResult:
        """Logits ``[bs, T, V]`` and hidden ``[bs, T, H]`` at the root and each node, and how
        many tokens the target ran. Positions a ragged verify did not run are zeros."""
        bs, t = len(slots), self.tokens_per_req
        rows = torch.cat([last[:, None], drafts.tokens], dim=1)
        if rows.shape[1] < t:  # a short proposal: filler the acceptance rule never accepts
            rows = torch.cat([rows, rows[:, -1:].expand(bs, t - rows.shape[1])], dim=1)
        if not drafts.is_chain():
            return self._tree(slots, rows, drafts)
        counts = (drafts.lengths + 1).tolist()
        if self.ragged and min(counts, default=t) < t:
            return self._ragged(slots, rows, counts)
        if self.graph_runner is not None and self.graph_runner.can_run(bs):
            logits, hidden = self.graph_runner.replay(slots, rows)
        else:
            mode = ForwardMode.TARGET_VERIFY if t > 1 else ForwardMode.DECODE
            logits, hidden = self.worker.forward(mode, slots, rows.tolist())
        return logits.view(bs, t, -1), hidden.view(bs, t, -1), bs * t

    def _tree(self, slots: list[int], rows: torch.Tensor, drafts: DraftTree) -> VerifyResult:
        bs, t = rows.shape
        dev = self.worker.device
        seq_lens = torch.tensor([self.worker.length(s) for s in slots], device=dev)
        depth, mask = tree_layout(drafts.parents.to(dev))
        tree = TreeTokens(seq_lens[:, None] + depth, mask)
        logits, hidden = self.worker.forward(
            ForwardMode.TARGET_VERIFY, slots, rows.tolist(), tree=tree
        )
        return logits.view(bs, t, -1), hidden.view(bs, t, -1), bs * t

    def _ragged(self, slots: list[int], rows: torch.Tensor, counts: list[int]) -> VerifyResult:
        bs, t = rows.shape
        tokens = [row[:count] for row, count in zip(rows.tolist(), counts, strict=True)]
        flat_logits, flat_hidden = self.worker.forward(ForwardMode.TARGET_VERIFY, slots, tokens)
        per_row = torch.tensor(counts)
        row_index = torch.repeat_interleave(torch.arange(bs), per_row)
        col_index = torch.arange(len(row_index)) - torch.repeat_interleave(
            per_row.cumsum(0) - per_row, per_row
        )
        logits = flat_logits.new_zeros(bs, t, flat_logits.shape[-1])
        logits[row_index, col_index] = flat_logits
        hidden = flat_hidden.new_zeros(bs, t, flat_hidden.shape[-1])
        hidden[row_index, col_index] = flat_hidden
        return logits, hidden, len(row_index)


def tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``[bs, n + 1]`` and ancestor-or-self mask ``[bs, n + 1, n + 1]`` of the verify row
    (index 0 the root, index ``j + 1`` node ``j``) from DraftTree ``parents [bs, n]``."""
    bs, n = parents.shape
    dev = parents.device
    up = torch.cat([torch.zeros(bs, 1, dtype=torch.int64, device=dev), parents + 1], dim=1)
    eye = torch.eye(n + 1, dtype=torch.bool, device=dev).expand(bs, -1, -1)
    mask = eye.clone()
    depth = torch.zeros(bs, n + 1, dtype=torch.int64, device=dev)
    for j in range(1, n + 1):  # parents come first: row j is its parent's row plus itself
        parent = up[:, j]
        mask[:, j] |= mask[torch.arange(bs, device=dev), parent]
        depth[:, j] = depth[torch.arange(bs, device=dev), parent] + 1
    return depth, mask
