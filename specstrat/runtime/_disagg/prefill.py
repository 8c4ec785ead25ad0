"""The prefill side: EXTEND for a batch of requests, then everything the decode side needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.contracts import hook_error
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE
from specstrat.models import LoadedModels
from specstrat.relay import RelayPayload
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._guard import call_hook
from specstrat.runtime._requests import Request
from specstrat.runtime._worker import ModelWorker
from specstrat.sampling import SamplingBatch, choose_tokens

__all__ = ["PrefillWorker"]


class PrefillWorker:
    """Prefills batches on the target and packages their KV, bonus tokens and the payload the
    algorithm's drafter asks for (``drafter.prefill_payload``; ``needs.prefill_fields``)."""

    def __init__(
        self, algo: SpecAlgorithm[Any], models: LoadedModels, *, context_len: int, batch_size: int
    ) -> None:
        self.algo, self.models = algo, models
        self.worker = ModelWorker(
            models.target,
            max_running_requests=batch_size,
            context_len=context_len,
            max_total_tokens=batch_size * context_len,
        )

    def prefill(self, requests: Sequence[Request]) -> TransferBatch:
        """Prefill ``requests``; frees its own slots whatever happens."""
        slots = [self.worker.alloc_request() for _ in requests]
        try:
            prompts = [list(r.prompt) for r in requests]
            lens = torch.tensor([len(p) for p in prompts])
            ends = lens.cumsum(0) - 1
            logits, hidden = self.worker.forward(  # the last rows' logits only
                ForwardMode.EXTEND, slots, prompts, logit_rows=ends.tolist()
            )
            params = tuple(r.sampling for r in requests)
            bonus, _ = choose_tokens(logits, SamplingBatch.of(params), lens, DRAW_SAMPLE)
            kv = [self.worker.export_kv(s) for s in slots]
            return TransferBatch(
                rids=tuple(r.rid for r in requests),
                prompts=tuple(tuple(r.prompt) for r in requests),
                max_new_tokens=torch.tensor([r.max_new_tokens for r in requests]),
                bonus_tokens=bonus,
                k=torch.cat([k for k, _ in kv], dim=1),
                v=torch.cat([v for _, v in kv], dim=1),
                payload=self._payload(bonus, hidden[ends]),
                stop_token_ids=tuple(r.stop_token_ids for r in requests),
                sampling=params,
            )
        finally:
            for slot in slots:
                self.worker.free_request(slot)

    def _payload(self, bonus: torch.Tensor, hidden: torch.Tensor) -> RelayPayload:
        drafter = self.algo.drafter
        hook = "drafter.prefill_payload"
        payload = call_hook(
            self.algo.name, hook, drafter.prefill_payload, self.models, bonus, hidden
        )
        want = drafter.needs.prefill_fields
        if not isinstance(payload, RelayPayload) or set(payload.present()) != want:
            got = sorted(payload.present()) if isinstance(payload, RelayPayload) else payload
            raise hook_error(
                self.algo.name, hook, f"returned {got}; needs.prefill_fields says {sorted(want)}"
            )
        return payload
