"""The speculation policy's test kit: a conformance runner, a scripted policy and a faulty one.

``check_speculation_policy(policy)`` checks a :class:`~specstrat.protocols.SpeculationPolicy`
as the engine will use it: its declaration (the same distinct ints >= 1 every time), its
choosers (every answer an int among the declared candidates, the same answers from two fresh
choosers fed the same observations) and one real engine run (lossless, nothing leaked).
:class:`ScriptedSpeculationPolicy` answers a fixed script of widths (a run that passes through
``D = 1`` on cue); :class:`FaultySpeculationPolicy` wraps a policy and fails on cue, as the
doubles of :mod:`specstrat.testing.doubles` do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from specstrat._hooks import hook_label
from specstrat._ints import is_int
from specstrat.algorithm import check_strategy
from specstrat.errors import ConformanceError, InvalidConfig, SpecstratError
from specstrat.protocols import SpeculationPolicy, WidthChooser
from specstrat.speculation import SpeculationObservation
from specstrat.testing.doubles import Fault, _Cue

__all__ = [
    "FaultyChooser",
    "FaultySpeculationPolicy",
    "ScriptedChooser",
    "ScriptedSpeculationPolicy",
    "check_speculation_policy",
    "observations",
]


def _fail(hook: str, text: str, detail: str) -> ConformanceError:
    return ConformanceError(f"{hook} broke the obligation '{text}': {detail}")


def observations(
    candidates: tuple[int, ...], per_request: bool = True
) -> list[SpeculationObservation]:
    """A fixed sequence of observations over ``candidates``: batch sizes 1 to 64, acceptance
    high, low and unobserved, step costs unmeasured, then measured (wider steps cost more);
    acceptance per request only where ``per_request`` (a policy's declaration)."""
    out = []
    depth = max(candidates) - 1
    for step, (bs, rate) in enumerate(
        [(1, None), (1, 0.9), (4, 0.5), (16, 0.1), (64, 0.9), (3, 0.0), (1, 0.7), (8, 0.3)] * 3
    ):
        measured = step >= 8
        accepted = tuple(int(rate * depth) if rate is not None else 0 for _ in range(bs))
        out.append(
            SpeculationObservation(
                batch_size=bs,
                candidates=candidates,
                current=candidates[step % len(candidates)],
                step=step,
                acceptance=(rate,) * depth,
                request_acceptance=((rate,) * depth,) * bs if per_request else None,
                recent_accepted=(accepted,) if step else (),
                recent_widths=(candidates[-1],) if step else (),
                confidence=None if step % 2 else (0.5,) * depth,
                step_seconds=tuple(
                    (0.01 * (1 + w / 4) * (1 + bs / 16) if measured else None) for w in candidates
                ),
            )
        )
    return out


def _declared(hook: str, policy: SpeculationPolicy, d: int) -> tuple[int, ...]:
    text = f"candidate_widths({d}) is the same non-empty sequence of distinct ints >= 1"
    answers = []
    for _ in range(2):
        try:
            answer = policy.candidate_widths(d)
        except InvalidConfig:
            return ()  # a refusal of this D, named by the policy
        except Exception as exc:
            raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        widths = (
            tuple(answer) if isinstance(answer, Sequence) and not isinstance(answer, str) else None
        )
        if (
            not widths
            or any(not is_int(w) or w < 1 for w in widths)
            or len(set(widths)) < len(widths)
        ):
            raise _fail(hook, text, f"declared {answer!r}")
        answers.append(widths)
    if answers[0] != answers[1]:
        raise _fail(hook, text, f"declared {answers[0]!r}, then {answers[1]!r}")
    return tuple(sorted(answers[0]))


def _answers(hook: str, chooser: WidthChooser, seen: list[SpeculationObservation]) -> list[int]:
    text = "choose_width answers an int among the declared candidates"
    out = []
    for observation in seen:
        try:
            answer = chooser.choose_width(observation)
        except Exception as exc:
            raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        if not is_int(answer) or answer not in observation.candidates:
            message = (
                f"answered {answer!r} ({type(answer).__name__}) at step "
                f"{observation.step} (batch size {observation.batch_size}); candidates are "
                f"{list(observation.candidates)}"
            )
            raise _fail(hook, text, message)
        out.append(answer)
    return out


def check_speculation_policy(
    policy: object, *, engine_run: bool = True, algorithm: str | None = None
) -> dict[int, tuple[int, ...]]:
    """``policy`` declares the same candidates every time (for D = 1, 2, 4, 8; an
    ``InvalidConfig`` refuses a D), answers only declared ints (a ``bool`` is not one), gives
    the same answers from two fresh choosers fed the same observations, and (``engine_run``)
    runs NGRAM in a real engine losslessly, leaking nothing. Returns the declared candidates by
    configured D; a broken obligation raises :class:`~specstrat.errors.ConformanceError`
    naming the policy and the value. ``algorithm``: the name of the algorithm the policy belongs
    to, for messages."""
    hook = hook_label(SpeculationPolicy, "speculation", policy, algorithm)
    try:
        check_strategy("speculation", SpeculationPolicy, policy)
    except SpecstratError as exc:
        raise _fail(hook, "implements SpeculationPolicy", str(exc)) from exc
    spec = cast("SpeculationPolicy", policy)
    per_request = spec.per_request_acceptance
    if not isinstance(per_request, bool):
        problem = (
            f"it is {per_request!r} ({type(per_request).__name__}); declare True only if the "
            "chooser reads SpeculationObservation.request_acceptance"
        )
        raise _fail(hook, "per_request_acceptance is a bool", problem)
    declared = {}
    for d in (1, 2, 4, 8):
        candidates = _declared(hook, spec, d)
        if not candidates:
            continue
        declared[d] = candidates
        runs = []
        for _ in range(2):
            try:
                chooser = spec.create_chooser(candidates, d)
                check_strategy(f"{hook}.create_chooser() result", WidthChooser, chooser)
            except Exception as exc:
                raise _fail(hook, "create_chooser returns a WidthChooser", str(exc)) from exc
            runs.append(_answers(hook, chooser, observations(candidates, per_request)))
        if runs[0] != runs[1]:
            text = "two fresh choosers fed the same observations answer the same"
            raise _fail(hook, text, f"answered {runs[0]} then {runs[1]} for D={d}")
    if not declared:
        raise _fail(hook, "declares candidates for some D in 1, 2, 4, 8", "it refused every one")
    if engine_run:
        _engine_run(hook, spec, max(declared))
    return declared


def _engine_run(hook: str, policy: SpeculationPolicy, d: int) -> None:
    """NGRAM under ``policy`` on the embedded models: target-only output, nothing leaked."""
    from specstrat.builtins import NGRAM, NONE
    from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload  # loads models

    models = EmbeddedModels.load()
    requests = workload(4, seed=7)
    config = EngineConfig(num_draft_tokens=d, context_len=512, max_running_requests=4)
    want = Engine(NONE, models, config).run(requests)
    engine = Engine(replace(NGRAM, speculation=policy), models, config)
    before = (engine.free_slots, engine.free_kv_tokens)
    text = "runs in an engine without changing a token or leaking a slot"
    try:
        got = engine.run(requests)
    except SpecstratError as exc:
        raise _fail(hook, text, str(exc)) from exc
    if got != want:
        raise _fail(hook, text, "the output differs from target-only greedy decoding")
    if (engine.free_slots, engine.free_kv_tokens) != before:
        raise _fail(hook, text, "slots or KV were not returned")


class ScriptedChooser:
    """Answers the script's widths in turn, then its last one."""

    def __init__(self, script: tuple[int, ...]) -> None:
        self.script = script

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The script's width for this step."""
        return self.script[min(observation.step, len(self.script) - 1)]


@dataclass(frozen=True, slots=True)
class ScriptedSpeculationPolicy:
    """Answers ``script[step]`` (its last entry past the end): e.g. ``(1,) * 20 + (4,)``
    decodes plainly for 20 steps, then drafts 3 tokens a step."""

    script: tuple[int, ...]
    per_request_acceptance = False  # reads the step number only

    def __post_init__(self) -> None:
        if not self.script or any(not is_int(w) or w < 1 for w in self.script):
            raise InvalidConfig(
                f"ScriptedSpeculationPolicy: script={self.script!r} must be ints >= 1"
            )

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """Every width the script names."""
        return tuple(sorted(set(self.script)))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> ScriptedChooser:
        """A chooser reading the script by step."""
        return ScriptedChooser(self.script)


class FaultyChooser:
    """A chooser whose ``choose_width`` fails on cue."""

    def __init__(self, inner: WidthChooser, cue: _Cue) -> None:
        self.inner, self.cue = inner, cue

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The wrapped answer, or the fault."""
        return self.cue("choose_width", lambda: self.inner.choose_width(observation))


@dataclass(frozen=True, slots=True)
class FaultySpeculationPolicy:
    """Wraps a policy; ``method`` (``candidate_widths``, ``create_chooser`` or the chooser's
    ``choose_width``) fails on cue: raises ``fault`` or returns ``fault(answer)``."""

    inner: SpeculationPolicy
    method: str
    fault: Fault
    after: int = field(default=0, kw_only=True)

    @property
    def per_request_acceptance(self) -> bool:
        """The wrapped policy's declaration."""
        return self.inner.per_request_acceptance

    def candidate_widths(self, num_draft_tokens: int) -> Sequence[int]:
        """The wrapped declaration, or the fault."""
        cue = _Cue(self.method, self.fault)
        return cue("candidate_widths", lambda: self.inner.candidate_widths(num_draft_tokens))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> FaultyChooser:
        """The wrapped chooser, failing on cue."""
        cue = _Cue(self.method, self.fault, self.after)
        inner = cue(
            "create_chooser", lambda: self.inner.create_chooser(candidates, num_draft_tokens)
        )
        return FaultyChooser(inner, cue)
