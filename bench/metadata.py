"""Launches and host syncs per TARGET_VERIFY metadata build, fused vs eager, plus CPU time ratio.

Counting (a dispatch mode sees every aten op; views and uninitialised allocations launch
nothing, ``_local_scalar_dense`` is a device-to-host read, i.e. a sync):

* fused: the library's launcher runs on ``meta`` tensors (no data: any host read would raise),
  with the Triton launch recorded instead of executed, so the count is what a CUDA call
  dispatches, without the value checks that run only on CPU tensors;
* eager: ``bench/baselines.py``, the engines' first implementation, on CPU tensors.

The tree forms (``tree``, ``tree-graph``: :func:`~specstrat.kernels.build_tree_verify_metadata`
and its graph form, EAGLE-2-sized trees of ``TREE_NODES`` nodes) are set against
``eager_tree``/``eager_tree_graph``: SGLang's Python-side preparation around its tree kernel plus
the eager attention metadata. SGLang runs the tree itself as one CUDA kernel, so the table shows
the eager count twice: every op eager, and "SGLang-shaped" with the tree part counted as 1 launch.

The bucketed ragged form ("bucketed" rows) pads ``bs`` ragged rows (1..T tokens) to a bucket of
``bs + max(1, bs // 8)`` rows and ``T`` tokens per row; its baseline is SGLang's eager
``padded_to_bucket`` + ``build_qo_indptr`` + key geometry, copied into the static buffers.

Time: the torch twin (``backend="torch"``) against the eager baseline, both on the CPU,
interleaved in one run; the ratio is eager time / twin time (above 1: the twin is faster).
Usage: ``python bench/metadata.py [--repeats N] [--stat median|min] [--threads K]``. On a machine
shared with other jobs, ``--stat min`` (the fastest call: preemption only ever adds time) and
``--threads 1`` (torch's intra-op threads otherwise wait on descheduled peers, which made single
builds 50x slower here) keep the time column stable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))

import torch
from baselines import (
    eager_graph,
    eager_ragged,
    eager_ragged_graph,
    eager_tree,
    eager_tree_graph,
    eager_tree_structure,
    eager_uniform,
)
from measure import OpCounter, median_seconds

import specstrat.kernels.tree_metadata as tm
import specstrat.kernels.verify_metadata as vm

BATCH_SIZES = (1, 16, 64, 256, 1024)
CTX, PAGE, T = 4096, 16, 4
# EAGLE-2-sized trees: 7 draft nodes, so T = 8 verify tokens per request.
TREE_NODES = 7


def inputs(bs: int, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(bs)
    tensors = {
        "seq_lens": torch.randint(1, CTX - T, (bs,), generator=gen),
        "ntok": torch.randint(1, T + 1, (bs,), generator=gen),
        "rpi": torch.randperm(bs + 1, generator=gen)[:bs],
        "rtt": torch.randint(0, 1 << 24, (bs + 1, CTX), generator=gen, dtype=torch.int32),
    }
    return {k: v.to(device) for k, v in tensors.items()}


def tree_inputs(bs: int, device: str) -> dict[str, Any]:
    """Random draft trees (any parent before each node), most rows full, some with filler."""
    x: dict[str, Any] = inputs(bs, "cpu")
    gen = torch.Generator().manual_seed(bs + 1)
    upper = torch.arange(TREE_NODES).expand(bs, TREE_NODES)
    x["parents"] = (
        (torch.rand(bs, TREE_NODES, generator=gen) * (upper + 1)).long() - 1
    ).contiguous()
    x["lengths"] = torch.randint(TREE_NODES - 2, TREE_NODES + 1, (bs,), generator=gen)
    t = TREE_NODES + 1
    pages = -(-CTX // PAGE)
    x["tree_bufs"] = tm.TreeVerifyMetadataBuffers.allocate(bs, t, max_pages=pages, device=device)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}


def paging(x: dict[str, Any]) -> vm.Paging:
    """The bench batch's page-table inputs."""
    return vm.Paging(req_pool_indices=x["rpi"], req_to_token=x["rtt"], page_size=PAGE)


def fused_tree(form: str, x: dict[str, Any], backend: Any) -> object:
    args = (x["parents"], x["lengths"], x["seq_lens"])
    if form == "tree":
        return tm.build_tree_verify_metadata(*args, paging=paging(x), backend=backend)
    bufs = x["tree_bufs"]
    return tm.build_tree_verify_metadata_into(bufs, *args, paging=paging(x), backend=backend)


def eager_tree_form(form: str, x: dict[str, Any]) -> object:
    args = (x["parents"], x["lengths"], x["seq_lens"], x["rpi"], x["rtt"], PAGE)
    if form == "tree":
        return eager_tree(*args)
    b = x["tree_bufs"]
    base = b.base
    bufs = (base.cu_seqlens_q, base.cache_seqlens, base.cu_seqlens_k, base.page_table)
    links = (b.retrive_index, b.retrive_next_token, b.retrive_next_sibling)
    return eager_tree_graph((*bufs, b.positions, b.tree_mask, *links), *args)


