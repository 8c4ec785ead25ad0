"""Rejection sampling: the Triton kernel equals its twin token for token on the same
probabilities, the counter-based uniforms are pure, and sampling_probs keeps what it should."""

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specstrat import InvalidConfig
from specstrat.kernels.rejection_sampling import (
    rejection_sample,
    rejection_sample_ref,
    sample_from,
    sampling_probs,
    uniform,
)

# (bs, nodes, vocab): bs 0 and 1, no nodes, a weird vocabulary, more rows than a warp.
SHAPES = [(0, 3, 16), (1, 0, 16), (1, 1, 7), (3, 2, 37), (7, 4, 256), (33, 3, 50)]


def case(bs: int, n: int, vocab: int, seed: int, *, with_q: bool) -> dict[str, Any]:
    """Target (and draft) probabilities computed once, by the shared sampling_probs."""
    gen = torch.Generator().manual_seed(seed)
    rows = bs * (n + 1)
    temperature = torch.rand(bs, generator=gen, dtype=torch.float64) * 1.5 + 0.2
    top_p = torch.where(torch.rand(bs, generator=gen) < 0.5, 1.0, 0.9).to(torch.float64)
    top_k = torch.where(torch.rand(bs, generator=gen) < 0.5, 0, 5)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2
    p = sampling_probs(
        logits,
        temperature.repeat_interleave(n + 1),
        top_p.repeat_interleave(n + 1),
        top_k.repeat_interleave(n + 1),
    ).reshape(bs, n + 1, vocab)
    q = None
    if with_q and n:
        q_logits = torch.randn(bs * n, vocab, generator=gen, dtype=torch.float64) * 2
        q = sampling_probs(
            q_logits,
            temperature.repeat_interleave(n),
            top_p.repeat_interleave(n),
            top_k.repeat_interleave(n),
        ).reshape(bs, n, vocab)
    # Drafts: the argmax of p half the time (so chains are accepted), random otherwise.
    tokens = torch.where(
        torch.rand(bs, n, generator=gen) < 0.5,
        p[:, :n].argmax(-1) if n else torch.zeros(bs, 0, dtype=torch.int64),
        torch.randint(0, vocab, (bs, n), generator=gen),
    )
    return {
        "p": p,
        "tokens": tokens,
        "lengths": torch.randint(0, n + 1, (bs,), generator=gen),
        "seeds": torch.randint(0, 2**62, (bs,), generator=gen),
        "positions": torch.randint(0, 4000, (bs,), generator=gen),
        "q": q,
    }


@pytest.mark.parametrize("with_q", [False, True], ids=["one-hot-q", "q"])
@pytest.mark.parametrize(("bs", "n", "vocab"), SHAPES)
def test_triton_equals_twin_on_the_shape_table(bs: int, n: int, vocab: int, with_q: bool) -> None:
    """Interpreted Triton and the torch twin choose the same tokens and lengths."""
    args = case(bs, n, vocab, seed=bs * 100 + n, with_q=with_q)
    twin = rejection_sample(**args, backend="torch")
    kernel = rejection_sample(**args, backend="triton")
    assert torch.equal(kernel[0], twin[0])
    assert torch.equal(kernel[1], twin[1])


@settings(max_examples=25, deadline=None)
@given(
    bs=st.integers(0, 6),
    n=st.integers(0, 4),
    vocab=st.integers(2, 40),
    seed=st.integers(0, 999),
    with_q=st.booleans(),
)
def test_triton_equals_twin_property(bs: int, n: int, vocab: int, seed: int, with_q: bool) -> None:
    """For any shape and seed, kernel and twin agree exactly."""
    args = case(bs, n, vocab, seed, with_q=with_q)
    twin = rejection_sample(**args, backend="torch")
    kernel = rejection_sample(**args, backend="triton")
    assert torch.equal(kernel[0], twin[0])
    assert torch.equal(kernel[1], twin[1])


def test_a_request_depends_only_on_its_own_row() -> None:
    """Each row's answer is the same alone as in any batch (no cross-row randomness)."""
    args = case(7, 3, 37, seed=5, with_q=True)
    together = rejection_sample_ref(**args)
    for row in range(7):
        one: dict[str, Any] = {
            k: (v[row : row + 1] if v is not None else None) for k, v in args.items()
        }
        alone = rejection_sample_ref(**one)
        assert alone[0].item() == together[0][row].item()
        assert alone[1].item() == together[1][row].item()


