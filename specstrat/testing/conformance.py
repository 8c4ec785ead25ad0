"""Conformance runners: check any implementation of a hook against that hook's obligations.

Each ``check_<hook>(impl)`` returns quietly when ``impl`` keeps every obligation in its
Protocol's docstring and raises :class:`~specstrat.errors.ConformanceError` naming the first
obligation it broke. Built-ins pass through the same runners (``tests/core/test_conformance.py``).
:func:`run_conformance` runs them all on an algorithm and reports one line per check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch

from specstrat._hooks import hook_label, user_location
from specstrat._ints import is_int
from specstrat.algorithm import Capabilities, SpecAlgorithm, check_strategy
from specstrat.batch import PrebuiltBatch
from specstrat.errors import (
    ConformanceError,
    DisaggError,
    InvalidConfig,
    InvalidStrategy,
    RelayError,
    SpecstratError,
)
from specstrat.protocols import (
    DisaggDraftBuilder,
    FutureMap,
    FutureMapFactory,
    TargetVerifyPolicy,
)
from specstrat.relay import RelayPayload
from specstrat.strategies.future_map import SlotFutureMapFactory
from specstrat.testing.drafting_checks import (
    check_acceptance_rule,
    check_drafter,
    check_tree_policy,
)
from specstrat.testing.speculation_checks import check_speculation_policy

__all__ = [
    "CheckResult",
    "check_algorithm",
    "check_disagg_draft_builder",
    "check_future_map_factory",
    "check_target_verify_policy",
    "run_conformance",
]


@contextmanager
def _obligation(hook: str, text: str) -> Iterator[None]:
    """Turn any failure inside the block into a ConformanceError naming the obligation."""
    try:
        yield
    except ConformanceError:
        raise
    except Exception as exc:
        raise ConformanceError(
            f"{hook} broke the obligation '{text}': {type(exc).__name__}: {exc}{user_location(exc)}"
        ) from exc


def _fail(hook: str, text: str, detail: str) -> ConformanceError:
    return ConformanceError(f"{hook} broke the obligation '{text}': {detail}")


def _structure(hook: str, protocol: type, impl: object) -> None:
    try:
        check_strategy(hook, protocol, impl)
    except InvalidStrategy as exc:
        raise _fail(hook, f"implements {protocol.__name__}", str(exc)) from exc


def check_target_verify_policy(
    policy: object, *, max_draft_tokens: int = 16, algorithm: str | None = None
) -> None:
    """``policy`` is a pure TargetVerifyPolicy whose T lies in ``1..D+1`` for D up to the max.
    ``algorithm``: the name of the algorithm the policy belongs to, for messages."""
    hook = hook_label(TargetVerifyPolicy, "target_verify", policy, algorithm)
    _structure(hook, TargetVerifyPolicy, policy)
    policy = cast(TargetVerifyPolicy, policy)
    text = "supports_target_verify_for_draft() returns a bool, the same every call"
    with _obligation(hook, text):
        first = policy.supports_target_verify_for_draft()
        second = policy.supports_target_verify_for_draft()
    if not isinstance(first, bool):
        raise _fail(hook, text, f"returned {first!r} ({type(first).__name__}), not a bool")
    if first is not second:
        raise _fail(hook, text, f"returned {first!r} then {second!r}")
    for num_draft_tokens in range(1, max_draft_tokens + 1):
        for is_draft_worker in (False, True):
            call = (
                f"get_num_tokens_per_req_for_target_verify(num_draft_tokens={num_draft_tokens}, "
                f"is_draft_worker={is_draft_worker})"
            )
            text = "T is an int in 1..num_draft_tokens+1, the same every call"
            with _obligation(hook, text):
                tokens = policy.get_num_tokens_per_req_for_target_verify(
                    num_draft_tokens, is_draft_worker
                )
                again = policy.get_num_tokens_per_req_for_target_verify(
                    num_draft_tokens, is_draft_worker
                )
            if not is_int(tokens):
                raise _fail(hook, text, f"{call} returned {tokens!r} ({type(tokens).__name__})")
            if not 1 <= tokens <= num_draft_tokens + 1:
                raise _fail(
                    hook,
                    text,
                    f"{call} returned {tokens!r}, outside 1..{num_draft_tokens + 1} (T counts "
                    "the root and at most num_draft_tokens drafted tokens)",
                )
            if again != tokens:
                raise _fail(hook, text, f"{call} returned {tokens!r} then {again!r}")


def _payload(rows: int, base: int, *, width: int = 2, hidden: int = 3) -> RelayPayload:
    """A distinctive payload: every value derives from ``base`` and the row."""
    ids = torch.arange(rows, dtype=torch.int64) + base
    return RelayPayload(
        bonus_tokens=ids,
        topk_p=(ids[:, None] + torch.arange(width)).float() / 100,
        topk_index=ids[:, None] * 10 + torch.arange(width),
        hidden_states=(ids[:, None] - torch.arange(hidden)).float(),
    )


def _expect_rows(
    hook: str, text: str, got: RelayPayload, want: RelayPayload, rows: list[int]
) -> None:
    """``got`` holds rows ``rows`` of ``want`` for every field ``want`` has."""
    if not isinstance(got, RelayPayload):
        raise _fail(hook, text, f"resolve returned {type(got).__name__}, not a RelayPayload")
    index = torch.tensor(rows, dtype=torch.int64)
    for name, tensor in want.present().items():
        value = getattr(got, name)
        expected = tensor.index_select(0, index)
        if value is None or not torch.equal(value.cpu(), expected):
            raise _fail(hook, text, f"{name}: resolved {value!r}, expected {expected!r}")


def check_future_map_factory(
    factory: object, *, device: torch.device | str = "cpu", algorithm: str | None = None
) -> None:
    """``factory`` makes FutureMaps that return the latest write per slot and refuse mismatches.
    ``algorithm``: the name of the algorithm the factory belongs to, for messages."""
    hook = hook_label(FutureMapFactory, "future_map", factory, algorithm)
    dev = torch.device(device)
    _structure(hook, FutureMapFactory, factory)
    factory = cast(FutureMapFactory, factory)
    with _obligation(hook, "create_future_map returns a FutureMap"):
        relay = factory.create_future_map(4, 8, 32, dev)
        _structure(f"{hook}.create_future_map() result", FutureMap, relay)

    def slots(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=dev)

    def on_device(payload: RelayPayload) -> RelayPayload:
        return RelayPayload(**{k: v.to(dev) for k, v in payload.present().items()})

    first, other, pad, fresh = _payload(2, 10), _payload(1, 50), _payload(1, 90), _payload(1, 70)
    seq = torch.tensor([5, 6], dtype=torch.int64)
    text = "resolve(slots) returns the latest publish/stash to each slot, in slot order"
    with _obligation(hook, text):
        relay.publish(slots(1, 2), seq.to(dev))
        relay.stash(slots(1, 2), on_device(first))
        relay.stash(slots(3), on_device(other))  # another request's write
        relay.stash(slots(0), on_device(pad))  # the padding row: harmless
        got = relay.resolve(slots(2, 1))
    _expect_rows(hook, text, got, first.merged(RelayPayload(seq_lens=seq)), [1, 0])

    text = "a slot re-written after resolve returns the new values (no stale read)"
    with _obligation(hook, text):
        relay.publish(slots(1), torch.tensor([7], dtype=torch.int64, device=dev))
        relay.stash(slots(1), on_device(fresh))
        got = relay.resolve(slots(1))
    _expect_rows(hook, text, got, fresh.merged(RelayPayload(seq_lens=torch.tensor([7]))), [0])

    bad_width = RelayPayload(topk_p=torch.zeros(1, 3, device=dev))
    bad_dtype = RelayPayload(hidden_states=torch.zeros(1, 3, dtype=torch.float64, device=dev))
    for field, bad in (("topk_p", bad_width), ("hidden_states", bad_dtype)):
        text = f"a {field} of another width or dtype raises RelayError(..., field={field!r})"
        try:
            relay.stash(slots(2), bad)
        except RelayError as exc:
            if exc.field != field:
                problem = f"RelayError.field={exc.field!r}, not {field!r}: {exc}"
                raise _fail(hook, text, problem) from exc
        except Exception as exc:
            raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        else:
            raise _fail(hook, text, "the mismatched payload was accepted")

    text = "writes to other slots and refused writes leave a slot unchanged"
    with _obligation(hook, text):
        got = relay.resolve(slots(3))
    _expect_rows(hook, text, got, other, [0])


def _batch(
    caps: Capabilities, bs: int, *, hidden: bool = True
) -> tuple[PrebuiltBatch, torch.Tensor]:
    k, width = 2, 3
    rows = torch.arange(bs, dtype=torch.int64)
    topk = caps.need_topk or caps.carries_draft_hidden_states
    batch = PrebuiltBatch(
        rids=tuple(f"req-{i}" for i in range(bs)),
        slots=rows + 1,
        seq_lens=rows * 3 + 4,
        topk_p=torch.full((bs, k), 0.5) if topk else None,
        topk_index=(rows[:, None] + torch.arange(k)) if topk else None,
        hidden_states=(
            torch.ones(bs, width) * rows[:, None]
            if caps.carries_draft_hidden_states and hidden
            else None
        ),
    )
    return batch, rows + 100


def _snapshot(batch: PrebuiltBatch, bonus: torch.Tensor) -> list[torch.Tensor | None]:
    parts = [batch.slots, batch.seq_lens, batch.topk_p, batch.topk_index, batch.hidden_states]
    return [None if t is None else t.clone() for t in [*parts, bonus]]


def check_disagg_draft_builder(
    builder: object,
    *,
    capabilities: Capabilities | None = None,
    future_maps: FutureMapFactory | None = None,
    algorithm: str | None = None,
) -> None:
    """``builder`` handles any batch size, keeps its inputs intact, relays when given a map, and
    raises DisaggError naming the requests when hidden states the algorithm carries are missing.

    ``capabilities`` says which fields travel (default: EAGLE's, the widest);
    ``future_maps`` makes the relay for the overlap check (default: slot-indexed);
    ``algorithm``: the name of the algorithm the builder belongs to, for messages.
    """
    hook = hook_label(DisaggDraftBuilder, "disagg", builder, algorithm)
    caps = capabilities or Capabilities(
        has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True
    )
    _structure(hook, DisaggDraftBuilder, builder)
    builder = cast("DisaggDraftBuilder[object]", builder)
    factory = future_maps or SlotFutureMapFactory()
    for bs in (0, 1, 3):
        batch, bonus = _batch(caps, bs)
        before = _snapshot(batch, bonus)
        with _obligation(hook, f"builds a draft input for bs={bs} without a relay"):
            result = builder.build_disagg_draft_input(batch, bonus, None)
        after = _snapshot(batch, bonus)
        for old, new in zip(before, after, strict=True):
            if old is not None and new is not None and not torch.equal(old, new):
                raise _fail(hook, "does not modify the batch or last_tokens", f"bs={bs}")
        if result is None and caps.carries_draft_hidden_states and bs:
            raise _fail(
                hook,
                "returns None only when the algorithm has no draft state to carry",
                f"returned None for bs={bs} though carries_draft_hidden_states=True",
            )

    text = "given a relay, publishes batch.seq_lens and stashes last_tokens at batch.slots"
    batch, bonus = _batch(caps, 3)
    with _obligation(hook, text):
        relay = factory.create_future_map(8, 8, 64, batch.device)
        builder.build_disagg_draft_input(batch, bonus, relay)
        got = relay.resolve(batch.slots)
    if got.seq_lens is None or not torch.equal(got.seq_lens, batch.seq_lens):
        raise _fail(hook, text, f"resolved seq_lens={got.seq_lens!r}, batch has {batch.seq_lens!r}")
    if got.bonus_tokens is None or not torch.equal(got.bonus_tokens, bonus):
        raise _fail(hook, text, f"resolved bonus_tokens={got.bonus_tokens!r}, sent {bonus!r}")

    if caps.carries_draft_hidden_states:
        text = "a batch missing hidden states raises DisaggError naming the request ids"
        batch, bonus = _batch(caps, 2, hidden=False)
        try:
            builder.build_disagg_draft_input(batch, bonus, None)
        except DisaggError as exc:
            if not all(rid in str(exc) for rid in batch.rids):
                raise _fail(hook, text, f"DisaggError did not name {batch.rids}: {exc}") from exc
        except Exception as exc:
            raise _fail(hook, text, f"raised {type(exc).__name__}: {exc}") from exc
        else:
            raise _fail(hook, text, "the batch was accepted without hidden states")


def _check_engine_methods(algo: SpecAlgorithm[object]) -> None:
    hook = f"{algo.name} (SpecAlgorithm)"
    if algo.is_none() == algo.is_speculative():
        raise _fail(hook, "is_none() is the negation of is_speculative()", "both agree")
    if algo.is_none():
        try:
            algo.get_num_tokens_per_req_for_target_verify(4, False)
        except InvalidConfig:
            return
        raise _fail(
            hook, "a non-speculative algorithm verifies no tokens per request", "returned one"
        )
    for d in range(1, 9):
        for worker in (False, True):
            try:  # a bad answer from the policy is named by the engine method itself
                per_req = algo.get_num_tokens_per_req_for_target_verify(d, worker)
            except SpecstratError as exc:
                raise _fail(hook, "answers T for num_draft_tokens 1..8", str(exc)) from exc
            text = "get_num_tokens_per_bs_for_target_verify aliases the per_req method"
            with _obligation(hook, text):
                per_bs = algo.get_num_tokens_per_bs_for_target_verify(d, worker)
            if per_req != per_bs:
                raise _fail(hook, text, f"D={d}: {per_req} != {per_bs}")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One conformance check's outcome: its name, whether it passed, why not, and the error
    that said so (its traceback reaches the user's frames; ``specstrat check --traceback``)."""

    name: str
    passed: bool
    message: str = ""
    error: SpecstratError | None = dataclasses.field(default=None, compare=False, repr=False)


def run_conformance(algo: object) -> list[CheckResult]:
    """Every conformance check on ``algo``, each reported, none stopping the others."""
    if not isinstance(algo, SpecAlgorithm):
        return [
            CheckResult(
                "algorithm", False, f"{algo!r} is a {type(algo).__name__}, not a SpecAlgorithm"
            )
        ]
    owner = algo.name
    checks: dict[str, Callable[[], object]] = {
        "target_verify": lambda: check_target_verify_policy(algo.target_verify, algorithm=owner),
        "future_map": lambda: check_future_map_factory(algo.future_map, algorithm=owner),
        "disagg": lambda: check_disagg_draft_builder(
            algo.disagg, capabilities=algo.capabilities, algorithm=owner
        ),
        "drafter": lambda: check_drafter(
            algo.drafter, capabilities=algo.capabilities, tree=algo.tree, algorithm=owner
        ),
        "tree": lambda: check_tree_policy(algo.tree, algorithm=owner),
        "acceptance": lambda: check_acceptance_rule(algo.acceptance, algorithm=owner),
        "speculation": lambda: check_speculation_policy(algo.speculation, algorithm=owner),
        "engine methods": lambda: _check_engine_methods(algo),
    }
    results: list[CheckResult] = []
    for name, run in checks.items():
        try:
            run()
        except SpecstratError as exc:
            results.append(CheckResult(name, False, str(exc), exc))
        else:
            results.append(CheckResult(name, True))
    return results


def check_algorithm(algo: object) -> None:
    """Every conformance check on ``algo``; raises on the first that fails."""
    for result in run_conformance(algo):
        if not result.passed:
            raise ConformanceError(f"{result.name}: {result.message}")
