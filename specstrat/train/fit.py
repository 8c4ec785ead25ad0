"""The optimisation loop a head and a draft LM share: shuffled batches of captured sequences,
AdamW with a linear warm-up then a cosine learning rate, gradient-norm clipping, a progress bar,
a checkpoint after each epoch, and a stop at the epochs or the deadline.

:func:`fit` takes the model's loss on a batch of sequence indices as a callable, so what a
step computes (training-time test for a head, teacher-forced distillation for a draft LM) stays
with the trainer, and the schedule, the stops and the checkpoints are written once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["FitState", "fit", "lr_scale"]


def lr_scale(progress: float, warmup: float) -> float:
    """The learning rate's share of its peak at ``progress`` in [0, 1] of training: linear up to
    ``warmup``, then a cosine down to 0."""
    if progress < warmup:
        return (progress + 1e-3) / (warmup + 1e-3)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (progress - warmup) / (1.0 - warmup + 1e-9))))


@dataclass(frozen=False, slots=True)
class FitState:
    """Where a run stands: ``epoch`` and ``step`` done, the ``recent`` losses (the last ten);
    a resumed run starts from its checkpoint's."""

    epoch: int = 0
    step: int = 0
    recent: list[float] = field(default_factory=list)

    @property
    def loss(self) -> float:
        """The mean of the recent losses (NaN before the first step)."""
        return sum(self.recent) / len(self.recent) if self.recent else math.nan


def fit(
    module: torch.nn.Module,
    opt: Any,
    params: Sequence[torch.nn.Parameter],
    loss_of: Callable[[list[int]], tuple[torch.Tensor, str]],
    *,
    count: int,
    config: Any,
    state: FitState,
    order: torch.Generator,
    deadline: float | None,
    save: Callable[[FitState], None],
    bar: Any,
    desc: str,
) -> FitState:
    """Train ``module`` (in train mode for the loop, eval mode after) over ``count`` sequences
    in shuffled batches of ``config.batch_size`` (``order`` shuffles) until ``config.epochs``
    epochs or ``deadline`` (one step at least: a budget that data generation used up still
    trains), ``loss_of(batch)`` giving each step's loss and its progress text; ``config.lr``
    scheduled by :func:`lr_scale` with ``config.warmup``, gradients clipped at
    ``config.clip``; ``save(state)`` after each epoch; ``bar``: a tqdm to show progress in, or
    falsy. Returns ``state``, advanced."""
    per_epoch = math.ceil(count / config.batch_size)
    total = None if config.epochs is None else config.epochs * per_epoch
    began = time.monotonic()
    pbar = bar(total=total, initial=state.step, desc=desc, unit="step") if bar else None
    module.train()
    try:
        while total is None or state.step < total:
            perm = torch.randperm(count, generator=order).tolist()
            for b in range(per_epoch):
                now = time.monotonic()
                late = deadline is not None and now > deadline and state.step > 0
                if late or (total and state.step >= total):
                    return state
                frac = state.step / total if total else 0.0
                if deadline is not None:
                    frac = max(frac, (now - began) / max(deadline - began, 1e-9))
                for group in opt.param_groups:
                    group["lr"] = config.lr * lr_scale(frac, config.warmup)
                loss, shown = loss_of(perm[b * config.batch_size :][: config.batch_size])
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(params, config.clip)
                opt.step()
                state.step += 1
                state.recent = [*state.recent[-9:], loss.item()]
                if pbar is not None:
                    pbar.set_postfix_str(f"loss {state.recent[-1]:.3f} {shown}")
                    pbar.update(1)
            state.epoch += 1
            save(state)
        return state
    finally:
        module.eval()
        if pbar is not None:
            pbar.close()
