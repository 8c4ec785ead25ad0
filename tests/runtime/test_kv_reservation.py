"""kv_reservation: the one answer to what a request reserves past its prompt and output, the
answer the engine admits against."""

from dataclasses import replace
from typing import Any

import pytest

import specstrat
from specstrat import InvalidConfig, SpecAlgorithm, TreeShape, UnknownAlgorithm
from specstrat.runtime import (
    EmbeddedModels,
    Engine,
    EngineConfig,
    KVReservation,
    Request,
    kv_reservation,
)
from specstrat.strategies import TopkTree
from specstrat.testing import ScriptedSpeculationPolicy

CONTEXT = 64
NEW_TOKENS = 6
EAGLE_TREE = replace(specstrat.EAGLE, name="EAGLE_TREE", tree=TopkTree(topk=2, num_steps=3))
WIDE_NGRAM = replace(
    specstrat.NGRAM, name="NGRAM_WIDE", speculation=ScriptedSpeculationPolicy((1, 2, 7))
)

#: (algorithm, D, T at the largest candidate D, tree columns): chains, a tree, a policy wider
#: than the configured D, and target-only.
CASES: list[tuple[SpecAlgorithm[Any], int, int, int]] = [
    (specstrat.NONE, 4, 1, 0),
    (specstrat.NGRAM, 4, 4, 0),
    (specstrat.DSPARK, 3, 3, 0),
    (EAGLE_TREE, 6, 6, 2 * (3 - 1)),
    (WIDE_NGRAM, 3, 7, 0),
]
IDS = [f"{a.name}-D{d}" for a, d, _, _ in CASES]


@pytest.mark.parametrize(("algo", "d", "tokens", "columns"), CASES, ids=IDS)
def test_the_margin_is_two_verify_widths_plus_the_tree_columns(
    algo: SpecAlgorithm[Any], d: int, tokens: int, columns: int
) -> None:
    """margin = 2 * T (T at the largest D the policy may choose) + topk * (num_steps - 1)."""
    reservation = kv_reservation(algo, d)
    assert reservation.widths[-1] >= d or not algo.is_speculative()
    assert (reservation.tokens_per_req, reservation.tree_columns) == (tokens, columns)
    assert reservation.margin == 2 * tokens + columns
    short, long = Request("short", (1, 2, 3), 5), Request("long", (1,), 9)
    assert reservation.for_request(short) == 3 + 5 + reservation.margin
    assert reservation.context_len_for([short, long]) == 1 + 9 + reservation.margin


@pytest.mark.parametrize(("algo", "d", "tokens", "columns"), CASES, ids=IDS)
def test_the_engine_admits_exactly_up_to_the_reservation(
    models: EmbeddedModels, algo: SpecAlgorithm[Any], d: int, tokens: int, columns: int
) -> None:
    """A request with prompt + max_new_tokens + margin == context_len is admitted and runs;
    one more prompt token is refused, naming the same margin."""
    margin = kv_reservation(algo, d, context_len=CONTEXT).margin
    fits = Request("fits", tuple(b"x = 1\n" * 20)[: CONTEXT - NEW_TOKENS - margin], NEW_TOKENS)
    over = Request("over", (65, *fits.prompt), NEW_TOKENS)
    engine = Engine(algo, models, EngineConfig(num_draft_tokens=d, context_len=CONTEXT))
    with pytest.raises(InvalidConfig, match=rf"\({margin}\) = {CONTEXT + 1} exceeds context_len"):
        engine.submit(over)
    assert len(engine.run([fits])["fits"]) == NEW_TOKENS


BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("not-an-algorithm", {"algo": 3}, r"algo=3 \(int\); pass a SpecAlgorithm"),
    ("unknown-name", {"algo": "NOPE"}, r"no algorithm named 'NOPE'; known: NONE, EAGLE"),
    ("zero-d", {"num_draft_tokens": 0}, r"num_draft_tokens=0 must be an int >= 1"),
    ("bool-d", {"num_draft_tokens": True}, r"num_draft_tokens=True must be an int >= 1"),
    ("str-context", {"context_len": "64"}, r"context_len='64' must be an int >= 1, or None"),
    ("T-leaves-no-room", {"context_len": 9}, r"T=4 tokens .* no room in context_len=9"),
    (
        "policy-too-wide",
        {"algo": WIDE_NGRAM, "num_draft_tokens": 3, "context_len": 12},
        r"NGRAM_WIDE: speculation=ScriptedSpeculationPolicy declares D up to 7",
    ),
]


@pytest.mark.parametrize(("case", "kwargs", "match"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_are_refused_by_name(case: str, kwargs: dict[str, Any], match: str) -> None:
    """A bad or unknown algorithm, D or context_len, or a width that does not fit the context,
    is refused naming the value, as the engine refuses it at start."""
    args: dict[str, Any] = {"algo": "NGRAM", **kwargs}
    with pytest.raises((InvalidConfig, UnknownAlgorithm), match=match):
        kv_reservation(args.pop("algo"), **args)


BAD_RESERVATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("no-widths", {"widths": ()}, r"widths=\(\) must be a non-empty ascending tuple"),
    ("unsorted", {"widths": (4, 2)}, r"widths=\(4, 2\) must be a non-empty ascending tuple"),
    ("zero-T", {"tokens_per_req": 0}, r"tokens_per_req=0 must be an int >= 1"),
    ("tree-of-other-T", {"tree": TreeShape.chain(3)}, r"must be a TreeShape with tokens_per_req=4"),
]


@pytest.mark.parametrize(
    ("case", "kwargs", "match"), BAD_RESERVATIONS, ids=[c[0] for c in BAD_RESERVATIONS]
)
def test_a_reservation_is_checked_when_built(case: str, kwargs: dict[str, Any], match: str) -> None:
    """KVReservation refuses widths, T or a tree that do not describe one configuration."""
    base: dict[str, Any] = {"widths": (4,), "tokens_per_req": 4, "tree": TreeShape.chain(4)}
    with pytest.raises(InvalidConfig, match=match):
        KVReservation(**{**base, **kwargs})


def test_requests_for_a_context_are_checked() -> None:
    """for_request takes a Request and context_len_for a non-empty sequence of them."""
    reservation = kv_reservation("NGRAM")
    with pytest.raises(InvalidConfig, match=r"request=\(1, 2\); pass a specstrat.runtime.Request"):
        reservation.for_request((1, 2))  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match=r"requests=\[\] must be a non-empty sequence"):
        reservation.context_len_for([])