def count_tree(form: str, bs: int) -> tuple[int, int, int, int, int]:
    """Fused launches and syncs; eager launches and syncs; the SGLang-shaped launch count."""
    launched: list[object] = []
    x = tree_inputs(bs, "meta")
    with (
        patch.object(tm, "launch", lambda kernel, grid, *a, **kw: launched.append(grid)),
        patch.object(tm, "resolve_backend", lambda backend, *tensors: "triton"),
        OpCounter() as fused_counter,
    ):
        fused_tree(form, x, "triton")
    x = tree_inputs(bs, "cpu")
    with OpCounter() as eager_counter:
        eager_tree_form(form, x)
    t = TREE_NODES + 1
    mask = torch.empty(bs * t * t, dtype=torch.bool)
    retrieve = torch.full((3, bs, t), -1)
    with OpCounter() as structure:
        eager_tree_structure(
            x["parents"],
            x["lengths"],
            x["seq_lens"],
            mask,
            torch.empty(bs * t, dtype=torch.long),
            retrieve,
        )
    return (
        fused_counter.launches + len(launched),
        fused_counter.syncs,
        eager_counter.launches,
        eager_counter.syncs,
        eager_counter.launches - structure.launches + 1,
    )


def fused(form: str, x: dict[str, Any], backend: Any) -> object:
    seq_lens, pages = x["seq_lens"], paging(x)
    bs = seq_lens.shape[0]
    if form == "uniform":
        return vm.build_verify_metadata(seq_lens, num_tokens=bs * T, paging=pages, backend=backend)
    if form == "ragged":
        return vm.build_ragged_verify_metadata(seq_lens, x["ntok"], paging=pages, backend=backend)
    return vm.build_verify_metadata_into(
        x["bufs"], seq_lens, tokens_per_req=T, paging=pages, backend=backend
    )


def eager(form: str, x: dict[str, Any]) -> object:
    bs = x["seq_lens"].shape[0]
    if form == "uniform":
        return eager_uniform(x["seq_lens"], bs * T, x["rpi"], x["rtt"], PAGE)
    if form == "ragged":
        return eager_ragged(x["seq_lens"], x["ntok"], x["rpi"], x["rtt"], PAGE)
    b = x["bufs"]
    bufs = (b.cu_seqlens_q, b.cache_seqlens, b.cu_seqlens_k, b.page_table)
    return eager_graph(bufs, x["seq_lens"], T, x["rpi"], x["rtt"], PAGE)


