"""Run statistics, one owner: each decode step emits a frozen :class:`StepRecord`, and the
:class:`RunLedger` folds the records into :class:`~specstrat.runtime._requests.RunStats` and
into what the speculation policy observes (:class:`~specstrat.speculation.SpeculationObservation`).

The ledger lives on the scheduler thread: :meth:`Scheduler.absorb
<specstrat.runtime._scheduler.Scheduler.absorb>` folds each step's record with the request-steps
a request kept (an overlapped extra step of a finished request is dropped with its tokens), and
:meth:`Scheduler.plan <specstrat.runtime._scheduler.Scheduler.plan>` takes the observation for
the step it plans. So the policy, ``RunStats``, ``demo --json``, ``--trace`` and ``specstrat
bench`` count the same request-steps: in sync mode the policy sees every step before the next;
in overlap mode step N + 1 is planned while step N runs, so it sees the steps up to N - 1 (as a
production engine's scheduler does), and the forward thread fills in what only it knows (the
previous step's D and the step count, :meth:`~specstrat.runtime._adapt.WidthControl.choose`).

τ (``RunStats.acceptance_length``) counts drafted steps only (D > 1); request-steps at D = 1
(plain decoding) are counted apart (``RunStats.plain_steps``, shared in ``plain_step_share``),
as defined in ``docs/glossary.md``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import repeat

from specstrat.runtime._requests import RunStats
from specstrat.speculation import COST_WEIGHT, RECENT_STEPS, SpeculationObservation

__all__ = ["RunLedger", "StepRecord"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one decode step measured, per request in the step's slot order (parallel tuples):
    ``proposed`` draft positions (a tree's depth), ``accepted`` drafts, ``verified`` target
    tokens of its verify row (T, or drafts + 1 under ragged verify); the step's D (``width``;
    1 for plain decoding), the drafter's mean confidence by position over the step's batch
    (``None``: it reported none), and the step's stage seconds (draft = ``drafter.propose``,
    verify = the target's forward, accept = the rule, ``seconds`` the whole step)."""

    width: int
    proposed: tuple[int, ...]
    accepted: tuple[int, ...]
    verified: tuple[int, ...]
    confidence: tuple[float, ...] | None
    draft_seconds: float
    verify_seconds: float
    accept_seconds: float
    seconds: float

    def kept(self, dropped: Collection[int]) -> StepRecord:
        """The record without the request-steps at indices ``dropped``."""
        keep = [i for i in range(len(self.proposed)) if i not in dropped]
        return StepRecord(
            self.width,
            tuple(self.proposed[i] for i in keep),
            tuple(self.accepted[i] for i in keep),
            tuple(self.verified[i] for i in keep),
            self.confidence,
            self.draft_seconds,
            self.verify_seconds,
            self.accept_seconds,
            self.seconds,
        )


def _bucket(batch_size: int) -> int:
    """The power of two at or above ``batch_size``: step costs are kept per bucket."""
    return 1 << max(batch_size - 1, 0).bit_length()


class _Counts:
    """Conditional acceptance counts by position: ``reached[j]`` request-steps that proposed
    position j + 1 and accepted position j; ``hit[j]`` those that accepted position j + 1."""

    def __init__(self, depth: int) -> None:
        self.reached, self.hit = [0] * depth, [0] * depth

    def add(self, proposed: int, accepted: int) -> None:
        """One request-step: ``proposed`` positions, ``accepted`` of them."""
        for j in range(min(proposed, accepted + 1, len(self.reached))):
            self.reached[j] += 1
            self.hit[j] += j < accepted

    def add_batch(self, proposed: Sequence[int], accepted: Sequence[int]) -> None:
        """A step's request-steps at once: a histogram of how far each reached and how many
        it accepted, then one pass over the positions (no per-request loop)."""
        depth = len(self.reached)
        reach = Counter(map(min, proposed, [a + 1 for a in accepted], repeat(depth)))
        hits = Counter(map(min, accepted, repeat(depth)))
        reaching, hitting = len(proposed), len(proposed)
        for j in range(depth):
            reaching -= reach.get(j, 0)
            hitting -= hits.get(j, 0)
            if reaching <= 0:
                break
            self.reached[j] += reaching
            self.hit[j] += hitting

    def rates(self) -> tuple[float | None, ...]:
        return tuple(h / r if r else None for h, r in zip(self.hit, self.reached, strict=True))


