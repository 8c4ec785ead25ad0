"""PlannedLinears: nn.Linear modules run by a plan timed on their weights."""

from __future__ import annotations

import torch
from torch import nn

from specstrat.hf.matmul_padding import MatmulPlan, PlannedLinears, pack


def _planned(packed: bool) -> tuple[nn.Linear, PlannedLinears]:
    torch.manual_seed(0)
    linear = nn.Linear(24, 40)
    planned = PlannedLinears([linear])
    form = "packed" if packed and pack(linear.weight) is not None else "mm"
    planned.plan = MatmulPlan({n: (form, n) for n in range(1, 9)}, "packed" if packed else None)
    return linear, planned


def test_a_planned_linear_gives_the_modules_output_for_any_leading_shape() -> None:
    """planned(module, x) is module(x) for x [B, T, in], packed or not, within float rounding."""
    for packed in (True, False):
        linear, planned = _planned(packed)
        x = torch.randn(2, 3, 24)
        with torch.inference_mode():
            got, want = planned(linear, x), linear(x)
        assert got.shape == (2, 3, 40)
        torch.testing.assert_close(got, want)


def test_a_weight_written_in_place_is_packed_anew() -> None:
    """After the module's weight is written in place, the next call reads the new weight, not
    a stale packed copy."""
    linear, planned = _planned(packed=True)
    x = torch.randn(1, 24)
    with torch.inference_mode():
        planned(linear, x)
    with torch.no_grad():
        linear.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(planned(linear, x), linear(x))


def test_a_call_that_records_gradients_runs_the_module() -> None:
    """With gradients recorded, the module itself runs, so the weight gets its gradient."""
    linear, planned = _planned(packed=True)
    (grad,) = torch.autograd.grad(planned(linear, torch.randn(3, 24)).sum(), [linear.weight])
    assert float(grad.abs().sum()) > 0
