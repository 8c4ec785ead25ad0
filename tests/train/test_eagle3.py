"""The head's shape follows the target's config; it reads fused features or its own hidden;
its DraftHead form drafts only draft-vocabulary ids and matches the self-attending forward."""

from typing import Any

import pytest
import torch

from specstrat.errors import InvalidConfig
from specstrat.models import DraftHead
from specstrat.train import Eagle3Config, Eagle3Head

D2T = torch.tensor([5, 0, 17, 300, 2, 9], dtype=torch.int64)


@pytest.fixture
def head(llama: Any) -> Eagle3Head:
    """A fresh head over layers (0, 1, 1) of the tiny llama with a 6-id draft vocabulary."""
    torch.manual_seed(0)
    return Eagle3Head.from_target(llama, layers=(0, 1, 1), d2t=D2T)


def test_the_mlp_takes_up_to_eight_times_the_targets_intermediate_size(llama: Any) -> None:
    """intermediate_size= sets the head's MLP (768 = 8x the tiny llama's 96 is built); past
    8x it is refused, naming the value and the widest that is taken."""
    head = Eagle3Head.from_target(llama, layers=(0, 1), d2t=D2T, intermediate_size=768)
    assert head.config.intermediate_size == 768
    assert head.gate_proj.out_features == head.down_proj.in_features == 768
    with pytest.raises(InvalidConfig, match=r"intermediate_size=769 .* pass at most 768"):
        Eagle3Head.from_target(llama, layers=(0, 1), d2t=D2T, intermediate_size=769)


def test_config_follows_the_target(head: Eagle3Head) -> None:
    """Widths, heads, rope theta and vocabulary come from the target's config."""
    c = head.config
    assert (c.hidden_size, c.heads, c.kv_heads, c.head_dim) == (64, 4, 2, 16)
    assert (c.intermediate_size, c.rope_theta, c.vocab_size) == (96, 10000.0, 400)
    assert (c.layers, c.draft_vocab_size) == ((0, 1, 1), 6)
    assert head.q_proj.in_features == 2 * 64


@pytest.mark.parametrize("width", [3 * 64, 64])
def test_forward_reads_fused_features_or_its_own_hidden(head: Eagle3Head, width: int) -> None:
    """[B, T, 3H] features and [B, T, H] hidden states both give [B, T, N] and [B, T, H]."""
    x, tokens = torch.randn(2, 5, width), torch.randint(0, 400, (2, 5))
    logits, hidden = head(x, tokens, torch.arange(5).expand(2, 5))
    assert logits.shape == (2, 5, 6)
    assert hidden.shape == (2, 5, 64)


def test_forward_refuses_another_width(head: Eagle3Head) -> None:
    """An input neither 3H nor H wide is refused naming both widths."""
    with pytest.raises(InvalidConfig, match=r"width=100.*3\*64=192.*\(64 wide\)"):
        head(torch.randn(1, 2, 100), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2))


def test_causal_rows_see_only_the_past(head: Eagle3Head) -> None:
    """Causal attention: changing the last row leaves the earlier rows' outputs unchanged."""
    x, tokens, pos = torch.randn(1, 4, 192), torch.randint(0, 400, (1, 4)), torch.arange(4)[None]
    before, _ = head(x, tokens, pos)
    x2 = x.clone()
    x2[0, 3] += 1.0
    after, _ = head(x2, tokens, pos)
    torch.testing.assert_close(after[0, :3], before[0, :3])
    assert not torch.allclose(after[0, 3], before[0, 3])


def test_draft_head_is_the_self_attending_forward(head: Eagle3Head) -> None:
    """The DraftHead form gives [n, V] logits, -inf outside d2t, equal to forward(causal=False)
    at the draft ids, and its hidden chains as the next call's input."""
    drafter: DraftHead = head.draft_head()
    x, tokens = torch.randn(3, 192), torch.tensor([1, 2, 3])
    logits, hidden = drafter(x, tokens)
    assert logits.shape == (3, 400)
    assert hidden.shape == (3, 64)
    outside = torch.ones(400, dtype=torch.bool)
    outside[D2T] = False
    assert bool(torch.isinf(logits[:, outside]).all())
    ref, ref_hidden = head(x[None], tokens[None], torch.arange(3)[None], causal=False)
    torch.testing.assert_close(logits[:, D2T], ref[0])
    torch.testing.assert_close(hidden, ref_hidden[0])
    again, _ = drafter(hidden, logits.argmax(-1))
    assert set(again.argmax(-1).tolist()) <= set(D2T.tolist())


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"layers": (1,)}, r"layers=\(1,\) must be at least 2"),
        ({"heads": 3}, r"heads=3 is not a multiple of kv_heads=2"),
        ({"draft_vocab_size": 500}, r"draft_vocab_size=500 exceeds.*vocab_size=400"),
        ({"rms_eps": 0.0}, r"rms_eps=0.0 must be a number > 0"),
    ],
)
def test_config_refuses_bad_values(head: Eagle3Head, change: dict[str, Any], match: str) -> None:
    """One fused layer, heads not a multiple of KV heads, a draft vocabulary past the target's
    and a zero epsilon are refused by name."""
    fields = {f: getattr(head.config, f) for f in Eagle3Config.__dataclass_fields__}
    with pytest.raises(InvalidConfig, match=match):
        Eagle3Config(**{**fields, **change})


def test_draft_head_refuses_a_vocabulary_below_the_draft_ids(head: Eagle3Head) -> None:
    """A target vocabulary that does not hold every draft id is refused."""
    with pytest.raises(InvalidConfig, match=r"vocab_size=100 must be an int above.*300"):
        head.draft_head(100)
