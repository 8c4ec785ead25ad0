"""Train the embedded models on the Python standard library's own source (deterministic).

``python -m specstrat.runtime._models.train [--out PATH] [--steps N]`` trains, in order: the target
LM on the text; the draft LM and the EAGLE-style head distilled from the target's greedy choices
(what speculation must match). ``--block-head`` trains only the block head (``weights/block.pt``)
against the frozen target and draft LM of ``embedded.pt``, which it leaves untouched: on the
target's greedy continuations of stdlib prompts (see :func:`train_block_head`). Seeds, file list and
the math library's settings are fixed (one thread; MKL on one code path, see ``REPRODUCIBLE_ENV``),
so the same Python, torch and CPU reproduce the same weights bit for bit. Weights are stored in
float16 beside their configs.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from specstrat.runtime._models.corpus import SOURCE_FILES, corpus
from specstrat.runtime._models.model import (
    VOCAB,
    BlockDraftLM,
    BlockHead,
    CausalAttention,
    EagleHead,
    ModelConfig,
    TinyLM,
)
from specstrat.runtime._models.weights import EmbeddedModels

__all__ = [
    "DRAFT_CONFIG",
    "REPRODUCIBLE_ENV",
    "TARGET_CONFIG",
    "greedy_rollouts",
    "main",
    "train_block_head",
    "block_main",
    "train_draft",
    "train_eagle",
    "train_target",
]

TARGET_CONFIG = ModelConfig(dim=128, layers=4, heads=4, mlp=512, max_positions=1024)
DRAFT_CONFIG = ModelConfig(dim=64, layers=2, heads=2, mlp=256, max_positions=1024)

#: Set before torch loads MKL (the ``__main__`` entry re-executes itself with them): with several
#: threads or MKL's run-time dispatch, two runs on one machine can differ in the last bit.
REPRODUCIBLE_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",
    "MKL_CBWR": "AUTO,STRICT",
}

SEQ_LEN = 256
BATCH = 24


def _batches(data: torch.Tensor, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - SEQ_LEN - 1, (steps, BATCH), generator=gen)
    offsets = torch.arange(SEQ_LEN + 1)
    return [data[s[:, None] + offsets] for s in starts]


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def _run(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, n = tokens.shape
    positions = torch.arange(n).repeat(b)
    logits, hidden = model(tokens.reshape(-1), positions, CausalAttention(b))
    return logits.view(b, n, -1), hidden.view(b, n, -1)


def _log(name: str, step: int, steps: int, loss: float, start: float) -> None:
    if step % 100 == 0 or step == steps - 1:
        print(
            f"{name} step {step:5d}/{steps} loss {loss:.3f} ({time.time() - start:.0f}s)",
            flush=True,
        )


def _fit(
    name: str,
    module: torch.nn.Module,
    data: torch.Tensor,
    steps: int,
    *,
    seed: int,
    peak_lr: float,
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    clip: bool = False,
) -> None:
    """AdamW over ``steps`` batches drawn with ``seed``: warm-up then cosine learning rate."""
    opt = torch.optim.AdamW(module.parameters(), lr=peak_lr, weight_decay=0.01)
    start = time.time()
    for step, batch in enumerate(_batches(data, steps, seed=seed)):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, peak_lr)
        loss = loss_of(batch)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if clip:
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        _log(name, step, steps, loss.item(), start)


def train_target(data: torch.Tensor, steps: int) -> TinyLM:
    """Next-byte cross-entropy on the corpus."""
    torch.manual_seed(1)
    model = TinyLM(TARGET_CONFIG)

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        logits, _ = _run(model, batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))

    _fit("target", model, data, steps, seed=2, peak_lr=3e-3, loss_of=loss_of, clip=True)
    return model.eval()


def train_draft(data: torch.Tensor, target: TinyLM, steps: int) -> TinyLM:
    """The draft LM learns the target's greedy next byte (distillation)."""
    torch.manual_seed(3)
    model = TinyLM(DRAFT_CONFIG)

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            greedy = _run(target, batch[:, :-1])[0].argmax(-1)
        logits, _ = _run(model, batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 256), greedy.reshape(-1))

    _fit("draft", model, data, steps, seed=4, peak_lr=3e-3, loss_of=loss_of)
    return model.eval()


