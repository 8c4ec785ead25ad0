"""The hooks a speculative-decoding algorithm is composed from, each a narrow Protocol.

A scheduler never asks an algorithm *what it is*; it calls these hooks and reads
:class:`~specstrat.algorithm.Capabilities`. Each docstring says when the scheduler calls the hook
and what an implementation must guarantee; :mod:`specstrat.testing` checks those guarantees on
any implementation (``check_target_verify_policy`` and friends).

The engine copies what a hook returns the moment it returns and uses only the copy, and what it
hands a hook is a copy it does not read back: a hook that keeps references and writes into them
later changes nothing (:mod:`specstrat.runtime._answers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

import torch

from specstrat.batch import PrebuiltBatch
from specstrat.drafting import (
    Acceptance,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
    TreeShape,
    VerifyInputs,
)
from specstrat.models import LoadedModels
from specstrat.relay import RelayPayload
from specstrat.speculation import SpeculationObservation

__all__ = [
    "AcceptanceRule",
    "DisaggDraftBuilder",
    "DraftAdmitter",
    "DraftProposer",
    "DraftT_co",
    "DraftT_contra",
    "Drafter",
    "DrafterFactory",
    "FutureMap",
    "FutureMapFactory",
    "SpeculationPolicy",
    "TargetVerifyPolicy",
    "TreePolicy",
    "WidthChooser",
]

DraftT_co = TypeVar("DraftT_co", covariant=True)
DraftT_contra = TypeVar("DraftT_contra", contravariant=True)


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
class TreePolicy(Protocol):
    """The draft tree an algorithm verifies: top-k expansion, depth and budget (EAGLE-2 style).

    Called once at engine start with the target's tokens per request ``T`` (the budget, root
    included); the engine hands the answer to the drafter in every
    :class:`~specstrat.drafting.DraftStep` and refuses, naming the drafter, a ``topk > 1``
    shape for a drafter whose ``needs.trees`` is False.

    Guarantees: pure; returns a :class:`~specstrat.drafting.TreeShape` whose
    ``tokens_per_req`` is the argument; a bad combination raises
    :class:`~specstrat.errors.InvalidConfig` naming the value.
    """

    def tree_shape(self, tokens_per_req: int) -> TreeShape:
        """The tree for ``tokens_per_req`` (T) verified tokens per request, root included."""
        ...


@runtime_checkable
class FutureMap(Protocol):
    """The overlap relay: results of step N that step N+1 reads before N has finished.

    ``slots`` are request-pool indices (int64 tensors on the relay's device); row 0 is the
    padding row that padded graph batches may read and write harmlessly. Called by the scheduler
    in both modes (the relay is always on): ``publish`` when step N's new sequence lengths are
    known, ``stash`` when its bonus tokens (and the drafter's relayed state) are produced,
    ``resolve`` when step N+1 builds its inputs.

    The scheduler resolves a finished request's slots once more when it releases them, so a
    relay that frees entries once read (the ring) holds nothing for finished requests.

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
    """Creates the relay; called once per engine, when it is built (the relay is on in sync and
    overlap mode alike, as SGLang 0.5.23's always-on FutureMap).

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

    Called once per received batch, after PREBUILT admission has installed its KV and built
    ``last_tokens`` (the first decode input of each request, ``[bs]`` int64). The relay is on in
    both modes (as SGLang 0.5.23's always-on FutureMap): given a ``future_map``, the builder
    publishes ``batch.seq_lens`` and stashes ``last_tokens`` as ``bonus_tokens`` (plus its draft
    state) at ``batch.slots``; the engine does not repeat those writes. What it returns is handed
    to the algorithm's drafter (``DraftAdmission.draft_input``).

    Guarantees: works on any batch size including 0; never loops over requests to stack tensors
    (fields arrive batched); does not modify the batch's tensors; returns ``None`` only when the
    algorithm has no draft state to carry (the first step then decodes plainly from
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


@runtime_checkable
class DraftAdmitter(Protocol[DraftT_contra]):
    """A drafter's request lifetime: requests come in, requests go.

    ``admit`` is called on the engine's forward thread once per batch of new requests: after a
    local prefill (``admission.hidden`` set, ``draft_input`` None) or after PREBUILT admission,
    with the ``DraftT`` the disagg builder returned (``None``: no draft state; the first step
    then proposes nothing for those requests). ``release`` is called once a request finished.

    Guarantees: ``admit`` returns the relay fields to stash for the new slots (an empty
    :class:`~specstrat.relay.RelayPayload` when it relays nothing); state is kept per target
    slot and ``release`` forgets all of it, so a slot reused by a later request starts clean.
    """

    def admit(self, admission: DraftAdmission[DraftT_contra]) -> RelayPayload:
        """Take on new requests; returns what to stash for them in the relay."""
        ...

    def release(self, slots: Sequence[int]) -> None:
        """Forget finished requests and free what they held (draft KV)."""
        ...


@runtime_checkable
class DraftProposer(Protocol):
    """A drafter's step: propose a draft tree, then learn what the target accepted.

    ``propose`` is called once per decode step for the running requests, before TARGET_VERIFY;
    ``commit`` after the acceptance rule decided, before the relay is written.

    Guarantees: ``propose`` returns a :class:`~specstrat.drafting.DraftTree` with one row per
    request of ``step.slots``, at most ``step.max_nodes`` nodes, token ids in the target's
    vocabulary (the plain scheduler verifies chains: node ``j``'s parent is ``j - 1``); a
    deterministic drafter leaves ``q`` None, a sampling one gives ``q`` for every node. ``commit``
    returns the relay fields the next ``propose`` reads (as ``step.payload``).
    """

    def propose(self, step: DraftStep) -> DraftTree:
        """Draft nodes for every running request."""
        ...

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Learn the accepted paths and bonus tokens; returns what to relay to the next step."""
        ...


@runtime_checkable
class Drafter(DraftAdmitter[DraftT_contra], DraftProposer, Protocol[DraftT_contra]):
    """A stateful drafter, created by a :class:`DrafterFactory` once per engine."""


@runtime_checkable
class DrafterFactory(Protocol[DraftT_contra]):
    """The ``drafter`` field of an algorithm: a frozen, picklable factory of drafters.

    Algorithms are shared and pickled for the prefill process, so they hold factories, not
    state. ``create_drafter`` is called once per engine with what the engine loaded;
    ``prefill_payload`` on the prefill side of disaggregation, after EXTEND, for what must travel.

    Guarantees: ``needs`` is constant and agrees with the algorithm's capabilities (checked at
    construction); ``prefill_payload`` returns exactly the fields of ``needs.prefill_fields``,
    one row per request; the factory holds no per-request state.
    """

    @property
    def needs(self) -> DrafterNeeds:
        """What the drafter needs from the engine and the prefill side."""
        ...

    def create_drafter(self, context: DrafterContext) -> Drafter[DraftT_contra]:
        """A fresh drafter for one engine."""
        ...

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Prefill side: the fields to send for requests whose bonus tokens (each one's first
        generated token) and last hidden states (``[bs, H]``) were just computed; called
        positionally, so an implementation may name its parameters as it likes."""
        ...


@runtime_checkable
class AcceptanceRule(Protocol):
    """The ``acceptance`` field of an algorithm: which drafts the target accepts.

    Called once per verify step on the forward thread, after TARGET_VERIFY, with the draft tree,
    the target's logits at the root and every node, and each request's sampling parameters.

    Guarantees: returns an :class:`~specstrat.drafting.Acceptance` whose path per request is a
    root-to-node path of the draft tree within its real nodes (``lengths``), and a bonus token
    in the vocabulary; ``lossless`` is True only when the output distribution equals the
    target's (greedy: output identical to target-only greedy decoding).
    """

    @property
    def lossless(self) -> bool:
        """Whether the rule preserves the target's output distribution."""
        ...

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """Accepted paths and bonus tokens."""
        ...


@runtime_checkable
class WidthChooser(Protocol):
    """A speculation policy's per-engine state: answers each decode step's D.

    Called on the engine's forward thread before every decode step of a speculative algorithm
    (sync, overlap and the decode side of disaggregation alike), with what the engine measured
    so far (:class:`~specstrat.speculation.SpeculationObservation`).

    Guarantees: returns an ``int`` among ``observation.candidates`` (the declared widths;
    anything else, a ``bool`` included, is a :class:`~specstrat.errors.StrategyError` naming
    the policy); the same state and observation give the same answer. ``1`` decodes plainly.
    Where the algorithm verifies ragged, the answer bounds every request's token count.
    """

    def choose_width(self, observation: SpeculationObservation) -> int:
        """D for the step about to run."""
        ...


@runtime_checkable
class SpeculationPolicy(Protocol):
    """The ``speculation`` field of an algorithm: how many tokens each decode step drafts.

    ``candidate_widths`` is called once at engine start with ``EngineConfig.num_draft_tokens``; the
    engine sizes KV reservations, relay widths and graph buckets for the largest answer and keeps a
    verify path (buckets, tree shape) per candidate. ``create_chooser`` is then called once per
    engine with the checked candidates, ascending, and the configured D, for the chooser that
    answers each step. Not consulted for a non-speculative algorithm (NONE decodes plainly).

    Guarantees: ``candidate_widths`` returns a non-empty sequence of distinct ints ``>= 1``
    (checked; a bad one, or one whose largest value the context cannot hold, is refused at
    engine start naming the policy); the policy itself holds no per-engine state (algorithms
    are shared and pickled), the chooser does.

    ``per_request_acceptance`` declares what the chooser reads beyond the global statistics:
    when true the engine counts acceptance by position for every request and hands it over
    as :attr:`~specstrat.speculation.SpeculationObservation.request_acceptance`; when false
    it counts nothing per request (that is work on every step's hot path) and the field is
    ``None``.
    """

    @property
    def per_request_acceptance(self) -> bool:
        """Whether the chooser reads ``SpeculationObservation.request_acceptance``."""
        ...

    def candidate_widths(self, num_draft_tokens: int) -> Sequence[int]:
        """The values of D this policy may answer, for the configured D."""
        ...

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> WidthChooser:
        """A fresh chooser for one engine, over the checked, ascending candidates."""
        ...
