"""A speculative-decoding algorithm: a frozen dataclass composing one strategy per hook.

The scheduler calls the engine-facing methods of :class:`SpecAlgorithm` (``create_future_map``,
``get_num_tokens_per_req_for_target_verify``, ...) and reads :class:`Capabilities`; it never asks
which algorithm it is running. Construction validates eagerly: a strategy that does not satisfy
its hook's Protocol is refused with :class:`~specstrat.errors.InvalidStrategy` naming the hook,
the method and what was found, instead of an ``AttributeError`` at scheduler start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, ParamSpec, TypeVar

import torch

from specstrat._hooks import call_start_hook
from specstrat._ints import is_int
from specstrat._protocol_check import check_strategy as check_strategy
from specstrat._protocol_check import read_member
from specstrat.batch import PrebuiltBatch
from specstrat.contracts import hook_error
from specstrat.drafting import ChainTree, DrafterNeeds
from specstrat.errors import InvalidConfig, InvalidStrategy, StrategyError
from specstrat.protocols import (
    AcceptanceRule,
    DisaggDraftBuilder,
    DrafterFactory,
    DraftT_co,
    FutureMap,
    FutureMapFactory,
    SpeculationPolicy,
    TargetVerifyPolicy,
    TreePolicy,
)
from specstrat.speculation import FixedSpeculationPolicy

__all__ = ["HOOKS", "Capabilities", "SpecAlgorithm", "check_strategy", "required_capabilities"]

#: Each strategy field of :class:`SpecAlgorithm` and the Protocol it must satisfy.
HOOKS: dict[str, type] = {
    "target_verify": TargetVerifyPolicy,
    "future_map": FutureMapFactory,
    "disagg": DisaggDraftBuilder,
    "drafter": DrafterFactory,
    "acceptance": AcceptanceRule,
    "tree": TreePolicy,
    "speculation": SpeculationPolicy,
}


def required_capabilities(needs: DrafterNeeds) -> dict[str, str]:
    """The capabilities a drafter's needs require, each with the need that requires it."""
    required: dict[str, str] = {}
    if needs.target_hidden_states:
        required["carries_draft_hidden_states"] = "target_hidden_states"
    if "hidden_states" in needs.prefill_fields:
        required.setdefault("carries_draft_hidden_states", "prefill_fields hidden_states")
    if needs.draft_model:
        required["has_draft_kv"] = "draft_model"
    if {"topk_p", "topk_index"} & needs.prefill_fields:
        required["need_topk"] = "prefill_fields topk"
    return required


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What an algorithm needs from the engine; the scheduler branches on these, never on names.

    ``speculative`` is False only for the NONE algorithm (plain decoding), which then has no
    other capability. ``has_draft_kv``: a draft model keeps its own KV cache. ``need_topk``: the
    draft step produces top-k probabilities/indices. ``carries_draft_hidden_states``: the
    target's last hidden state feeds the next draft step (and crosses disaggregation).
    ``supports_overlap``: runs in overlap mode. ``supports_ragged_verify``: may verify a
    different number of tokens per request.
    """

    speculative: bool = True
    has_draft_kv: bool = False
    carries_draft_hidden_states: bool = False
    need_topk: bool = False
    supports_overlap: bool = True
    supports_ragged_verify: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise InvalidConfig(f"Capabilities.{f.name}={value!r} must be True or False")
        if not self.speculative:
            drafty = [
                name
                for name in (
                    "has_draft_kv",
                    "carries_draft_hidden_states",
                    "need_topk",
                    "supports_ragged_verify",
                )
                if getattr(self, name)
            ]
            if drafty:
                raise InvalidConfig(
                    f"speculative=False with {', '.join(f'{n}=True' for n in drafty)}; "
                    "a non-speculative algorithm has no draft capabilities"
                )

    def as_dict(self) -> dict[str, bool]:
        """Every capability by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecAlgorithm(Generic[DraftT_co]):
    """A speculative-decoding algorithm composed from strategies, generic in its draft input.

    ``name`` is an identifier (registry lookups are case-insensitive); ``target_verify``,
    ``future_map`` and ``disagg`` satisfy :class:`~specstrat.protocols.TargetVerifyPolicy`,
    :class:`~specstrat.protocols.FutureMapFactory` and
    :class:`~specstrat.protocols.DisaggDraftBuilder` respectively; ``drafter`` and
    ``acceptance`` decide how it drafts and accepts; ``tree`` (a
    :class:`~specstrat.protocols.TreePolicy`, default a chain) the draft tree it verifies;
    ``speculation`` (a :class:`~specstrat.protocols.SpeculationPolicy`, default
    :class:`~specstrat.speculation.FixedSpeculationPolicy`: every step at the configured D)
    how many tokens each decode step drafts.
    """

    name: str
    capabilities: Capabilities
    target_verify: TargetVerifyPolicy
    future_map: FutureMapFactory
    disagg: DisaggDraftBuilder[DraftT_co]
    drafter: DrafterFactory[DraftT_co]
    acceptance: AcceptanceRule
    tree: TreePolicy = field(default_factory=ChainTree)
    speculation: SpeculationPolicy = field(default_factory=FixedSpeculationPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidConfig(
                f"name={self.name!r} is not an identifier; use letters, digits and '_', "
                "starting with a letter (e.g. 'MY_EAGLE')"
            )
        if not isinstance(self.capabilities, Capabilities):
            raise InvalidConfig(
                f"{self.name}: capabilities={self.capabilities!r}; pass specstrat.Capabilities(...)"
            )
        for hook, protocol in HOOKS.items():
            try:
                check_strategy(hook, protocol, getattr(self, hook))
            except InvalidStrategy as exc:
                raise InvalidStrategy(f"{self.name}: {exc}") from exc.__cause__
        self._check_drafter_needs()
        lossless = read_member("acceptance", AcceptanceRule, self.acceptance, "lossless")
        if not isinstance(lossless, bool):
            raise InvalidStrategy(
                f"{self.name}: acceptance={type(self.acceptance).__name__}.lossless is "
                f"{lossless!r}; AcceptanceRule needs a bool property `lossless`"
            )

    def _check_drafter_needs(self) -> None:
        """The drafter's declared needs agree with the declared capabilities."""
        kind = type(self.drafter).__name__
        needs = read_member("drafter", DrafterFactory, self.drafter, "needs")
        if not isinstance(needs, DrafterNeeds):
            raise InvalidStrategy(
                f"{self.name}: drafter={kind}.needs is {needs!r}; DrafterFactory needs a `needs` "
                "property returning specstrat.DrafterNeeds"
            )
        for capability, need in required_capabilities(needs).items():
            if not getattr(self.capabilities, capability):
                raise InvalidStrategy(
                    f"{self.name}: drafter={kind} needs {need} but capabilities."
                    f"{capability}=False; declare Capabilities({capability}=True) or use a "
                    "drafter that does not need it"
                )
        if needs.draft_worker_verify and not self._allows_draft_worker_verify():
            raise InvalidStrategy(
                f"{self.name}: drafter={kind} needs draft_worker_verify (a TARGET_VERIFY forward "
                f"on the draft worker) but target_verify={type(self.target_verify).__name__}."
                "supports_target_verify_for_draft() is False; use a policy that allows it (e.g. "
                "OffsetVerifyPolicy(allow_on_draft_worker=True)) or a drafter that does not "
                "need it"
            )

    def _allows_draft_worker_verify(self) -> bool:
        """``supports_target_verify_for_draft()`` at construction: a policy that raises is a
        strategy that cannot be composed (InvalidStrategy), the original chained."""
        try:
            return self.supports_target_verify_for_draft()
        except StrategyError as exc:
            raise InvalidStrategy(str(exc)) from exc.__cause__

    def _call(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """A strategy's method, guarded as the engine guards start-up hooks: anything but a
        SpecstratError it raises becomes a StrategyError naming ``NAME.hook``."""
        return call_start_hook(self.name, hook, fn, *args, **kwargs)

    # -- engine-facing methods, by delegation -------------------------------------------------

    def is_none(self) -> bool:
        """True for plain decoding (no speculation)."""
        return not self.capabilities.speculative

    def is_speculative(self) -> bool:
        """True when the algorithm drafts and verifies tokens."""
        return self.capabilities.speculative

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> FutureMap:
        """The overlap relay, from the ``future_map`` strategy; checked to be a FutureMap."""
        relay = self._call(
            "future_map.create_future_map",
            self.future_map.create_future_map,
            max_running_requests,
            chunked_prefill_size,
            context_len,
            device,
        )
        check_strategy(f"{self.name}.create_future_map() result", FutureMap, relay)
        return relay

    def supports_target_verify_for_draft(self) -> bool:
        """Whether a draft worker may run TARGET_VERIFY, from the ``target_verify`` policy."""
        allowed = self._call(
            "target_verify.supports_target_verify_for_draft",
            self.target_verify.supports_target_verify_for_draft,
        )
        if not isinstance(allowed, bool):
            hook = "target_verify.supports_target_verify_for_draft"
            message = f"returned {allowed!r}; the policy must return True or False"
            raise hook_error(self.name, hook, message)
        return allowed

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool = False
    ) -> int:
        """Tokens per request TARGET_VERIFY runs; checked to be an int in ``1..D+1``."""
        if not is_int(num_draft_tokens):
            raise InvalidConfig(f"num_draft_tokens={num_draft_tokens!r} must be an int >= 1")
        if num_draft_tokens < 1:
            raise InvalidConfig(f"num_draft_tokens={num_draft_tokens} must be >= 1")
        if not isinstance(is_draft_worker, bool):
            raise InvalidConfig(f"is_draft_worker={is_draft_worker!r} must be True or False")
        if self.is_none():
            raise InvalidConfig(
                f"algorithm {self.name} is not speculative; it verifies no tokens per request "
                "(check algo.is_speculative() before sizing verify graphs)"
            )
        tokens = self._call(
            "target_verify.get_num_tokens_per_req_for_target_verify",
            self.target_verify.get_num_tokens_per_req_for_target_verify,
            num_draft_tokens,
            is_draft_worker,
        )
        # A wrong answer is the policy's, not a value the caller passed: a StrategyError.
        hook = "target_verify.get_num_tokens_per_req_for_target_verify"
        if not is_int(tokens):
            message = (
                f"returned tokens per request={tokens!r} "
                f"({type(tokens).__name__}) for num_draft_tokens={num_draft_tokens}; the policy "
                "must return an int"
            )
            raise hook_error(self.name, hook, message)
        if not 1 <= tokens <= num_draft_tokens + 1:
            message = (
                f"returned tokens per request={tokens} for num_draft_tokens="
                f"{num_draft_tokens}, outside 1..{num_draft_tokens + 1}; fix the policy"
            )
            raise hook_error(self.name, hook, message)
        return tokens

    def get_num_tokens_per_bs_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool = False
    ) -> int:
        """Alias of :meth:`get_num_tokens_per_req_for_target_verify` (the engines' old name).

        The value is per *request*, not per batch; prefer the ``per_req`` name.
        """
        return self.get_num_tokens_per_req_for_target_verify(num_draft_tokens, is_draft_worker)

    def build_disagg_draft_input(
        self,
        batch: PrebuiltBatch,
        last_tokens: torch.Tensor,
        future_map: FutureMap | None,
    ) -> DraftT_co | None:
        """Draft input for a received batch, from the ``disagg`` builder; ``None``: plain decode."""
        return self.disagg.build_disagg_draft_input(batch, last_tokens, future_map)

    @property
    def lossless(self) -> bool:
        """Whether the acceptance rule preserves the target's output distribution."""
        return bool(self.acceptance.lossless)

    def describe(self) -> dict[str, Any]:
        """Name, strategy class names and capabilities, for listings."""
        return {
            "name": self.name,
            "strategies": {hook: type(getattr(self, hook)).__name__ for hook in HOOKS},
            "capabilities": self.capabilities.as_dict(),
        }
