"""One scheduler step on the forward thread: prefill new requests, or one decode step.

A decode step reads top to bottom — resolve -> draft -> verify -> accept -> commit — with one
collaborator per stage: the relay (the algorithm's FutureMap), the drafter, the verifier, the
acceptance rule, then the worker (KV rewind) and the relay again. Sequence lengths come from
the worker's request pool, their one owner; the relay's copy is checked against it. Every hook
call goes through :func:`~specstrat.runtime.guard.call_hook`, and what a hook returns is checked
against its contract (:mod:`specstrat.runtime.checks`) before anything uses it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
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
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.guard import call_hook
from specstrat.runtime.requests import Request, RunStats
from specstrat.runtime.verify import Verifier
from specstrat.runtime.worker import ModelWorker

__all__ = ["Produced", "StepRunner"]


@dataclass(frozen=True, slots=True)
class Produced:
    """What one step produced for one request: its tokens and, when the run is traced, what
    was drafted (tokens, parents) and which nodes were accepted."""

    tokens: list[int]
    drafts: Sequence[int] = ()
    parents: Sequence[int] = ()
    accepted: Sequence[int] = ()


class StepRunner:
    """Runs prefill and decode steps for one engine; called from the forward thread only."""

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
        self.tracing = False  # set by the scheduler while a run is traced

    def hook(self, hook: str, fn: Any, *args: Any) -> Any:
        """Call one of the algorithm's hooks (``hook`` names it, e.g. ``drafter.propose``)."""
        return call_hook(self.algo.name, hook, fn, *args)

    def _slots(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.worker.device)

    def relay_write(
        self, slots: torch.Tensor, seq_lens: torch.Tensor, payload: RelayPayload
    ) -> None:
        """Publish the new sequence lengths and stash ``payload`` for the next step."""
        self.hook("future_map.publish", self.relay.publish, slots, seq_lens)
        self.hook("future_map.stash", self.relay.stash, slots, payload)

    def admit_drafter(self, admission: DraftAdmission[Any]) -> RelayPayload:
        """``drafter.admit``, its payload checked."""
        payload = self.hook("drafter.admit", self.drafter.admit, admission)
        check_payload(self.algo.name, "drafter.admit", payload, len(admission.slots))
        return payload  # type: ignore[no-any-return]

    def release(self, slots: Sequence[int]) -> None:
        """Finished requests: drain their relay rows, the drafter forgets them, KV is freed."""
        self.hook("future_map.resolve", self.relay.resolve, self._slots(slots))
        self.hook("drafter.release", self.drafter.release, list(slots))
        for slot in slots:
            self.worker.free_request(slot)

    # -- prefill ------------------------------------------------------------------------------

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> dict[int, Produced]:
        """EXTEND over the prompts, the first token of each, and the drafter's admission."""
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        logits, hidden = self.worker.forward(ForwardMode.EXTEND, slots, prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.worker.device)
        ends = lens.cumsum(0) - 1
        first = logits[ends].argmax(-1)
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots),
            first_tokens=first,
            seq_lens=lens,
            hidden=hidden[ends],
            draft_input=None,
            prebuilt=False,
        )
        payload = self.admit_drafter(admission)
        self.relay_write(self._slots(slots), lens, payload.merged(RelayPayload(bonus_tokens=first)))
        return {s: Produced([int(t)]) for s, t in zip(slots, first.tolist(), strict=True)}

    # -- decode -------------------------------------------------------------------------------

    def decode(self, slots: list[int]) -> dict[int, Produced]:
        """One decode step for the running requests ``slots``."""
        start = time.perf_counter()
        step = self._resolve(slots)
        drafts = self._draft(step)
        drafted = time.perf_counter()
        logits, hidden, ran = self.verifier.verify(slots, step.last_tokens, drafts)
        verified = time.perf_counter()
        acceptance = self._accept(drafts, logits, step)
        accepted = time.perf_counter()
        produced = self._commit(step, drafts, acceptance, hidden)
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
        relay = self.hook("future_map.resolve", self.relay.resolve, self._slots(slots))
        check_payload(self.algo.name, "future_map.resolve", relay, len(slots))
        seq_lens = torch.tensor([self.worker.length(s) for s in slots], dtype=torch.int64)
        if relay.bonus_tokens is None:
            raise hook_error(
                self.algo.name,
                "future_map.resolve",
                "returned no bonus_tokens for the running "
                f"requests (slots {slots}); the relay must keep the last stash of each slot",
            )
        if relay.seq_lens is not None and not torch.equal(relay.seq_lens.cpu(), seq_lens):
            raise hook_error(
                self.algo.name,
                "future_map.resolve",
                f"returned seq_lens="
                f"{relay.seq_lens.tolist()} but the request pool holds {seq_lens.tolist()} for "
                f"slots {slots}: a stale or aliased relay entry",
            )
        return DraftStep(
            slots=tuple(slots),
            last_tokens=relay.bonus_tokens,
            seq_lens=seq_lens,
            relay=relay,
            max_nodes=self.max_nodes,
        )

    def _draft(self, step: DraftStep) -> DraftTree:
        drafts = self.hook("drafter.propose", self.drafter.propose, step)
        check_drafts(self.algo.name, drafts, len(step.slots), self.max_nodes, self.vocab)
        if not drafts.is_chain():
            raise hook_error(
                self.algo.name,
                "drafter.propose",
                "proposed a tree that is not a chain; this "
                "engine verifies chains (tree attention masks are not built yet): parents j - 1",
            )
        return drafts  # type: ignore[no-any-return]

    def _accept(self, drafts: DraftTree, logits: torch.Tensor, step: DraftStep) -> Acceptance:
        inputs = VerifyInputs(
            drafts=drafts,
            logits=logits[:, : drafts.num_nodes + 1],
            positions=step.seq_lens,
            sampling=(GREEDY,) * len(step.slots),
        )
        acceptance = self.hook("acceptance.accept", self.algo.acceptance.accept, inputs)
        check_acceptance(self.algo.name, acceptance, drafts, self.vocab)
        return acceptance  # type: ignore[no-any-return]

    def _commit(
        self, step: DraftStep, drafts: DraftTree, acceptance: Acceptance, hidden: torch.Tensor
    ) -> dict[int, Produced]:
        accepted = acceptance.accept_lengths
        counts = accepted.tolist()
        for slot, length, a in zip(step.slots, step.seq_lens.tolist(), counts, strict=True):
            self.worker.rewind(slot, length + a + 1)  # keep the root and the accepted path
        index = acceptance.accept_index
        bs = len(step.slots)
        last_node = (
            index.gather(1, (accepted - 1).clamp(min=0)[:, None]).squeeze(1)
            if drafts.num_nodes
            else accepted
        )
        at_bonus = torch.where(accepted > 0, last_node + 1, 0)
        outcome = StepOutcome(
            step=step,
            drafts=drafts,
            acceptance=acceptance,
            hidden=hidden[torch.arange(bs), at_bonus],
        )
        payload = self.hook("drafter.commit", self.drafter.commit, outcome)
        check_payload(self.algo.name, "drafter.commit", payload, bs)
        bonus = acceptance.bonus_tokens
        new_lens = (step.seq_lens + accepted.cpu() + 1).to(self.worker.device)
        self.relay_write(
            self._slots(step.slots), new_lens, payload.merged(RelayPayload(bonus_tokens=bonus))
        )
        path = drafts.tokens.gather(1, index.clamp(min=0)).tolist()
        bonuses = bonus.tolist()
        if not self.tracing:
            return {
                slot: Produced([*path[i][: counts[i]], bonuses[i]])
                for i, slot in enumerate(step.slots)
            }
        real = drafts.lengths.tolist()
        tokens, parents, nodes = drafts.tokens.tolist(), drafts.parents.tolist(), index.tolist()
        return {
            slot: Produced(
                [*path[i][: counts[i]], bonuses[i]],
                tokens[i][: real[i]],
                parents[i][: real[i]],
                nodes[i][: counts[i]],
            )
            for i, slot in enumerate(step.slots)
        }
