"""Conformance runners for the drafting hooks: ``check_drafter`` and ``check_acceptance_rule``.

``check_acceptance_rule`` feeds a rule draft trees (chains, ragged chains, a branching tree) and
target logits, and checks every answer against the contract the engine enforces
(:mod:`specstrat.contracts`); a rule that says it is lossless must, at temperature 0, accept
exactly what greedy decoding would. ``check_drafter`` runs the drafter for real: an engine on the
embedded models (or yours), sync and overlap, D = 1 and 3, with greedy acceptance; its output must
equal target-only decoding and every request slot and KV index must come back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import torch

from specstrat._hooks import hook_label
from specstrat.algorithm import Capabilities, SpecAlgorithm, check_strategy, required_capabilities
from specstrat.contracts import check_acceptance
from specstrat.drafting import GREEDY, DrafterNeeds, DraftTree, TreeShape, VerifyInputs
from specstrat.errors import ConformanceError, InvalidConfig, SpecstratError
from specstrat.models import LoadedModels
from specstrat.protocols import AcceptanceRule, DrafterFactory, TreePolicy
from specstrat.relay import RelayPayload
from specstrat.strategies.acceptance import GreedyAcceptance
from specstrat.strategies.disagg import NoDraftStateDisaggDraftBuilder
from specstrat.strategies.future_map import SlotFutureMapFactory
from specstrat.strategies.tree import ChainTree
from specstrat.strategies.verify_policies import OffsetVerifyPolicy

__all__ = ["check_acceptance_rule", "check_drafter", "check_tree_policy"]


def _fail(hook: str, text: str, detail: str) -> ConformanceError:
    return ConformanceError(f"{hook} broke the obligation '{text}': {detail}")


_T = TypeVar("_T")


def _declared(
    hook: str, field: str, protocol: type, impl: object, attribute: str, kind: type[_T]
) -> _T:
    """``impl`` implements ``protocol``; its ``attribute`` is a ``kind``, returned."""
    try:
        check_strategy(field, protocol, impl)
    except SpecstratError as exc:
        raise _fail(hook, f"implements {protocol.__name__}", str(exc)) from exc
    value = getattr(impl, attribute, None)
    if not isinstance(value, kind):
        raise _fail(hook, f"{attribute} is a {kind.__name__}", f"found {value!r}")
    return value


def _trees(vocab: int, gen: torch.Generator) -> list[tuple[str, DraftTree, torch.Tensor]]:
    """(name, drafts, logits) cases; drafts partly follow the logits' argmax so paths go deep."""
    cases = []
    for name, parents, lengths in (
        ("chain", [-1, 0, 1], [3, 3, 3, 3]),
        ("ragged chain", [-1, 0, 1], [0, 1, 3, 2]),
        ("tree", [-1, -1, 0, 1, 2], [5, 5, 3, 1]),
        ("empty", [], [0, 0, 0, 0]),
    ):
        bs, n = len(lengths), len(parents)
        logits = torch.randn(bs, n + 1, vocab, generator=gen, dtype=torch.float64)
        greedy = logits.argmax(-1)
        parent = torch.tensor(parents, dtype=torch.int64).expand(bs, n)
        tokens = greedy.gather(1, parent + 1)  # node j holds the target's choice at its parent
        flip = torch.rand(bs, n, generator=gen) < 0.3
        tokens = torch.where(flip, (tokens + 1) % vocab, tokens)
        drafts = DraftTree(tokens.contiguous(), parent.contiguous(), torch.tensor(lengths))
        cases.append((name, drafts, logits))
    return cases


def check_acceptance_rule(
    rule: object, *, vocab: int = 12, seed: int = 0, algorithm: str | None = None
) -> None:
    """``rule`` answers every case with a path of the tree within its real nodes and a bonus in
    the vocabulary, the same answer for the same greedy inputs, and — when it claims to be
    lossless — exactly the greedy answer at temperature 0. ``algorithm``: the name of the
    algorithm the rule belongs to, for messages."""
    hook = hook_label(AcceptanceRule, "acceptance", rule, algorithm)
    lossless = _declared(hook, "acceptance", AcceptanceRule, rule, "lossless", bool)
    rule = cast(AcceptanceRule, rule)
    gen = torch.Generator().manual_seed(seed)
    for name, drafts, logits in _trees(vocab, gen):
        inputs = VerifyInputs(
            drafts=drafts,
            logits=logits,
            positions=torch.arange(drafts.bs, dtype=torch.int64) + 7,
            sampling=(GREEDY,) * drafts.bs,
        )
        text = f"returns a root-to-node path of the draft tree ({name})"
        try:
            answer = rule.accept(inputs)
            owner = algorithm or type(rule).__name__
            check_acceptance(owner, answer, drafts, vocab, drafts.tokens.device)
            again = rule.accept(inputs)
        except SpecstratError as exc:
            raise _fail(hook, text, str(exc)) from exc
        except Exception as exc:
            raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        fields = ("accept_index", "accept_lengths", "bonus_tokens")
        if any(not torch.equal(getattr(answer, f), getattr(again, f)) for f in fields):
            raise _fail(hook, "answers the same greedy inputs the same way", name)
        if lossless:
            want = GreedyAcceptance().accept(inputs)
            if any(not torch.equal(getattr(answer, f), getattr(want, f)) for f in fields):
                raise _fail(
                    hook,
                    "a lossless rule accepts what greedy decoding would at temperature 0",
                    f"{name}: accepted {answer.accept_lengths.tolist()} with bonus "
                    f"{answer.bonus_tokens.tolist()}; greedy: {want.accept_lengths.tolist()} "
                    f"with {want.bonus_tokens.tolist()}",
                )


