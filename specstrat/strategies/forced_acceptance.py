"""Forced acceptance: measure the system apart from the drafter (vLLM's "synthetic" sampler).

:class:`ForcedAcceptance` ignores what the target thinks of the drafts: along each request's
chain (a tree's first children), draft position ``i`` is accepted with probability ``rate``
given positions ``1..i-1`` were, so a step that proposes ``k`` drafts accepts ``a`` of them with
``P(a >= i) = rate**i``, and τ, as ``docs/glossary.md`` defines it (tokens per drafted step:
the accepted drafts and the bonus token), is ``1 + rate + ... + rate**k``. ``rate=0`` accepts
nothing (``tau = 1``), ``rate=1`` everything (``tau = k + 1``). The bonus token is the
target's own choice after the last accepted draft, under each request's sampling parameters.
Outputs are not the target's: the rule is lossy and says so (``lossless`` is False); pair it
with requests that never stop early (``specstrat bench --force-accept`` turns stop tokens off)
so every run decodes the same number of tokens.

Each decision is a pure function of the request's seed, the rule's ``seed`` and the draft's
absolute position (:func:`~specstrat.kernels.rejection_sampling.uniform`), so a request's accepted
lengths do not depend on the batch it runs in, on overlap or on the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat._ints import is_int
from specstrat.drafting import Acceptance, VerifyInputs
from specstrat.errors import InvalidConfig
from specstrat.kernels.rejection_sampling import DRAW_SAMPLE, uniform
from specstrat.sampling import SamplingBatch, choose_tokens
from specstrat.strategies.acceptance import _along, _first_chain

__all__ = ["ForcedAcceptance"]

#: Draw index of the forced accept decisions (apart from the sampler's draws 0..2).
_DRAW_FORCED = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class ForcedAcceptance:
    """Accept each draft position with conditional probability ``rate`` (lossy, for measuring
    the system at a chosen acceptance; see the module docstring)."""

    rate: float
    seed: int = 0

    def __post_init__(self) -> None:
        r = self.rate
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r <= 1:
            raise InvalidConfig(f"ForcedAcceptance rate={r!r} must be a number in [0, 1]")
        s = self.seed
        if not is_int(s) or not 0 <= s < 2**32:
            raise InvalidConfig(f"ForcedAcceptance seed={s!r} must be an int in 0..2**32-1")

    @property
    def lossless(self) -> bool:
        """Forced acceptance ignores the target's verdict on the drafts: lossy."""
        return False

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """Each chain's leading run of positions whose draw falls below ``rate``, then the
        target's token after them."""
        drafts = inputs.drafts
        bs, n = drafts.tokens.shape
        dev = drafts.tokens.device
        nodes, length = _first_chain(drafts)
        sampling = SamplingBatch.of(inputs.sampling, dev)
        positions = inputs.positions.to(dev)
        depth = torch.arange(1, n + 1, device=dev)[None, :]
        seeds = (sampling.seed ^ self.seed)[:, None].expand(bs, n)
        u = uniform(seeds, positions[:, None] + depth, _DRAW_FORCED)
        taken = (u < self.rate) & (depth <= length[:, None])
        accepted = taken.to(torch.int64).cumprod(dim=1).sum(dim=1)
        # The target's logits after the last accepted node: column a of [root, chain nodes].
        path = torch.cat([nodes.new_full((bs, 1), -1), nodes], dim=1)
        last = path.gather(1, accepted[:, None]).squeeze(1) + 1
        at = inputs.logits[torch.arange(bs, device=dev), last]
        bonus, _ = choose_tokens(at, sampling, positions + 1 + accepted, DRAW_SAMPLE)
        return Acceptance(_along(nodes, length, accepted), accepted, bonus)
