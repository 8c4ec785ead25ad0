"""One scheduler step on the forward thread: prefill, PREBUILT admission, or one decode step.

A decode step reads top to bottom — resolve -> draft -> verify -> accept -> commit — with one
collaborator per stage: the relay (the algorithm's FutureMap), the drafter, the verifier, the
acceptance rule, then the worker (KV rewind) and the relay again. Sequence lengths come from the
worker's request pool, their one owner: the step publishes what the pool holds after the rewind,
and checks what the relay resolves against it. Every hook call goes through
:func:`~specstrat.runtime.guard.call_hook`, and what a hook returns is checked against its
contract (:mod:`specstrat.contracts`) before anything uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.contracts import check_acceptance, check_drafts, check_payload, hook_error
from specstrat.drafting import (
    GREEDY,
    Acceptance,
    DraftAdmission,
    DraftStep,
    DraftTree,
    SamplingParams,
    StepOutcome,
    TreeShape,
    VerifyInputs,
)
from specstrat.kernels.sampling import DRAW_SAMPLE
from specstrat.protocols import Drafter, FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime.admission import TransferBatch
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.guard import call_hook
from specstrat.runtime.requests import Request, RunStats
from specstrat.runtime.verify import Verifier
from specstrat.runtime.worker import ModelWorker
from specstrat.sampling import SamplingBatch, choose_tokens

__all__ = ["Produced", "StepRunner"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class Produced:
    """What one step produced for one request: its tokens and, when the run is traced, what
    was drafted (tokens, parents) and which nodes were accepted."""

    tokens: list[int]
    drafts: Sequence[int] = ()
    parents: Sequence[int] = ()
    accepted: Sequence[int] = ()


class StepRunner:
    """Runs prefill, PREBUILT admission and decode steps for one engine, on the forward thread."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        worker: ModelWorker,
        drafter: Drafter[Any],
        verifier: Verifier,
        relay: FutureMap,
        stats: RunStats,
        tree: TreeShape,
    ) -> None:
        self.algo, self.worker, self.drafter = algo, worker, drafter
        self.verifier, self.relay, self.stats = verifier, relay, stats
        self.tree = tree
        self.max_nodes = verifier.tokens_per_req - 1
        self.vocab = worker.shape.vocab_size
        # Slots admitted PREBUILT whose first resolve is still to come: the builder relayed
        # their first tokens, so a wrong one there is the builder's.
        self._from_builder: set[int] = set()
        self._sampling: dict[int, SamplingParams] = {}  # each running request's parameters

    def _hook(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return call_hook(self.algo.name, hook, fn, *args, **kwargs)

    def _slots(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.worker.device)

    def _lengths(self, slots: Sequence[int]) -> torch.Tensor:
        """Sequence lengths from the request pool, their one owner."""
        return torch.tensor([self.worker.length(s) for s in slots], dtype=torch.int64)

    def _relay_write(self, slots: Sequence[int], payload: RelayPayload) -> None:
        """Publish the pool's sequence lengths and stash ``payload`` for the next step."""
        index = self._slots(slots)
        lengths = self._lengths(slots).to(self.worker.device)
        self._hook("future_map.publish", self.relay.publish, index, lengths)
        self._hook("future_map.stash", self.relay.stash, index, payload)

    def _admit_drafter(self, admission: DraftAdmission[Any]) -> RelayPayload:
        payload = self._hook("drafter.admit", self.drafter.admit, admission)
        check_payload(self.algo.name, "drafter.admit", payload, len(admission.slots))
        return payload

    def release(self, slots: Sequence[int]) -> None:
        """Finished requests: their relay entries are resolved one last time (a relay may free
        entries once read), the drafter forgets them, their KV and slots are freed."""
        self._hook("future_map.resolve", self.relay.resolve, self._slots(slots))
        self._hook("drafter.release", self.drafter.release, list(slots))
        for slot in slots:
            self._from_builder.discard(slot)
            self._sampling.pop(slot, None)
            self.worker.free_request(slot)

    # -- admission ----------------------------------------------------------------------------

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> dict[int, Produced]:
        """EXTEND over the prompts, the first token of each, and the drafter's admission."""
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        logits, hidden = self.worker.forward(ForwardMode.EXTEND, slots, prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.worker.device)
        ends = lens.cumsum(0) - 1
        params = tuple(req.sampling for req, _ in admit)
        self._sampling.update(zip(slots, params, strict=True))
        sampling = SamplingBatch.of(params, self.worker.device)
        first, _ = choose_tokens(logits[ends], sampling, lens, DRAW_SAMPLE)
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), first_tokens=first, seq_lens=lens, hidden=hidden[ends],
            draft_input=None, sampling=params,
        )  # fmt: skip
        payload = self._admit_drafter(admission)
        self._relay_write(slots, payload.merged(RelayPayload(bonus_tokens=first)))
        tokens = first.tolist()
        self.worker.set_last(slots, tokens)
        return {s: Produced([t]) for s, t in zip(slots, tokens, strict=True)}

    def admit_prebuilt(self, batch: TransferBatch, slots: list[int]) -> dict[int, Produced]:
        """Install the transferred KV, call ``algo.build_disagg_draft_input`` (which relays the
        first tokens and its draft state itself), then ``drafter.admit`` with what it returned
        (``None``: no draft state; the first step decodes plainly from the first tokens)."""
        offset = 0
        for slot, prompt in zip(slots, batch.prompts, strict=True):
            end = offset + len(prompt)
            self.worker.admit_prebuilt(slot, prompt, batch.k[:, offset:end], batch.v[:, offset:end])
            offset = end
        dev = self.worker.device
        last_tokens = batch.first_tokens.to(dev)
        seq_lens = self._lengths(slots).to(dev)
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
            last_tokens,
            self.relay,
        )
        params = batch.sampling or (GREEDY,) * len(slots)
        self._sampling.update(zip(slots, params, strict=True))
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), first_tokens=last_tokens, seq_lens=seq_lens, hidden=None,
            draft_input=draft_input, sampling=tuple(params),
        )  # fmt: skip
        extra = self._admit_drafter(admission)
        if extra.present():
            self._hook("future_map.stash", self.relay.stash, self._slots(slots), extra)
        first = batch.first_tokens.tolist()
        self.worker.set_last(slots, first)
        self._from_builder.update(slots)
        return {slot: Produced([t]) for slot, t in zip(slots, first, strict=True)}

    # -- decode -------------------------------------------------------------------------------

    def decode(self, slots: list[int], *, tracing: bool = False) -> dict[int, Produced]:
        """One decode step for the running requests ``slots`` (``tracing``: record drafts).

        What a hook returns is checked, then copied to the host before the next hook runs, so
        a hook that later writes into a tensor it was given cannot change the step's tokens.
        """
        start = time.perf_counter()
        step, host = self._resolve(slots)
        drafts = self._draft(step)
        drafted = time.perf_counter()
        host.take_drafts(drafts)
        last = torch.tensor(host.last, dtype=torch.int64, device=self.worker.device)
        logits, hidden, ran = self.verifier.verify(slots, last, drafts)
        verified = time.perf_counter()
        acceptance = self._accept(drafts, logits, step)
        accepted = time.perf_counter()
        host.take_acceptance(acceptance)
        produced = self._commit(step, drafts, acceptance, hidden, host, tracing)
        stats = self.stats
        stats.decode_steps += 1
        if self.algo.is_speculative():
            stats.verified_requests += len(slots)
            stats.verified_tokens += sum(len(p.tokens) for p in produced.values())
            stats.verify_forward_tokens += ran
            stats.count_positions(host.real, host.counts)
        stats.draft_seconds += drafted - start
        stats.verify_seconds += verified - drafted
        stats.accept_seconds += accepted - verified
        stats.decode_seconds += time.perf_counter() - start
        return produced

    def _resolve(self, slots: list[int]) -> tuple[DraftStep, _HostStep]:
        hook = "future_map.resolve"
        relay = self._hook(hook, self.relay.resolve, self._slots(slots))
        check_payload(self.algo.name, hook, relay, len(slots))
        host = _HostStep([self.worker.length(s) for s in slots], self.worker.last(slots))
        if relay.bonus_tokens is None:
            raise hook_error(
                self.algo.name, hook, f"returned no bonus_tokens for the running requests "
                f"(slots {slots}); the relay must keep the last stash of each slot"
            )  # fmt: skip
        if relay.seq_lens is not None and relay.seq_lens.tolist() != host.lengths:
            raise hook_error(
                self.algo.name, hook, f"returned seq_lens={relay.seq_lens.tolist()} but the "
                f"request pool holds {host.lengths} for slots {slots}: a stale or aliased "
                "relay entry"
            )  # fmt: skip
        resolved = relay.bonus_tokens.tolist()
        if resolved != host.last:
            self._blame_last(slots, resolved, host.last)
        self._from_builder.difference_update(slots)
        step = DraftStep(
            slots=tuple(slots),
            last_tokens=relay.bonus_tokens,
            seq_lens=torch.tensor(host.lengths, dtype=torch.int64),
            relay=relay,
            max_nodes=self.max_nodes,
            sampling=tuple(self._sampling[s] for s in slots),
            tree=self.tree,
        )
        return step, host

    def _blame_last(self, slots: list[int], resolved: list[int], want: list[int]) -> None:
        """The relay returned last tokens other than the ones stashed: name who stashed them."""
        for slot, got, token in zip(slots, resolved, want, strict=True):
            if got == token:
                continue
            if slot in self._from_builder:
                raise hook_error(
                    self.algo.name, "disagg.build_disagg_draft_input", f"slot {slot} resolved "
                    f"last token {got} but the batch's first token is {token}: the builder "
                    "must stash last_tokens as bonus_tokens at batch.slots (and publish "
                    "batch.seq_lens) in the future_map it is given"
                )  # fmt: skip
            raise hook_error(
                self.algo.name, "future_map.resolve", f"returned bonus token {got} for slot "
                f"{slot}, but {token} was stashed there: a stale or aliased relay entry"
            )  # fmt: skip

    def _draft(self, step: DraftStep) -> DraftTree:
        drafts = self._hook("drafter.propose", self.drafter.propose, step)
        check_drafts(
            self.algo.name, drafts, len(step.slots), self.max_nodes, self.vocab, self.worker.device
        )
        if drafts.is_chain():
            return drafts
        if step.shape.is_chain:
            raise hook_error(
                self.algo.name, "drafter.propose", "proposed a tree that is not a chain, but "
                f"tree={type(self.algo.tree).__name__} asks for a chain (topk 1); compose the "
                "algorithm with tree=TopkTree(topk=..., num_steps=...) to verify trees"
            )  # fmt: skip
        depth = _depth(drafts.parents, drafts.lengths)
        if depth > step.shape.num_steps:
            raise hook_error(
                self.algo.name, "drafter.propose", f"proposed a tree {depth} nodes deep, but "
                f"tree={type(self.algo.tree).__name__} allows num_steps="
                f"{step.shape.num_steps}"
            )  # fmt: skip
        return drafts

    def _accept(self, drafts: DraftTree, logits: torch.Tensor, step: DraftStep) -> Acceptance:
        inputs = VerifyInputs(
            drafts=drafts,
            logits=logits[:, : drafts.num_nodes + 1],
            positions=step.seq_lens.clone(),
            sampling=step.sampling,
        )
        acceptance = self._hook("acceptance.accept", self.algo.acceptance.accept, inputs)
        check_acceptance(self.algo.name, acceptance, drafts, self.vocab)
        return acceptance

    def _commit(
        self,
        step: DraftStep,
        drafts: DraftTree,
        acceptance: Acceptance,
        hidden: torch.Tensor,
        host: _HostStep,
        tracing: bool,
    ) -> dict[int, Produced]:
        for slot, length, path in zip(step.slots, host.lengths, host.paths, strict=True):
            # Keep the root and the accepted path, moved into place; free the other nodes.
            self.worker.keep_path(slot, length, [0, *(j + 1 for j in path)])
        # The target's hidden state where each bonus token was chosen: the last accepted node's.
        at_bonus = [path[-1] + 1 if path else 0 for path in host.paths]
        rows = torch.arange(len(step.slots))
        outcome = StepOutcome(
            step=step,
            drafts=drafts,
            acceptance=acceptance,
            hidden=hidden[rows, torch.tensor(at_bonus, dtype=torch.int64)],
        )
        payload = self._hook("drafter.commit", self.drafter.commit, outcome)
        check_payload(self.algo.name, "drafter.commit", payload, len(step.slots))
        bonus = torch.tensor(host.bonus, dtype=torch.int64, device=self.worker.device)
        self._relay_write(step.slots, payload.merged(RelayPayload(bonus_tokens=bonus)))
        self.worker.set_last(step.slots, host.bonus)
        tokens = [
            [*(row[j] for j in path), b]
            for row, path, b in zip(host.tokens, host.paths, host.bonus, strict=True)
        ]
        if not tracing:
            return {slot: Produced(t) for slot, t in zip(step.slots, tokens, strict=True)}
        return {
            slot: Produced(
                tokens[i],
                host.tokens[i][: host.real[i]],
                host.parents[i][: host.real[i]],
                host.paths[i],
            )
            for i, slot in enumerate(step.slots)
        }


