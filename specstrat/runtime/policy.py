"""What an engine checks of an algorithm's policies before it builds anything: the verify
width ``T`` (pure, and leaving room in the context) and the draft tree (a shape of budget ``T``
that the drafter can draft)."""

from __future__ import annotations

from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.contracts import hook_error
from specstrat.drafting import TreeShape
from specstrat.errors import InvalidConfig, SpecstratError
from specstrat.runtime.requests import EngineConfig

__all__ = ["tree_shape", "verify_width"]


def verify_width(algo: SpecAlgorithm[Any], cfg: EngineConfig) -> int:
    """T for the target, checked to be pure over the D this engine sees; fits the context."""
    if not algo.is_speculative():
        return 1
    d = cfg.num_draft_tokens
    kinds = (False, True) if algo.supports_target_verify_for_draft() else (False,)
    for worker in kinds:
        first = algo.get_num_tokens_per_req_for_target_verify(d, worker)
        if algo.get_num_tokens_per_req_for_target_verify(d, worker) != first:
            raise InvalidConfig(
                f"{algo.name}: target_verify={type(algo.target_verify).__name__} answered "
                f"differently for the same num_draft_tokens={d}; the policy must be pure"
            )
    tokens = algo.get_num_tokens_per_req_for_target_verify(d, False)
    if 2 * tokens + 1 >= cfg.context_len:
        raise InvalidConfig(
            f"num_draft_tokens={d} verifies T={tokens} tokens per request, which leaves no "
            f"room in context_len={cfg.context_len} (needs > 2*T + 1); lower "
            "num_draft_tokens or raise context_len"
        )
    return tokens


def tree_shape(algo: SpecAlgorithm[Any], tokens_per_req: int) -> TreeShape:
    """The draft tree for the target's verify width, from the algorithm's tree policy;
    refused for a drafter that drafts chains only when the tree is not one."""
    policy = type(algo.tree).__name__
    try:
        shape = algo.tree.tree_shape(tokens_per_req)
    except SpecstratError:
        raise
    except Exception as exc:
        raise hook_error(
            algo.name, "tree.tree_shape", f"raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(shape, TreeShape) or shape.num_draft_tokens != tokens_per_req:
        raise InvalidConfig(
            f"{algo.name}: tree={policy}.tree_shape({tokens_per_req}) returned "
            f"{shape!r}; it must be a TreeShape with num_draft_tokens={tokens_per_req}"
        )
    if not shape.is_chain and not algo.drafter.needs.trees:
        raise InvalidConfig(
            f"{algo.name}: tree={policy} asks for topk={shape.topk} but drafter="
            f"{type(algo.drafter).__name__} drafts chains only (needs.trees=False); use "
            "tree=ChainTree() or a drafter that drafts trees"
        )
    return shape