def test_uniforms_are_pure_and_spread() -> None:
    """The same (seed, position, draw) gives the same number; different ones look uniform."""
    seeds = torch.arange(20000)
    u = uniform(seeds, torch.full_like(seeds, 7), 0)
    assert torch.equal(u, uniform(seeds, torch.full_like(seeds, 7), 0))
    assert not torch.equal(u, uniform(seeds, torch.full_like(seeds, 7), 1))
    assert bool(((u > 0) & (u < 1)).all())
    assert abs(float(u.mean()) - 0.5) < 0.01
    histogram = torch.histc(u.float(), bins=10, min=0, max=1)
    assert float(histogram.min()) > 1800  # 2000 expected per bin


def test_sampling_probs_applies_temperature_top_k_and_top_p() -> None:
    """Temperature 0 is one-hot at the argmax; top-k keeps k tokens; top-p the smallest head."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]] * 3, dtype=torch.float64)
    probs = sampling_probs(
        logits,
        torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64),
        torch.tensor([1.0, 1.0, 0.6], dtype=torch.float64),
        torch.tensor([0, 2, 0]),
    )
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert (probs[1] > 0).tolist() == [False, True, True, False]
    assert (probs[2] > 0).tolist() == [False, True, False, False]  # top token holds 0.66 > 0.6
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, dtype=torch.float64))


def test_sample_from_never_picks_a_zero_probability_token() -> None:
    """Inverse-CDF sampling skips tokens without mass, even at the extremes of u."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]] * 4, dtype=torch.float64)
    u = torch.tensor([1e-12, 0.5 - 1e-12, 0.5 + 1e-12, 1 - 1e-12], dtype=torch.float64)
    assert sample_from(probs, u).tolist() == [1, 1, 3, 3]


def test_rejection_is_exact_greedy_for_one_hot_distributions() -> None:
    """With one-hot p and no q, a draft is accepted iff it is the argmax; the bonus is the
    argmax."""
    p = torch.zeros(1, 3, 5, dtype=torch.float64)
    p[0, 0, 2] = p[0, 1, 4] = p[0, 2, 1] = 1.0
    args: dict[str, Any] = {
        "lengths": torch.tensor([2]),
        "seeds": torch.tensor([3]),
        "positions": torch.tensor([9]),
    }
    assert [t.item() for t in rejection_sample_ref(p, torch.tensor([[2, 4]]), **args)] == [2, 1]
    assert [t.item() for t in rejection_sample_ref(p, torch.tensor([[2, 3]]), **args)] == [1, 4]


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "tokens-float",
        {"tokens": torch.zeros(2, 3)},
        r"tokens is torch.float32 \(2, 3\); need int64",
    ),
    (
        "p-shape",
        {"p": torch.zeros(2, 3, 8, dtype=torch.float64)},
        r"p is torch.float64 \(2, 3, 8\); need floating \[bs=2, n \+ 1=4",
    ),
    (
        "q-shape",
        {"q": torch.zeros(2, 3, 7, dtype=torch.float64)},
        r"q is torch.float64 \(2, 3, 7\); need floating \(2, 3, 8\)",
    ),
    (
        "seeds-int32",
        {"seeds": torch.zeros(2, dtype=torch.int32)},
        r"seeds is torch.int32 \(2,\); need int64 \[2\]",
    ),
    ("lengths-too-long", {"lengths": torch.tensor([1, 4])}, r"lengths=\[1, 4\] must lie in 0\.\.3"),
    (
        "token-out-of-vocab",
        {"tokens": torch.tensor([[0, 1, 8], [0, 0, 0]])},
        r"tokens hold ids outside the vocabulary 0\.\.7",
    ),
]


@pytest.mark.parametrize(("name", "change", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_refused(name: str, change: dict[str, Any], message: str) -> None:
    """Every argument is checked, each error naming the value and what it needs."""
    args: dict[str, Any] = {
        "p": torch.full((2, 4, 8), 0.125, dtype=torch.float64),
        "tokens": torch.zeros(2, 3, dtype=torch.int64),
        "lengths": torch.tensor([1, 3]),
        "seeds": torch.tensor([1, 2]),
        "positions": torch.tensor([4, 5]),
        **change,
    }
    with pytest.raises(InvalidConfig, match=message):
        rejection_sample(**args, backend="torch")