def _depth(parents: torch.Tensor, lengths: torch.Tensor) -> int:
    """The deepest real node of any row (the root's children are at depth 1)."""
    bs, n = parents.shape
    depth = torch.zeros(bs, n + 1, dtype=torch.int64)
    up = parents.cpu() + 1
    for j in range(n):
        depth[:, j + 1] = depth.gather(1, up[:, j : j + 1]).squeeze(1) + 1
    real = torch.arange(n)[None, :] < lengths.cpu()[:, None]
    return int(torch.where(real, depth[:, 1:], 0).max()) if bs and n else 0


@dataclass(frozen=False, slots=True)
class _HostStep:
    """Host copies of what one decode step decided, taken as each stage's answer is checked."""

    lengths: list[int]
    last: list[int]
    tokens: list[list[int]] = field(default_factory=list)
    parents: list[list[int]] = field(default_factory=list)
    real: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)
    bonus: list[int] = field(default_factory=list)

    def take_drafts(self, drafts: DraftTree) -> None:
        self.tokens, self.parents = drafts.tokens.tolist(), drafts.parents.tolist()
        self.real = drafts.lengths.tolist()

    def take_acceptance(self, acceptance: Acceptance) -> None:
        self.counts = acceptance.accept_lengths.tolist()
        index = acceptance.accept_index.tolist()
        self.paths = [row[:count] for row, count in zip(index, self.counts, strict=True)]
        self.bonus = acceptance.bonus_tokens.tolist()
