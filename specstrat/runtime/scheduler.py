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
from dataclasses import dataclass, field
from typing import TextIO

from specstrat.runtime.admission import TransferBatch
from specstrat.runtime.requests import Request, RunStats
from specstrat.runtime.step import Produced, StepRunner
from specstrat.runtime.worker import ModelWorker

__all__ = ["Scheduler"]

Progress = Callable[[int, int], None]
Source = Callable[[bool], bool]


@dataclass(frozen=False, slots=True)
class _Live:
    request: Request
    slot: int
    reserved: int
    output: list[int] = field(default_factory=list)
    finished: bool = False
    released: bool = False


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

    A request reserves its worst case of KV (``reserve(request)`` token slots: prompt, output and
    one overlapped step) when admitted and returns it when released, so no step ever runs out of
    KV; requests wait while the pool cannot hold them. Request slots are allocated here, on the
    scheduler thread, and freed on the forward thread; the pool's free list is a Python list
    whose ``pop``/``append`` are atomic, and a stale count only delays an admission.
    """

    def __init__(
        self,
        worker: ModelWorker,
        steps: StepRunner,
        stats: RunStats,
        reserve: Callable[[Request], int],
    ) -> None:
        self.worker, self.steps, self.stats, self.reserve = worker, steps, stats, reserve
        self.waiting: deque[Request] = deque()
        self.prebuilt: deque[TransferBatch] = deque()
        self.live: dict[str, _Live] = {}
        self.reserved = 0
        self._trace: TextIO | None = None
        self._step_index = 0

    # -- the forward thread -------------------------------------------------------------------

    def execute(self, plan: _Plan) -> dict[int, Produced]:
        """One step: release, decode the running requests, prefill, admit PREBUILT batches."""
        steps = self.steps
        if plan.release:
            steps.release(plan.release)
        tracing = self._trace is not None
        produced = steps.decode(plan.running, tracing=tracing) if plan.running else {}
        if plan.admit:
            produced.update(steps.prefill(plan.admit))
        for batch, slots in plan.prebuilt:
            produced.update(steps.admit_prebuilt(batch, slots))
        return produced

    # -- the scheduler thread -----------------------------------------------------------------

    def _fits(self, need: int) -> bool:
        return self.reserved + need <= self.worker.kv.capacity

    def plan(self, release: list[int]) -> _Plan:
        """Slots to release, requests to admit (slots allocated, KV reserved), running ones."""
        for live in self.live.values():
            if live.finished and not live.released and live.slot in release:
                live.released = True
                self.reserved -= live.reserved
        running = [live.slot for live in self.live.values() if not live.finished]
        admit: list[tuple[Request, int]] = []
        free = self.worker.requests.available
        while (
            self.waiting and free > len(admit) and self._fits(need := self.reserve(self.waiting[0]))
        ):
            request = self.waiting.popleft()
            slot = self.worker.requests.alloc()
            self.live[request.rid] = _Live(request, slot, need)
            self.reserved += need
            admit.append((request, slot))
        prebuilt: list[tuple[TransferBatch, list[int]]] = []
        while self.prebuilt:
            batch = self.prebuilt[0]
            requests = batch.requests()
            needs = [self.reserve(r) for r in requests]
            if self.worker.requests.available < len(requests) or not self._fits(sum(needs)):
                break
            self.prebuilt.popleft()
            slots = [self.worker.requests.alloc() for _ in requests]
            for request, slot, need in zip(requests, slots, needs, strict=True):
                self.live[request.rid] = _Live(request, slot, need)
                self.reserved += need
            prebuilt.append((batch, slots))
        return _Plan(release, admit, running, prebuilt)

    def _take(self, live: _Live, tokens: list[int]) -> list[int]:
        """Append what a step produced, up to the budget and the first stop token; what was
        kept."""
        request = live.request
        room = request.max_new_tokens - len(live.output)
        kept = tokens[: max(room, 0)]
        for i, token in enumerate(kept):
            if token in request.stop_token_ids:
                kept = kept[: i + 1]
                live.finished = True
                break
        live.output.extend(kept)
        self.stats.generated_tokens += len(kept)
        if len(live.output) >= request.max_new_tokens:
            live.finished = True
        return kept

    def absorb(self, produced: dict[int, Produced]) -> list[int]:
        """Append step outputs (stop tokens and budgets applied); the slots that finished."""
        by_slot = {live.slot: live for live in self.live.values() if not live.finished}
        done: list[int] = []
        step = self._step_index
        self._step_index += 1
        now = time.perf_counter()
        stats = self.stats
        for slot, result in produced.items():
            live = by_slot.get(slot)
            if live is None:  # an overlapped extra step of a finished request: dropped
                stats.dropped_steps += 1
                continue
            if result.verify is not None:  # counted only for steps a request keeps
                v = result.verify
                stats.count_verify(v.proposed, v.accepted, len(result.tokens), v.width)
            kept = self._take(live, result.tokens)
            if kept:
                stats.first_token_at.setdefault(live.request.rid, now)
                stats.last_token_at[live.request.rid] = now
            if live.finished:
                done.append(slot)
            if self._trace is not None:
                record = {
                    "step": step,
                    "rid": live.request.rid,
                    "drafts": list(result.drafts),
                    "parents": list(result.parents),
                    "accepted": list(result.accepted),
                    "tokens": kept,  # what the request kept (cut at its budget or stop)
                    "stop": live.finished
                    and bool(live.output)
                    and live.output[-1] in live.request.stop_token_ids,
                }
                self._trace.write(json.dumps(record) + "\n")
        return done

    def busy(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.prebuilt) or any(
            not live.finished for live in self.live.values()
        )

    def finished(self) -> int:
        """Requests that finished."""
        return sum(live.finished for live in self.live.values())

    def enqueue(self, request: Request) -> None:
        """Queue a request the engine checked (it fits the context and the KV pool)."""
        self.waiting.append(request)

    def enqueue_prebuilt(self, batch: TransferBatch) -> None:
        """Queue a received batch the engine checked; admitted whole when it fits."""
        self.prebuilt.append(batch)

    def take_outputs(self, rids: list[str]) -> dict[str, list[int]]:
        """The outputs of finished requests ``rids``, forgotten here."""
        return {rid: self.live.pop(rid).output for rid in rids}

    def reset(self) -> None:
        """Forget every request (after a failed run; the engine resets the pools)."""
        self.live.clear()
        self.waiting.clear()
        self.prebuilt.clear()
        self.reserved = 0

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
            pending: Future[dict[int, Produced]] | None = None
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
            progress(self.finished(), len(self.live) + len(self.waiting))
