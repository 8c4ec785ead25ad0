"""One verify entry: the target's logits at the root and every draft node of a step.

The verify row of a request is its bonus token followed by its draft nodes, ``T`` tokens
wide (filler pads a drafter's short rows). It runs through the graph runner's buckets when the
batch fits one, eagerly otherwise, or, for an algorithm that allows ragged verify, only over
each request's real nodes (ragged metadata, replayed from the buckets' token buckets too); a
step in which no request drafted anything verifies the roots alone, the cost of a decode. A
draft that is not a chain is verified as a tree: every node at position ``seq_len + depth``,
attending to the prefix, its ancestors and itself (the tree metadata kernel's mask).
"""

from __future__ import annotations

import torch

from specstrat.drafting import DraftTree
from specstrat.kernels import build_tree_verify_metadata
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._worker import ModelWorker, TreeTokens, run_offsets

__all__ = ["VerifyResult", "Verifier"]

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

    def verify(
        self,
        slots: list[int],
        bonus: torch.Tensor,
        drafts: DraftTree,
        *,
        seq_lens: list[int],
        chain: bool | None = None,
        node_counts: list[int] | None = None,
    ) -> VerifyResult:
        """Logits ``[bs, T, V]`` and hidden ``[bs, T, H]`` at the root and each node, and how
        many tokens the target ran. ``seq_lens`` are the slots' committed tokens (the slot
        table's, read by the caller); ``node_counts`` each request's real draft nodes
        (``drafts.lengths`` when not given). Positions a ragged verify did not run are zeros."""
        bs, t = len(slots), self.tokens_per_req
        rows = torch.cat([bonus[:, None], drafts.tokens], dim=1)
        if rows.shape[1] < t:  # a short proposal: filler the acceptance rule never accepts
            rows = torch.cat([rows, rows[:, -1:].expand(bs, t - rows.shape[1])], dim=1)
        if not (drafts.is_chain() if chain is None else chain):
            return self._tree(slots, rows, drafts, seq_lens)
        counts = [n + 1 for n in (drafts.lengths.tolist() if node_counts is None else node_counts)]
        if t > 1 and max(counts, default=1) == 1:
            return self._roots(slots, rows)
        if self.ragged and min(counts, default=t) < t:
            return self._ragged(slots, rows, counts)
        if self.graph_runner is not None and self.graph_runner.can_run(bs):
            logits, hidden = self.graph_runner.replay(slots, rows)
        else:
            mode = ForwardMode.TARGET_VERIFY if t > 1 else ForwardMode.DECODE
            logits, hidden = self.worker.forward(mode, slots, rows.tolist())
        return logits.view(bs, t, -1), hidden.view(bs, t, -1), bs * t

    def _tree(
        self, slots: list[int], rows: torch.Tensor, drafts: DraftTree, seq_lens: list[int]
    ) -> VerifyResult:
        """Tree verify: through the graph buckets when one fits, else eagerly; positions and
        tree masks from the tree metadata kernel either way."""
        bs, t = rows.shape
        dev = self.worker.device
        parents, lengths = drafts.parents.to(dev), drafts.lengths.to(dev)
        if parents.shape[1] < t - 1:  # a short proposal: filler nodes under the root
            filler = parents.new_full((bs, t - 1 - parents.shape[1]), -1)
            parents = torch.cat([parents, filler], dim=1)
        if self.graph_runner is not None and self.graph_runner.can_run(bs):
            logits, hidden = self.graph_runner.replay_tree(slots, rows, parents, lengths)
        else:
            meta = build_tree_verify_metadata(
                parents, lengths, torch.tensor(seq_lens, device=dev), seq_lens_cpu=seq_lens
            )
            tree = TreeTokens(meta.positions.view(bs, t), meta.tree_mask)
            logits, hidden = self.worker.forward(
                ForwardMode.TARGET_VERIFY, slots, rows.tolist(), tree=tree
            )
        return logits.view(bs, t, -1), hidden.view(bs, t, -1), bs * t

    def _roots(self, slots: list[int], rows: torch.Tensor) -> VerifyResult:
        """No request drafted anything: one DECODE forward of the roots (every row one token,
        a uniform batch, so no ragged support is needed), the draft positions zeros."""
        bs, t = rows.shape
        logits, hidden = self.worker.forward(ForwardMode.DECODE, slots, rows[:, :1].tolist())
        full_logits = logits.new_zeros(bs, t, logits.shape[-1])
        full_logits[:, 0] = logits
        full_hidden = hidden.new_zeros(bs, t, hidden.shape[-1])
        full_hidden[:, 0] = hidden
        return full_logits, full_hidden, bs

    def _ragged(self, slots: list[int], rows: torch.Tensor, counts: list[int]) -> VerifyResult:
        bs, t = rows.shape
        tokens = [row[:count] for row, count in zip(rows.tolist(), counts, strict=True)]
        runner = self.graph_runner
        if runner is not None and runner.can_run_ragged(bs, sum(counts)):
            flat_logits, flat_hidden = runner.replay_ragged(slots, tokens)
        else:
            flat_logits, flat_hidden = self.worker.forward(ForwardMode.TARGET_VERIFY, slots, tokens)
        per_row = torch.tensor(counts)
        row_index = torch.repeat_interleave(torch.arange(bs), per_row)
        col_index = run_offsets(per_row)
        logits = flat_logits.new_zeros(bs, t, flat_logits.shape[-1])
        logits[row_index, col_index] = flat_logits
        hidden = flat_hidden.new_zeros(bs, t, flat_hidden.shape[-1])
        hidden[row_index, col_index] = flat_hidden
        return logits, hidden, len(row_index)
