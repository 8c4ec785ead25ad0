"""Relay gather: one launch, bit-exact against index_select for every field subset."""

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specstrat.kernels.relay_gather as rg
from specstrat import InvalidConfig, RelayPayload
from specstrat.kernels import gather_relay, gather_relay_ref
from specstrat.testing import relay_payloads

ROWS = [0, 1, 3, 7, 64, 257]  # source rows (0 only with an empty index)
HIDDEN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit pattern, so NaN payloads and -0.0 compare exactly."""
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def assert_bit_exact(got: RelayPayload, want: RelayPayload) -> None:
    assert got.present().keys() == want.present().keys()
    for name, tensor in want.present().items():
        other = got.present()[name]
        assert other.dtype == tensor.dtype
        assert torch.equal(bits(other), bits(tensor)), name


def source(rows: int, hidden_dtype: torch.dtype, *, seed: int = 0) -> RelayPayload:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 130, generator=gen).to(hidden_dtype)
    if rows:
        hidden[0, 0] = float("nan")
        hidden[-1, -1] = -0.0
    return RelayPayload(
        bonus_tokens=torch.randint(0, 1 << 40, (rows,), generator=gen),
        seq_lens=torch.randint(0, 1 << 20, (rows,), generator=gen, dtype=torch.int32),
        topk_p=torch.rand(rows, 3, generator=gen),
        topk_index=torch.randint(0, 1 << 30, (rows, 3), generator=gen),
        hidden_states=hidden,
    )


@pytest.mark.parametrize("dtype", HIDDEN_DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_table_bit_exact(rows: int, dtype: torch.dtype) -> None:
    """Every field, gathered with duplicates and reversed order, equals index_select bit for bit."""
    src = source(rows, dtype, seed=rows)
    n = rows and rows * 2 + 1
    index = torch.randint(0, max(rows, 1), (n,)) if rows else torch.zeros(0, dtype=torch.int64)
    want = gather_relay_ref(src, index)
    assert_bit_exact(gather_relay(src, index, backend="triton"), want)
    assert_bit_exact(gather_relay(src, index, backend="torch"), want)


@pytest.mark.parametrize(
    "fields",
    [
        ("bonus_tokens",),
        ("seq_lens", "hidden_states"),
        ("topk_p", "topk_index"),
        ("hidden_states",),
    ],
)
def test_field_subsets(fields: tuple[str, ...]) -> None:
    """Any subset of fields is gathered, and absent fields stay absent."""
    full = source(9, torch.float32)
    src = RelayPayload(**{f: getattr(full, f) for f in fields})
    index = torch.tensor([8, 0, 0, 4], dtype=torch.int32)
    got = gather_relay(src, index, backend="triton")
    assert tuple(got.present()) == fields
    assert_bit_exact(got, gather_relay_ref(src, index.long()))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_into_caller_owned_outputs(backend: Any) -> None:
    """With out=, results land in the caller's buffers and out is returned."""
    src = source(12, torch.bfloat16)
    index = torch.tensor([11, 2, 2])
    out = RelayPayload(
        **{k: torch.empty((3, *v.shape[1:]), dtype=v.dtype) for k, v in src.present().items()}
    )
    assert gather_relay(src, index, out=out, backend=backend) is out
    assert_bit_exact(out, gather_relay_ref(src, index))


def test_one_launch_for_all_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five fields are gathered by a single kernel launch; an empty index launches nothing."""
    launches: list[Any] = []
    real = rg.launch  # type: ignore[attr-defined]

    def counted(kernel: Any, grid: Any, *args: Any, **kw: Any) -> None:
        launches.append(grid)
        real(kernel, grid, *args, **kw)

    monkeypatch.setattr(rg, "launch", counted)
    src = source(300, torch.float32)
    gather_relay(src, torch.arange(300).flip(0), backend="triton")
    assert len(launches) == 1
    gather_relay(src, torch.zeros(0, dtype=torch.int64), backend="triton")
    assert len(launches) == 1


def test_empty_source_returns_empty_payload() -> None:
    """A relay with no fields allocated gathers to an empty payload."""
    assert gather_relay(RelayPayload(), torch.tensor([1, 2])).present() == {}


@given(
    st.integers(1, 40).flatmap(
        lambda rows: st.tuples(
            relay_payloads(rows, topk=st_width(rows), hidden=33),
            st.lists(st.integers(0, rows - 1), max_size=80),
        )
    )
)
def test_property_bit_exact(case: tuple[RelayPayload, list[int]]) -> None:
    """Any payload and any index list (duplicates, empty): Triton == index_select, bit for bit."""
    src, idx = case
    index = torch.tensor(idx, dtype=torch.int64)
    assert_bit_exact(gather_relay(src, index, backend="triton"), gather_relay_ref(src, index))


def st_width(rows: int) -> int:
    """A top-k width that varies with the row count (1..8)."""
    return rows % 8 + 1


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


SRC = RelayPayload(bonus_tokens=torch.arange(4), hidden_states=torch.zeros(4, 2))
ERRORS: list[tuple[str, Any, str]] = [
    (
        "source-type",
        lambda: gather_relay(loose({"bonus_tokens": torch.arange(3)}), torch.tensor([0])),
        r"source=dict; pass a RelayPayload",
    ),
    ("index-float", lambda: gather_relay(SRC, torch.tensor([0.0])), r"index.dtype=torch.float32"),
    (
        "index-2d",
        lambda: gather_relay(SRC, torch.tensor([[0]])),
        r"index.shape=\(1, 1\) must have rank 1",
    ),
    (
        "index-negative",
        lambda: gather_relay(SRC, torch.tensor([-1])),
        r"index range -1\.\.-1 is outside the source's 4 rows",
    ),
    (
        "source-noncontig",
        lambda: gather_relay(
            RelayPayload(hidden_states=torch.zeros(2, 4)[:, ::2]), torch.tensor([0])
        ),
        r"source.hidden_states is not contiguous",
    ),
    (
        "out-fields",
        lambda: gather_relay(
            SRC, torch.tensor([0]), out=RelayPayload(bonus_tokens=torch.zeros(1, dtype=torch.int64))
        ),
        r"out has fields \['bonus_tokens'\] but source has",
    ),
    (
        "out-shape",
        lambda: gather_relay(
            SRC,
            torch.tensor([0]),
            out=RelayPayload(
                bonus_tokens=torch.zeros(2, dtype=torch.int64), hidden_states=torch.zeros(2, 2)
            ),
        ),
        r"out.bonus_tokens is torch.int64 \(2,\) .* must be torch.int64 \(1,\)",
    ),
    (
        "out-dtype",
        lambda: gather_relay(
            SRC,
            torch.tensor([0]),
            out=RelayPayload(
                bonus_tokens=torch.zeros(1, dtype=torch.int64),
                hidden_states=torch.zeros(1, 2, dtype=torch.float64),
            ),
        ),
        r"out.hidden_states is torch.float64",
    ),
]


@pytest.mark.parametrize(("call", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_validation_errors(call: Any, message: str) -> None:
    """Bad sources, indices and outputs raise InvalidConfig naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        call()