def train_eagle(data: torch.Tensor, target: TinyLM, steps: int, unroll: int = 3) -> EagleHead:
    """The head chains (hidden, next byte) -> target's greedy byte after, ``unroll`` steps deep."""
    torch.manual_seed(5)
    head = EagleHead(TARGET_CONFIG.dim)

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits, hidden = _run(target, batch[:, :-1])
            greedy = logits.argmax(-1)  # greedy[t]: the target's choice after position t
        n = SEQ_LEN - unroll
        h, token = hidden[:, :n], greedy[:, :n]
        loss = torch.zeros(())
        for k in range(unroll):
            # From position t+k's hidden and the byte the target chose there, predict the byte
            # it chooses at t+k+1, and that position's hidden state.
            logits_k, h = head(h, token, target)
            want = greedy[:, k + 1 : n + k + 1]
            loss = loss + F.cross_entropy(logits_k.reshape(-1, 256), want.reshape(-1))
            loss = loss + F.mse_loss(h, hidden[:, k + 1 : n + k + 1])
            token = want
        return loss

    _fit("eagle", head, data, steps, seed=6, peak_lr=2e-3, loss_of=loss_of)
    return head.eval()


class _CachedAttention:
    """Causal attention for ``batch`` sequences of up to ``length`` tokens that keeps every
    layer's keys and values, so a greedy rollout runs one new token per sequence per forward
    (the caller advances ``filled`` after each forward)."""

    def __init__(self, batch: int, length: int) -> None:
        self.batch, self.length, self.filled = batch, length, 0
        self.kv: dict[int, torch.Tensor] = {}  # layer -> [2, batch, heads, length, head_dim]

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        n, h, d = q.shape
        new, past = n // self.batch, self.filled

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(self.batch, new, h, d).transpose(1, 2)

        if layer not in self.kv:
            self.kv[layer] = q.new_zeros(2, self.batch, h, self.length, d)
        cache = self.kv[layer]
        cache[0, :, :, past : past + new], cache[1, :, :, past : past + new] = split(k), split(v)
        mask = torch.ones(new, past + new, dtype=torch.bool).tril(past)
        keys, values = cache[0, :, :, : past + new], cache[1, :, :, : past + new]
        out = F.scaled_dot_product_attention(split(q), keys, values, attn_mask=mask)
        return out.transpose(1, 2).reshape(n, h, d)


def greedy_rollouts(
    target: TinyLM, data: torch.Tensor, count: int, *, prompt_len: int, length: int, seed: int
) -> torch.Tensor:
    """``count`` sequences ``[count, length]``: a corpus window of ``prompt_len`` bytes, then the
    target's greedy continuation (every byte after the prompt is the target's argmax given all
    before it, which is what a lossless speculative run commits at temperature 0)."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - prompt_len, (count,), generator=gen)
    out = []
    with torch.no_grad():
        for first in range(0, count, 64):
            seq = data[starts[first : first + 64, None] + torch.arange(prompt_len)]
            b, cache = seq.shape[0], _CachedAttention(seq.shape[0], length)
            logits, _ = target(seq.reshape(-1), torch.arange(prompt_len).repeat(b), cache)
            token = logits.view(b, prompt_len, -1)[:, -1].argmax(-1)
            tokens = [seq, token[:, None]]
            for pos in range(prompt_len, length - 1):
                cache.filled = pos
                logits, _ = target(token, torch.full((b,), pos), cache)
                token = logits.argmax(-1)
                tokens.append(token[:, None])
            out.append(torch.cat(tokens, dim=1))
    return torch.cat(out)


#: Block offsets the head learns (D - 1 placeholders: D up to 9 without reusing the last one).
BLOCK = 8
#: Context bytes a training example keeps before its anchor (cost: an example is WINDOW + BLOCK
#: rows).
WINDOW = 96
#: Steps of the shipped block head, and its transformer layers.
BLOCK_STEPS, HEAD_LAYERS = 3000, 2


def train_block_head(
    draft: TinyLM, rollouts: torch.Tensor, steps: int, *, prompt_len: int, batch: int = 48
) -> BlockHead:
    """The block head, on the frozen ``draft``: each example is a rollout's first ``c`` bytes
    (``c`` drawn per step, the anchor's position ``c - 1`` past the prompt) followed by
    ``BLOCK`` placeholders, which learn the rollout's next ``BLOCK`` bytes (cross-entropy, equal
    weight per offset). Only the head's parameters train."""
    torch.manual_seed(7)
    head = BlockHead(draft.cfg, BLOCK, HEAD_LAYERS)
    model = BlockDraftLM(draft, head)
    gen = torch.Generator().manual_seed(8)
    blanks = VOCAB + torch.arange(BLOCK)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=0.01)
    start, length = time.time(), rollouts.shape[1]
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, 3e-3)
        rows = torch.randint(0, rollouts.shape[0], (batch,), generator=gen)
        c = int(torch.randint(prompt_len, length - BLOCK + 1, (1,), generator=gen))
        picked = rollouts[rows]
        lo = max(0, c - WINDOW)  # the last WINDOW bytes of context, at their own positions
        tokens = torch.cat([picked[:, lo:c], blanks.expand(batch, BLOCK)], dim=1)
        positions = torch.arange(lo, c + BLOCK).repeat(batch)
        logits, _ = model(tokens.reshape(-1), positions, CausalAttention(batch))
        logits = logits.view(batch, c + BLOCK - lo, VOCAB)
        want = picked[:, c : c + BLOCK]
        loss = F.cross_entropy(logits[:, c - lo :].reshape(-1, VOCAB), want.reshape(-1))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        _log("block", step, steps, loss.item(), start)
    return head.eval()


