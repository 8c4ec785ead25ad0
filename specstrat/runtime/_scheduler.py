"""Continuous batching: admission by request slots and KV budget, and the sync and overlap
loops. The only module with threads.

Each step runs on the forward thread: release finished requests, one decode step for the running
ones, prefill newly admitted ones, admit PREBUILT batches. Synchronous mode waits for each step
before planning the next. Overlap mode plans step N+1 while step N's forward runs: N+1 reads N's
results only through the relay, and a request that finishes at step N may run one extra step
whose tokens are dropped (as in the engines).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TextIO

from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._requests import Request, RunStats
from specstrat.runtime._slots import SlotRow, SlotTable
from specstrat.runtime._step import Produced, StepOutput, StepRunner, VerifyCount

__all__ = ["Scheduler"]

Progress = Callable[[int, int], None]
Source = Callable[[bool], bool]


@dataclass(frozen=True, slots=True)
class _Plan:
    release: list[int]
    admit: list[tuple[Request, int]]
    running: list[int]
    prebuilt: list[tuple[TransferBatch, list[int]]]

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
    """

    def __init__(
        self,
        table: SlotTable,
        steps: StepRunner,
        stats: RunStats,
        reserve: Callable[[Request], int],
    ) -> None:
        self.table, self.steps, self.stats, self.reserve = table, steps, stats, reserve
        self.waiting: deque[Request] = deque()
        self.prebuilt: deque[TransferBatch] = deque()
        self._trace: TextIO | None = None
        self._step_index = 0

    # -- the forward thread -------------------------------------------------------------------

    def execute(self, plan: _Plan) -> list[StepOutput]:
        """One step: release, decode the running requests, prefill, admit PREBUILT batches."""
        steps, outputs = self.steps, list[StepOutput]()
        if plan.release:
            steps.release(plan.release)
        if plan.running:
            outputs.append(steps.decode(plan.running, tracing=self._trace is not None))
        if plan.admit:
            outputs.append(steps.prefill(plan.admit))
        outputs.extend(steps.admit_prebuilt(batch, slots) for batch, slots in plan.prebuilt)
        return outputs

    # -- the scheduler thread -----------------------------------------------------------------

    def plan(self, release: list[int]) -> _Plan:
        """Slots to release, requests to admit (slots allocated, KV reserved), running ones."""
        table = self.table
        table.unreserve(release)
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
        return _Plan(release, admit, running, prebuilt)

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
        """Append step outputs (stop tokens and budgets applied), count the verify statistics
        of the steps requests keep (a dropped overlapped step counts only as dropped); the
        slots that finished."""
        stats, done = self.stats, list[int]()
        step, now = self._step_index, time.perf_counter()
        self._step_index += 1
        counts, made, generated = list[VerifyCount](), 0, 0
        for out in outputs:
            rows, kept_rids, dropped = self.table.live_rows(out.slots), list[str](), set[int]()
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
                if self._trace is not None:  # a prefill's record: no drafts, D = 0
                    traced = out.traced[i] if out.traced else Produced(tokens)
                    self._write_trace(step, row, traced, kept)
            if out.verify is not None:  # counted only for steps a request keeps
                verify, tokens_of = out.verify, out.tokens
                if dropped:
                    verify = [v for i, v in enumerate(verify) if i not in dropped]
                    tokens_of = [t for i, t in enumerate(tokens_of) if i not in dropped]
                counts.extend(verify)
                made += sum(map(len, tokens_of))
            stats.dropped_steps += len(dropped)
            for rid in kept_rids:
                stats.first_token_at.setdefault(rid, now)
            stats.last_token_at.update(dict.fromkeys(kept_rids, now))
        stats.generated_tokens += generated
        if counts:
            proposed, accepted, widths = zip(*counts, strict=True)
            stats.count_verified(list(proposed), list(accepted), made, sum(widths))
        return done

    def _write_trace(self, step: int, row: SlotRow, result: Produced, kept: list[int]) -> None:
        record = {
            "step": step,
            "rid": row.request.rid,
            "width": result.width,  # the step's D (0 for a prefill)
            "drafts": list(result.drafts),
            "parents": list(result.parents),
            "accepted": list(result.accepted),
            "tokens": kept,  # what the request kept (cut at its budget or stop)
            "stop": row.finished
            and bool(row.output)
            and row.output[-1] in row.request.stop_token_ids,
        }
        assert self._trace is not None
        self._trace.write(json.dumps(record) + "\n")

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
        self._trace = trace
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
