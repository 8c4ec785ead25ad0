"""Per-step draft widths: the algorithm's speculation policy, checked.

At engine start :func:`candidate_widths` asks ``algo.speculation`` for its candidate values of D
(checked: distinct ints >= 1; :func:`top_tokens_per_req` checks the largest fits the context; a
non-speculative algorithm has the one lane D = 1, plain decoding) and :func:`build_lanes` builds one
:class:`WidthLane` per candidate: its tokens per request T (from the target-verify policy), its tree
shape and a verifier with graph buckets of its own. Before each decode step
:meth:`WidthControl.choose` asks the policy's chooser for the step's D (checked to be a declared
candidate) from the :class:`~specstrat.speculation.SpeculationObservation` the run's ledger
(:mod:`specstrat.runtime._stats`) folded from the request-steps requests kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specstrat._hooks import call_hook, call_start_hook
from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm, check_strategy
from specstrat.contracts import hook_error
from specstrat.drafting import TreeShape
from specstrat.errors import InternalError, InvalidConfig
from specstrat.protocols import WidthChooser
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._policy import check_same_tokens_per_req, tree_shape, verify_tokens_per_req
from specstrat.runtime._requests import EngineConfig
from specstrat.runtime._verify import Verifier
from specstrat.runtime._worker import ModelWorker
from specstrat.speculation import SpeculationObservation

__all__ = [
    "WidthControl",
    "WidthLane",
    "build_lanes",
    "candidate_widths",
    "top_tokens_per_req",
]

_DECLARE = "speculation.candidate_widths"
_CHOOSE = "speculation.choose_width"


@dataclass(frozen=True, slots=True)
class WidthLane:
    """One candidate D: its tokens per request T, draft tree and verifier (graph buckets
    included)."""

    width: int
    tokens_per_req: int
    tree: TreeShape
    verifier: Verifier

    @property
    def max_nodes(self) -> int:
        """Draft nodes a step at this D may propose (T - 1)."""
        return self.tokens_per_req - 1


def candidate_widths(algo: SpecAlgorithm[Any], cfg: EngineConfig) -> tuple[int, ...]:
    """The policy's declared D values, ascending; D = 1 alone (plain decoding) for a
    non-speculative algorithm (whose policy is not consulted)."""
    if not algo.is_speculative():
        return (1,)
    policy = type(algo.speculation).__name__
    answer = call_start_hook(
        algo.name, _DECLARE, algo.speculation.candidate_widths, cfg.num_draft_tokens
    )
    widths = tuple(answer) if isinstance(answer, Sequence) and not isinstance(answer, str) else ()
    if not widths or any(not is_int(w) or w < 1 for w in widths) or len(set(widths)) < len(widths):
        raise hook_error(
            algo.name,
            _DECLARE,
            f"speculation={policy} declared {answer!r}; declare a non-empty sequence of "
            "distinct ints >= 1 (D, root included; 1 = plain decode)",
        )
    return tuple(sorted(widths))


def top_tokens_per_req(algo: SpecAlgorithm[Any], cfg: EngineConfig, widths: tuple[int, ...]) -> int:
    """T of the largest candidate (checked pure; it must fit the context, or the policy that
    declared it is named)."""
    try:
        return verify_tokens_per_req(algo, replace(cfg, num_draft_tokens=widths[-1]))
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
            else verify_tokens_per_req(algo, replace(cfg, num_draft_tokens=width))
        )
        graphs = (
            GraphRunner(worker, algo, width, buckets=cfg.graph_buckets)
            if algo.is_speculative() and cfg.use_graph_runner
            else None
        )
        if graphs is not None:
            check_same_tokens_per_req(
                algo, False, "when its graph runner was built", graphs.tokens_per_req, tokens
            )
        verifier = Verifier(worker, tokens, graph_runner=graphs, ragged=ragged)
        lanes[width] = WidthLane(width, tokens, _lane_tree(algo, tokens, width, top), verifier)
    return lanes


def _lane_tree(algo: SpecAlgorithm[Any], tokens: int, width: int, top: TreeShape) -> TreeShape:
    """The tree policy's shape for a lane's T; where it refuses a narrower lane (a top-k tree
    deeper than T - 1), the widest lane's tree cut to depth T - 1; where every lane verifies
    one token, the widest lane's chain of no nodes (a D = 1 step drafts nothing)."""
    if top.tokens_per_req == 1:
        return top
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
            algo.name,
            "speculation.per_request_acceptance",
            f"speculation={type(policy).__name__} declared {answer!r} "
            f"({type(answer).__name__}); declare True if its chooser reads "
            "SpeculationObservation.request_acceptance, else False",
        )
    return answer


class WidthControl:
    """Asks the chooser for each step's D (forward thread only). What the chooser observes is
    folded by the run's ledger (:mod:`specstrat.runtime._stats`) from the kept request-steps;
    the control adds what only the forward thread knows: the previous step's D and the count
    of steps run."""

    def __init__(
        self, algo: SpecAlgorithm[Any], lanes: dict[int, WidthLane], num_draft_tokens: int
    ) -> None:
        self.algo, self.lanes = algo, lanes
        self.candidates = tuple(sorted(lanes))
        self.depth = max(lane.max_nodes for lane in lanes.values())
        self.chooser: WidthChooser | None = None
        self.per_request = False  # counts per request only for a policy that reads them
        if algo.is_speculative():
            chooser = call_start_hook(
                algo.name,
                "speculation.create_chooser",
                algo.speculation.create_chooser,
                self.candidates,
                num_draft_tokens,
            )
            check_strategy(
                f"{algo.name}.speculation.create_chooser() result", WidthChooser, chooser
            )
            self.chooser = chooser
            self.per_request = _declares_per_request(algo)
        self.current = self.candidates[-1]  # the D of the previous step
        self.steps = 0  # decode steps chosen

    def choose(self, slots: Sequence[int], observed: SpeculationObservation | None) -> WidthLane:
        """The lane of the D the policy answers for a step over ``slots`` (checked), from
        ``observed`` (the ledger's, taken when the step was planned)."""
        if self.chooser is None:
            return self.lanes[self.candidates[0]]
        if observed is None or observed.batch_size != len(slots):
            raise InternalError(
                f"a decode step over {len(slots)} requests was planned without its "
                "observation; this is a bug in specstrat, please report it"
            )
        observation = replace(observed, current=self.current, step=self.steps)
        answer = call_hook(self.algo.name, _CHOOSE, self.chooser.choose_width, observation)
        if not is_int(answer) or answer not in self.lanes:
            policy = type(self.algo.speculation).__name__
            raise hook_error(
                self.algo.name,
                _CHOOSE,
                f"speculation={policy} answered D={answer!r} ({type(answer).__name__}) for a "
                f"batch of {len(slots)}; answer an int among the declared candidates "
                f"{list(self.candidates)}",
            )
        self.current, self.steps = answer, self.steps + 1
        return self.lanes[answer]
