"""The training API type-checks under mypy --strict: a config, a run, its file and the head."""

from pathlib import Path

from specstrat.hf import HFModels
from specstrat.models import ContextDraftHead, DraftHead
from specstrat.train import (
    Agreement,
    Eagle3ContextDraftHead,
    HeadConfig,
    TrainedHead,
    attach_head,
    default_prompts,
    load_head,
    save_head,
    train_head,
)


def train_and_attach(models: HFModels, out: Path) -> tuple[HFModels, float]:
    """Train a two-minute head for ``models``, save it, attach it; its held-out tau."""
    config = HeadConfig(draft_vocab=4096, budget_seconds=120.0, epochs=None, ttt_steps=3)
    trained: TrainedHead = train_head(config, models.target, models.tokenizer, default_prompts())
    path: Path = save_head(out, trained)
    head: DraftHead = load_head(path, models.target).draft_head()
    assert callable(head)
    return attach_head(models, path), trained.tau


def acceptance(agreement: Agreement) -> list[float]:
    """The chained acceptance by draft position."""
    return agreement["acceptance"]


def context_head(models: HFModels, out: Path) -> ContextDraftHead:
    """Train a head that attends over the context; its drafting form is a ContextDraftHead."""
    config = HeadConfig(budget_seconds=60.0, epochs=None, context=True)
    trained = train_head(config, models.target, models.tokenizer, default_prompts())
    drafted = load_head(save_head(out, trained), models.target).draft_head()
    assert isinstance(drafted, Eagle3ContextDraftHead)
    head: ContextDraftHead = drafted
    return head
