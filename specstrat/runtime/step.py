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
from dataclasses import dataclass
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
    StepOutcome,
    VerifyInputs,
)
from specstrat.protocols import Drafter, FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime.admission import TransferBatch
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.guard import call_hook
from specstrat.runtime.requests import Request, RunStats
from specstrat.runtime.verify import Verifier
from specstrat.runtime.worker import ModelWorker

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
    ) -> None:
        self.algo, self.worker, self.drafter = algo, worker, drafter
        self.verifier, self.relay, self.stats = verifier, relay, stats
        self.max_nodes = verifier.tokens_per_req - 1
        self.vocab = worker.shape.vocab_size
        # First tokens of PREBUILT requests, by slot: the builder relays them; the first
        # resolve checks that it did.
        self._relayed_by_builder: dict[int, int] = {}

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
            self._relayed_by_builder.pop(slot, None)
            self.worker.free_request(slot)

    # -- admission ----------------------------------------------------------------------------

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> dict[int, Produced]:
        """EXTEND over the prompts, the first token of each, and the drafter's admission."""
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        logits, hidden = self.worker.forward(ForwardMode.EXTEND, slots, prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.worker.device)
        ends = lens.cumsum(0) - 1
        first = logits[ends].argmax(-1)
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), first_tokens=first, seq_lens=lens, hidden=hidden[ends],
            draft_input=None,
        )  # fmt: skip
        payload = self._admit_drafter(admission)
        self._relay_write(slots, payload.merged(RelayPayload(bonus_tokens=first)))
        return {s: Produced([int(t)]) for s, t in zip(slots, first.tolist(), strict=True)}

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
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots), first_tokens=last_tokens, seq_lens=seq_lens, hidden=None,
            draft_input=draft_input,
        )  # fmt: skip
        extra = self._admit_drafter(admission)
        if extra.present():
            self._hook("future_map.stash", self.relay.stash, self._slots(slots), extra)
        first = batch.first_tokens.tolist()
        self._relayed_by_builder.update(zip(slots, first, strict=True))
        return {slot: Produced([int(t)]) for slot, t in zip(slots, first, strict=True)}

    # -- decode -------------------------------------------------------------------------------

    def decode(self, slots: list[int], *, tracing: bool = False) -> dict[int, Produced]:
        """One decode step for the running requests ``slots`` (``tracing``: record drafts)."""
        start = time.perf_counter()
        step = self._resolve(slots)
        drafts = self._draft(step)
        drafted = time.perf_counter()
        logits, hidden, ran = self.verifier.verify(slots, step.last_tokens, drafts)
        verified = time.perf_counter()
        acceptance = self._accept(drafts, logits, step)
        accepted = time.perf_counter()
        produced = self._commit(step, drafts, acceptance, hidden, tracing)
        stats = self.stats
        stats.decode_steps += 1
        if self.algo.is_speculative():
            stats.verified_requests += len(slots)
            stats.verified_tokens += sum(len(p.tokens) for p in produced.values())
            stats.verify_forward_tokens += ran
            stats.count_positions(drafts.lengths.tolist(), acceptance.accept_lengths.tolist())
        stats.draft_seconds += drafted - start
        stats.verify_seconds += verified - drafted
        stats.accept_seconds += accepted - verified
        stats.decode_seconds += time.perf_counter() - start
        return produced

    def _resolve(self, slots: list[int]) -> DraftStep:
        hook = "future_map.resolve"
        relay = self._hook(hook, self.relay.resolve, self._slots(slots))
        check_payload(self.algo.name, hook, relay, len(slots))
        seq_lens = self._lengths(slots)
        if relay.bonus_tokens is None:
            raise hook_error(
                self.algo.name, hook, f"returned no bonus_tokens for the running requests "
                f"(slots {slots}); the relay must keep the last stash of each slot"
            )  # fmt: skip
        if relay.seq_lens is not None and not torch.equal(relay.seq_lens.cpu(), seq_lens):
            raise hook_error(
                self.algo.name, hook, f"returned seq_lens={relay.seq_lens.tolist()} but the "
                f"request pool holds {seq_lens.tolist()} for slots {slots}: a stale or aliased "
                "relay entry"
            )  # fmt: skip
        self._check_builder_relayed(slots, relay.bonus_tokens)
        return DraftStep(
            slots=tuple(slots),
            last_tokens=relay.bonus_tokens,
            seq_lens=seq_lens,
            relay=relay,
            max_nodes=self.max_nodes,
        )

    def _check_builder_relayed(self, slots: list[int], last: torch.Tensor) -> None:
        """A PREBUILT request's first resolve must return the first token its builder got."""
        if not self._relayed_by_builder:
            return
        resolved = last.tolist()
        for slot, token in zip(slots, resolved, strict=True):
            want = self._relayed_by_builder.pop(slot, None)
            if want is not None and want != token:
                raise hook_error(
                    self.algo.name, "disagg.build_disagg_draft_input", f"slot {slot} resolved "
                    f"last token {token} but the batch's first token is {want}: the builder "
                    "must stash last_tokens as bonus_tokens at batch.slots (and publish "
                    "batch.seq_lens) in the future_map it is given"
                )  # fmt: skip

    def _draft(self, step: DraftStep) -> DraftTree:
        drafts = self._hook("drafter.propose", self.drafter.propose, step)
        check_drafts(self.algo.name, drafts, len(step.slots), self.max_nodes, self.vocab)
        if not drafts.is_chain():
            raise hook_error(
                self.algo.name, "drafter.propose", "proposed a tree that is not a chain; this "
                "engine verifies chains (node j's parent j - 1)"
            )  # fmt: skip
        return drafts

    def _accept(self, drafts: DraftTree, logits: torch.Tensor, step: DraftStep) -> Acceptance:
        inputs = VerifyInputs(
            drafts=drafts,
            logits=logits[:, : drafts.num_nodes + 1],
            positions=step.seq_lens,
            sampling=(GREEDY,) * len(step.slots),
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
        tracing: bool,
    ) -> dict[int, Produced]:
        accepted, index = acceptance.accept_lengths, acceptance.accept_index
        counts = accepted.tolist()
        for slot, length, a in zip(step.slots, step.seq_lens.tolist(), counts, strict=True):
            self.worker.rewind(slot, length + a + 1)  # keep the root and the accepted path
        # The target's hidden state where each bonus token was chosen: the last accepted node's.
        at_bonus = torch.zeros_like(accepted)
        if drafts.num_nodes:
            last_node = index.gather(1, (accepted - 1).clamp(min=0)[:, None]).squeeze(1)
            at_bonus = torch.where(accepted > 0, last_node + 1, at_bonus)
        rows = torch.arange(len(step.slots))
        outcome = StepOutcome(
            step=step, drafts=drafts, acceptance=acceptance, hidden=hidden[rows, at_bonus]
        )
        payload = self._hook("drafter.commit", self.drafter.commit, outcome)
        check_payload(self.algo.name, "drafter.commit", payload, len(step.slots))
        bonus = acceptance.bonus_tokens
        self._relay_write(step.slots, payload.merged(RelayPayload(bonus_tokens=bonus)))
        path = drafts.tokens.gather(1, index.clamp(min=0)).tolist()
        bonuses = bonus.tolist()
        tokens = [[*path[i][: counts[i]], bonuses[i]] for i in range(len(step.slots))]
        if not tracing:
            return {slot: Produced(t) for slot, t in zip(step.slots, tokens, strict=True)}
        real = drafts.lengths.tolist()
        nodes, parents, nodes_taken = (
            drafts.tokens.tolist(),
            drafts.parents.tolist(),
            index.tolist(),
        )
        return {
            slot: Produced(
                tokens[i], nodes[i][: real[i]], parents[i][: real[i]], nodes_taken[i][: counts[i]]
            )
            for i, slot in enumerate(step.slots)
        }
