"""The ``--adaptive`` flag of ``specstrat demo`` and ``specstrat bench``: a built-in speculation
policy by name, or the user's own as ``MODULE:ATTR``, composed into the algorithm run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from specstrat._module_attr import not_a
from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig
from specstrat.protocols import SpeculationPolicy
from specstrat.registry import default_registry
from specstrat.strategies.speculation_policies import (
    BatchScheduleSpeculationPolicy,
    EmaLadderSpeculationPolicy,
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
)

__all__ = ["POLICIES", "add_adaptive_flag", "with_policy"]

#: ``--adaptive`` names: each built-in policy with its defaults.
POLICIES: dict[str, Callable[[], SpeculationPolicy]] = {
    "fixed": FixedSpeculationPolicy,
    "ema": EmaLadderSpeculationPolicy,
    "schedule": BatchScheduleSpeculationPolicy,
    "goodput": GoodputSpeculationPolicy,
}


def add_adaptive_flag(parser: argparse.ArgumentParser) -> None:
    """``--adaptive POLICY`` (repeatable in ``bench``, once in ``demo``)."""
    parser.add_argument(
        "--adaptive",
        action="append",
        metavar="POLICY",
        help="speculation policy deciding D per step: fixed (default), ema (SGLang's EMA "
        "ladder), schedule (batch-size schedule), goodput, or MODULE:ATTR; bench: repeat it to "
        "compare several",
    )


def with_policy(
    algo: SpecAlgorithm[Any] | str,
    spec: str,
    load: Callable[[str, str], tuple[Any, Any]],
    command: str,
) -> SpecAlgorithm[Any]:
    """``algo`` (an algorithm or a registered name) speculating under ``spec``: a built-in's
    name (the algorithm is renamed ``NAME_SPEC``, e.g. ``NGRAM_EMA``, so several compare side
    by side) or ``MODULE:ATTR`` (renamed ``NAME_ATTR``)."""
    base = default_registry().get(algo) if isinstance(algo, str) else algo
    if spec in POLICIES:
        policy, label = POLICIES[spec](), spec
    elif ":" in spec:
        policy, label = load(spec, command)[0], spec.rpartition(":")[2]
        # A class has the Protocol's methods too: only an instance is one.
        if isinstance(policy, type) or not isinstance(policy, SpeculationPolicy):
            wanted = "SpeculationPolicy (candidate_widths and create_chooser)"
            raise InvalidConfig(not_a("--adaptive", spec, policy, wanted, SpeculationPolicy))
    else:
        raise InvalidConfig(
            f"--adaptive {spec!r} is not one of {', '.join(POLICIES)} or MODULE:ATTR"
        )
    return replace(base, name=f"{base.name}_{label.upper()}", speculation=policy)


def demo_algorithm(
    algo: SpecAlgorithm[Any] | str,
    specs: list[str] | None,
    load: Callable[[str, str], tuple[Any, Any]],
) -> SpecAlgorithm[Any] | str:
    """``demo --adaptive``: ``algo`` under the one policy named, unchanged without the flag."""
    if not specs:
        return algo
    if len(specs) > 1:
        raise InvalidConfig(
            f"--adaptive given {len(specs)} times ({', '.join(specs)}); demo runs one policy "
            "(bench compares several)"
        )
    return with_policy(algo, specs[0], load, "demo")