def _half(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float16).clone() for k, v in module.state_dict().items()}


#: The block head's data: rollouts of the target (float64, as the engine runs it).
ROLLOUTS, PROMPT_LEN, ROLLOUT_LEN = 512, 48, 264


def block_main(frozen: Path, out: Path, steps: int) -> int:
    """Train the block head against the frozen models of ``frozen``; write it to ``out``."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    models = EmbeddedModels.load(frozen, block=None, dtype=torch.float32)  # as stored
    target, draft = models.target.requires_grad_(False), models.draft.requires_grad_(False)
    data = corpus()
    start = time.time()
    rollouts = greedy_rollouts(
        target.double(), data, ROLLOUTS, prompt_len=PROMPT_LEN, length=ROLLOUT_LEN, seed=9
    )
    print(f"rollouts: {tuple(rollouts.shape)} ({time.time() - start:.0f}s)", flush=True)
    head = train_block_head(draft.float(), rollouts, steps, prompt_len=PROMPT_LEN)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "block_head": {
                "config": draft.cfg.as_dict(),
                "max_block": BLOCK,
                "layers": HEAD_LAYERS,
                "state": _half(head),
            },
            "frozen": {
                "file": frozen.name,
                "sha256": hashlib.sha256(frozen.read_bytes()).hexdigest(),
            },
            "trained_with": {
                "python": sys.version.split()[0],
                "torch": str(torch.__version__),
                "steps": steps,
            },
        },
        out,
    )
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Train all three models and write them to ``--out`` (``--block-head``: the block head)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    weights = Path(__file__).parent / "weights"
    parser.add_argument("--out", type=Path, default=None, help="default: weights/embedded.pt")
    parser.add_argument(
        "--steps", type=int, default=3000, help="target and head steps; the draft LM uses half"
    )
    parser.add_argument(
        "--block-head",
        action="store_true",
        help="train only the block head against the frozen --frozen models (out: block.pt)",
    )
    parser.add_argument("--frozen", type=Path, default=weights / "embedded.pt")
    parser.add_argument("--block-steps", type=int, default=BLOCK_STEPS)
    args = parser.parse_args(argv)
    steps = {"--steps": (args.steps, 3000), "--block-steps": (args.block_steps, BLOCK_STEPS)}
    for flag, (value, shipped) in steps.items():
        if value < 1:
            parser.error(
                f"{flag} must be at least 1, got {value}; the shipped weights use {shipped}"
            )
    if args.block_head:
        return block_main(args.frozen, args.out or weights / "block.pt", args.block_steps)
    args.out = args.out or weights / "embedded.pt"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = corpus()
    print(f"corpus: {data.numel()} bytes from {len(SOURCE_FILES)} stdlib files", flush=True)
    target = train_target(data, args.steps)
    for p in target.parameters():
        p.requires_grad_(False)  # the target is frozen from here on
    draft = train_draft(data, target, args.steps // 2)
    eagle = train_eagle(data, target, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "target": {"config": TARGET_CONFIG.as_dict(), "state": _half(target)},
            "draft": {"config": DRAFT_CONFIG.as_dict(), "state": _half(draft)},
            "eagle": {"dim": TARGET_CONFIG.dim, "state": _half(eagle)},
            "trained_with": {
                "python": sys.version.split()[0],
                "torch": str(torch.__version__),
                "steps": args.steps,
                "bytes": data.numel(),
            },
        },
        args.out,
    )
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    if any(os.environ.get(key) != value for key, value in REPRODUCIBLE_ENV.items()):
        # MKL reads these once, when torch loads it, so start again with them set.
        argv = [sys.executable, "-m", "specstrat.runtime._models.train", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, **REPRODUCIBLE_ENV})
    raise SystemExit(main())
