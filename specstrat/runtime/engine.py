"""The plain scheduler: continuous batching of any composed algorithm on the embedded models.

Each step runs on a forward thread: release finished requests, prefill (EXTEND) admitted ones,
then one decode step for the running ones. A speculative decode step resolves the previous step's
results from the relay (``algo.create_future_map``), drafts ``T - 1`` tokens, runs TARGET_VERIFY
with ``T = algo.get_num_tokens_per_req_for_target_verify(D, False)``, accepts the longest prefix
of drafts that matches the target's greedy choices plus one bonus token (lossless: the output is
exactly target-only greedy decoding), rewinds the KV of rejected positions, and publishes/stashes
the results for the next step.

Synchronous mode waits for each step before scheduling the next. Overlap mode schedules step
N+1 while step N's forward runs: step N+1 reads N's results only through the relay, and requests
that finish at step N may run one extra step whose tokens are dropped (as in the engines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.errors import DisaggError, InvalidConfig
from specstrat.protocols import FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime.drafters import Drafter, Drafts, StepInputs, drafter_for
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.graph_runner import GraphRunner
from specstrat.runtime.model import TinyLM
from specstrat.runtime.requests import EngineConfig, Request, RunStats
from specstrat.runtime.weights import EmbeddedModels
from specstrat.runtime.worker import ModelWorker

__all__ = ["Engine"]


@dataclass
class _Live:
    request: Request
    slot: int
    output: list[int] = field(default_factory=list)
    finished: bool = False


@dataclass(frozen=True, slots=True)
class _Plan:
    release: list[int]
    admit: list[tuple[Request, int]]
    running: list[int]
    prebuilt: list[tuple[Any, list[int]]] = field(default_factory=list)

    def has_work(self) -> bool:
        return bool(self.release or self.admit or self.running or self.prebuilt)


class Engine:
    """Runs one algorithm on the embedded models: submit requests, then :meth:`run`."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        models: EmbeddedModels,
        config: EngineConfig | None = None,
    ) -> None:
        self.algo = algo
        self.config = cfg = config or EngineConfig()
        if cfg.overlap and not algo.capabilities.supports_overlap:
            raise InvalidConfig(f"algorithm {algo.name} does not support overlap mode")
        dtype = next(models.target.parameters()).dtype
        device = next(models.target.parameters()).device
        total = cfg.max_total_tokens or cfg.max_running_requests * cfg.context_len

        def worker(model: TinyLM) -> ModelWorker:
            return ModelWorker(
                model,
                max_running_requests=cfg.max_running_requests,
                context_len=cfg.context_len,
                max_total_tokens=total,
                device=device,
                dtype=dtype,
            )

        self.target = worker(models.target)
        caps = algo.capabilities
        draft_worker = (
            worker(models.draft)
            if caps.has_draft_kv and not caps.carries_draft_hidden_states
            else None
        )
        self.drafter: Drafter | None = drafter_for(
            algo, models.target, draft_worker=draft_worker, eagle_head=models.eagle
        )
        self.tokens_per_req = (
            algo.get_num_tokens_per_req_for_target_verify(cfg.num_draft_tokens, False)
            if algo.is_speculative()
            else 1
        )
        # Ragged verify: only for algorithms that allow it, and only rows a drafter reports short.
        self._ragged = cfg.ragged_verify and algo.capabilities.supports_ragged_verify
        self.graph_runner = (
            GraphRunner(self.target, algo, cfg.num_draft_tokens, buckets=cfg.graph_buckets)
            if algo.is_speculative() and cfg.use_graph_runner
            else None
        )
        self.future_map: FutureMap = self.init_overlap(device)
        self._waiting: list[Request] = []
        self._prebuilt: list[Any] = []  # TransferBatch, received from a prefill process
        self._live: dict[str, _Live] = {}
        self._rids: set[str] = set()
        self._source: Callable[[bool], bool] = lambda idle: False
        self._more = False  # whether the source may still bring work
        self.stats = RunStats()

    def init_overlap(self, device: torch.device) -> FutureMap:
        """The relay between steps, from the algorithm's future-map strategy."""
        cfg = self.config
        return self.algo.create_future_map(
            cfg.max_running_requests, cfg.chunked_prefill_size, cfg.context_len, device
        )

    # -- submission ---------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request; bad requests are refused before anything changes."""
        if not isinstance(request, Request):
            raise InvalidConfig(f"request={request!r}; pass a specstrat.runtime.Request")
        if request.rid in self._rids:
            raise InvalidConfig(f"request id {request.rid!r} was already submitted")
        # Room for the prompt, the output, and one overlapped step of T tokens past the end.
        need = len(request.prompt) + request.max_new_tokens + 2 * self.tokens_per_req
        if need > self.config.context_len:
            raise InvalidConfig(
                f"request {request.rid!r}: prompt ({len(request.prompt)}) + max_new_tokens "
                f"({request.max_new_tokens}) + 2*T ({2 * self.tokens_per_req}) = {need} exceeds "
                f"context_len={self.config.context_len}; shorten the prompt or the output"
            )
        self._waiting.append(request)
        self._rids.add(request.rid)

    def submit_prebuilt(self, batch: Any) -> None:
        """Queue a batch prefilled elsewhere (a :class:`~specstrat.runtime.disagg.TransferBatch`).

        The whole batch is checked against this engine's algorithm and model first
        (:class:`~specstrat.errors.DisaggError` naming the requests, nothing queued); it is
        admitted in PREBUILT mode when slots for all of it are free.
        """
        from specstrat.runtime.disagg import check_transfer  # disagg imports this module

        check_transfer(batch, self)
        requests = batch.requests()
        if len(requests) > self.config.max_running_requests:
            raise DisaggError(
                f"batch of {len(requests)} requests exceeds max_running_requests="
                f"{self.config.max_running_requests}; the batch was not admitted"
            )
        for request in requests:
            if request.rid in self._rids:
                raise DisaggError(
                    f"request id {request.rid!r} arrived twice; the batch was not admitted"
                )
            need = len(request.prompt) + request.max_new_tokens + 2 * self.tokens_per_req
            if need > self.config.context_len:
                raise DisaggError(
                    f"request {request.rid!r} needs {need} positions > context_len="
                    f"{self.config.context_len}; the batch was not admitted"
                )
        self._prebuilt.append(batch)
        self._rids.update(r.rid for r in requests)

    def submitted_ids(self) -> list[str]:
        """Ids of every request submitted or admitted so far."""
        return sorted(self._rids)

    # -- the forward thread's work ------------------------------------------------------------

    def _prefill(self, admit: list[tuple[Request, int]]) -> dict[int, list[int]]:
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        logits, hidden = self.target.forward(ForwardMode.EXTEND, slots, prompts)
        ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
        first = logits[ends].argmax(-1)
        extra = (
            self.drafter.admit(slots, prompts, first, hidden[ends])
            if self.drafter is not None
            else RelayPayload()
        )
        slot_tensor = torch.tensor(slots, dtype=torch.int64, device=self.target.device)
        self.future_map.publish(
            slot_tensor, torch.tensor([len(p) for p in prompts], device=self.target.device)
        )
        self.future_map.stash(slot_tensor, extra.merged(RelayPayload(bonus_tokens=first)))
        return {slot: [int(t)] for slot, t in zip(slots, first.tolist(), strict=True)}

    def _decode(self, slots: list[int]) -> dict[int, list[int]]:
        slot_tensor = torch.tensor(slots, dtype=torch.int64, device=self.target.device)
        relay = self.future_map.resolve(slot_tensor)
        if relay.bonus_tokens is None or relay.seq_lens is None:
            raise InvalidConfig("the relay lost bonus_tokens or seq_lens between steps")
        inputs = StepInputs(
            slots, relay.bonus_tokens, [int(x) for x in relay.seq_lens.tolist()], relay
        )
        bs, t = len(slots), self.tokens_per_req
        if self.drafter is None:
            logits, _ = self.target.forward(
                ForwardMode.DECODE, slots, [[x] for x in inputs.last.tolist()]
            )
            bonus = logits.argmax(-1)
            new_lens = [n + 1 for n in inputs.seq_lens]
            extra = RelayPayload()
            produced = {s: [int(b)] for s, b in zip(slots, bonus.tolist(), strict=True)}
        else:
            proposal = (
                self.drafter.draft(inputs, t - 1)
                if t > 1
                else Drafts(torch.zeros(bs, 0, dtype=torch.int64))
            )
            drafts = proposal.tokens
            verify = torch.cat([inputs.last[:, None], drafts], dim=1)
            found = proposal.lengths if self._ragged else None  # None: verify every row full
            if found and min(found) < t - 1:
                greedy, hidden = self._verify_ragged(slots, verify, [n + 1 for n in found])
            else:
                found = None
                if self.graph_runner is not None and self.graph_runner.can_run(bs):
                    logits, flat_hidden = self.graph_runner.replay(slots, verify)
                else:
                    logits, flat_hidden = self.target.forward(
                        ForwardMode.TARGET_VERIFY, slots, verify.tolist()
                    )
                greedy, hidden = logits.argmax(-1).view(bs, t), flat_hidden.view(bs, t, -1)
                self.stats.verify_forward_tokens += bs * t
            match = (drafts == greedy[:, :-1]).to(torch.int64)
            accepted = match.cumprod(dim=1).sum(dim=1)
            if found is not None:
                # Filler past a row's found tokens was not run; the target's token there is unknown.
                accepted = torch.minimum(accepted, torch.tensor(found))
            rows = torch.arange(bs)
            bonus = greedy[rows, accepted]
            at_bonus = hidden[rows, accepted]
            acc = [int(a) for a in accepted.tolist()]
            new_lens = [n + a + 1 for n, a in zip(inputs.seq_lens, acc, strict=True)]
            for slot, length in zip(slots, new_lens, strict=True):
                self.target.rewind(slot, length)  # drop rejected draft positions
            extra = self.drafter.accept(inputs, drafts, acc, bonus, at_bonus)
            draft_rows = drafts.tolist()
            produced = {s: [*draft_rows[i][: acc[i]], int(bonus[i])] for i, s in enumerate(slots)}
            self.stats.verified_requests += bs
            self.stats.verified_tokens += sum(a + 1 for a in acc)
        self.future_map.publish(slot_tensor, torch.tensor(new_lens, device=self.target.device))
        self.future_map.stash(slot_tensor, extra.merged(RelayPayload(bonus_tokens=bonus)))
        self.stats.decode_steps += 1
        return produced

    def _verify_ragged(
        self, slots: list[int], verify: torch.Tensor, counts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TARGET_VERIFY over the first ``counts[i]`` tokens of each row only (ragged metadata).

        Returns the target's greedy tokens and hidden states laid out ``[bs, T]`` like a uniform
        verify; positions that were not run hold -1 (no draft token equals it) and zeros.
        """
        bs, t = verify.shape
        rows = [row[:count] for row, count in zip(verify.tolist(), counts, strict=True)]
        logits, flat_hidden = self.target.forward(ForwardMode.TARGET_VERIFY, slots, rows)
        per_row = torch.tensor(counts)
        row_index = torch.repeat_interleave(torch.arange(bs), per_row)
        col_index = torch.arange(len(row_index)) - torch.repeat_interleave(
            per_row.cumsum(0) - per_row, per_row
        )
        greedy = torch.full((bs, t), -1, dtype=torch.int64)
        greedy[row_index, col_index] = logits.argmax(-1)
        hidden = flat_hidden.new_zeros(bs, t, flat_hidden.shape[-1])
        hidden[row_index, col_index] = flat_hidden
        self.stats.verify_forward_tokens += len(row_index)
        return greedy, hidden

    def _step(self, plan: _Plan) -> dict[int, list[int]]:
        for slot in plan.release:
            self.future_map.resolve(torch.tensor([slot], device=self.target.device))  # drain
            if self.drafter is not None:
                self.drafter.release(slot)
            self.target.free_request(slot)
        produced = self._decode(plan.running) if plan.running else {}
        if plan.admit:
            produced.update(self._prefill(plan.admit))
        for batch, slots in plan.prebuilt:
            produced.update(self._admit_prebuilt(batch, slots))
        return produced

    def _admit_prebuilt(self, batch: Any, slots: list[int]) -> dict[int, list[int]]:
        """PREBUILT admission: install the transferred KV, relay the first tokens, rebuild draft
        state with ``algo.build_disagg_draft_input`` (None: plain decode from last_tokens)."""
        offset = 0
        for slot, length in zip(slots, batch.kv_lens, strict=True):
            k = batch.k[:, offset : offset + length]
            v = batch.v[:, offset : offset + length]
            self.target.admit_prebuilt(slot, k, v)
            offset += length
        dev = self.target.device
        slot_tensor = torch.tensor(slots, dtype=torch.int64, device=dev)
        seq_lens = torch.tensor(batch.kv_lens, dtype=torch.int64, device=dev)
        last_tokens = batch.first_tokens.to(dev)
        # The engine relays every step's state (both modes), so the builder sees overlap on.
        self.future_map.publish(slot_tensor, seq_lens)
        self.future_map.stash(slot_tensor, RelayPayload(bonus_tokens=last_tokens))
        prebuilt = PrebuiltBatch(
            rids=batch.rids,
            slots=slot_tensor,
            seq_lens=seq_lens,
            topk_p=batch.topk_p,
            topk_index=batch.topk_index,
            hidden_states=batch.hidden_states,
            device=dev,
            enable_overlap=True,
        )
        self.algo.build_disagg_draft_input(prebuilt, last_tokens, self.future_map)
        if self.drafter is not None:
            prompts = [list(p) for p in batch.prompts]
            self.drafter.admit(slots, prompts, last_tokens, None)
        return {slot: [] for slot in slots}

    # -- the scheduler thread's work ----------------------------------------------------------

    def _plan(self, release: list[int]) -> _Plan:
        """Step composition: slots to release, requests to admit (slots allocated), running."""
        running = [live.slot for live in self._live.values() if not live.finished]
        admit: list[tuple[Request, int]] = []
        while self._waiting and self.target.requests.available > len(admit):
            request = self._waiting.pop(0)
            slot = self.target.requests.alloc()
            self._live[request.rid] = _Live(request, slot)
            admit.append((request, slot))
        prebuilt: list[tuple[Any, list[int]]] = []
        while self._prebuilt and self.target.requests.available >= len(self._prebuilt[0].rids):
            batch = self._prebuilt.pop(0)
            slots = [self.target.requests.alloc() for _ in batch.rids]
            first = batch.first_tokens.tolist()
            for request, slot, token in zip(batch.requests(), slots, first, strict=True):
                self._live[request.rid] = _Live(request, slot, [int(token)])
                self.stats.generated_tokens += 1
            prebuilt.append((batch, slots))
        return _Plan(release, admit, running, prebuilt)

    def _absorb(self, produced: dict[int, list[int]]) -> list[int]:
        """Append step outputs; return the slots of requests that just finished."""
        by_slot = {live.slot: live for live in self._live.values() if not live.finished}
        done: list[int] = []
        for slot, tokens in produced.items():
            live = by_slot.get(slot)
            if live is None:
                continue  # an overlapped extra step of a finished request: dropped
            room = live.request.max_new_tokens - len(live.output)
            live.output.extend(tokens[: max(room, 0)])
            self.stats.generated_tokens += max(min(room, len(tokens)), 0)
            if len(live.output) >= live.request.max_new_tokens:
                live.finished = True
                done.append(slot)
        return done

    def run(
        self,
        requests: Sequence[Request] = (),
        *,
        progress: Callable[[int, int], None] | None = None,
        source: Callable[[bool], bool] | None = None,
    ) -> dict[str, list[int]]:
        """Submit ``requests``, run until every submitted request finished; outputs by id.

        ``source(idle)`` is polled once per step to bring in more work (prebuilt batches from a
        prefill process); it returns whether more may still come, and may block while ``idle``.
        """
        for request in requests:
            self.submit(request)
        self._source = source or (lambda idle: False)
        self._more = True
        start = time.perf_counter()
        if self.config.overlap:
            self._run_overlap(progress)
        else:
            self._run_sync(progress)
        self.stats.seconds += time.perf_counter() - start
        return {rid: live.output for rid, live in self._live.items()}

    def _busy(self) -> bool:
        return bool(self._waiting or self._prebuilt) or any(
            not live.finished for live in self._live.values()
        )

    def _poll(self, idle: bool) -> None:
        if self._more:
            self._more = self._source(idle)

    def _report(self, progress: Callable[[int, int], None] | None) -> None:
        if progress is not None:
            progress(self._finished(), len(self._live) + len(self._waiting))

    def _finished(self) -> int:
        return sum(live.finished for live in self._live.values())

    def _run_sync(self, progress: Callable[[int, int], None] | None) -> None:
        release: list[int] = []
        self._poll(idle=not self._busy())
        while self._busy() or self._more:
            plan = self._plan(release)
            release = self._absorb(self._step(plan)) if plan.has_work() else []
            self._report(progress)
            self._poll(idle=not self._busy())
        self._step(_Plan(release, [], []))

    def _run_overlap(self, progress: Callable[[int, int], None] | None) -> None:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specstrat-forward") as pool:
            release: list[int] = []
            pending: Future[dict[int, list[int]]] | None = None
            self._poll(idle=not self._busy())
            while pending is not None or self._busy() or self._more:
                plan = self._plan(release)
                release = []
                if pending is not None:
                    produced = pending.result()  # step N done
                    pending = None
                    if plan.has_work():
                        pending = pool.submit(self._step, plan)  # step N+1 runs ...
                    release = self._absorb(produced)  # ... while N's results are absorbed
                elif plan.has_work():
                    pending = pool.submit(self._step, plan)
                self._report(progress)
                self._poll(idle=pending is None and not self._busy())
            self._step(_Plan(release, [], []))
