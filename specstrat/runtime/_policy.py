"""What an engine checks of an algorithm's strategies at start: the tokens per request ``T`` it
verifies (pure, and leaving room in the context), the draft tree (a shape of budget ``T`` that the
drafter can draft) and the drafter its factory creates (a whole
:class:`~specstrat.protocols.Drafter`)."""

from __future__ import annotations

from typing import Any

from specstrat._hooks import call_start_hook
from specstrat.algorithm import SpecAlgorithm, check_strategy
from specstrat.contracts import hook_error
from specstrat.drafting import DrafterContext, TreeShape
from specstrat.errors import InvalidConfig, InvalidStrategy
from specstrat.protocols import Drafter
from specstrat.runtime._requests import EngineConfig

__all__ = [
    "check_same_tokens_per_req",
    "create_drafter",
    "pure_tokens_per_req",
    "tree_shape",
    "verify_tokens_per_req",
]

_TOKENS_HOOK = "target_verify.get_num_tokens_per_req_for_target_verify"


def check_same_tokens_per_req(
    algo: SpecAlgorithm[Any], is_draft_worker: bool, where: str, got: int, want: int
) -> None:
    """The verify policy answered ``got`` ``where`` (e.g. when a graph runner was built) after
    answering ``want`` before, for the same D: an impure policy, named where it is used."""
    if got != want:
        kind = "draft" if is_draft_worker else "target"
        message = (
            f"target_verify={type(algo.target_verify).__name__} "
            f"answered T={got} for the {kind} worker {where}, after T={want} for the same "
            "num_draft_tokens; the policy must be pure (same inputs, same answer)"
        )
        raise hook_error(algo.name, _TOKENS_HOOK, message)


def pure_tokens_per_req(algo: SpecAlgorithm[Any], d: int) -> int:
    """T for the target at ``d``, checked to be pure (each worker's answer asked twice); 1 for
    an algorithm that does not speculate."""
    if not algo.is_speculative():
        return 1
    kinds = (False, True) if algo.supports_target_verify_for_draft() else (False,)
    for worker in kinds:
        first = algo.get_num_tokens_per_req_for_target_verify(d, worker)
        again = algo.get_num_tokens_per_req_for_target_verify(d, worker)
        check_same_tokens_per_req(algo, worker, "when asked again", again, first)
    return algo.get_num_tokens_per_req_for_target_verify(d, False)


def verify_tokens_per_req(algo: SpecAlgorithm[Any], cfg: EngineConfig) -> int:
    """T for the target, checked to be pure over the D this engine sees; fits the context."""
    if not algo.is_speculative():
        return 1
    d = cfg.num_draft_tokens
    tokens = pure_tokens_per_req(algo, d)
    if 2 * tokens + 1 >= cfg.context_len:
        raise InvalidConfig(
            f"num_draft_tokens={d} verifies T={tokens} tokens per request, which leaves no "
            f"room in context_len={cfg.context_len} (needs > 2*T + 1); lower "
            "EngineConfig.num_draft_tokens (--draft-tokens) or raise EngineConfig.context_len "
            f"(--context-len) to {2 * tokens + 2} or more"
        )
    return tokens


def _fitting_width(algo: SpecAlgorithm[Any], num_draft_tokens: int) -> int | None:
    """The smallest D above ``num_draft_tokens`` (within 64 more) whose T the tree policy
    shapes, or ``None``: what a refusal suggests, so the suggestion is one that works."""
    for width in range(num_draft_tokens + 1, num_draft_tokens + 65):
        try:
            tokens = pure_tokens_per_req(algo, width)
            algo.tree.tree_shape(tokens)
        except Exception:  # a width the policies refuse is not suggested
            continue
        return width
    return None


def tree_shape(
    algo: SpecAlgorithm[Any],
    tokens_per_req: int,
    num_draft_tokens: int,
    *,
    declared_by: str | None = None,
) -> TreeShape:
    """The draft tree for the target's tokens per request ``T``, from the algorithm's tree
    policy; refused for a drafter that drafts chains only when the tree is not one. A policy
    refusing ``T`` is told where ``T`` came from: the verify policy at ``num_draft_tokens``,
    which is the configured D or (``declared_by``: the speculation policy's name) the widest
    width that policy declares; the suggested width is one the tree policy accepts."""
    policy = type(algo.tree).__name__
    try:
        shape = call_start_hook(algo.name, "tree.tree_shape", algo.tree.tree_shape, tokens_per_req)
    except InvalidConfig as exc:
        if not algo.is_speculative():
            raise InvalidConfig(
                f"{algo.name}.tree ({algo.tree!r}) asks for a draft tree, but {algo.name} does "
                "not speculate: it verifies T=1 token per request and drafts nothing; use "
                "tree=ChainTree() with it (demo: drop --topk and --steps), or compose the tree "
                "with a speculative algorithm"
            ) from exc
        verify = type(algo.target_verify).__name__
        wider = _fitting_width(algo, num_draft_tokens)
        fix = f"pick a tree that fits T={tokens_per_req}"
        origin = f"num_draft_tokens={num_draft_tokens}"
        if declared_by is not None:
            origin = f"D={num_draft_tokens}, the widest width speculation={declared_by} declares"
        if wider is not None and declared_by is None:
            fix = f"raise num_draft_tokens to {wider} (--draft-tokens {wider}) or {fix}"
        elif wider is not None:
            fix = f"declare a width of {wider} or more in {declared_by}.candidate_widths or {fix}"
        raise InvalidConfig(
            f"{algo.name}.tree ({algo.tree!r}) cannot shape T={tokens_per_req} tokens per "
            f"request, what {algo.name}.target_verify ({verify}) verifies for {origin}: {exc}; "
            f"{fix}"
        ) from exc
    if not isinstance(shape, TreeShape) or shape.tokens_per_req != tokens_per_req:
        raise InvalidConfig(
            f"{algo.name}: tree={policy}.tree_shape({tokens_per_req}) returned "
            f"{shape!r}; it must be a TreeShape with tokens_per_req={tokens_per_req}"
        )
    if not shape.is_chain and not algo.drafter.needs.trees:
        raise InvalidConfig(
            f"{algo.name}.tree ({algo.tree!r}) asks for topk={shape.topk}, but "
            f"{algo.name}.drafter ({type(algo.drafter).__name__}) drafts chains only "
            "(needs.trees=False); use tree=ChainTree() (demo: drop --topk, or --topk 1) or a "
            "drafter that drafts trees"
        )
    return shape


def create_drafter(algo: SpecAlgorithm[Any], context: DrafterContext) -> Drafter[Any]:
    """The algorithm's drafter for one engine, checked against :class:`Drafter` (every member
    it inherits) before the first request; a factory that raises is named."""
    # A factory refusing the models or limits stays a configuration error, told whose it is.
    try:
        drafter = call_start_hook(
            algo.name, "drafter.create_drafter", algo.drafter.create_drafter, context
        )
    except InvalidConfig as exc:
        raise InvalidConfig(
            f"{algo.name}.drafter ({type(algo.drafter).__name__}) refused this engine: {exc}"
        ) from exc
    if drafter is None:
        raise InvalidStrategy(
            f"{algo.name}.drafter.create_drafter() returned None; drafter="
            f"{type(algo.drafter).__name__} must return a Drafter (admit, release, propose, "
            "commit), e.g. NoDrafterFactory's for an algorithm that drafts nothing"
        )
    check_strategy(f"{algo.name}.drafter.create_drafter() result", Drafter, drafter)
    return drafter