class _Observed:
    """What a speculation policy observes, folded from the kept request-steps."""

    def __init__(self, depth: int, current: int, per_request: bool) -> None:
        self.depth, self.current, self.per_request = depth, current, per_request
        self.counts = _Counts(depth)
        self.per_slot: dict[int, _Counts] = {}
        self.recent: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=RECENT_STEPS)
        self.confidence: tuple[float, ...] | None = None
        self.costs: dict[tuple[int, int], float] = {}

    def fold(self, slots: Sequence[int], record: StepRecord, batch_size: int) -> None:
        """One step's kept request-steps (``slots``, ``record``) of a batch of ``batch_size``."""
        self.current = record.width
        self.counts.add_batch(record.proposed, record.accepted)
        if self.per_request:  # a per-request loop only for a policy that reads the counts
            for slot, p, a in zip(slots, record.proposed, record.accepted, strict=True):
                self.per_slot.setdefault(slot, _Counts(self.depth)).add(p, a)
        self.recent.append((record.width, record.accepted))
        if record.confidence is not None:
            self.confidence = record.confidence
        key = (_bucket(batch_size), record.width)
        old = self.costs.get(key)
        seconds = record.seconds
        self.costs[key] = (
            seconds if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * seconds
        )

    def observation(
        self, slots: Sequence[int], candidates: tuple[int, ...], step: int
    ) -> SpeculationObservation:
        bucket = _bucket(len(slots))
        requests = None
        if self.per_request:
            empty = _Counts(self.depth)  # a request not yet verified: every position unobserved
            requests = tuple(self.per_slot.get(s, empty).rates() for s in slots)
        return SpeculationObservation(
            batch_size=len(slots),
            candidates=candidates,
            current=self.current,
            step=step,
            acceptance=self.counts.rates(),
            request_acceptance=requests,
            recent_accepted=tuple(a for _, a in self.recent),
            recent_widths=tuple(w for w, _ in self.recent),
            confidence=self.confidence,
            step_seconds=tuple(self.costs.get((bucket, w)) for w in candidates),
        )


class RunLedger:
    """The one writer of a run's statistics (scheduler thread): folds step records and kept
    tokens into :attr:`stats`, and what the speculation policy observes.

    ``candidates``: the declared D values, ascending; ``depth``: the widest lane's draft nodes;
    ``observes``: whether a speculation policy reads observations (a speculative algorithm);
    ``per_request``: whether it reads per-request acceptance.
    """

    def __init__(
        self,
        stats: RunStats,
        candidates: tuple[int, ...],
        depth: int,
        *,
        observes: bool,
        per_request: bool,
    ) -> None:
        self.stats, self.candidates, self.observes = stats, candidates, observes
        self._observed = _Observed(depth, candidates[-1], per_request)

    def fold_step(self, slots: Sequence[int], record: StepRecord, dropped: Collection[int]) -> None:
        """One decode step over ``slots``; the request-steps at indices ``dropped`` (overlapped
        extra steps of finished requests) count only in ``dropped_steps``."""
        stats = self.stats
        stats.decode_steps += 1
        stats.widths.append(record.width)
        stats.draft_seconds += record.draft_seconds
        stats.verify_seconds += record.verify_seconds
        stats.accept_seconds += record.accept_seconds
        stats.decode_seconds += record.seconds
        batch_size = len(slots)
        if dropped:  # rare (overlap's last step of a request): the per-request filter is here
            stats.dropped_steps += len(dropped)
            record = record.kept(dropped)
            slots = [s for i, s in enumerate(slots) if i not in dropped]
        kept = len(record.proposed)
        if record.width == 1:  # plain decoding: apart from tau (docs/glossary.md)
            stats.plain_steps += kept
        elif kept:
            accepted = record.accepted
            stats.count_verified(
                list(record.proposed), list(accepted), sum(accepted) + kept, sum(record.verified)
            )
        if self.observes:
            self._observed.fold(slots, record, batch_size)

    def fold_tokens(self, rids: Sequence[str], generated: int, now: float) -> None:
        """Tokens a step's requests ``rids`` kept (``generated`` in all) at ``now``."""
        stats = self.stats
        stats.generated_tokens += generated
        first = stats.first_token_at
        for rid in rids:
            first.setdefault(rid, now)
        stats.last_token_at.update(dict.fromkeys(rids, now))

    def observation(self, slots: Sequence[int]) -> SpeculationObservation | None:
        """What the policy observes before a step over ``slots`` (``None``: no policy reads
        it); ``current`` and ``step`` as folded so far (the forward thread has the newest)."""
        if not self.observes:
            return None
        return self._observed.observation(slots, self.candidates, self.stats.decode_steps)

    def forget(self, slots: Sequence[int]) -> None:
        """Released requests: their per-request counts go (a reused slot starts clean)."""
        per_slot = self._observed.per_slot
        if per_slot:
            for slot in slots:
                per_slot.pop(slot, None)
