"""How :func:`~specstrat.train.train_head` builds a head: :class:`HeadConfig`, checked when made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = ["INITS", "KINDS", "MAX_INTERMEDIATE_MULTIPLE", "HeadConfig", "head_intermediate_size"]

#: What ``specstrat train --kind`` trains: an EAGLE-3-style head, a draft LM, or a block drafter.
KINDS = ("eagle3", "draft-lm", "block")

#: How ``specstrat train --init`` starts a head: from the target's layer, or at random (the
#: default).
INITS = ("target", "random")


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadConfig:
    """How :func:`train_head` builds a head. ``layers``: the fused target layers (``None``:
    :func:`~specstrat.train.default_layers`); ``draft_vocab``: the draft vocabulary's size
    (capped at the target's vocabulary); ``ttt_steps``: unrolled steps; ``lr``: AdamW's peak
    learning rate (``warmup``: the share of training spent warming up); ``batch_size``:
    sequences per step; ``epochs`` passes over the data and/or ``budget_seconds`` for data
    generation plus training (generation stops at half the budget, training at all of it);
    ``seed``; ``temperature`` (0: greedy responses); ``repeat_temperature``: with a budget,
    once every prompt has a response before half the budget, further passes over the prompts
    sample at ``max(temperature, repeat_temperature)``, seeded anew each pass, so the rest of
    the data half still adds new text (0 with greedy responses: no further passes);
    ``max_new_tokens`` per response;
    ``held_out``: the share of prompts kept for measuring tau; ``eval_depth``: draft tokens
    measured per anchor; ``context``: the head attends over the context, prompt included, through
    its own KV cache (EAGLE-3's form, trained with its training-time-test mask and drafted by
    :class:`~specstrat.strategies.ContextHeadDrafter`) instead of each row attending to
    itself, which is what the one-token :class:`~specstrat.train.Eagle3DraftHead` runs (the
    default, ``False``); ``kind``: what trains, ``"eagle3"`` (a head, the default) or
    ``"draft-lm"`` (a draft LM for STANDALONE, :func:`~specstrat.train.train_draft_lm`: then
    ``layers`` names the target layers it starts from, ``None``:
    :func:`~specstrat.train.default_draft_layers`, and ``ttt_steps`` and ``context`` are not
    used); ``"block"`` (a block drafter for DFLASH and DSPARK,
    :func:`~specstrat.train.train_block_lm`: ``layers`` as for a draft LM, ``None``:
    :func:`~specstrat.train.default_block_layers`; ``block``: its placeholders, the drafts of one
    block, D - 1 for the widest D it serves; ``anchors``: the blocks trained per sequence and
    step); ``self_written``: prompts the target writes itself
    (:func:`~specstrat.train.self_written_prompts`, sampled at ``max(temperature,
    repeat_temperature)``, or 1.0 when both are 0, within the first quarter of the budget),
    answered first, one for one with the prompts (0: none, the default); ``intermediate_size``:
    the width of the head's MLP (``None``: the target's own, the default; a head only);
    ``init``: how a head's weights start, ``"random"`` (the default) or ``"target"`` (from the
    target's decoder layer after the highest fused one,
    :func:`~specstrat.train.start_from_target`)."""

    layers: tuple[int, ...] | None = None
    draft_vocab: int = 8192
    ttt_steps: int = 3
    lr: float = 1e-3
    warmup: float = 0.05
    batch_size: int = 8
    epochs: int | None = 2
    budget_seconds: float | None = None
    seed: int = 0
    temperature: float = 0.0
    repeat_temperature: float = 0.7
    max_new_tokens: int = 128
    held_out: float = 0.1
    eval_depth: int = 5
    clip: float = 1.0
    context: bool = False
    kind: str = "eagle3"
    block: int = 4
    anchors: int = 16
    self_written: int = 0
    intermediate_size: int | None = None
    init: str = "random"

    def __post_init__(self) -> None:
        counts = ("draft_vocab", "ttt_steps", "batch_size", "max_new_tokens", "eval_depth")
        for name in (*counts, "block", "anchors"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidConfig(f"HeadConfig.{name}={value!r} must be an int >= 1")
        if not is_int(self.self_written) or self.self_written < 0:
            raise InvalidConfig(
                f"HeadConfig.self_written={self.self_written!r} must be an int >= 0 (0: none)"
            )
        if self.intermediate_size is not None and (
            not is_int(self.intermediate_size) or self.intermediate_size < 1
        ):
            raise InvalidConfig(
                f"HeadConfig.intermediate_size={self.intermediate_size!r} must be None (the "
                "target's own width) or an int >= 1"
            )
        if not is_int(self.seed):
            raise InvalidConfig(f"HeadConfig.seed={self.seed!r} must be an int")
        if self.kind not in KINDS:
            raise InvalidConfig(
                f"HeadConfig.kind={self.kind!r} must be one of {', '.join(map(repr, KINDS))}"
            )
        if self.intermediate_size is not None and self.kind != "eagle3":
            raise InvalidConfig(
                f"HeadConfig.intermediate_size={self.intermediate_size} (--intermediate-size) "
                f"sets a head's MLP, but kind={self.kind!r} trains no head; drop it, or train "
                "kind='eagle3' (--kind eagle3)"
            )
        if self.init not in INITS:
            raise InvalidConfig(
                f"HeadConfig.init={self.init!r} (--init) must be one of "
                f"{', '.join(map(repr, INITS))}"
            )
        if self.init != "random" and self.kind != "eagle3":
            raise InvalidConfig(
                f"HeadConfig.init={self.init!r} (--init) sets how a head starts, but "
                f"kind={self.kind!r} trains no head; drop it, or train kind='eagle3' (--kind "
                "eagle3)"
            )
        least = 2 if self.kind == "eagle3" else 1  # a head fuses two layers or more
        if self.layers is not None and (
            len(self.layers) < least or not all(is_int(x) and x >= 0 for x in self.layers)
        ):
            raise InvalidConfig(
                f"HeadConfig.layers={self.layers!r} must be None (the default rule) or at least "
                f"{least} decoder-layer indices >= 0, e.g. (1, 8, 14)"
            )
        if not isinstance(self.context, bool):
            raise InvalidConfig(f"HeadConfig.context={self.context!r} must be True or False")
        if self.epochs is None and self.budget_seconds is None:
            raise InvalidConfig(
                "HeadConfig.epochs=None and budget_seconds=None: training would never end; "
                "set epochs=N, budget_seconds=S, or both"
            )
        if self.epochs is not None and (not is_int(self.epochs) or self.epochs < 1):
            raise InvalidConfig(f"HeadConfig.epochs={self.epochs!r} must be an int >= 1, or None")
        checks = {
            "lr": (self.lr, 0.0, math.inf, False),
            "warmup": (self.warmup, 0.0, 1.0, True),
            "temperature": (self.temperature, 0.0, math.inf, True),
            "repeat_temperature": (self.repeat_temperature, 0.0, math.inf, True),
            "held_out": (self.held_out, 0.0, 1.0, True),
            "clip": (self.clip, 0.0, math.inf, False),
        }
        if self.budget_seconds is not None:
            checks["budget_seconds"] = (self.budget_seconds, 0.0, math.inf, False)
        for name, (value, low, high, closed) in checks.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not (low <= value if closed else low < value) or value >= high:
                side = ">=" if closed else ">"
                raise InvalidConfig(
                    f"HeadConfig.{name}={value!r} must be a number {side} {low} and < {high}"
                )


#: The widest MLP :meth:`~specstrat.train.Eagle3Head.from_target` builds, in multiples of the
#: target's own ``intermediate_size``: a guard against a mistyped width that would allocate
#: gigabytes (8x SmolLM2's is 21M parameters, about 340 MB with AdamW's state), not a measured
#: optimum.
MAX_INTERMEDIATE_MULTIPLE = 8


def head_intermediate_size(config: Any, asked: int | None = None) -> int:
    """The ``intermediate_size`` of a head's MLP for a target of transformers ``config``:
    ``asked``, or the target's own (``4 * hidden_size`` where the config has none) when
    ``None``; more than :data:`MAX_INTERMEDIATE_MULTIPLE` times the target's own is an
    :class:`~specstrat.errors.InvalidConfig`."""
    own = int(getattr(config, "intermediate_size", None) or 4 * int(config.hidden_size))
    if asked is None:
        return own
    most = MAX_INTERMEDIATE_MULTIPLE * own
    if asked > most:
        raise InvalidConfig(
            f"HeadConfig.intermediate_size={asked} (--intermediate-size) is more than "
            f"{MAX_INTERMEDIATE_MULTIPLE}x the target's intermediate_size={own}; pass at most "
            f"{most}"
        )
    return asked
