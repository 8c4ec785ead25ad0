"""The KV an engine reserves per request: its prompt, its output and a margin past them.

The margin is ``2 * T + tree columns``: ``T`` is the target's tokens per request at the largest D
the algorithm's speculation policy may choose (a verify row and one more overlapped step of ``T``),
and the tree columns (``topk * (num_steps - 1)``, none for a chain) are what a drafter's own KV
holds while it expands a draft tree. :func:`kv_reservation` asks the algorithm's strategies exactly
as :class:`~specstrat.runtime.Engine` does at start, and the engine admits against the answer, so a
caller sizing ``context_len`` and the engine agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import TreeShape
from specstrat.errors import InvalidConfig
from specstrat.runtime._adapt import candidate_widths, top_tokens_per_req
from specstrat.runtime._engine_args import check_algorithm
from specstrat.runtime._policy import pure_tokens_per_req, tree_shape
from specstrat.runtime._requests import EngineConfig, Request

__all__ = ["KVReservation", "kv_reservation"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KVReservation:
    """What an engine reserves per request for one algorithm and D (from :func:`kv_reservation`).

    ``widths``: the D values the speculation policy may choose, ascending (the configured D alone
    for an algorithm that does not speculate); ``tokens_per_req``: ``T``, the target's tokens per
    request at the largest of them (1 without speculation); ``tree``: the draft tree at that ``T``.
    A request may occupy :meth:`for_request` KV positions: its prompt, its ``max_new_tokens`` and
    :attr:`margin`; the engine refuses one for which that exceeds ``context_len``.
    """

    widths: tuple[int, ...]
    tokens_per_req: int
    tree: TreeShape

    def __post_init__(self) -> None:
        w = self.widths
        if (
            not isinstance(w, tuple)
            or not w
            or any(not is_int(d) or d < 1 for d in w)
            or list(w) != sorted(set(w))
        ):
            raise InvalidConfig(
                f"KVReservation widths={w!r} must be a non-empty ascending tuple of distinct "
                "ints >= 1"
            )
        t = self.tokens_per_req
        if not is_int(t) or t < 1:
            raise InvalidConfig(f"KVReservation tokens_per_req={t!r} must be an int >= 1")
        if not isinstance(self.tree, TreeShape) or self.tree.tokens_per_req != t:
            raise InvalidConfig(
                f"KVReservation tree={self.tree!r} must be a TreeShape with tokens_per_req={t}"
            )

    @property
    def tree_columns(self) -> int:
        """Columns a drafter's own KV holds while it expands the tree: ``topk`` per depth past
        the first (``topk * (num_steps - 1)``); 0 for a chain."""
        tree = self.tree
        return 0 if tree.is_chain else tree.topk * (tree.num_steps - 1)

    @property
    def margin(self) -> int:
        """KV positions a request may need past its prompt and output:
        ``2 * tokens_per_req + tree_columns``."""
        return 2 * self.tokens_per_req + self.tree_columns

    def for_request(self, request: Request) -> int:
        """KV positions ``request`` may occupy: ``len(prompt) + max_new_tokens + margin``."""
        if not isinstance(request, Request):
            raise InvalidConfig(f"request={request!r}; pass a specstrat.runtime.Request")
        return len(request.prompt) + request.max_new_tokens + self.margin

    def context_len_for(self, requests: Sequence[Request]) -> int:
        """The smallest ``context_len`` that admits every one of ``requests``."""
        if isinstance(requests, Request) or not isinstance(requests, Sequence) or not requests:
            raise InvalidConfig(f"requests={requests!r} must be a non-empty sequence of Requests")
        return max(self.for_request(r) for r in requests)


def kv_reservation(
    algo: SpecAlgorithm[Any] | str,
    num_draft_tokens: int = 4,
    *,
    context_len: int | None = None,
) -> KVReservation:
    """The KV an engine running ``algo`` with ``EngineConfig(num_draft_tokens=...)`` reserves per
    request, past its prompt and output (``algo``: a SpecAlgorithm or a registered name).

    The algorithm's strategies are asked as the engine asks them at start: the speculation
    policy for its candidate widths, the verify policy for ``T`` at the largest (twice, to check
    it is pure), the tree policy for its shape at that ``T``. ``Engine(algo, models, config)``
    makes this very call and admits a request exactly when
    ``reservation.for_request(request) <= config.context_len`` (and its KV pool holds it).

    With ``context_len``, ``T`` must also leave room in it, as at engine start (more than
    ``2 * T + 1`` positions; a policy that declares too wide a D is named). Raises
    :class:`~specstrat.errors.InvalidConfig` for a bad argument or a width that does not fit,
    and the errors the engine raises for a strategy that answers out of contract.
    """
    algo = check_algorithm(algo)
    if not is_int(num_draft_tokens) or num_draft_tokens < 1:
        raise InvalidConfig(f"num_draft_tokens={num_draft_tokens!r} must be an int >= 1")
    if context_len is not None and (not is_int(context_len) or context_len < 1):
        raise InvalidConfig(
            f"context_len={context_len!r} must be an int >= 1, or None to check no context"
        )
    # candidate_widths reads only num_draft_tokens; top_tokens_per_req reads context_len too.
    config = EngineConfig(num_draft_tokens=num_draft_tokens, context_len=context_len or 1)
    widths = candidate_widths(algo, config)
    if context_len is None:
        tokens = pure_tokens_per_req(algo, widths[-1])
    else:
        tokens = top_tokens_per_req(algo, config, widths)
    return KVReservation(
        widths=widths, tokens_per_req=tokens, tree=_top_tree(algo, tokens, widths, num_draft_tokens)
    )


def _top_tree(
    algo: SpecAlgorithm[Any], tokens: int, widths: tuple[int, ...], num_draft_tokens: int
) -> TreeShape:
    """The widest lane's tree: none needed where that lane verifies one token (a D = 1 step
    drafts nothing: a chain of no nodes) of a speculative algorithm, else the tree policy's
    shape, a refusal naming the speculation policy when the width is one it declared rather
    than the configured D (or, for an algorithm that never speculates, saying so)."""
    if tokens == 1 and algo.is_speculative():
        return TreeShape.chain(1)
    declared = None if widths[-1] == num_draft_tokens else type(algo.speculation).__name__
    return tree_shape(algo, tokens, widths[-1], declared_by=declared)
