"""The test kit specstrat ships: conformance runners, invariant checkers, hypothesis strategies.

Run ``check_algorithm(MY_ALGO)`` (or one ``check_<hook>`` per strategy: ``check_drafter``,
``check_acceptance_rule``, ``check_speculation_policy``, ...) in your own tests;
measure the system apart from the drafter with ``ForcedAcceptance(rate=...)``;
property-test metadata with ``verify_batches`` and ``check_verify_metadata`` (tree verification:
``tree_verify_batches`` and ``check_tree_verify_metadata``).

``ForcedAcceptance`` (from :mod:`specstrat.strategies.forced_acceptance`) and
``check_lossless_in_distribution`` (from :mod:`specstrat.lossless`) are product code that
``specstrat bench`` and the demo use too; the kit re-exports them.
"""

from specstrat.lossless import LosslessReport, check_lossless_in_distribution
from specstrat.strategies.forced_acceptance import ForcedAcceptance
from specstrat.testing.conformance import (
    CheckResult,
    check_algorithm,
    check_disagg_draft_builder,
    check_future_map_factory,
    check_target_verify_policy,
    run_conformance,
)
from specstrat.testing.doubles import (
    FaultyAcceptance,
    FaultyDrafterFactory,
    FaultyFutureMapFactory,
)
from specstrat.testing.drafting_checks import (
    check_acceptance_rule,
    check_drafter,
    check_tree_policy,
)
from specstrat.testing.invariants import VerifyBatch, check_verify_metadata
from specstrat.testing.speculation_checks import (
    FaultySpeculationPolicy,
    ScriptedSpeculationPolicy,
    check_speculation_policy,
)
from specstrat.testing.strategies import (
    num_draft_tokens,
    prebuilt_batches,
    relay_payloads,
    slot_tensors,
    verify_batches,
)
from specstrat.testing.trees import (
    TreeVerifyBatch,
    check_tree_verify_metadata,
    draft_trees,
    tree_verify_batches,
)

__all__ = [
    "CheckResult",
    "FaultyAcceptance",
    "FaultyDrafterFactory",
    "FaultyFutureMapFactory",
    "FaultySpeculationPolicy",
    "ForcedAcceptance",
    "LosslessReport",
    "ScriptedSpeculationPolicy",
    "TreeVerifyBatch",
    "VerifyBatch",
    "check_acceptance_rule",
    "check_algorithm",
    "check_disagg_draft_builder",
    "check_drafter",
    "check_tree_policy",
    "check_future_map_factory",
    "check_lossless_in_distribution",
    "check_speculation_policy",
    "check_target_verify_policy",
    "check_tree_verify_metadata",
    "check_verify_metadata",
    "draft_trees",
    "num_draft_tokens",
    "prebuilt_batches",
    "relay_payloads",
    "run_conformance",
    "slot_tensors",
    "tree_verify_batches",
    "verify_batches",
]
