"""One scheduler step on the forward thread: prefill, PREBUILT admission, or one decode step.

A decode step reads top to bottom — the step's D from the speculation policy (its lane: verify
width, tree, buckets), then resolve -> draft -> verify -> accept -> commit — with one
collaborator per stage: the relay (the algorithm's FutureMap), the drafter, the verifier, the
acceptance rule, then the worker (KV rewind) and the relay again. Sequence lengths come from the
worker's request pool, their one owner: the step publishes what the pool holds after the rewind,
and checks what the relay resolves against it. Every hook call goes through
:func:`~specstrat.runtime._guard.call_hook`, and what a hook returns is checked against its
contract (:mod:`specstrat.contracts`) before anything uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, ParamSpec, TypeVar

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.contracts import HostAcceptance, HostTree, hook_error
from specstrat.drafting import (
    GREEDY,
    Acceptance,
    DraftAdmission,
    DraftStep,
    DraftTree,
    StepOutcome,
    VerifyInputs,
)
from specstrat.errors import InternalError, InvalidConfig
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE
from specstrat.protocols import Drafter, FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime._adapt import WidthControl, WidthLane
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._answers import copy_tree, frozen_acceptance, frozen_drafts, frozen_payload
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._guard import call_hook
from specstrat.runtime._requests import Request, RunStats
from specstrat.runtime._slots import SlotRow, SlotTable
from specstrat.runtime._step_relay import StepRelay
from specstrat.runtime._worker import ModelWorker
from specstrat.sampling import SamplingBatch, choose_tokens

__all__ = ["Produced", "StepOutput", "StepRunner", "VerifyCount"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class VerifyCount(NamedTuple):
    """One request's verify step, for :meth:`RunStats.count_verified`: draft positions
    proposed (the tree's depth), how many the rule accepted, and the target tokens its verify
    row held (a tuple: one is made per request per step)."""

    proposed: int
    accepted: int
    width: int


@dataclass(frozen=False, slots=True)
class StepOutput:
    """What one prefill, PREBUILT admission or decode step produced, per request in ``slots``'
    order (parallel lists, built with list operations: nothing is made per request that the
    scheduler does not need): the tokens, the verify statistics (``None`` outside a
    speculative decode step; the scheduler counts them only for requests that keep the step),
    the step's D (0 for a prefill or an admission) and, when the run is traced, what each
    request drafted (:class:`Produced`)."""

    slots: list[int]
    tokens: list[list[int]]
    verify: list[VerifyCount] | None = None
    width: int = 0
    traced: list[Produced] | None = None


@dataclass(frozen=True, slots=True)
class Produced:
    """A traced step's record for one request: its tokens, its verify statistics, what was
    drafted (tokens, parents), which nodes were accepted and the step's D."""

    tokens: list[int]
    drafts: Sequence[int] = ()
    parents: Sequence[int] = ()
    accepted: Sequence[int] = ()
    verify: VerifyCount | None = None
    width: int = 0  # the step's D (traced)


class StepRunner:
    """Runs prefill, PREBUILT admission and decode steps for one engine, on the forward thread."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        worker: ModelWorker,
        drafter: Drafter[Any],
        control: WidthControl,
        relay: FutureMap,
        stats: RunStats,
        table: SlotTable,
    ) -> None:
        self.algo, self.worker, self.drafter = algo, worker, drafter
        self.control, self.relay, self.stats = control, relay, stats
        self.table = table
        self.vocab = worker.shape.vocab_size
        self.relay_io = StepRelay(algo.name, relay, worker.device)

    def _hook(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return call_hook(self.algo.name, hook, fn, *args, **kwargs)

    def _slots(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.worker.device)

    def _lengths(self, slots: Sequence[int]) -> list[int]:
        """Sequence lengths: the committed tokens the slot table holds."""
        return self.table.lengths(slots)

    def _admit_drafter(self, admission: DraftAdmission[Any]) -> RelayPayload:
        payload = self._hook("drafter.admit", self.drafter.admit, admission)
        return frozen_payload(self.algo.name, "drafter.admit", payload, len(admission.slots))

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
        self.control.forget(slots)
        for slot in slots:
            self.worker.free_request(slot)

    # -- admission ----------------------------------------------------------------------------

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> StepOutput:
        """EXTEND over the prompts, the first token of each, and the drafter's admission."""
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        with _engine_invariant("prefill"):
            logits, hidden = self.worker.forward(ForwardMode.EXTEND, slots, prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.worker.device)
        ends = lens.cumsum(0) - 1
        params = tuple(req.sampling for req, _ in admit)
        sampling = SamplingBatch.of(params, self.worker.device)
        first, _ = choose_tokens(logits[ends], sampling, lens, DRAW_SAMPLE)
        tokens = first.tolist()  # before the drafter sees them: it gets a copy
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), bonus_tokens=first.clone(), seq_lens=lens, hidden=hidden[ends],
            draft_input=None, sampling=params,
        )  # fmt: skip
        self.table.start(slots, prompts, tokens)  # the drafter's admit reads the prompts
        payload = self._admit_drafter(admission)
        self.relay_io.write(slots, self._lengths(slots), first, payload, "drafter.admit")
        return StepOutput(slots, [[t] for t in tokens])

    def admit_prebuilt(self, batch: TransferBatch, slots: list[int]) -> StepOutput:
        """Install the transferred KV, call ``algo.build_disagg_draft_input`` (which relays the
        first tokens and its draft state itself), then ``drafter.admit`` with what it returned
        (``None``: no draft state; the first step decodes plainly from the first tokens)."""
        offset = 0
        for slot, prompt in zip(slots, batch.prompts, strict=True):
            end = offset + len(prompt)
            self.worker.admit_prebuilt(slot, prompt, batch.k[:, offset:end], batch.v[:, offset:end])
            offset = end
        dev = self.worker.device
        first = batch.bonus_tokens.tolist()  # before any hook sees them: each gets a copy
        self.table.start(slots, batch.prompts, first)
        seq_lens = torch.tensor(self._lengths(slots), dtype=torch.int64, device=dev)
        payload = batch.payload
        prebuilt = PrebuiltBatch(
            rids=batch.rids, slots=self._slots(slots), seq_lens=seq_lens,
            topk_p=payload.topk_p, topk_index=payload.topk_index,
            hidden_states=payload.hidden_states, device=dev,
        )  # fmt: skip
        draft_input = self._hook(
            "disagg.build_disagg_draft_input",
            self.algo.build_disagg_draft_input,
            prebuilt,
            batch.bonus_tokens.to(dev, copy=True),
            self.relay,
        )
        self.relay_io.built(slots)
        params = batch.sampling or (GREEDY,) * len(slots)
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), bonus_tokens=batch.bonus_tokens.to(dev, copy=True),
            seq_lens=seq_lens.clone(), hidden=None, draft_input=draft_input,
            sampling=tuple(params),
        )  # fmt: skip
        extra = self._admit_drafter(admission)
        if extra.present():
            self.relay_io.stash(slots, extra, "drafter.admit")
        return StepOutput(list(slots), [[t] for t in first])

    # -- decode -------------------------------------------------------------------------------

    def decode(self, slots: list[int], *, tracing: bool = False) -> StepOutput:
        """One decode step for the running requests ``slots`` (``tracing``: record drafts).

        What a hook returns is copied the moment it returns and checked on the copy; only the
        copy is used after (:mod:`specstrat.runtime._answers`), and what a hook is handed is a
        copy the step does not read back. So a hook that later writes into a tensor it
        returned or was given cannot change the step's tokens.
        """
        start = time.perf_counter()
        lane = self.control.choose(slots)  # the step's D, before anything changes
        step, host = self._resolve(slots, lane)
        host.width = lane.width
        drafts, host.tree = self._draft(step)
        host.chain = host.tree.is_chain()
        drafted = time.perf_counter()
        last = torch.tensor(host.last, dtype=torch.int64, device=self.worker.device)
        with _engine_invariant("verify"):
            logits, hidden, ran = lane.verifier.verify(
                slots, last, drafts, chain=host.chain, lengths=host.tree.lengths
            )
        verified = time.perf_counter()
        acceptance, host.answer = self._accept(drafts, host, logits, step)
        accepted = time.perf_counter()
        counts = self._verify_counts(host, ran, lane) if self.algo.is_speculative() else None
        produced = self._commit(step, drafts, acceptance, hidden, host, tracing, counts)
        stats, end = self.stats, time.perf_counter()
        stats.decode_steps += 1
        stats.draft_seconds += drafted - start
        stats.verify_seconds += verified - drafted
        stats.accept_seconds += accepted - verified
        stats.decode_seconds += end - start
        proposed = [c.proposed for c in counts] if counts else [0] * len(slots)
        self.control.record(
            lane, slots, proposed, host.answer.counts, drafts.confidence, end - start
        )
        return produced

    def _verify_counts(self, host: _HostStep, ran: int, lane: WidthLane) -> list[VerifyCount]:
        """Each request's verify statistics. The verifier ran ``T`` tokens per request (the
        step's D's) unless it verified ragged rows, then each row's drafts plus the root
        (``ran`` tells which)."""
        tree, t = host.tree, lane.tokens_per_req
        uniform = ran == t * len(tree.lengths)
        depths = tree.lengths if host.chain else _depths(tree)  # a chain's depth is its length
        widths = [t] * len(depths) if uniform else [n + 1 for n in tree.lengths]
        return list(map(VerifyCount._make, zip(depths, host.answer.counts, widths, strict=True)))

    def _resolve(self, slots: list[int], lane: WidthLane) -> tuple[DraftStep, _HostStep]:
        rows = self.table.rows(slots)
        host = _HostStep(rows, [len(r.committed) for r in rows], [r.bonus for r in rows])
        relay = self.relay_io.resolve(slots, host.lengths, host.last)
        assert relay.bonus_tokens is not None  # resolve refused a relay without them
        step = DraftStep(
            slots=tuple(slots),
            bonus_tokens=relay.bonus_tokens,
            seq_lens=torch.tensor(host.lengths, dtype=torch.int64),
            payload=relay,
            max_nodes=lane.max_nodes,
            sampling=tuple(r.request.sampling for r in rows),
            tree=lane.tree,
        )
        return step, host

    def _draft(self, step: DraftStep) -> tuple[DraftTree, HostTree]:
        hook = "drafter.propose"
        answer = self._hook(hook, self.drafter.propose, step)
        drafts, tree = frozen_drafts(
            self.algo.name, answer, bs=len(step.slots), max_nodes=step.max_nodes,
            vocab=self.vocab, device=self.worker.device,
        )  # fmt: skip
        if tree.is_chain():
            return drafts, tree
        if step.shape.is_chain:
            raise hook_error(
                self.algo.name, hook, "proposed a tree that is not a chain, but "
                f"tree={type(self.algo.tree).__name__} asks for a chain (topk 1); compose the "
                "algorithm with tree=TopkTree(topk=..., num_steps=...) to verify trees"
            )  # fmt: skip
        depth = tree.depth()
        if depth > step.shape.num_steps:
            raise hook_error(
                self.algo.name, hook, f"proposed a tree {depth} nodes deep, but "
                f"tree={type(self.algo.tree).__name__} allows num_steps="
                f"{step.shape.num_steps}"
            )  # fmt: skip
        return drafts, tree

    def _accept(
        self, drafts: DraftTree, host: _HostStep, logits: torch.Tensor, step: DraftStep
    ) -> tuple[Acceptance, HostAcceptance]:
        inputs = VerifyInputs(
            drafts=copy_tree(drafts),  # the rule's own copy: the drafter's commit gets `drafts`
            logits=logits[:, : drafts.num_nodes + 1],
            positions=torch.tensor(host.lengths, dtype=torch.int64),
            sampling=step.sampling,
        )
        answer = self._hook("acceptance.accept", self.algo.acceptance.accept, inputs)
        return frozen_acceptance(
            self.algo.name, answer, drafts, host.tree, vocab=self.vocab, device=self.worker.device
        )

    def _commit(
        self,
        step: DraftStep,
        drafts: DraftTree,
        acceptance: Acceptance,
        hidden: torch.Tensor,
        host: _HostStep,
        tracing: bool,
        counts: list[VerifyCount] | None,
    ) -> StepOutput:
        paths, counts_accepted = host.answer.paths, host.answer.counts
        bonus_list, tree = host.answer.bonus, host.tree
        # Each sequence grows by its root (the old bonus token) and the accepted drafts.
        lengths = [n + 1 + c for n, c in zip(host.lengths, counts_accepted, strict=True)]
        with _engine_invariant("keeping the accepted path after a checked acceptance"):
            if host.chain:  # keep the root and the accepted prefix: one batched rewind
                self.worker.rewind_many(step.slots, lengths)
            else:  # move each accepted path into place, free the other nodes
                for slot, length, path in zip(step.slots, host.lengths, paths, strict=True):
                    self.worker.keep_path(slot, length, [0, *(j + 1 for j in path)])
        if host.chain:  # a chain's path is its first nodes: slices, and the bonus after them
            accepted = [row[:c] for row, c in zip(tree.tokens, counts_accepted, strict=True)]
            at_bonus = counts_accepted
        else:
            accepted = [[row[j] for j in p] for row, p in zip(tree.tokens, paths, strict=True)]
            at_bonus = [path[-1] + 1 if path else 0 for path in paths]
        self.table.commit(host.rows, accepted, bonus_list)  # what the drafter's commit reads
        # The target's hidden state where each bonus token was chosen: the last accepted node's.
        rows = torch.arange(len(step.slots))
        outcome = StepOutcome(
            step=step,
            drafts=drafts,
            acceptance=acceptance,
            hidden=hidden[rows, torch.tensor(at_bonus, dtype=torch.int64)],
        )
        answer = self._hook("drafter.commit", self.drafter.commit, outcome)
        payload = frozen_payload(self.algo.name, "drafter.commit", answer, len(step.slots))
        bonus = torch.tensor(bonus_list, dtype=torch.int64, device=self.worker.device)
        self.relay_io.write(step.slots, lengths, bonus, payload, "drafter.commit")
        tokens = [[*a, b] for a, b in zip(accepted, bonus_list, strict=True)]
        output = StepOutput(list(step.slots), tokens, counts, host.width)
        if tracing:
            verify: Sequence[VerifyCount | None] = counts or [None] * len(step.slots)
            output.traced = [
                Produced(
                    tokens[i],
                    tree.tokens[i][: tree.lengths[i]],
                    tree.parents[i][: tree.lengths[i]],
                    paths[i],
                    verify[i],
                    host.width,
                )
                for i in range(len(step.slots))
            ]
        return output


