"""A model whose outputs disagree with its ModelShape is refused by name at its first forward."""

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from specstrat import NGRAM, STANDALONE, ModelSet, ModelShape, ModelShapeError
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.runtime._model_check import check_model_outputs

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = [replace(r, max_new_tokens=6) for r in workload(2, seed=3)]


class Misshapen(nn.Module):
    """A model whose logits or hidden states are wider or narrower than its shape says."""

    def __init__(self, inner: Any, *, extra_logits: int = 0, hidden_cut: int = 0) -> None:
        super().__init__()
        self.inner, self.extra_logits, self.hidden_cut = inner, extra_logits, hidden_cut

    @property
    def shape(self) -> ModelShape:
        """The wrapped model's shape, unchanged."""
        return self.inner.shape  # type: ignore[no-any-return]

    def forward(self, tokens: Any, positions: Any, attention: Any) -> tuple[Any, Any]:
        """The wrapped outputs, padded or cut."""
        logits, hidden = self.inner(tokens, positions, attention)
        pad = logits.new_full((logits.shape[0], self.extra_logits), -1e9)
        return torch.cat([logits, pad], dim=1), hidden[:, : hidden.shape[1] - self.hidden_cut]


CASES: list[tuple[str, str, dict[str, int], str]] = [
    (
        "target-wider-logits",
        "target",
        {"extra_logits": 44},
        r"model=Misshapen returned logits 300 wide but its ModelShape\.vocab_size=256; declare "
        r"vocab_size=300 in the model's shape, or return logits of width 256 \(slice a padded LM "
        r"head to the vocabulary\)",
    ),
    (
        "target-narrower-hidden",
        "target",
        {"hidden_cut": 8},
        r"model=Misshapen returned hidden states 120 wide but its ModelShape\.hidden_size=128",
    ),
    (
        "draft-wider-logits",
        "draft",
        {"extra_logits": 1},
        r"model=Misshapen returned logits 257 wide but its ModelShape\.vocab_size=256",
    ),
    (
        "draft-narrower-hidden",
        "draft",
        {"hidden_cut": 1},
        r"model=Misshapen returned hidden states \d+ wide but its ModelShape\.hidden_size=\d+",
    ),
]


@pytest.mark.parametrize(("case", "which", "kw", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_misshapen_model_is_refused_at_its_first_forward(
    case: str, which: str, kw: dict[str, int], message: str, models: EmbeddedModels
) -> None:
    """Wider logits or narrower hidden states than ModelShape, of the target or of a draft
    LM, end the first forward in a ModelShapeError naming the model (not the drafter); nothing
    leaks."""
    parts = {"target": models.target, "draft": models.draft, "head": models.head}
    parts[which] = Misshapen(parts[which], **kw)
    mine = ModelSet(**parts)  # type: ignore[arg-type]
    algo = STANDALONE if which == "draft" else NGRAM
    engine = Engine(algo, mine, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(ModelShapeError, match=message):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before


SHAPE = ModelShape(vocab_size=8, hidden_size=4, layers=1, heads=1, head_dim=4, max_positions=8)
OUTPUTS: list[tuple[str, Any, Any, str]] = [
    (
        "logits-not-a-tensor",
        [[0.0] * 8],
        torch.zeros(1, 4),
        r"returned logits of list for 1 tokens",
    ),
    (
        "logits-rank-3",
        torch.zeros(1, 1, 8),
        torch.zeros(1, 4),
        r"logits of torch\.float32 \(1, 1, 8\)",
    ),
    (
        "too-few-rows",
        torch.zeros(0, 8),
        torch.zeros(1, 4),
        r"returned 0 rows of logits for 1 tokens",
    ),
    (
        "narrower-logits",
        torch.zeros(1, 7),
        torch.zeros(1, 4),
        r"logits 7 wide but its ModelShape\.vocab_size=8",
    ),
    (
        "wider-hidden",
        torch.zeros(1, 8),
        torch.zeros(1, 5),
        r"hidden states 5 wide but its ModelShape\.hidden_size=4",
    ),
]


@pytest.mark.parametrize(
    ("case", "logits", "hidden", "message"), OUTPUTS, ids=[c[0] for c in OUTPUTS]
)
def test_check_model_outputs_names_what_disagrees(
    case: str, logits: Any, hidden: Any, message: str
) -> None:
    """Every way the outputs can disagree with the shape is named, with the model's name."""
    with pytest.raises(ModelShapeError, match=r"model=str .*" + message):
        check_model_outputs("m", SHAPE, 1, logits, hidden)
    check_model_outputs("m", SHAPE, 1, torch.zeros(1, 8), torch.zeros(1, 4))


def test_check_model_outputs_counts_the_asked_logit_rows() -> None:
    """With logit_rows the logits have that many rows and the hidden states one per token; a
    forward_rows that returns every row's logits is named."""
    check_model_outputs("m", SHAPE, 3, torch.zeros(1, 8), torch.zeros(3, 4), logit_rows=1)
    with pytest.raises(ModelShapeError, match=r"3 rows of logits for 3 tokens \(forward_rows"):
        check_model_outputs("m", SHAPE, 3, torch.zeros(3, 8), torch.zeros(3, 4), logit_rows=1)
