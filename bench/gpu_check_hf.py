"""GPU check of the Hugging Face adapter: the engine's paged attention inside transformers'
forward on CUDA, in float32 and bfloat16, lossless against transformers' own greedy generate on
the same device, and tokens/s of NONE and NGRAM against generate.

The model is ``--model PATH`` (a model directory or .gguf file on the device machine), else a
randomly initialised model of SmolLM2-135M's shape (LLaMA, 30 layers, 9 query / 3 KV heads,
vocabulary 49152): SmolLM2's 98 MB GGUF file does not fit what travels to a device machine, and
the adapter's correctness and cost do not depend on the weights (acceptance does: NGRAM's
figure on random weights is not SmolLM2's). ``--dry-run`` runs a tiny model on the CPU.

Usage: ``python bench/gpu_check_hf.py [--model PATH] [--dry-run]`` (``gpu_check.sh --hf``).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import Any

import torch

from specstrat import NGRAM, NONE, ModelSet
from specstrat.hf import HFCausalLM, compare, generate_reference, load
from specstrat.runtime import Engine, EngineConfig, Request

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


def smollm2_shaped(device: str, dtype: torch.dtype, tiny: bool) -> HFCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    size: dict[str, Any] = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=512)
        if tiny
        else dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)
    )
    size.update(
        num_attention_heads=4 if tiny else 9,
        num_key_value_heads=2 if tiny else 3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )
    config = LlamaConfig(**size)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
    return HFCausalLM(model, name=f"smollm2-shaped-{dtype}")


def requests(vocab: int, n: int, new: int) -> list[Request]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        motif = torch.randint(1, vocab, (24,), generator=g).tolist()
        out.append(Request(f"r{i}", tuple(motif * 6), new))  # repeats: prompt lookup can read it
    return out


def run(lm: HFCausalLM, label: str, n: int, new: int) -> None:
    reqs = requests(lm.shape.vocab_size, n, new)
    generate_reference(lm, [Request("warm", reqs[0].prompt, 2)])  # kernels and caches warm
    start = time.perf_counter()
    want = generate_reference(lm, reqs)
    hf_tps = sum(len(v) for v in want.values()) / (time.perf_counter() - start)
    print(f"{label}: transformers generate {hf_tps:.1f} tokens/s", flush=True)
    for algo in (NONE, NGRAM):
        for bs in (1, n):
            what = f"{label} {algo.name} bs={bs}"
            try:
                config = EngineConfig(context_len=256, max_running_requests=bs, overlap=True)
                engine = Engine(algo, ModelSet(target=lm), config)
                engine.run(reqs[:1])  # warm-up (fresh ids below)
                start = time.perf_counter()
                out = engine.run([Request(f"{r.rid}.", r.prompt, r.max_new_tokens) for r in reqs])
                tps = sum(len(v) for v in out.values()) / (time.perf_counter() - start)
                got = {k[:-1]: v for k, v in out.items()}
                result = compare(lm, reqs, got, want)
                speed = f"{tps:.1f} tokens/s ({tps / hf_tps:.2f}x generate bs=1)"
                tau = f"acceptance {engine.stats.acceptance_length:.2f}"
                print(f"  {what}: {speed}, {tau}; {result.line()}")
                if label.endswith("float32"):
                    check(result.lossless, f"{what} lossless")
                else:  # bf16 rounds logits far past TIE_EPSILON: reported, never a pass
                    diverged = len(result.mismatches)
                    print(
                        f"INFO {what}: not certified in bf16 ({diverged} divergences from generate)"
                    )
            except Exception as exc:  # a failure on the device is a finding: report, go on
                traceback.print_exc()
                check(False, f"{what}: {type(exc).__name__}: {exc}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine only (--dry-run: on the CPU)")
        return 2
    device = "cpu" if args.dry_run else "cuda"
    n, new = (2, 8) if args.dry_run else (8, 64)
    for dtype in (torch.float32, torch.bfloat16):
        label = f"{device} {str(dtype).removeprefix('torch.')}"
        try:
            lm: Any = (
                load(args.model, dtype=dtype, device=device).target
                if args.model
                else smollm2_shaped(device, dtype, tiny=args.dry_run)
            )
        except Exception as exc:
            traceback.print_exc()
            check(False, f"{label} load: {type(exc).__name__}: {exc}")
            continue
        run(lm, label, n, new)
    print(f"{len(failures)} failed" if failures else "all HF adapter checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
