"""One scheduler step on the forward thread: a decode step, or (delegated to
:mod:`specstrat.runtime._step_admit`) a prefill or PREBUILT admission.

A decode step reads top to bottom in :meth:`StepRunner.decode` — the step's D from the
speculation policy (its lane: tokens per request, tree, buckets), then resolve -> draft -> verify ->
accept -> keep -> commit -> publish — with one collaborator per stage: the width control, the
relay (the algorithm's FutureMap), the drafter, the verifier, the acceptance rule, the worker
(KV rewind), the slot table, the drafter again and the relay again. Each stage returns a frozen
record (:mod:`specstrat.runtime._step_types`) the later stages read; none calls back into the
stage before it. Sequence lengths come from the slot table, their one owner: the step publishes
what it holds after the rewind, and checks the target pool's fill and what the relay resolves
against it. Every hook call goes through :func:`~specstrat.runtime._guard.call_hook`, and what a
hook returns is checked against its contract (:mod:`specstrat.contracts`) before anything uses
it. The step emits one
:class:`~specstrat.runtime._stats.StepRecord` of what it measured; the run's ledger folds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.contracts import HostTree, hook_error
from specstrat.drafting import DraftStep, StepOutcome, VerifyInputs
from specstrat.errors import InternalError
from specstrat.protocols import Drafter, FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime._adapt import WidthControl, WidthLane
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._answers import copy_tree, frozen_acceptance, frozen_drafts, frozen_payload
from specstrat.runtime._guard import call_hook
from specstrat.runtime._requests import Request
from specstrat.runtime._slots import SlotTable
from specstrat.runtime._stats import StepRecord
from specstrat.runtime._step_admit import AdmissionSteps
from specstrat.runtime._step_relay import StepRelay
from specstrat.runtime._step_types import (
    Accepted,
    Drafted,
    Kept,
    Resolved,
    StepOutput,
    Verified,
    engine_invariant,
)
from specstrat.runtime._trace import traced
from specstrat.runtime._worker import ModelWorker
from specstrat.speculation import SpeculationObservation

__all__ = ["StepRunner"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class StepRunner:
    """Runs prefill, PREBUILT admission and decode steps for one engine, on the forward thread."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        worker: ModelWorker,
        drafter: Drafter[Any],
        control: WidthControl,
        relay: FutureMap,
        table: SlotTable,
        prefill_tokens: int,
    ) -> None:
        self.algo, self.worker, self.drafter = algo, worker, drafter
        self.control, self.relay, self.table = control, relay, table
        self.vocab = worker.shape.vocab_size
        self.speculative = algo.is_speculative()
        self.relay_io = StepRelay(algo.name, relay, worker.device)
        self.admission = AdmissionSteps(
            algo, worker, drafter, relay, self.relay_io, table, prefill_tokens
        )

    def _hook(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return call_hook(self.algo.name, hook, fn, *args, **kwargs)

    def release(self, slots: Sequence[int]) -> None:
        """Finished requests: their relay entries are resolved one last time (a relay may free
        entries once read), the drafter forgets them, the draft rows it left (it forgot, or
        raised) are freed, their KV and slots are freed."""
        self.relay_io.release(slots)
        try:
            self._hook("drafter.release", self.drafter.release, list(slots))
        finally:
            self.table.free_draft_rows(slots)  # what the slot table says they still hold
        self.table.forget(slots)  # before the pool frees a slot the scheduler may reuse
        for slot in slots:
            self.worker.free_request(slot)

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> StepOutput:
        """EXTEND over the prompts (:meth:`AdmissionSteps.prefill`)."""
        return self.admission.prefill(admit)

    def admit_prebuilt(self, batch: TransferBatch, slots: list[int]) -> StepOutput:
        """A received PREBUILT batch (:meth:`AdmissionSteps.admit_prebuilt`)."""
        return self.admission.admit_prebuilt(batch, slots)

    # -- decode -------------------------------------------------------------------------------

    def decode(
        self,
        slots: list[int],
        observed: SpeculationObservation | None = None,
        *,
        tracing: bool = False,
    ) -> StepOutput:
        """One decode step for the running requests ``slots``; ``observed``: what the
        speculation policy observes, taken when the step was planned (``None`` for a
        non-speculative algorithm); ``tracing``: record drafts.

        What a hook returns is copied the moment it returns and checked on the copy; only the
        copy is used after (:mod:`specstrat.runtime._answers`), and what a hook is handed is a
        copy the step does not read back. So a hook that later writes into a tensor it
        returned or was given cannot change the step's tokens.
        """
        start = time.perf_counter()
        lane = self.control.choose(slots, observed)  # the step's D, before anything changes
        resolved = self._resolve(slots, lane, start)
        drafted = self._draft(resolved)
        verified = self._verify(resolved, drafted)
        accepted = self._accept(resolved, drafted, verified)
        kept = self._keep(resolved, drafted, accepted)
        self.table.commit(resolved.rows, kept.accepted, accepted.answer.bonus)
        payload = self._commit_drafter(resolved, drafted, verified, accepted, kept)
        self._publish(resolved, accepted, kept, payload)
        return self._output(resolved, drafted, verified, accepted, kept, tracing)

    def _resolve(self, slots: list[int], lane: WidthLane, start: float) -> Resolved:
        """The slots' rows, lengths and bonus tokens, and the relay's payload for them."""
        rows = self.table.rows(slots)
        lengths, bonus = [len(r.committed) for r in rows], [r.bonus for r in rows]
        if (cached := self.worker.cached(slots)) != lengths:  # the pool mirrors the table
            raise InternalError(
                f"the target's KV holds {cached} positions for slots {slots} but they committed "
                f"{lengths} tokens; a bug in specstrat"
            )
        relay = self.relay_io.resolve(slots, lengths, bonus)
        assert relay.bonus_tokens is not None  # resolve refused a relay without them
        step = DraftStep(
            slots=tuple(slots),
            bonus_tokens=relay.bonus_tokens,
            seq_lens=torch.tensor(lengths, dtype=torch.int64),
            payload=relay,
            max_nodes=lane.max_nodes,
            sampling=tuple(r.request.sampling for r in rows),
            tree=lane.tree,
        )
        return Resolved(lane, rows, lengths, bonus, step, start)

    def _draft(self, resolved: Resolved) -> Drafted:
        """``drafter.propose``, its tree checked against the step's tree shape."""
        hook, step, name = "drafter.propose", resolved.step, self.algo.name
        answer = self._hook(hook, self.drafter.propose, step)
        drafts, tree = frozen_drafts(
            name,
            answer,
            bs=len(step.slots),
            max_nodes=step.max_nodes,
            vocab=self.vocab,
            device=self.worker.device,
        )
        chain = tree.is_chain()
        policy = type(self.algo.tree).__name__
        if not chain and step.shape.is_chain:
            raise hook_error(
                name,
                hook,
                f"proposed a tree that is not a chain, but tree={policy} asks for a chain "
                "(topk 1); compose the algorithm with tree=TopkTree(topk=..., num_steps=...) "
                "to verify trees",
            )
        if not chain and (depth := tree.depth()) > step.shape.num_steps:
            raise hook_error(
                name,
                hook,
                f"proposed a tree {depth} nodes deep, but tree={policy} allows "
                f"num_steps={step.shape.num_steps}",
            )
        return Drafted(drafts, tree, chain, time.perf_counter())

    def _verify(self, resolved: Resolved, drafted: Drafted) -> Verified:
        """The target's TARGET_VERIFY forward over each request's root and drafts."""
        bonus = torch.tensor(resolved.bonus, dtype=torch.int64, device=self.worker.device)
        with engine_invariant("verify"):
            logits, hidden, ran = resolved.lane.verifier.verify(
                list(resolved.step.slots),
                bonus,
                drafted.drafts,
                seq_lens=resolved.lengths,
                chain=drafted.chain,
                node_counts=drafted.tree.lengths,
            )
        return Verified(logits, hidden, ran, time.perf_counter())

    def _accept(self, resolved: Resolved, drafted: Drafted, verified: Verified) -> Accepted:
        """``acceptance.accept`` over the verify logits, its answer checked."""
        drafts = drafted.drafts
        inputs = VerifyInputs(
            drafts=copy_tree(drafts),  # the rule's own copy: the drafter's commit gets `drafts`
            logits=verified.logits[:, : drafts.num_nodes + 1],
            positions=torch.tensor(resolved.lengths, dtype=torch.int64),
            sampling=resolved.step.sampling,
        )
        answer = self._hook("acceptance.accept", self.algo.acceptance.accept, inputs)
        acceptance, host = frozen_acceptance(
            self.algo.name,
            answer,
            drafts,
            drafted.tree,
            vocab=self.vocab,
            device=self.worker.device,
        )
        return Accepted(acceptance, host, time.perf_counter())

    def _keep(self, resolved: Resolved, drafted: Drafted, accepted: Accepted) -> Kept:
        """The KV keeps each request's root and accepted path (the worker's rewind); what each
        request produced: its accepted drafts and the bonus token."""
        slots, tree, answer = resolved.step.slots, drafted.tree, accepted.answer
        counts, bonus = answer.counts, answer.bonus
        # Each sequence grows by its root (the old bonus token) and the accepted drafts.
        lengths = [n + 1 + c for n, c in zip(resolved.lengths, counts, strict=True)]
        with engine_invariant("keeping the accepted path after a checked acceptance"):
            if drafted.chain:  # keep the root and the accepted prefix: one batched rewind
                self.worker.rewind_many(slots, lengths)
            else:  # copy each accepted path into place, free the other nodes
                for slot, length, path in zip(slots, resolved.lengths, answer.paths, strict=True):
                    self.worker.keep_path(slot, length, [0, *(j + 1 for j in path)])
        if drafted.chain:  # a chain's path is its first nodes: slices, and the bonus after them
            kept = [row[:c] for row, c in zip(tree.tokens, counts, strict=True)]
            at_bonus = counts
        else:
            paths = answer.paths
            kept = [[row[j] for j in p] for row, p in zip(tree.tokens, paths, strict=True)]
            at_bonus = [path[-1] + 1 if path else 0 for path in paths]
        tokens = [[*a, b] for a, b in zip(kept, bonus, strict=True)]
        return Kept(lengths, kept, at_bonus, tokens)

    def _commit_drafter(
        self,
        resolved: Resolved,
        drafted: Drafted,
        verified: Verified,
        accepted: Accepted,
        kept: Kept,
    ) -> RelayPayload:
        """``drafter.commit`` with the step's outcome (after the slot table's commit, which it
        reads); the payload it returns, checked."""
        rows = torch.arange(len(resolved.rows))
        # The target's hidden state where each bonus token was chosen: the last accepted node's.
        at_bonus = torch.tensor(kept.at_bonus, dtype=torch.int64)
        # Each request's root and accepted nodes (verify rows 0 and node + 1), zeroed past it.
        counts, dev = accepted.answer.counts, verified.hidden.device
        index = torch.zeros(len(counts), max(counts, default=0) + 1, dtype=torch.int64)
        for i, path in enumerate(accepted.answer.paths):
            index[i, 1 : len(path) + 1] = torch.tensor(path, dtype=torch.int64) + 1
        past = torch.arange(index.shape[1])[None] > torch.tensor(counts)[:, None]
        path_hidden = verified.hidden[rows[:, None].to(dev), index.to(dev)]
        outcome = StepOutcome(
            step=resolved.step,
            drafts=drafted.drafts,
            acceptance=accepted.acceptance,
            hidden=verified.hidden[rows, at_bonus],
            path_hidden=path_hidden.masked_fill(past[:, :, None].to(dev), 0.0),
        )
        answer = self._hook("drafter.commit", self.drafter.commit, outcome)
        return frozen_payload(self.algo.name, "drafter.commit", answer, len(resolved.rows))

    def _publish(
        self, resolved: Resolved, accepted: Accepted, kept: Kept, payload: RelayPayload
    ) -> None:
        """The relay gets the new lengths, the bonus tokens and the drafter's payload."""
        bonus = torch.tensor(accepted.answer.bonus, dtype=torch.int64, device=self.worker.device)
        self.relay_io.write(resolved.step.slots, kept.lengths, bonus, payload, "drafter.commit")

    def _output(
        self,
        resolved: Resolved,
        drafted: Drafted,
        verified: Verified,
        accepted: Accepted,
        kept: Kept,
        tracing: bool,
    ) -> StepOutput:
        """The step's tokens, its record and, when traced, what each request drafted."""
        lane, tree, counts = resolved.lane, drafted.tree, accepted.answer.counts
        bs, t = len(counts), lane.tokens_per_req
        # Proposed positions: a chain's depth is its length. The verifier ran T tokens per
        # request unless it verified ragged rows, then each row's drafts plus the root.
        proposed = tree.lengths if drafted.chain else _depths(tree)
        ragged = verified.ran != t * bs
        confidence = drafted.drafts.confidence
        mean = None
        if self.speculative and confidence is not None and confidence.numel():
            mean = tuple(confidence.double().mean(0).tolist())
        start, end = resolved.started, time.perf_counter()
        record = StepRecord(
            width=lane.width,
            proposed=tuple(proposed),
            accepted=tuple(counts),
            verified=tuple(n + 1 for n in tree.lengths) if ragged else (t,) * bs,
            confidence=mean,
            draft_seconds=drafted.at - start,
            verify_seconds=verified.at - drafted.at,
            accept_seconds=accepted.at - verified.at,
            seconds=end - start,
        )
        slots = list(resolved.step.slots)
        if not tracing:
            return StepOutput(slots, kept.tokens, record)
        produced = traced(kept.tokens, tree, accepted.answer.paths, lane.width)
        return StepOutput(slots, kept.tokens, record, produced)


def _depths(tree: HostTree) -> list[int]:
    """Each row's draft positions: a tree's depth (its deepest real node)."""
    out = []
    for parents, length in zip(tree.parents, tree.lengths, strict=True):
        depth = [0] * length
        for j in range(length):  # parents come before children
            depth[j] = 1 + (depth[parents[j]] if parents[j] >= 0 else 0)
        out.append(max(depth, default=0))
    return out
