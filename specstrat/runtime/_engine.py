"""The plain scheduler's public face: build an engine for one algorithm, submit, run.

:class:`Engine` wires the components: the target's worker, the relay from
``algo.create_future_map`` (on in both modes, as SGLang 0.5.23's always-on FutureMap), the
drafter from ``algo.drafter.create_drafter``, the verifier (graph buckets, eager, ragged), the
step runner and the scheduler. It never asks which algorithm it runs.

A run is all or nothing for the engine: if anything fails mid-run (a hook raising, an interrupt),
every request slot and all KV are released, the exception propagates, and the engine refuses
further use with :class:`~specstrat.errors.EngineStateError` — it never continues with state a
failed step may have half-changed. One ``run`` at a time: a concurrent call is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import DrafterContext
from specstrat.errors import (
    DisaggError,
    EngineStateError,
    InvalidConfig,
)
from specstrat.models import BlockKV, CausalLM, DraftKV, LoadedModels
from specstrat.protocols import Drafter, FutureMap
from specstrat.runtime._adapt import WidthControl, build_lanes
from specstrat.runtime._admission import TransferBatch, check_transfer
from specstrat.runtime._engine_args import check_algorithm, check_models, check_run_arguments
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._kv_runner import BlockKVRunner, KVRunner
from specstrat.runtime._policy import check_same_tokens_per_req, create_drafter
from specstrat.runtime._requests import EngineConfig, Request, RunStats
from specstrat.runtime._reservation import kv_reservation
from specstrat.runtime._scheduler import Progress, Scheduler, Source
from specstrat.runtime._slots import SlotTable
from specstrat.runtime._stats import RunLedger
from specstrat.runtime._step import StepRunner
from specstrat.runtime._worker import ModelWorker

__all__ = ["Engine"]


class Engine:
    """Runs one algorithm on loaded models: :meth:`submit` requests, then :meth:`run`.

    ``algo`` is a :class:`~specstrat.algorithm.SpecAlgorithm` or a registered name; ``models``
    any :class:`~specstrat.models.LoadedModels` (``EmbeddedModels.load()``, or a
    :class:`~specstrat.models.ModelSet` of your own torch modules).
    """

    def __init__(
        self,
        algo: SpecAlgorithm[Any] | str,
        models: LoadedModels,
        config: EngineConfig | None = None,
    ) -> None:
        self.algo = algo = check_algorithm(algo)
        self.models = models = check_models(models)
        if config is not None and not isinstance(config, EngineConfig):
            raise InvalidConfig(f"config={config!r}; pass a specstrat.runtime.EngineConfig")
        self.config = cfg = config or EngineConfig()
        if cfg.overlap and not algo.capabilities.supports_overlap:
            raise InvalidConfig(
                f"algorithm {algo.name} has supports_overlap=False; run it with "
                "EngineConfig(overlap=False)"
            )
        # One lane per candidate D of the speculation policy; sized for the largest. The KV a
        # request reserves past prompt and output is the public kv_reservation's answer.
        reservation = kv_reservation(algo, cfg.num_draft_tokens, context_len=cfg.context_len)
        widths = reservation.widths
        self._top = widths[-1]
        self.tokens_per_req = reservation.tokens_per_req
        self._target = ModelWorker(
            models.target,
            max_running_requests=cfg.max_running_requests,
            context_len=cfg.context_len,
            max_total_tokens=cfg.kv_tokens,
        )
        self._workers = [self._target]
        self._table = SlotTable(self._target.requests, self._target.kv.capacity)
        self.tree = reservation.tree
        self._margin = reservation.margin
        columns = " + tree columns" if reservation.tree_columns else ""
        self._margin_label = f"2*T{columns} ({self._margin})"
        self.stats = RunStats()  # before the drafter: its draft-worker verify forwards count here
        self._drafter = self._create_drafter()
        lanes = build_lanes(algo, cfg, self._target, widths, self.tree)
        self._graph_runner = lanes[self._top].verifier.graph_runner
        self._relay: FutureMap = self._init_overlap(self._target.device)
        control = WidthControl(algo, lanes, cfg.num_draft_tokens)
        self._steps = StepRunner(
            algo,
            self._target,
            self._drafter,
            control,
            self._relay,
            self._table,
            cfg.chunked_prefill_size,
        )
        ledger = RunLedger(
            self.stats,
            control.candidates,
            control.depth,
            observes=control.chooser is not None,
            per_request=control.per_request,
        )
        self._scheduler = Scheduler(self._table, self._steps, ledger, self._reserve)
        self._rids: set[str] = set()
        self._this_run: list[str] = []
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._closed: str | None = None

    # -- construction -------------------------------------------------------------------------

    def _new_worker(self, model: CausalLM) -> ModelWorker:
        """A worker for a drafter's model, sized like the target's pools."""
        cfg = self.config
        worker = ModelWorker(
            model,
            max_running_requests=cfg.max_running_requests,
            context_len=cfg.context_len,
            max_total_tokens=cfg.kv_tokens,
        )
        self._workers.append(worker)
        return worker

    def _new_runner(self, model: CausalLM) -> DraftKV:
        """A KV runner for a drafter's model: a draft pool of the slot table."""
        return KVRunner(self._new_worker(model), self._table)

    def _new_block_runner(self, model: CausalLM) -> BlockKV:
        """A KV runner that also runs TARGET_VERIFY on the draft worker, through a draft-worker
        graph runner (which refuses a policy without ``supports_target_verify_for_draft``)."""
        algo, cfg, worker = self.algo, self.config, self._new_worker(model)
        graphs = GraphRunner(
            worker, algo, self._top, is_draft_worker=True, buckets=cfg.graph_buckets
        )
        checked = algo.get_num_tokens_per_req_for_target_verify(self._top, True)
        check_same_tokens_per_req(
            algo, True, "when its graph runner was built", graphs.tokens_per_req, checked
        )
        self.stats.draft_worker_tokens_per_req = graphs.tokens_per_req

        def counted() -> None:
            self.stats.draft_worker_verify_forwards += 1

        return BlockKVRunner(
            worker,
            self._table,
            graphs.tokens_per_req,
            graphs=graphs if cfg.use_graph_runner else None,
            on_verify=counted,
        )

    def _create_drafter(self) -> Drafter[Any]:
        algo, cfg = self.algo, self.config
        context = DrafterContext(
            models=self.models,
            new_kv_runner=self._new_runner,
            target_tokens=self._table.tokens,
            num_draft_tokens=self._top,
            max_running_requests=cfg.max_running_requests,
            context_len=cfg.context_len,
            device=self._target.device,
            tree=self.tree,
            new_block_runner=self._new_block_runner,
            verify_tokens_per_req=self.tokens_per_req,
        )
        return create_drafter(algo, context)

    def _init_overlap(self, device: torch.device) -> FutureMap:
        """The relay between steps, from the algorithm's future-map strategy."""
        cfg = self.config
        return self.algo.create_future_map(
            cfg.max_running_requests, cfg.chunked_prefill_size, cfg.context_len, device
        )

    # -- resources ----------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the target model runs."""
        return self._target.device

    @property
    def free_slots(self) -> int:
        """Free request slots over every model this engine runs (target and drafters')."""
        return sum(w.requests.available for w in self._workers)

    @property
    def free_kv_tokens(self) -> int:
        """Free KV indices over every model this engine runs."""
        return sum(w.kv.available for w in self._workers)

    def _reserve(self, request: Request) -> int:
        """KV positions a request may occupy: prompt, output and the margin of
        :func:`~specstrat.runtime.kv_reservation` (``KVReservation.for_request``)."""
        return len(request.prompt) + request.max_new_tokens + self._margin

    # -- submission ---------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed is not None:
            raise EngineStateError(
                f"{what}: this engine was closed after a failed run ({self._closed}); its "
                "requests were released; create a new Engine"
            )
        if self._owner is not None and self._owner != threading.get_ident():
            raise EngineStateError(
                f"{what}: run() is in progress on another thread; one run at a time per engine"
            )
        if what == "run" and self._owner is not None:
            raise EngineStateError(
                "run: run() is already in progress on this thread (called again from a hook, "
                "a source or a progress callback); one run at a time per engine"
            )

    def _check_request(self, request: object) -> Request:
        if not isinstance(request, Request):
            raise InvalidConfig(f"request={request!r}; pass a specstrat.runtime.Request")
        if request.rid in self._rids:
            raise InvalidConfig(f"request id {request.rid!r} was already submitted")
        vocab = self._target.shape.vocab_size
        if max(request.prompt) >= vocab:
            raise InvalidConfig(
                f"request {request.rid!r}: prompt token {max(request.prompt)} is outside the "
                f"target's vocabulary 0..{vocab - 1}"
            )
        need, cfg = self._reserve(request), self.config
        if need > cfg.context_len:
            raise InvalidConfig(
                f"request {request.rid!r}: prompt ({len(request.prompt)}) + max_new_tokens "
                f"({request.max_new_tokens}) + {self._margin_label} = {need} exceeds "
                f"context_len={cfg.context_len}; shorten the prompt or the output"
            )
        if need > self._target.kv.capacity:
            raise InvalidConfig(
                f"request {request.rid!r} needs {need} KV indices > max_total_tokens="
                f"{self._target.kv.capacity}; raise max_total_tokens"
            )
        return request

    def submit(self, request: Request) -> None:
        """Queue a request; a bad one is refused (InvalidConfig) before anything changes."""
        self._check_open("submit")
        self._enqueue(self._check_request(request))

    def _enqueue(self, request: Request) -> None:
        self._scheduler.enqueue(request)
        self._rids.add(request.rid)
        self._this_run.append(request.rid)

    def submit_prebuilt(self, batch: TransferBatch) -> None:
        """Queue a batch prefilled elsewhere (:class:`~specstrat.runtime._admission.TransferBatch`).

        The whole batch is checked against this engine's model and algorithm first
        (:class:`~specstrat.errors.DisaggError` naming the requests; nothing queued); it is
        admitted in PREBUILT mode when slots and KV for all of it are free.
        """
        self._check_open("submit_prebuilt")
        cfg = self.config
        check_transfer(
            batch,
            shape=self._target.shape,
            prefill_fields=self.algo.drafter.needs.prefill_fields,
            known_rids=self._rids,
            room=cfg.context_len - self._margin,
        )
        requests = batch.requests()
        need = sum(self._reserve(r) for r in requests)
        if len(requests) > cfg.max_running_requests or need > self._target.kv.capacity:
            raise DisaggError(
                f"batch of {len(requests)} requests needs {need} KV indices; this engine holds "
                f"max_running_requests={cfg.max_running_requests} and max_total_tokens="
                f"{self._target.kv.capacity}; the batch was not admitted"
            )
        self._scheduler.enqueue_prebuilt(batch)
        self._rids.update(batch.rids)
        self._this_run.extend(batch.rids)

    def submitted_ids(self) -> list[str]:
        """Ids of every request submitted or admitted so far."""
        return sorted(self._rids)

    # -- running ------------------------------------------------------------------------------

    def run(
        self,
        requests: Sequence[Request] = (),
        *,
        progress: Progress | None = None,
        source: Source | None = None,
        trace: TextIO | None = None,
    ) -> dict[str, list[int]]:
        """Submit ``requests``, run until every request of this run finished; their outputs.

        Returns the outputs of the requests submitted since the previous run (``requests``,
        earlier :meth:`submit` calls, and batches ``source`` brought in), by id. ``source(idle)``
        is polled once per step for more work and returns whether more may come; it may block
        while ``idle``. ``trace``: a text stream that gets one JSON line per step and request.
        """
        self._check_open("run")
        check_run_arguments(requests, progress, source, trace)
        if not self._lock.acquire(blocking=False):
            raise EngineStateError("run() is in progress on another thread; one run at a time")
        try:
            self._owner = threading.get_ident()
            checked = [self._check_request(r) for r in requests]
            rids = [r.rid for r in checked]
            repeated = sorted({rid for rid in rids if rids.count(rid) > 1})
            if repeated:
                raise InvalidConfig(f"requests repeat the ids {repeated}; every rid is unique")
            for request in checked:
                self._enqueue(request)
            return self._run(source or (lambda idle: False), progress, trace)
        finally:
            self._owner = None
            self._lock.release()

    def _run(
        self, source: Callable[[bool], bool], progress: Progress | None, trace: TextIO | None
    ) -> dict[str, list[int]]:
        start = time.perf_counter()
        try:
            self._scheduler.run(source, progress, overlap=self.config.overlap, trace=trace)
        except BaseException as exc:
            self._close(exc)
            raise
        finally:
            self.stats.seconds += time.perf_counter() - start
        outputs = self._scheduler.take_outputs(self._this_run)
        self._this_run = []
        return outputs

    def _close(self, cause: BaseException) -> None:
        """Release every request and all KV; the engine refuses further use."""
        self._closed = f"{type(cause).__name__}: {cause}"
        for worker in self._workers:
            worker.reset()
        self._scheduler.reset()
