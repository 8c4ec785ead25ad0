"""The hooks a speculative-decoding algorithm is composed from, each a narrow Protocol.

A scheduler never asks an algorithm *what it is*; it calls these hooks and reads
:class:`~specstrat.algorithm.Capabilities`. Each docstring says when the scheduler calls the hook
and what an implementation must guarantee; :mod:`specstrat.testing` checks those guarantees on
any implementation (``check_target_verify_policy`` and friends).
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

import torch

from specstrat.batch import PrebuiltBatch
from specstrat.relay import RelayPayload

__all__ = [
    "DisaggDraftBuilder",
    "DraftT_co",
    "FutureMap",
    "FutureMapFactory",
    "TargetVerifyPolicy",
]

DraftT_co = TypeVar("DraftT_co", covariant=True)


@runtime_checkable
class TargetVerifyPolicy(Protocol):
    """How many tokens per request TARGET_VERIFY runs, and whether a draft worker may run it.

    Called once at graph-runner initialisation (to size the captured TARGET_VERIFY batch at
    ``bs * T`` tokens per bucket) and again when the runner builds attention metadata.

    Guarantees: both methods are pure (same inputs, same answer; no dependence on step state);
    ``get_num_tokens_per_req_for_target_verify`` returns an ``int`` ``T`` with
    ``1 <= T <= num_draft_tokens + 1`` for every ``num_draft_tokens >= 1``.
    """

    def supports_target_verify_for_draft(self) -> bool:
        """Whether a *draft* worker may run TARGET_VERIFY forwards (DFLASH, DSPARK do)."""
        ...

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        """Tokens per request ``T`` that TARGET_VERIFY processes on this worker."""
        ...


@runtime_checkable
class FutureMap(Protocol):
    """The overlap relay: results of step N that step N+1 reads before N has finished.

    ``slots`` are request-pool indices (int64 tensors on the relay's device); row 0 is the
    padding row that padded graph batches may read and write harmlessly. Called by the scheduler
    in overlap mode: ``publish`` when step N's new sequence lengths are known, ``stash`` when its
    bonus tokens (and, as the algorithm needs, topk / hidden states) are produced, ``resolve``
    when step N+1 builds its inputs.

    Guarantees: ``resolve(slots)`` returns, for each slot, the values of the latest
    ``publish``/``stash`` to that slot (never another request's, never a stale one); a write to
    one slot leaves every other slot unchanged; a payload whose width or dtype disagrees with the
    buffers already allocated for a field raises :class:`~specstrat.errors.RelayError` naming the
    field, never casts or overwrites silently.
    """

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Record the step's new sequence lengths for ``slots``."""
        ...

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        """Record the step's bonus tokens and draft state for ``slots``."""
        ...

    def resolve(self, slots: torch.Tensor) -> RelayPayload:
        """What the next step reads for ``slots``: every field written so far, one row each."""
        ...


@runtime_checkable
class FutureMapFactory(Protocol):
    """Creates the overlap relay; called once, by ``init_overlap``, when overlap mode starts.

    Guarantees: the returned map satisfies :class:`FutureMap` and accepts every slot in
    ``0..max_running_requests`` (or refuses with :class:`~specstrat.errors.RelayError` when a
    write would alias a live entry; it never corrupts one).
    """

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> FutureMap:
        """A fresh, empty relay sized for the scheduler's limits."""
        ...


@runtime_checkable
class DisaggDraftBuilder(Protocol[DraftT_co]):
    """Rebuilds draft state on the decode side of prefill/decode disaggregation.

    Called once per received batch, after PREBUILT admission and after ``last_tokens`` (the
    first decode input of each request, ``[bs]`` int64) are built. With overlap on
    (``batch.enable_overlap`` and a ``future_map``), the builder publishes ``batch.seq_lens`` and
    stashes its payload at ``batch.slots`` so the first overlapped step resolves it.

    Guarantees: works on any batch size including 0; never loops over requests to stack tensors
    (fields arrive batched); does not modify the batch's tensors; returns ``None`` only when the
    algorithm has no draft state to carry (the scheduler then decodes plainly from
    ``last_tokens``); raises :class:`~specstrat.errors.DisaggError` naming the request ids when a
    field the algorithm needs did not arrive.
    """

    def build_disagg_draft_input(
        self,
        batch: PrebuiltBatch,
        last_tokens: torch.Tensor,
        future_map: FutureMap | None,
    ) -> DraftT_co | None:
        """The draft input the first decode step starts from, or ``None`` for none."""
        ...