def _depths(tree: HostTree) -> list[int]:
    """Each row's draft positions: a tree's depth (its deepest real node)."""
    out = []
    for parents, length in zip(tree.parents, tree.lengths, strict=True):
        depth = [0] * length
        for j in range(length):  # parents come before children
            depth[j] = 1 + (depth[parents[j]] if parents[j] >= 0 else 0)
        out.append(max(depth, default=0))
    return out


@contextmanager
def _engine_invariant(what: str) -> Iterator[None]:
    """The engine's own calls with values it checked or reserved (admission reserved every
    position, the hooks' answers were checked): an InvalidConfig there is a broken invariant
    of specstrat, not a value the caller passed."""
    try:
        yield
    except InvalidConfig as exc:
        raise InternalError(
            f"{what} refused values the engine checked before ({exc}); this is a bug in "
            "specstrat, please report it"
        ) from exc


@dataclass(frozen=False, slots=True)
class _HostStep:
    """Host copies of what one decode step decided, taken as each stage's answer is checked:
    the slots' rows, their lengths and bonus tokens, the tree (and whether it is a chain) and
    the acceptance."""

    rows: list[SlotRow]
    lengths: list[int]
    last: list[int]
    chain: bool = True
    width: int = 0  # the step's D
    tree: HostTree = field(default_factory=lambda: HostTree([], [], []))
    answer: HostAcceptance = field(default_factory=lambda: HostAcceptance([], [], []))
