"""Train the embedded models on the Python standard library's own source (deterministic).

``python -m specstrat.runtime.models.train [--out PATH] [--steps N]`` trains, in order: the target LM on
the text; the draft LM and the EAGLE-style head distilled from the target's greedy choices (what
speculation must match). Seeds, file list and the math library's settings are fixed (one thread;
MKL on one code path, see ``REPRODUCIBLE_ENV``), so the same Python, torch and CPU reproduce the
same weights bit for bit. Weights are stored in float16 beside their configs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from specstrat.runtime.models.model import CausalAttention, EagleHead, ModelConfig, TinyLM
from specstrat.runtime.models.text import encode_indentation

__all__ = [
    "DRAFT_CONFIG",
    "REPRODUCIBLE_ENV",
    "SOURCE_FILES",
    "TARGET_CONFIG",
    "corpus",
    "main",
    "train_draft",
    "train_eagle",
    "train_target",
]

TARGET_CONFIG = ModelConfig(dim=128, layers=4, heads=4, mlp=512, max_positions=1024)
DRAFT_CONFIG = ModelConfig(dim=64, layers=2, heads=2, mlp=256, max_positions=1024)

#: Standard-library modules every CPython 3.10+ ships; missing ones are skipped.
SOURCE_FILES = (
    "abc.py", "argparse.py", "bisect.py", "calendar.py", "collections/__init__.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py",
    "fractions.py", "functools.py", "heapq.py", "inspect.py", "json/decoder.py",
    "json/encoder.py", "logging/__init__.py", "os.py", "pprint.py", "queue.py", "random.py",
    "shutil.py", "statistics.py", "string.py", "tempfile.py", "textwrap.py", "threading.py",
    "typing.py", "unittest/case.py",
)  # fmt: skip

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


def corpus() -> torch.Tensor:
    """The training bytes: the listed stdlib files, indentation encoded, concatenated in order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        encode_indentation((root / name).read_bytes())
        for name in SOURCE_FILES
        if (root / name).is_file()
    ]
    return torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()


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


def _half(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float16).clone() for k, v in module.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    """Train all three models and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default = Path(__file__).parent / "weights" / "embedded.pt"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument(
        "--steps", type=int, default=3000, help="target and head steps; the draft LM uses half"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}; the shipped weights use 3000")
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
        argv = [sys.executable, "-m", "specstrat.runtime.models.train", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, **REPRODUCIBLE_ENV})
    raise SystemExit(main())
