"""``check_sglang``: does SGLang see a specstrat algorithm as the algorithm it is?

Two parities, each one line of the report. Method set: every public instance method of SGLang's
``SpeculativeAlgorithm`` enum (what its code calls on an algorithm object; the class-level
``from_string``/``register`` are not) exists on the class SGLang registers. Hook answers: each
hook answers as the specstrat algorithm does, for D = 2..8 and both worker kinds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig, SpecstratError
from specstrat.integrations._sglang_adapter import (
    BUILTIN_BUILDERS,
    SGLangBinding,
    SpecstratSpecAlgo,
    ToSpecInput,
)
from specstrat.integrations._sglang_import import SGLANG_VERSION, SGLangModules, load_sglang
from specstrat.integrations._sglang_registry import register, registered, unregister

__all__ = ["CHECKED_DRAFT_TOKENS", "SGLangCheck", "SGLangReport", "check_sglang", "enum_methods"]

#: The draft widths D the hook-answer parity covers.
CHECKED_DRAFT_TOKENS: tuple[int, ...] = tuple(range(2, 9))


@dataclass(frozen=True, slots=True)
class SGLangCheck:
    """One line of the report: what was checked, whether it passed, and why not."""

    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        """``PASS name`` or ``FAIL name`` followed by the reason, indented."""
        head = f"{'PASS' if self.passed else 'FAIL'} sglang: {self.name}"
        return head if self.passed or not self.detail else f"{head}\n    {self.detail}"


@dataclass(frozen=True, slots=True)
class SGLangReport:
    """Every check :func:`check_sglang` ran on one algorithm, in order."""

    algorithm: str
    sglang_version: str
    checks: tuple[SGLangCheck, ...]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(check.passed for check in self.checks)

    def failures(self) -> tuple[SGLangCheck, ...]:
        """The checks that failed."""
        return tuple(check for check in self.checks if not check.passed)


def enum_methods(modules: SGLangModules) -> frozenset[str]:
    """Public instance methods of SGLang's ``SpeculativeAlgorithm`` (no class-level helpers)."""
    return frozenset(
        name
        for name, member in vars(modules.algorithm_enum).items()
        if not name.startswith("_") and inspect.isfunction(member)
    )


def _placeholder_worker(server_args: Any) -> type:
    """The worker factory of a registration made only to be checked; it is never a worker."""
    raise SpecstratError(
        "check_sglang registered this algorithm only to check it; register it with "
        "specstrat.integrations.sglang.register(algo, worker=...) to run it"
    )


@contextmanager
def _registered(
    algo: SpecAlgorithm[Any], name: str, to_spec_input: ToSpecInput | None
) -> Iterator[Any]:
    """The SGLang object registered for ``algo``: the existing one, or a temporary one."""
    existing = registered(name)
    if isinstance(existing, SpecstratSpecAlgo) and existing.specstrat.algorithm is algo:
        yield existing
        return
    spec = register(algo, worker=_placeholder_worker, name=name, to_spec_input=to_spec_input)
    try:
        yield spec
    finally:
        unregister(name)


def _call(method: Callable[..., object], *args: object) -> object:
    """The method's answer, or what it raised (so a raising hook is one FAIL line)."""
    try:
        return method(*args)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"


def _compare(name: str, cases: dict[str, tuple[object, object]]) -> SGLangCheck:
    """A check that passes when every case's (SGLang, specstrat) answers agree."""
    wrong = [
        f"{case + ': ' if case else ''}sglang={got!r}, specstrat={want!r}"
        for case, (got, want) in cases.items()
        if got != want
    ]
    return SGLangCheck(name, not wrong, "; ".join(wrong))