def with_buffers(x: dict[str, Any], device: str) -> dict[str, Any]:
    bs = x["seq_lens"].shape[0]
    pages = -(-CTX // PAGE)
    return {**x, "bufs": vm.VerifyMetadataBuffers.allocate(bs, max_pages=pages, device=device)}


def count_fused(form: str, bs: int) -> tuple[int, int]:
    launched: list[object] = []
    x = with_buffers(inputs(bs, "meta"), "meta")
    # The launch is recorded, not run (meta tensors hold no data); the backend is forced so the
    # Triton path is the one counted.
    with (
        patch.object(vm, "launch", lambda kernel, grid, *a, **kw: launched.append(grid)),
        patch.object(vm, "resolve_backend", lambda backend, *tensors: "triton"),
        OpCounter() as counter,
    ):
        fused(form, x, "triton")
    return counter.launches + len(launched), counter.syncs


def count_eager(form: str, bs: int) -> tuple[int, int]:
    x = with_buffers(inputs(bs, "cpu"), "cpu")
    with OpCounter() as counter:
        eager(form, x)
    return counter.launches, counter.syncs


def min_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` calls of ``fn``, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--stat", choices=("median", "min"), default="median")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    seconds = median_seconds if args.stat == "median" else min_seconds
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"T={T}, page_size={PAGE}, context={CTX}; CPU time: {args.stat} of {args.repeats}, "
        f"interleaved, {torch.get_num_threads()} torch threads"
    )
    header = (
        f"{'form':<8} {'bs':>5} | {'fused launches':>14} {'syncs':>5} "
        f"| {'eager launches':>14} {'syncs':>5} | {'eager/twin CPU time':>19}"
    )
    print(header)
    print("-" * len(header))
    for form in ("uniform", "graph", "ragged"):
        for bs in BATCH_SIZES:
            fl, fs = count_fused(form, bs)
            el, es = count_eager(form, bs)
            x = with_buffers(inputs(bs, "cpu"), "cpu")
            twin_s = eager_s = 0.0
            twin = partial(fused, form, x, "torch")
            base = partial(eager, form, x)
            for _ in range(3):  # interleave, so machine noise hits both sides alike
                twin_s += seconds(twin, args.repeats)
                eager_s += seconds(base, args.repeats)
            print(
                f"{form:<8} {bs:>5} | {fl:>14} {fs:>5} "
                f"| {el:>14} {es:>5} | {eager_s / twin_s:>18.2f}x"
            )
    ragged_graph_rows(args.repeats)
    print()
    print(f"tree forms: N={TREE_NODES} draft nodes, T={TREE_NODES + 1} verify tokens per request")
    header = (
        f"{'form':<10} {'bs':>5} | {'fused launches':>14} {'syncs':>5} | {'eager launches':>14} "
        f"{'syncs':>5} | {'SGLang-shaped':>13} | {'eager/twin CPU time':>19}"
    )
    print(header)
    print("-" * len(header))
    for form in ("tree", "tree-graph"):
        for bs in BATCH_SIZES:
            fl, fs, el, es, sl = count_tree(form, bs)
            x = tree_inputs(bs, "cpu")
            twin_s = eager_s = 0.0
            twin = partial(fused_tree, form, x, "torch")
            base = partial(eager_tree_form, form, x)
            for _ in range(3):
                twin_s += seconds(twin, args.repeats)
                eager_s += seconds(base, args.repeats)
            print(
                f"{form:<10} {bs:>5} | {fl:>14} {fs:>5} | {el:>14} "
                f"{es:>5} | {sl:>13} | {eager_s / twin_s:>18.2f}x"
            )


def bucket(bs: int) -> tuple[int, int]:
    """The bench's token bucket for ``bs`` ragged rows: ``bs // 8`` (at least 1) padding rows
    and ``T`` tokens per row, so the padding rows take what the real rows leave."""
    padded_bs = bs + max(1, bs // 8)
    return padded_bs, padded_bs * T


def ragged_graph_inputs(bs: int, device: str) -> dict[str, Any]:
    """Inputs of one bucketed ragged build: token counts 1..T and static buffers for the bucket."""
    x: dict[str, Any] = inputs(bs, device)
    padded_bs, padded_tokens = bucket(bs)
    bufs = vm.VerifyMetadataBuffers.allocate(padded_bs, max_pages=-(-CTX // PAGE), device=device)
    return {**x, "bufs": bufs, "padded_tokens": padded_tokens}


def fused_ragged_graph(x: dict[str, Any], backend: Any) -> object:
    return vm.build_ragged_verify_metadata_into(
        x["bufs"],
        x["seq_lens"],
        x["ntok"],
        padded_tokens=x["padded_tokens"],
        paging=paging(x),
        backend=backend,
    )


def eager_ragged_graph_build(x: dict[str, Any]) -> object:
    b = x["bufs"]
    bufs = (b.cu_seqlens_q, b.cache_seqlens, b.cu_seqlens_k, b.page_table)
    return eager_ragged_graph(
        bufs, x["seq_lens"], x["ntok"], x["padded_tokens"], x["rpi"], x["rtt"], PAGE
    )


def count_ragged_graph(bs: int) -> tuple[int, int, int, int]:
    """Launches and syncs of the fused bucketed ragged build (on meta tensors, the launch
    recorded as in :func:`count_fused`) and of the eager baseline (on CPU tensors)."""
    launched: list[object] = []
    on_meta = ragged_graph_inputs(bs, "meta")
    with (
        patch.object(vm, "launch", lambda kernel, grid, *a, **kw: launched.append(grid)),
        patch.object(vm, "resolve_backend", lambda backend, *tensors: "triton"),
        OpCounter() as fused_counter,
    ):
        fused_ragged_graph(on_meta, "triton")
    x = ragged_graph_inputs(bs, "cpu")
    with OpCounter() as eager_counter:
        eager_ragged_graph_build(x)
    fused_launches = fused_counter.launches + len(launched)
    return fused_launches, fused_counter.syncs, eager_counter.launches, eager_counter.syncs


def ragged_graph_rows(repeats: int) -> None:
    """The bucketed ragged form's rows ("bucketed"), printed like the other forms'."""
    for bs in BATCH_SIZES:
        fl, fs, el, es = count_ragged_graph(bs)
        x = ragged_graph_inputs(bs, "cpu")
        twin_s = eager_s = 0.0
        for _ in range(3):  # interleave, so machine noise hits both sides alike
            twin_s += median_seconds(partial(fused_ragged_graph, x, "torch"), repeats)
            eager_s += median_seconds(partial(eager_ragged_graph_build, x), repeats)
        print(
            f"{'bucketed':<8} {bs:>5} | {fl:>14} {fs:>5} | {el:>14} {es:>5} | "
            f"{eager_s / twin_s:>18.2f}x"
        )


if __name__ == "__main__":
    main()
