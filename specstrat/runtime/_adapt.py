"""Per-step draft widths: the algorithm's speculation policy, checked, and what it observes.

At engine start :func:`candidate_widths` asks ``algo.speculation`` for its candidate values of
D (checked: distinct ints >= 1; :func:`top_width` checks the largest fits the context) and
:func:`build_lanes` builds one :class:`WidthLane` per candidate: its verify width T (from the
target-verify policy), its tree shape and a verifier with graph buckets of its own. Before each decode step
:meth:`WidthControl.choose` builds a :class:`~specstrat.speculation.SpeculationObservation` and
asks the policy's chooser for the step's D (checked to be a declared candidate); after the step
:meth:`WidthControl.record` counts what was proposed and accepted by position (only positions
proposed and verified; a batch at once, and per request only for a policy that declares
``per_request_acceptance``) and the step's measured cost at its D.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

import torch

from specstrat._hooks import call_hook, call_start_hook
from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm, check_strategy
from specstrat.contracts import hook_error
from specstrat.drafting import TreeShape
from specstrat.errors import InvalidConfig
from specstrat.protocols import WidthChooser
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._policy import check_same_width, tree_shape, verify_width
from specstrat.runtime._requests import EngineConfig
from specstrat.runtime._verify import Verifier
from specstrat.runtime._worker import ModelWorker
from specstrat.speculation import COST_WEIGHT, RECENT_STEPS, SpeculationObservation

__all__ = ["WidthControl", "WidthLane", "build_lanes", "candidate_widths", "top_width"]

_DECLARE = "speculation.candidate_widths"
_CHOOSE = "speculation.choose_width"


@dataclass(frozen=True, slots=True)
class WidthLane:
    """One candidate D: its verify width T, draft tree and verifier (graph buckets included)."""

    width: int
    tokens_per_req: int
    tree: TreeShape
    verifier: Verifier

    @property
    def max_nodes(self) -> int:
        """Draft nodes a step at this D may propose (T - 1)."""
        return self.tokens_per_req - 1


def candidate_widths(algo: SpecAlgorithm[Any], cfg: EngineConfig) -> tuple[int, ...]:
    """The policy's declared D values, ascending; the configured D alone for a
    non-speculative algorithm (whose policy is not consulted)."""
    if not algo.is_speculative():
        return (cfg.num_draft_tokens,)
    policy = type(algo.speculation).__name__
    answer = call_start_hook(
        algo.name, _DECLARE, algo.speculation.candidate_widths, cfg.num_draft_tokens
    )
    widths = tuple(answer) if isinstance(answer, Sequence) and not isinstance(answer, str) else ()
    if not widths or any(not is_int(w) or w < 1 for w in widths) or len(set(widths)) < len(widths):
        raise hook_error(
            algo.name, _DECLARE, f"speculation={policy} declared {answer!r}; declare a "
            "non-empty sequence of distinct ints >= 1 (D, root included; 1 = plain decode)"
        )  # fmt: skip
    return tuple(sorted(widths))


def top_width(algo: SpecAlgorithm[Any], cfg: EngineConfig, widths: tuple[int, ...]) -> int:
    """T of the largest candidate (checked pure; it must fit the context, or the policy that
    declared it is named)."""
    try:
        return verify_width(algo, replace(cfg, num_draft_tokens=widths[-1]))
    except InvalidConfig as exc:
        if len(widths) == 1 and widths[0] == cfg.num_draft_tokens:
            raise  # the configured D itself: the configuration's error, as before
        policy = type(algo.speculation).__name__
        raise InvalidConfig(
            f"{algo.name}: speculation={policy} declares D up to {widths[-1]}, more than this "
            f"engine allows: {exc}; declare smaller widths or raise context_len"
        ) from exc


def build_lanes(
    algo: SpecAlgorithm[Any],
    cfg: EngineConfig,
    worker: ModelWorker,
    widths: tuple[int, ...],
    top: TreeShape,
) -> dict[int, WidthLane]:
    """A lane per candidate D, each with its own verify buckets (as SGLang keeps one runtime
    state per step count); ``top``: the widest lane's tree (its T already checked)."""
    lanes = {}
    ragged = cfg.ragged_verify and algo.capabilities.supports_ragged_verify
    for width in widths:
        tokens = (
            top.tokens_per_req
            if width == widths[-1]
            else verify_width(algo, replace(cfg, num_draft_tokens=width))
        )
        graphs = (
            GraphRunner(worker, algo, width, buckets=cfg.graph_buckets)
            if algo.is_speculative() and cfg.use_graph_runner
            else None
        )
        if graphs is not None:
            check_same_width(
                algo, False, "when its graph runner was built", graphs.tokens_per_req, tokens
            )
        verifier = Verifier(worker, tokens, graph_runner=graphs, ragged=ragged)
        lanes[width] = WidthLane(width, tokens, _lane_tree(algo, tokens, width, top), verifier)
    return lanes


