"""PlannedLinears and MatmulPlan: nn.Linear modules run by a plan timed on their weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from specstrat.errors import InvalidConfig
from specstrat.hf import matmul_padding
from specstrat.hf.matmul_padding import MatmulPlan, PlannedLinears, pack


def _planned(linear: nn.Linear | None = None) -> tuple[nn.Linear, PlannedLinears]:
    """A linear and a PlannedLinears whose plan runs it packed on any row count."""
    torch.manual_seed(0)
    linear = linear or nn.Linear(24, 40)
    if pack(linear.weight) is None:
        pytest.skip("this torch has no oneDNN to pack with")
    planned = PlannedLinears([linear])
    planned.plan = MatmulPlan({1: ("packed", 1)}, "packed")
    return linear, planned


def test_a_planned_linear_gives_the_modules_output_for_any_leading_shape() -> None:
    """planned(module, x) is module(x) for x [B, T, in] (packed, or padded mm), within float
    rounding (assert_close's float32 default: the sums run in another order)."""
    linear, planned = _planned()
    x = torch.randn(2, 3, 24)
    for plan in (planned.plan, MatmulPlan({6: ("mm", 8)})):
        planned.plan = plan
        with torch.inference_mode():
            got, want = planned(linear, x), linear(x)
        assert got.shape == (2, 3, 40)
        torch.testing.assert_close(got, want)


def test_a_weight_written_in_place_is_packed_anew() -> None:
    """After the module's weight is written in place, the next call reads the new weight, not
    a stale packed copy."""
    linear, planned = _planned()
    x = torch.randn(1, 24)
    with torch.inference_mode():
        planned(linear, x)
    with torch.no_grad():
        linear.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(planned(linear, x), linear(x))


def test_a_call_that_records_gradients_runs_the_module() -> None:
    """With gradients recorded, the module itself runs, so the weight, or a bias that trains
    beside a frozen weight, gets its gradient."""
    linear, planned = _planned()
    (grad,) = torch.autograd.grad(planned(linear, torch.randn(3, 24)).sum(), [linear.weight])
    assert float(grad.abs().sum()) > 0
    linear.weight.requires_grad_(False)
    (grad,) = torch.autograd.grad(planned(linear, torch.randn(3, 24)).sum(), [linear.bias])
    assert float(grad.abs().sum()) > 0


def test_a_hooked_or_subclassed_linear_runs_itself() -> None:
    """A forward hook still fires, and a subclass's own forward still runs."""
    linear, planned = _planned()
    seen: list[int] = []
    linear.register_forward_hook(lambda module, args, out: seen.append(1))
    with torch.inference_mode():
        planned(linear, torch.randn(1, 24))
    assert seen == [1]

    class Doubled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = 2 * super().forward(x)
            return out

    doubled, planned = _planned(Doubled(24, 40))
    x = torch.randn(1, 24)
    with torch.inference_mode():
        torch.testing.assert_close(planned(doubled, x), doubled(x))


def test_inference_tensor_weights_run_unpacked() -> None:
    """A linear made inside inference mode (weights with no version counter) runs, unpacked."""
    with torch.inference_mode():
        linear = nn.Linear(24, 40)
        _, planned = _planned(linear)
        x = torch.randn(2, 24)
        torch.testing.assert_close(planned(linear, x), linear(x))


@pytest.mark.parametrize(
    ("ways", "beyond", "match"),
    [
        ({1: ("cuda", 1)}, None, r"ways\[1\]=\('cuda', 1\).*form one of"),
        ({0: ("mm", 1)}, None, r"row count >= 1"),
        ({4: ("mm", 2)}, None, r"pad 4 rows to 4 or more"),
        ({2: ("packed", 4)}, None, r"run on the rows they have"),
        ({}, "mm", r"beyond='mm': only a form that runs any row count"),
        ({1: ("packed", 1)}, "packed-bf16", r"a plan runs one of \['packed', 'packed-bf16'\]"),
        ({2: ("mv", 2)}, None, r"ways\[2\]=\('mv', 2\): mv is a one-row product; run 2 rows as"),
        ({1: 5}, None, r"ways\[1\]=5: a plan maps a row count"),
        ("ab", None, r"ways='ab': pass a dict of row count -> \(form, rows\)"),
        ({}, ["packed"], r"beyond=\['packed'\]: only a form that runs any row count"),
    ],
)
def test_a_plan_with_a_way_it_cannot_run_is_refused(
    ways: dict[int, Any], beyond: str | None, match: str
) -> None:
    """MatmulPlan names the way it cannot run and what it takes."""
    with pytest.raises(InvalidConfig, match=match):
        MatmulPlan(ways, beyond)


def test_planned_linears_needs_modules() -> None:
    """An empty module list is refused by name."""
    with pytest.raises(InvalidConfig, match=r"modules=\[\]: pass the nn.Linear modules"):
        PlannedLinears([])


def test_planned_linears_refuses_a_narrow_that_is_not_a_bool() -> None:
    """narrow must be True or False; another value is refused by name before any timing."""
    with pytest.raises(InvalidConfig, match=r"narrow='yes': pass True \(a draft model\) or False"):
        PlannedLinears([nn.Linear(4, 4)], narrow="yes")  # type: ignore[arg-type]


def test_a_plans_summary_does_not_run_a_padded_way_into_another() -> None:
    """Rows padded to 3 and rows run on their own 4 are two runs in the summary."""
    plan = MatmulPlan({2: ("mm", 3), 3: ("mm", 3), 4: ("mm", 4), 5: ("packed", 5)}, "packed")
    assert plan.summary() == "2-3: mm on 3; 4: mm; 5: packed; past 5: packed"


def test_a_narrow_plan_runs_bfloat16_copies_of_the_weights() -> None:
    """A plan running packed-bf16 computes module(x) within bfloat16's rounding, on a packed
    bfloat16 copy (so not float32's exact sums), and names the dtype its copy is packed in."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    if pack(linear.weight, torch.bfloat16) is None:
        pytest.skip("this torch's oneDNN packs no bfloat16 weight here")
    planned = PlannedLinears([linear], narrow=True)
    planned.plan = MatmulPlan({1: ("packed-bf16", 1)}, "packed-bf16")
    assert planned.plan.packed_form() == "packed-bf16"
    x = torch.randn(5, 64)
    with torch.inference_mode():
        got, want = planned(linear, x), linear(x)
    assert got.dtype == torch.float32
    assert not torch.equal(got, want)
    # bfloat16 keeps 8 bits of mantissa: 64 products of unit-scale values stay within 2e-2
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_narrow_forms_are_timed_only_for_a_narrow_plan_and_one_packed_form_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """matmul_plan times packed-bf16 only when asked for a narrow plan; where both packed forms
    were timed it keeps the one faster over all row counts, so a weight holds one copy."""
    costs = {"linear": 100.0, "mm": 100.0, "mv": 100.0, "packed": 20.0, "packed-bf16": 10.0}
    timed: set[str] = set()

    def seconds(weights: Any, rows: int, form: str, dtypes: Any) -> float:
        timed.add(form)
        return costs[form] + (rows > 8 and form == "packed-bf16") * 30.0

    monkeypatch.setattr(matmul_padding, "_matmul_seconds", seconds)
    monkeypatch.setattr(matmul_padding, "pack", lambda weight, dtype=None: weight)
    monkeypatch.setattr(matmul_padding, "_MEASURED", {})
    plain = matmul_padding.matmul_plan([torch.zeros(8, 4)])
    assert "packed-bf16" not in timed
    assert plain.packed_form() == "packed"
    narrow = matmul_padding.matmul_plan([torch.zeros(8, 4)], narrow=True)
    # bf16 is faster to 8 rows and slower past them: over all counts "packed" wins, alone
    assert (narrow.forms(), narrow.beyond) == (frozenset({"packed"}), "packed")
    costs["packed"] = 35.0
    monkeypatch.setattr(matmul_padding, "_MEASURED", {})
    narrow = matmul_padding.matmul_plan([torch.zeros(8, 4)], narrow=True)
    assert narrow.ways[1] == ("packed-bf16", 1)
    assert narrow.packed_form() == "packed-bf16"
    assert "packed" not in narrow.forms()


def test_modules_of_several_dtypes_are_planned_and_run() -> None:
    """A plan over float32 and bfloat16 linears is timed with each weight's own dtype, and each
    module then runs as itself within its dtype's rounding."""
    torch.manual_seed(0)
    modules = [nn.Linear(16, 8), nn.Linear(16, 8).bfloat16()]
    planned = PlannedLinears(modules, narrow=True)
    for module in modules:
        x = torch.randn(3, 16, dtype=module.weight.dtype)
        with torch.inference_mode():  # bfloat16's rounding, as in the narrow test above
            torch.testing.assert_close(planned(module, x), module(x), rtol=2e-2, atol=2e-2)


def test_matmul_plan_refuses_a_narrow_that_is_not_a_bool() -> None:
    """matmul_plan's narrow must be True or False ("no" would read as true)."""
    with pytest.raises(InvalidConfig, match=r"narrow='no': pass True \(a draft model\) or False"):
        matmul_padding.matmul_plan([torch.zeros(8, 4)], narrow="no")  # type: ignore[arg-type]
