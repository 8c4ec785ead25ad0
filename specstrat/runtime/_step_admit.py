"""The admission steps on the forward thread: prefill, and PREBUILT admission of a received
batch (the decode side of disaggregation). Each starts its requests in the slot table, hands
the drafter its admission and relays the bonus tokens; what a hook returns is checked
(:mod:`specstrat.contracts`) and copied before anything uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.drafting import GREEDY, DraftAdmission
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE
from specstrat.protocols import Drafter, FutureMap
from specstrat.relay import RelayPayload
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._answers import frozen_payload
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._guard import call_hook
from specstrat.runtime._requests import Request
from specstrat.runtime._slots import SlotTable
from specstrat.runtime._step_relay import StepRelay
from specstrat.runtime._step_types import StepOutput, engine_invariant
from specstrat.runtime._worker import ModelWorker
from specstrat.sampling import SamplingBatch, choose_tokens

__all__ = ["AdmissionSteps"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class AdmissionSteps:
    """Prefill and PREBUILT admission for one engine."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        worker: ModelWorker,
        drafter: Drafter[Any],
        relay: FutureMap,
        relay_io: StepRelay,
        table: SlotTable,
        prefill_tokens: int,
    ) -> None:
        self.algo, self.worker, self.drafter = algo, worker, drafter
        self.relay, self.relay_io, self.table = relay, relay_io, table
        #: Tokens per prefill forward (``EngineConfig.chunked_prefill_size``).
        self.prefill_tokens = prefill_tokens

    def _hook(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return call_hook(self.algo.name, hook, fn, *args, **kwargs)

    def _admit_drafter(self, admission: DraftAdmission[Any]) -> RelayPayload:
        payload = self._hook("drafter.admit", self.drafter.admit, admission)
        return frozen_payload(self.algo.name, "drafter.admit", payload, len(admission.slots))

    def _extend(
        self, slots: list[int], prompts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """EXTEND over the prompts in forwards of at most :attr:`prefill_tokens` tokens (a
        longer prompt in consecutive pieces, each after the KV of the one before), so a
        forward's activations and logits stay bounded however many prompts arrive; the logits
        and hidden state of each prompt's last position, in ``slots`` order, and each prompt's
        hidden states at every position."""
        last: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        pieces_of: list[list[torch.Tensor]] = [[] for _ in prompts]
        forwards: list[list[tuple[int, int, int]]] = [[]]  # (request, start, end) per forward
        room = self.prefill_tokens
        for i, prompt in enumerate(prompts):
            start = 0
            while start < len(prompt):
                if room == 0:
                    forwards.append([])
                    room = self.prefill_tokens
                end = min(len(prompt), start + room)
                forwards[-1].append((i, start, end))
                room -= end - start
                start = end
        for pieces in forwards:
            tokens = [prompts[i][start:end] for i, start, end in pieces]
            ends = list(itertools.accumulate(len(piece) for piece in tokens))
            finished = [k for k, (i, _, end) in enumerate(pieces) if end == len(prompts[i])]
            logits, hidden = self.worker.forward(  # only a prompt's last row's logits are read
                ForwardMode.EXTEND,
                [slots[i] for i, _, _ in pieces],
                tokens,
                logit_rows=[ends[k] - 1 for k in finished],
            )
            for (i, _, _), piece, end in zip(pieces, tokens, ends, strict=True):
                pieces_of[i].append(hidden[end - len(piece) : end])
            for row, k in enumerate(finished):
                last[pieces[k][0]] = (logits[row], hidden[ends[k] - 1])
        logits, hidden = (torch.stack([last[i][k] for i in range(len(prompts))]) for k in (0, 1))
        return logits, hidden, tuple(torch.cat(p) for p in pieces_of)

    def prefill(self, admit: Sequence[tuple[Request, int]]) -> StepOutput:
        """EXTEND over the prompts, the first token of each, and the drafter's admission."""
        slots = [slot for _, slot in admit]
        prompts = [list(req.prompt) for req, _ in admit]
        with engine_invariant("prefill"):
            logits, hidden, prompt_hidden = self._extend(slots, prompts)
        lens = torch.tensor([len(p) for p in prompts], device=self.worker.device)
        params = tuple(req.sampling for req, _ in admit)
        sampling = SamplingBatch.of(params, self.worker.device)
        first, _ = choose_tokens(logits, sampling, lens, DRAW_SAMPLE)
        tokens = first.tolist()  # before the drafter sees them: it gets a copy
        admission: DraftAdmission[Any] = DraftAdmission(
            slots=tuple(slots),
            bonus_tokens=first.clone(),
            seq_lens=lens,
            hidden=hidden,
            draft_input=None,
            sampling=params,
            prompt_hidden=prompt_hidden,
        )
        self.table.start(slots, prompts, tokens)  # the drafter's admit reads the prompts
        payload = self._admit_drafter(admission)
        lengths = self.table.lengths(slots)
        self.relay_io.write(slots, lengths, first, payload, "drafter.admit")
        return StepOutput(slots, [[t] for t in tokens])

    def admit_prebuilt(self, batch: TransferBatch, slots: list[int]) -> StepOutput:
        """Install the transferred KV, call ``algo.build_disagg_draft_input`` (which relays the
        bonus tokens and its draft state itself), then ``drafter.admit`` with what it returned
        (``None``: no draft state; the first step decodes plainly from the bonus tokens)."""
        offset = 0
        for slot, prompt in zip(slots, batch.prompts, strict=True):
            end = offset + len(prompt)
            self.worker.admit_prebuilt(slot, prompt, batch.k[:, offset:end], batch.v[:, offset:end])
            offset = end
        dev = self.worker.device
        first = batch.bonus_tokens.tolist()  # before any hook sees them: each gets a copy
        self.table.start(slots, batch.prompts, first)
        lengths = self.table.lengths(slots)
        seq_lens = torch.tensor(lengths, dtype=torch.int64, device=dev)
        payload = batch.payload
        prebuilt = PrebuiltBatch(
            rids=batch.rids,
            slots=torch.tensor(slots, dtype=torch.int64, device=dev),
            seq_lens=seq_lens,
            topk_p=payload.topk_p,
            topk_index=payload.topk_index,
            hidden_states=payload.hidden_states,
            device=dev,
        )
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
            slots=tuple(slots),
            bonus_tokens=batch.bonus_tokens.to(dev, copy=True),
            seq_lens=seq_lens.clone(),
            hidden=None,
            draft_input=draft_input,
            sampling=tuple(params),
        )
        extra = self._admit_drafter(admission)
        if extra.present():
            self.relay_io.stash(slots, extra, "drafter.admit")
        return StepOutput(list(slots), [[t] for t in first])