def _capabilities(needs: DrafterNeeds) -> Capabilities:
    return Capabilities(**dict.fromkeys(required_capabilities(needs), True))


@dataclass(frozen=True, slots=True)
class _Refused:
    """A policy's ``InvalidConfig`` for one budget (a refusal, not a wrong answer)."""

    message: str


def check_tree_policy(policy: object, *, algorithm: str | None = None) -> list[int]:
    """``policy`` answers ``tree_shape(T)`` for budgets ``T = 1..16`` purely, each with a
    :class:`~specstrat.drafting.TreeShape` of that budget or a named ``InvalidConfig``, and
    accepts at least one; returns the budgets it accepts. ``algorithm``: the name of the
    algorithm the policy belongs to, for messages."""
    hook = hook_label(TreePolicy, "tree", policy, algorithm)
    try:
        check_strategy("tree", TreePolicy, policy)
    except SpecstratError as exc:
        raise _fail(hook, "implements TreePolicy", str(exc)) from exc
    tree = cast("TreePolicy", policy)
    accepted: list[int] = []
    for t in range(1, 17):
        text = f"tree_shape({t}) is a TreeShape of budget {t} or an InvalidConfig, every time"
        answers: list[object] = []
        for _ in range(2):
            try:
                answers.append(tree.tree_shape(t))
            except InvalidConfig as exc:
                answers.append(_Refused(str(exc)))
            except Exception as exc:
                raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        first = answers[0]
        if answers[1] != first:
            raise _fail(hook, text, f"answered {answers[0]!r}, then {answers[1]!r}")
        if isinstance(first, TreeShape) and first.tokens_per_req == t:
            accepted.append(t)
        elif not isinstance(first, _Refused):
            raise _fail(hook, text, f"returned {first!r}")
    if not accepted:
        raise _fail(hook, "accepts some budget in 1..16", "it refused every one")
    return accepted


def check_drafter(
    factory: object,
    *,
    models: LoadedModels | None = None,
    capabilities: Capabilities | None = None,
    tree: TreePolicy | None = None,
    algorithm: str | None = None,
) -> None:
    """``factory`` declares its needs, sends exactly them from the prefill side, and its drafter
    runs in a real engine (sync and overlap, D = 1 and 3; under a ``tree`` policy that refuses
    those, the two smallest budgets it accepts) without breaking any contract, leaking a slot,
    or changing a token of target-only greedy output. ``algorithm``: the name of the algorithm
    the factory belongs to, which the engine's messages then name."""
    from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload  # loads models

    hook = hook_label(DrafterFactory, "drafter", factory, algorithm)
    needs = _declared(hook, "drafter", DrafterFactory, factory, "needs", DrafterNeeds)
    drafter = cast("DrafterFactory[Any]", factory)
    loaded: LoadedModels = models or EmbeddedModels.load()
    hidden = torch.zeros(3, loaded.target.shape.hidden_size, dtype=torch.float64)
    text = "prefill_payload returns exactly needs.prefill_fields, one row per request"
    try:
        payload = drafter.prefill_payload(loaded, torch.tensor([1, 2, 3]), hidden)
    except Exception as exc:
        raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, RelayPayload) or set(payload.present()) != needs.prefill_fields:
        raise _fail(hook, text, f"returned {payload!r} for {sorted(needs.prefill_fields)}")
    if payload.present() and payload.num_rows != 3:
        raise _fail(hook, text, f"{payload.num_rows} rows for 3 requests")
    algo: SpecAlgorithm[Any] = SpecAlgorithm(
        name=algorithm or type(factory).__name__,
        capabilities=capabilities or _capabilities(needs),
        target_verify=OffsetVerifyPolicy(allow_on_draft_worker=needs.draft_worker_verify),
        future_map=SlotFutureMapFactory(),
        disagg=NoDraftStateDisaggDraftBuilder(),
        drafter=drafter,
        acceptance=GreedyAcceptance(),
        tree=tree or ChainTree(),
    )
    accepted = [1, 3] if tree is None else check_tree_policy(tree, algorithm=algorithm)
    budgets = [d for d in (1, 3) if d in accepted] or accepted[:2]
    requests = [replace(r, max_new_tokens=24) for r in workload(3, seed=1)]
    for d in budgets:
        config = EngineConfig(num_draft_tokens=d, context_len=256, max_running_requests=4)
        target_only = Engine("NONE", loaded, config).run(requests)
        for overlap in (False, True):
            mode = "overlap" if overlap else "sync"
            text = f"runs in an engine and matches target-only greedy output (D={d}, {mode})"
            try:
                engine = Engine(algo, loaded, replace(config, overlap=overlap))
                before = (engine.free_slots, engine.free_kv_tokens)
                outputs = engine.run(requests)
            except SpecstratError as exc:
                raise _fail(hook, text, str(exc)) from exc
            if outputs != target_only:
                raise _fail(hook, text, "the output differs from target-only greedy decoding")
            after = (engine.free_slots, engine.free_kv_tokens)
            if after != before:
                raise _fail(hook, "releases what it holds", f"free (slots, KV) {before} -> {after}")