def _hooks(spec: Any, algo: SpecAlgorithm[Any], modules: SGLangModules) -> list[SGLangCheck]:
    caps = algo.capabilities
    widths = {
        f"D={d} {'draft' if draft else 'target'}": (
            _call(spec.get_num_tokens_per_req_for_target_verify, d, draft),
            _call(algo.get_num_tokens_per_req_for_target_verify, d, draft),
        )
        for d in CHECKED_DRAFT_TOKENS
        for draft in (False, True)
    }
    checks = [
        _compare(
            "hook supports_target_verify_for_draft",
            {
                "": (
                    _call(spec.supports_target_verify_for_draft),
                    _call(algo.supports_target_verify_for_draft),
                )
            },
        ),
        _compare(
            f"hook get_num_tokens_per_req_for_target_verify "
            f"(D={CHECKED_DRAFT_TOKENS[0]}..{CHECKED_DRAFT_TOKENS[-1]}, target and draft worker)",
            widths,
        ),
    ]
    for flag in (
        "has_draft_kv",
        "supports_ragged_verify",
        "need_topk",
        "carries_draft_hidden_states",
    ):
        checks.append(
            _compare(f"hook {flag}", {"": (_call(getattr(spec, flag)), getattr(caps, flag))})
        )
    checks.append(
        _compare("hook supports_overlap", {"": (spec.supports_overlap, caps.supports_overlap)})
    )
    checks.append(
        _compare(
            "hook is_speculative/is_none/is_some",
            {"": ((spec.is_speculative(), spec.is_none(), spec.is_some()), (True, False, True))},
        )
    )
    checks.append(_future_map_check(spec, modules))
    checks.append(
        _compare("hook get_platform_worker_cls", {"": (_call(spec.get_platform_worker_cls), None)})
    )
    checks.append(_disagg_check(spec))
    return checks


def _future_map_check(spec: Any, modules: SGLangModules) -> SGLangCheck:
    name = "hook create_future_map (SGLang 0.5.23 arguments -> SGLang's FutureMap)"
    pool = SimpleNamespace(req_to_token=torch.zeros((3, 8), dtype=torch.int32))
    try:
        relay = spec.create_future_map(
            torch.device("cpu"), pool, needs_cpu_seq_lens=True, needs_confidence_relay=False
        )
    except Exception as exc:
        return SGLangCheck(name, False, f"raised {type(exc).__name__}: {exc}")
    future_map = modules.overlap_utils.FutureMap
    if not isinstance(relay, future_map) or relay.spec_algo is not spec:
        return SGLangCheck(name, False, f"returned {relay!r}, not a FutureMap for {spec!r}")
    return SGLangCheck(name, True)


def _disagg_check(spec: Any) -> SGLangCheck:
    binding: SGLangBinding = spec.specstrat
    builder = type(binding.algorithm.disagg).__name__
    name = "hook build_disagg_draft_input (draft input -> SGLang SpecInput)"
    if binding.to_spec_input is None and not isinstance(binding.algorithm.disagg, BUILTIN_BUILDERS):
        return SGLangCheck(name, False, f"{builder} needs to_spec_input")
    how = "to_spec_input" if binding.to_spec_input is not None else "the adapter"
    return SGLangCheck(f"{name}: {builder}, converted by {how}", True)


def check_sglang(
    algo: SpecAlgorithm[Any],
    *,
    name: str | None = None,
    to_spec_input: ToSpecInput | None = None,
) -> SGLangReport:
    """Check ``algo`` against the installed SGLang; returns the report, raises nothing it finds.

    Registers ``algo`` as ``name`` (default ``algo.name``; a built-in's name clashes with
    SGLang's, so check e.g. specstrat's EAGLE as ``name='SPECSTRAT_EAGLE'``) unless specstrat
    already registered it there, looks it up with ``from_string``, checks method-set parity and
    every hook's answer, and removes a registration it made. Raises
    :class:`~specstrat.integrations.sglang.IntegrationError` when SGLang is not installed.
    """
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(
            f"algo={algo!r} is a {type(algo).__name__}; check_sglang checks a "
            "specstrat.SpecAlgorithm"
        )
    modules = load_sglang()
    checks = [
        SGLangCheck(
            f"version {modules.version}",
            modules.version == SGLANG_VERSION,
            f"the adapter follows SGLang {SGLANG_VERSION}'s plugin contract",
        )
    ]
    key = algo.name if name is None else name
    try:
        with _registered(algo, key, to_spec_input) as spec:
            found = modules.algorithm_enum.from_string(key)
            checks.append(
                SGLangCheck(
                    f"registration and from_string({key!r})",
                    found is spec,
                    f"from_string({key!r}) returned {found!r}, not the registered {spec!r}",
                )
            )
            checks.append(_method_set(spec, modules))
            checks.extend(_hooks(spec, algo, modules))
    except SpecstratError as exc:
        checks.append(SGLangCheck("registration", False, f"{type(exc).__name__}: {exc}"))
    return SGLangReport(algo.name, modules.version, tuple(checks))


def _method_set(spec: Any, modules: SGLangModules) -> SGLangCheck:
    expected = enum_methods(modules)
    missing = sorted(m for m in expected if not callable(getattr(spec, m, None)))
    name = f"method set ({len(expected)} methods of SpeculativeAlgorithm)"
    return SGLangCheck(name, not missing, f"missing: {', '.join(missing)}")