def _lane_tree(algo: SpecAlgorithm[Any], tokens: int, width: int, top: TreeShape) -> TreeShape:
    """The tree policy's shape for a lane's T; where it refuses a narrower lane (a top-k tree
    deeper than T - 1), the widest lane's tree cut to depth T - 1."""
    try:
        return tree_shape(algo, tokens, width)
    except InvalidConfig:
        if tokens >= top.tokens_per_req:
            raise
        return TreeShape(
            topk=top.topk, num_steps=min(top.num_steps, tokens - 1), tokens_per_req=tokens
        )


def _declares_per_request(algo: SpecAlgorithm[Any]) -> bool:
    """The policy's ``per_request_acceptance``, checked to be a bool."""
    policy = algo.speculation
    answer = call_start_hook(
        algo.name, "speculation.per_request_acceptance", lambda: policy.per_request_acceptance
    )
    if not isinstance(answer, bool):
        raise hook_error(
            algo.name, "speculation.per_request_acceptance", f"speculation="
            f"{type(policy).__name__} declared {answer!r} ({type(answer).__name__}); declare "
            "True if its chooser reads SpeculationObservation.request_acceptance, else False"
        )  # fmt: skip
    return answer


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


class WidthControl:
    """Asks the chooser for each step's D and keeps what it observes (forward thread only)."""

    def __init__(
        self,
        algo: SpecAlgorithm[Any],
        lanes: dict[int, WidthLane],
        num_draft_tokens: int,
        widths: list[int],
    ) -> None:
        self.algo, self.lanes = algo, lanes
        self.candidates = tuple(sorted(lanes))
        self.depth = max(lane.max_nodes for lane in lanes.values())
        self.chooser: WidthChooser | None = None
        self.per_request = False  # counts per request only for a policy that reads them
        if algo.is_speculative():
            chooser = call_start_hook(
                algo.name, "speculation.create_chooser", algo.speculation.create_chooser,
                self.candidates, num_draft_tokens,
            )  # fmt: skip
            check_strategy(
                f"{algo.name}.speculation.create_chooser() result", WidthChooser, chooser
            )
            self.chooser = chooser
            self.per_request = _declares_per_request(algo)
        self.widths = widths  # RunStats.widths: one entry per decode step
        self.counts = _Counts(self.depth)
        self.per_slot: dict[int, _Counts] = {}
        self.recent: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=RECENT_STEPS)
        self.confidence: tuple[float, ...] | None = None
        self.costs: dict[tuple[int, int], float] = {}
        self.current = self.candidates[-1]

    def choose(self, slots: Sequence[int]) -> WidthLane:
        """The lane of the D the policy answers for a step over ``slots`` (checked)."""
        if self.chooser is None:
            return self.lanes[self.candidates[0]]
        bucket = _bucket(len(slots))
        observation = SpeculationObservation(
            batch_size=len(slots),
            candidates=self.candidates,
            current=self.current,
            step=len(self.widths),
            acceptance=self.counts.rates(),
            request_acceptance=self._request_rates(slots) if self.per_request else None,
            recent_accepted=tuple(a for _, a in self.recent),
            recent_widths=tuple(w for w, _ in self.recent),
            confidence=self.confidence,
            step_seconds=tuple(self.costs.get((bucket, w)) for w in self.candidates),
        )
        answer = call_hook(self.algo.name, _CHOOSE, self.chooser.choose_width, observation)
        if not is_int(answer) or answer not in self.lanes:
            policy = type(self.algo.speculation).__name__
            raise hook_error(
                self.algo.name, _CHOOSE, f"speculation={policy} answered D={answer!r} "
                f"({type(answer).__name__}) for a batch of {len(slots)}; answer an int among "
                f"the declared candidates {list(self.candidates)}"
            )  # fmt: skip
        return self.lanes[answer]

    def _request_rates(self, slots: Sequence[int]) -> tuple[tuple[float | None, ...], ...]:
        empty = _Counts(self.depth)  # a request not yet verified: every position unobserved
        return tuple(self.per_slot.get(s, empty).rates() for s in slots)

    def record(
        self,
        lane: WidthLane,
        slots: Sequence[int],
        proposed: Sequence[int],
        accepted: Sequence[int],
        confidence: torch.Tensor | None,
        seconds: float,
    ) -> None:
        """Count a finished step at ``lane``'s D: positions proposed and accepted per request,
        the drafter's confidences (``[bs, nodes]``, or None), the step's seconds."""
        if self.chooser is None:  # plain decoding: every step is D = 1
            self.widths.append(1)
            return
        self.widths.append(lane.width)
        self.current = lane.width
        self.counts.add_batch(proposed, accepted)
        if self.per_request:
            for slot, p, a in zip(slots, proposed, accepted, strict=True):
                self.per_slot.setdefault(slot, _Counts(self.depth)).add(p, a)
        self.recent.append((lane.width, tuple(accepted)))
        if confidence is not None and confidence.numel():
            self.confidence = tuple(confidence.double().mean(0).tolist())
        key = (_bucket(len(slots)), lane.width)
        old = self.costs.get(key)
        self.costs[key] = (
            seconds if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * seconds
        )

    def forget(self, slots: Sequence[int]) -> None:
        """Finished requests: their per-request counts go (a reused slot starts clean)."""
        for slot in slots:
            self.per_slot.pop(slot, None)
