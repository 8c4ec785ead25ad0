"""The engine on SmolLM2 with its forward eager and compiled (``--compile``), side by side.

Two copies of the model load (with the shipped head attached when an EAGLE algorithm runs, so
both sides read the same layers); one is compiled for ``--compile`` token counts
(:meth:`specstrat.hf.HFCausalLM.compile`). Each algorithm runs on the code-editing workload at
batch size 1 on both, in interleaved rounds (:func:`specstrat.bench.interleaved`, warm-up not
counted); the compiled side's outputs are checked against the eager side's (certified ties
allowed). Target-only (``NONE``) also runs beside transformers' own greedy ``generate`` on the
same requests and threads.

Usage: ``python bench/compile_engine.py [--algo NONE --algo NGRAM] [--compile 1,4]
[--requests 4] [--max-new-tokens 64] [--draft-tokens 4] [--rounds 3] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import time

import torch
from hf_speed import engine_run, hf_generate

from specstrat.bench import Contender, interleaved, ratio
from specstrat.hf import compare, load
from specstrat.hf.hf_demo import code_requests
from specstrat.hf.loader import HFModels
from specstrat.hf.smollm2 import smollm2_path
from specstrat.registry import default_registry
from specstrat.train import attach_files, trained_files


def _models(algos: list[str]) -> HFModels:
    """SmolLM2, with the files the algorithms draft with attached."""
    return attach_files(load(smollm2_path()), *trained_files("smollm2", None, None, None, algos))


def main() -> None:
    """Print each algorithm's tokens/s eager and compiled, their ratio and the check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", action="append")
    parser.add_argument("--compile", default="1,4")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    algos = args.algo or ["NONE", "NGRAM"]
    torch.set_num_threads(args.threads)
    eager, compiled = _models(algos), _models(algos)
    counts = [int(c) for c in args.compile.split(",")]
    start = time.perf_counter()
    compiled.target.compile(counts)
    print(
        f"torch {torch.__version__}, threads {args.threads}; compiled for {counts} token(s) "
        f"in {time.perf_counter() - start:.1f} s"
    )
    requests = code_requests(eager, args.requests, args.max_new_tokens)
    d = args.draft_tokens
    for algo in algos:
        spec = default_registry().get(algo)
        contenders = [
            Contender(f"{algo} eager", engine_run(eager, spec, requests, bs=1, d=d)[1]),
            Contender(f"{algo} compiled", engine_run(compiled, spec, requests, bs=1, d=d)[1]),
        ]
        if algo == "NONE":
            contenders.append(Contender("hf generate", hf_generate(eager, requests)))
        timings = interleaved(contenders, rounds=args.rounds, warmup=1)
        a, b = timings[f"{algo} eager"], timings[f"{algo} compiled"]
        check = compare(eager.target, requests, b.outputs, a.outputs)
        print(
            f"{algo}: eager {a.tokens_per_s:.1f} tokens/s, compiled {b.tokens_per_s:.1f} "
            f"({ratio(timings, b.name, a.name).line()}); {check.line()}"
        )
        if "hf generate" in timings:
            for side in (a, b):
                print(f"  {ratio(timings, side.name, 'hf generate').line()}")


if __name__ == "__main__":
    main()
