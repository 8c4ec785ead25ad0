"""Continuous batching: admission by request slots and KV budget, and the sync and overlap
loops. The only module with threads.

Each step runs on the forward thread: release finished requests, one decode step for the running
ones, prefill newly admitted ones, admit PREBUILT batches. Synchronous mode waits for each step
before planning the next. Overlap mode plans step N+1 while step N's forward runs: N+1 reads N's
results only through the relay, and a request that finishes at step N may run one extra step
whose tokens are dropped (as in the engines).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TextIO

from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._requests import Request
from specstrat.runtime._slots import SlotRow, SlotTable
from specstrat.runtime._stats import RunLedger
from specstrat.runtime._step import StepRunner
from specstrat.runtime._step_types import Produced, StepOutput
from specstrat.runtime._trace import TraceWriter
from specstrat.speculation import SpeculationObservation

__all__ = ["Scheduler"]

Progress = Callable[[int, int], None]
Source = Callable[[bool], bool]


@dataclass(frozen=True, slots=True)
class _Plan:
    release: list[int]
    admit: list[tuple[Request, int]]
    running: list[int]
    prebuilt: list[tuple[TransferBatch, list[int]]]
    observed: SpeculationObservation | None = None  # what the policy sees for ``running``

    def has_work(self) -> bool:
        return bool(self.release or self.admit or self.running or self.prebuilt)


class Scheduler:
    """Queues, admission and the step loops for one engine.

    A request reserves its worst case of KV (``reserve(request)`` positions: prompt, output and
    one overlapped step) when admitted and returns it when released, so no step ever runs out of
    KV; requests wait while the pool cannot hold them. Slots and reservations are the slot
    table's (:mod:`specstrat.runtime._slots`): admitted here, on the scheduler thread, freed on
    the forward thread; the pool's free list is a Python list whose ``pop``/``append`` are
    atomic, and a stale count only delays an admission.

    The run's statistics are the ledger's (:mod:`specstrat.runtime._stats`), written on this
    thread only: :meth:`absorb` folds each step's record with the request-steps requests kept,
    :meth:`plan` takes what the speculation policy observes for the step it plans.
    """

    def __init__(
        self,
        table: SlotTable,
        steps: StepRunner,
        ledger: RunLedger,
        reserve: Callable[[Request], int],
    ) -> None:
        self.table, self.steps, self.ledger, self.reserve = table, steps, ledger, reserve
        self.waiting: deque[Request] = deque()
        self.prebuilt: deque[TransferBatch] = deque()
        self._trace: TraceWriter | None = None
        self._step_index = 0

    # -- the forward thread -------------------------------------------------------------------

    def execute(self, plan: _Plan) -> list[StepOutput]:
        """One step: release, decode the running requests, prefill, admit PREBUILT batches."""
        steps, outputs = self.steps, list[StepOutput]()
        if plan.release:
            steps.release(plan.release)
        if plan.running:
            tracing = self._trace is not None
            outputs.append(steps.decode(plan.running, plan.observed, tracing=tracing))
        if plan.admit:
            outputs.append(steps.prefill(plan.admit))
        outputs.extend(steps.admit_prebuilt(batch, slots) for batch, slots in plan.prebuilt)
        return outputs

    # -- the scheduler thread -----------------------------------------------------------------

    def plan(self, release: list[int]) -> _Plan:
        """Slots to release, requests to admit (slots allocated, KV reserved), running ones."""
        table = self.table
        table.unreserve(release)
        self.ledger.forget(release)
        running = table.running()
        admit: list[tuple[Request, int]] = []
        free = table.free_slots
        while (
            self.waiting and free > len(admit) and table.fits(need := self.reserve(self.waiting[0]))
        ):
            request = self.waiting.popleft()
            admit.append((request, table.admit(request, need, "prefill")))
        prebuilt: list[tuple[TransferBatch, list[int]]] = []
        while self.prebuilt:
            batch = self.prebuilt[0]
            requests = batch.requests()
            needs = [self.reserve(r) for r in requests]
            if table.free_slots < len(requests) or not table.fits(sum(needs)):
                break
            self.prebuilt.popleft()
            slots = [table.admit(r, n, "prebuilt") for r, n in zip(requests, needs, strict=True)]
            prebuilt.append((batch, slots))
        observed = self.ledger.observation(running) if running else None
        return _Plan(release, admit, running, prebuilt, observed)

    def _take(self, row: SlotRow, tokens: list[int]) -> list[int]:
        """Append what a step produced, cut at the budget and the first stop token; what was
        kept."""
        request, output = row.request, row.output
        kept = tokens[: max(request.max_new_tokens - len(output), 0)]
        for i, token in enumerate(kept):
            if token in request.stop_token_ids:
                kept = kept[: i + 1]
                row.finished = True
                break
        output.extend(kept)
        if len(output) >= request.max_new_tokens:
            row.finished = True
        return kept

    def absorb(self, outputs: list[StepOutput]) -> list[int]:
        """Append step outputs (stop tokens and budgets applied) and fold them into the run's
        ledger: a decode step's record counts the request-steps requests keep (a dropped
        overlapped step counts only as dropped); the slots that finished."""
        ledger, done = self.ledger, list[int]()
        step, now = self._step_index, time.perf_counter()
        self._step_index += 1
        trace, generated, kept_rids = self._trace, 0, list[str]()
        for out in outputs:
            rows, dropped = self.table.live_rows(out.slots), set[int]()
            for i, (row, tokens) in enumerate(zip(rows, out.tokens, strict=True)):
                if row is None or row.finished:  # an overlapped extra step of a finished one
                    dropped.add(i)
                    continue
                request, output = row.request, row.output
                stops = request.stop_token_ids
                if len(tokens) < request.max_new_tokens - len(output) and (
                    not stops or stops.isdisjoint(tokens)
                ):
                    output.extend(tokens)  # the common case: nothing to cut
                    kept = tokens
                else:
                    kept = self._take(row, tokens)
                    if row.finished:
                        done.append(row.slot)
                if kept:
                    generated += len(kept)
                    kept_rids.append(request.rid)
                if trace is not None:  # a prefill's record: no drafts, D = 0
                    traced = out.traced[i] if out.traced else Produced(tokens)
                    trace.write(step, row, traced, kept)
            if out.record is not None:
                ledger.fold_step(out.slots, out.record, dropped)
        ledger.fold_tokens(kept_rids, generated, now)
        return done

    def busy(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.prebuilt) or any(
            not row.finished for row in self.table.by_rid.values()
        )

    def finished(self) -> int:
        """Requests that finished."""
        return sum(row.finished for row in self.table.by_rid.values())

    def enqueue(self, request: Request) -> None:
        """Queue a request the engine checked (it fits the context and the KV pool)."""
        self.waiting.append(request)

    def enqueue_prebuilt(self, batch: TransferBatch) -> None:
        """Queue a received batch the engine checked; admitted whole when it fits."""
        self.prebuilt.append(batch)

    def take_outputs(self, rids: list[str]) -> dict[str, list[int]]:
        """The outputs of finished requests ``rids``, forgotten here."""
        return self.table.take_outputs(rids)

    def reset(self) -> None:
        """Forget every request (after a failed run; the engine resets the pools)."""
        self.table.reset()
        self.waiting.clear()
        self.prebuilt.clear()

    # -- loops --------------------------------------------------------------------------------

    def run(
        self, source: Source, progress: Progress | None, *, overlap: bool, trace: TextIO | None
    ) -> None:
        """Run until nothing waits, runs, or may still come, in sync or overlap mode;
        ``trace`` gets one JSON line per step and request."""
        self._trace = TraceWriter(trace) if trace is not None else None
        try:
            if overlap:
                self._run_overlap(source, progress)
            else:
                self._run_sync(source, progress)
        finally:
            self._trace = None

    def _run_sync(self, source: Source, progress: Progress | None) -> None:
        """Plan, execute, absorb, until nothing waits, runs, or may still come."""
        more = source(not self.busy())
        release: list[int] = []
        while self.busy() or more:
            plan = self.plan(release)
            release = self.absorb(self.execute(plan)) if plan.has_work() else []
            self._report(progress)
            if more:
                more = source(not self.busy())
        self.execute(self.plan(release))

    def _run_overlap(self, source: Source, progress: Progress | None) -> None:
        """As :meth:`_run_sync`, with step N+1 planned and started before N is absorbed."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specstrat-forward") as pool:
            release: list[int] = []
            pending: Future[list[StepOutput]] | None = None
            more = source(not self.busy())
            while pending is not None or self.busy() or more:
                plan = self.plan(release)
                release = []
                if pending is not None:
                    produced = pending.result()  # step N done
                    pending = pool.submit(self.execute, plan) if plan.has_work() else None
                    release = self.absorb(produced)  # ... while N's results are absorbed
                elif plan.has_work():
                    pending = pool.submit(self.execute, plan)
                self._report(progress)
                if more:
                    more = source(pending is None and not self.busy())
            self.execute(self.plan(release))

    def _report(self, progress: Progress | None) -> None:
        if progress is not None:
            progress(self.finished(), len(self.table.by_rid) + len(self.waiting))
