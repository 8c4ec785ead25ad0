"""GPU check for the kernels: real Triton vs the twins, CUDA-graph capture/replay, timings
(the TARGET_VERIFY metadata in every form, tree and bucketed ragged included, the relay gather and
rejection sampling), and with ``--engine`` the engine on CUDA through the graph runner's tree and
ragged replays.

Needs a CUDA device (run through ``bench/gpu_check.sh``). Prints PASS/FAIL/SKIP lines, then a
table of microseconds per build (``triton.testing.do_bench``) for the fused path vs the eager
baseline, and the CUDA kernel count per build from ``torch.profiler``. Exits non-zero on any
mismatch.

``--dry-run`` runs on the CPU with ``TRITON_INTERPRET=1`` (smaller tables): the Triton bodies in
the interpreter against the twins, the graph checks' update/compare loops eagerly (no capture, no
sync debug mode), each timed pair called once (no ``do_bench``) and the engine check on the CPU;
every CUDA-only part prints a SKIP line. It proves the script runs, not the GPU results.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from baselines import (
    eager_graph,
    eager_ragged,
    eager_ragged_graph,
    eager_tree,
    eager_tree_graph,
    eager_uniform,
)
from torch.profiler import ProfilerActivity, profile

from specstrat import EAGLE, NGRAM, NONE, RelayPayload
from specstrat.kernels import (
    INTERPRETED,
    Paging,
    TreeVerifyMetadata,
    TreeVerifyMetadataBuffers,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_ragged_verify_metadata_into,
    build_tree_verify_metadata,
    build_tree_verify_metadata_into,
    build_verify_metadata,
    build_verify_metadata_into,
    gather_relay,
    gather_relay_ref,
)
from specstrat.kernels.rejection_sampling import rejection_sample

DRY_RUN = "--dry-run" in sys.argv[1:]
ENGINE = "--engine" in sys.argv[1:]
DEV = "cpu" if DRY_RUN else "cuda"
# The interpreter runs each program in numpy: the dry run keeps the small shapes of every table.
BATCH_SIZES = (1, 16) if DRY_RUN else (1, 16, 64, 256, 1024)
KERNEL_BS = (0, 1, 3, 7) if DRY_RUN else (0, 1, 3, 7, 64, 257, 1024)
TREE_BS = (0, 1, 3, 7) if DRY_RUN else (0, 1, 3, 7, 64, 257)
# Draft nodes N (T = N + 1): no nodes, odd, EAGLE-2's 7, and the kernel's T <= 64 ceiling.
TREE_NODES = (0, 3, 7) if DRY_RUN else (0, 3, 7, 15, 63)
CTX, PAGE = (256, 16) if DRY_RUN else (4096, 16)
FIELDS = ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table")
# EAGLE-2-sized trees for the timings, as bench/metadata.py times them: 7 nodes, T = 8.
TIMED_TREE_NODES = 7
TREE_FIELDS = (
    "positions",
    "tree_mask",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
)
REPLAYED = (
    "run eagerly (dry run: no capture, no sync debug mode)"
    if DRY_RUN
    else "captured in a CUDA graph with sync debug mode 'error'"
)
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def skip(what: str, why: str) -> None:
    print(f"SKIP {what}: {why}")


def same(a: VerifyMetadata, b: VerifyMetadata) -> bool:
    pairs = [(getattr(a, f), getattr(b, f)) for f in FIELDS]
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in pairs
    )


def inputs(bs: int, t: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(bs * 31 + t)
    cpu = {
        "seq_lens": torch.randint(0, CTX - t, (bs,), generator=gen),
        "ntok": torch.randint(1, t + 2, (bs,), generator=gen),
        "rpi": torch.randperm(bs + 3, generator=gen)[:bs],
        "rtt": torch.randint(0, 1 << 24, (bs + 3, CTX), generator=gen, dtype=torch.int32),
    }
    return {k: v.to(DEV) for k, v in cpu.items()}


def paging(x: dict[str, torch.Tensor]) -> Paging:
    return Paging(req_pool_indices=x["rpi"], req_to_token=x["rtt"], page_size=PAGE)


def check_kernels_against_twins() -> None:
    for bs in KERNEL_BS:
        for t in (1, 2, 5, 8):
            x = inputs(bs, t)
            uni = [
                build_verify_metadata(x["seq_lens"], num_tokens=bs * t, backend=b, paging=paging(x))
                for b in ("triton", "torch")
            ]
            rag = [
                build_ragged_verify_metadata(x["seq_lens"], x["ntok"], backend=b, paging=paging(x))
                for b in ("triton", "torch")
            ]
            graph = []
            for b in ("triton", "torch"):
                bufs = VerifyMetadataBuffers.allocate(bs + 5, max_pages=CTX // PAGE, device=DEV)
                graph.append(
                    build_verify_metadata_into(
                        bufs, x["seq_lens"], tokens_per_req=t, backend=b, paging=paging(x)
                    )
                )
            check(
                same(*uni) and same(*rag) and same(*graph),
                f"triton == twin, bs={bs} T={t} (uniform, ragged, graph)",
            )
    rows, hidden = (64, 256) if DRY_RUN else (1024, 4096)
    src = RelayPayload(
        bonus_tokens=torch.arange(500, device=DEV),
        seq_lens=torch.arange(500, device=DEV, dtype=torch.int32),
        topk_p=torch.rand(500, 8, device=DEV),
        topk_index=torch.randint(0, 1 << 20, (500, 8), device=DEV),
        hidden_states=torch.randn(500, hidden, device=DEV, dtype=torch.bfloat16),
    )
    index = torch.randint(0, 500, (rows,), device=DEV)
    got, want = gather_relay(src, index, backend="triton"), gather_relay_ref(src, index)
    exact = all(
        torch.equal(got.present()[k].view(torch.uint8), v.view(torch.uint8))
        for k, v in want.present().items()
    )
    check(
        exact, f"relay gather == index_select, bit for bit (5 fields, {rows} rows, H={hidden} bf16)"
    )


def sampling_inputs(bs: int, n: int, vocab: int) -> dict[str, Any]:
    """Rejection-sampling inputs on the GPU (float64 probabilities: the kernel computes in fp64)."""
    gen = torch.Generator().manual_seed(bs * 7 + n)
    p = torch.softmax(torch.randn(bs, n + 1, vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(bs, n, vocab, generator=gen, dtype=torch.float64), -1)
    cpu = {
        "p": p,
        "q": q,
        "tokens": torch.randint(0, vocab, (bs, n), generator=gen),
        "lengths": torch.randint(0, n + 1, (bs,), generator=gen),
        "seeds": torch.randint(0, 2**62, (bs,), generator=gen),
        "positions": torch.randint(0, 4000, (bs,), generator=gen),
    }
    return {k: v.to(DEV) for k, v in cpu.items()}


def check_rejection_sampling() -> None:
    ok = True
    shapes = (
        ((1, 3, 256), (8, 3, 64))
        if DRY_RUN
        else ((1, 3, 256), (64, 3, 256), (256, 7, 1000), (1024, 3, 32000))
    )
    for bs, n, vocab in shapes:
        x = sampling_inputs(bs, n, vocab)
        for q in (x["q"], None):
            args = {**x, "q": q}
            kernel = rejection_sample(**args, backend="triton")
            twin = rejection_sample(**args, backend="torch")
            ok &= all(torch.equal(a, b) for a, b in zip(kernel, twin, strict=True))
    big = max(shapes)
    on = "CPU (interpreted)" if DRY_RUN else "CUDA"
    check(ok, f"rejection_sample Triton == twin on {on} (bs up to {big[0]}, vocab up to {big[2]})")
    if DRY_RUN:
        skip("rejection_sample captured in a CUDA graph", "needs CUDA")
        return
    x = sampling_inputs(48, 3, 256)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles the kernel outside the capture
        rejection_sample(**x, backend="triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rejection_sample(**x, backend="triton")
    ok = True
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            x["seeds"].copy_(torch.randint(0, 2**62, (48,), device=DEV))
            graph.replay()
            torch.cuda.set_sync_debug_mode("default")
            want = rejection_sample(**x, backend="torch")
            ok &= all(torch.equal(a, b) for a, b in zip(captured, want, strict=True))
            torch.cuda.set_sync_debug_mode("error")
    except RuntimeError as exc:
        ok = False
        print(f"    {exc}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check(ok, "rejection_sample captured in a CUDA graph; 5 replays == twin, no host sync")


def check_graph_capture() -> None:
    if DRY_RUN:
        skip("graph form captured in a CUDA graph", "needs CUDA")
        return
    padded, bs, t = 64, 48, 4
    x = inputs(bs, t)
    static_seq = x["seq_lens"].clone()
    bufs = VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles the kernel outside the capture
        build_verify_metadata_into(
            bufs, static_seq, tokens_per_req=t, backend="triton", paging=paging(x)
        )
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build_verify_metadata_into(
            bufs, static_seq, tokens_per_req=t, backend="triton", paging=paging(x)
        )
    ok = True
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(5):
            static_seq.copy_(torch.randint(0, CTX - t, (bs,), device=DEV))
            graph.replay()
            # The eager launcher path must not sync either.
            build_verify_metadata(static_seq, num_tokens=bs * t, backend="triton", paging=paging(x))
            torch.cuda.set_sync_debug_mode("default")
            ref = VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV)
            want = build_verify_metadata_into(
                ref, static_seq, tokens_per_req=t, backend="torch", paging=paging(x)
            )
            ok &= same(VerifyMetadata(bufs, bs, PAGE, t, t, None), want)
            torch.cuda.set_sync_debug_mode("error")
            _ = step
    except RuntimeError as exc:
        ok = False
        print(f"    {exc}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check(ok, "graph form captured in a CUDA graph; 5 replays == twin with sync debug mode 'error'")


def tree_inputs(bs: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    """Draft trees as ``specstrat.testing.draft_trees`` draws them (chains, stars, arbitrary
    parents before each node; full rows and rows with filler), on ``DEV``."""
    gen = torch.Generator().manual_seed(seed)
    column = torch.arange(n).expand(bs, n)
    shape = torch.randint(0, 3, (bs, 1), generator=gen)  # 0 chain, 1 star, 2 arbitrary
    anywhere = (torch.rand(bs, n, generator=gen) * (column + 1)).long() - 1
    parents = torch.where(shape == 0, column - 1, torch.where(shape == 1, -1, anywhere))
    full = torch.rand(bs, generator=gen) < 0.5
    lengths = torch.where(full, n, torch.randint(0, n + 1, (bs,), generator=gen))
    cpu = {"parents": parents.contiguous(), "lengths": lengths}
    return {k: v.to(DEV) for k, v in cpu.items()}


def same_tree(a: TreeVerifyMetadata, b: TreeVerifyMetadata) -> bool:
    return same(a.base, b.base) and all(
        torch.equal(getattr(a, f), getattr(b, f)) for f in TREE_FIELDS
    )


def scribble(*tensors: torch.Tensor | None) -> None:
    """Fill static buffers with junk, so equality shows the build wrote every element."""
    for x in tensors:
        if x is not None:
            x.fill_(x.dtype == torch.bool or -7)


def tree_buffers(padded_bs: int, t: int, paged: bool) -> TreeVerifyMetadataBuffers:
    pages = CTX // PAGE if paged else None
    bufs = TreeVerifyMetadataBuffers.allocate(padded_bs, t, max_pages=pages, device=DEV)
    base = bufs.base
    scribble(base.cu_seqlens_q, base.cache_seqlens, base.cu_seqlens_k, base.page_table)
    scribble(*(getattr(bufs, f) for f in TREE_FIELDS))
    return bufs


def check_tree_kernel_against_twin() -> None:
    for bs in TREE_BS:
        for n in TREE_NODES:
            t = n + 1
            x, tree = inputs(bs, t), tree_inputs(bs, n, bs * 131 + n)
            args = (tree["parents"], tree["lengths"], x["seq_lens"])
            ok = True
            for paged in (False, True):
                pages = paging(x) if paged else None
                alloc = [
                    build_tree_verify_metadata(*args, paging=pages, backend=b)
                    for b in ("triton", "torch")
                ]
                graph = [
                    build_tree_verify_metadata_into(
                        tree_buffers(bs + 5, t, paged), *args, paging=pages, backend=b
                    )
                    for b in ("triton", "torch")
                ]
                ok &= same_tree(*alloc) and same_tree(*graph)
            check(ok, f"tree triton == twin, bs={bs} N={n} (alloc, graph +5 rows; paged, unpaged)")


def bucketed_inputs(bs: int, t: int, pad: int, seed: int) -> dict[str, Any]:
    """A ragged step of ``bs`` rows (counts 1..T) for a bucket of ``bs + pad`` rows; with
    ``pad == 0`` every row is full, so the bucket's ``bs * T`` tokens leave nothing over."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, t + 1, (bs,), generator=gen) if pad else torch.full((bs,), t)
    padded_bs = bs + pad
    # SGLang's bucket (B * T tokens), or a tight one that leaves some padding rows 0 tokens.
    tight = int(counts.sum()) + pad // 2
    tokens = padded_bs * t if seed % 2 or not pad else tight
    return {"counts": counts.to(DEV), "padded_bs": padded_bs, "padded_tokens": tokens}


def check_bucketed_ragged_against_twin() -> None:
    for bs in KERNEL_BS:
        for t in (1, 2, 5, 8):
            ok = True
            for pad in (0, 1, 5):
                if pad == 0 and bs == 0:
                    continue  # an empty bucket: nothing to verify
                for seed in (0, 1):
                    x, r = inputs(bs, t), bucketed_inputs(bs, t, pad, bs * 7 + t + seed)
                    built = []
                    for b in ("triton", "torch"):
                        bufs = VerifyMetadataBuffers.allocate(
                            r["padded_bs"], max_pages=CTX // PAGE, device=DEV
                        )
                        scribble(bufs.cu_seqlens_q, bufs.cache_seqlens, bufs.cu_seqlens_k)
                        scribble(bufs.page_table)
                        built.append(
                            build_ragged_verify_metadata_into(
                                bufs,
                                x["seq_lens"],
                                r["counts"],
                                padded_tokens=r["padded_tokens"],
                                backend=b,
                                paging=paging(x),
                            )
                        )
                    ok &= same(*built)
            check(ok, f"bucketed ragged triton == twin, bs={bs} T={t} (pad 0/1/5, B*T and tight)")


def capture(build: Callable[[], object]) -> Callable[[], None]:
    """``build`` captured in a CUDA graph after a warm-up on a side stream; its replay. The dry
    run has no graphs: the replay is the eager call."""
    if DRY_RUN:

        def eager() -> None:
            build()

        return eager
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles the kernel outside the capture
        build()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()
    return graph.replay


@contextmanager
def sync_debug(mode: str) -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode(mode)`` inside, 'default' after (a no-op in the dry run)."""
    if not DRY_RUN:
        torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        if not DRY_RUN:
            torch.cuda.set_sync_debug_mode("default")


def replays_match(
    replay: Callable[[], None], update: Callable[[], None], want: Callable[[], bool]
) -> bool:
    """Five rounds of new inputs and a replay with host syncs as errors, each compared with the
    twin outside that mode."""
    try:
        for _ in range(5):
            with sync_debug("error"):
                update()
                replay()
            if not want():
                return False
    except RuntimeError as exc:
        print(f"    {exc}")
        return False
    return True


def check_tree_graph_capture() -> None:
    padded, bs, n = 64, 48, 7
    t = n + 1
    x, tree = inputs(bs, t), tree_inputs(bs, n, 5)
    parents, lengths, seq = tree["parents"].clone(), tree["lengths"].clone(), x["seq_lens"].clone()
    bufs = tree_buffers(padded, t, paged=True)

    def build() -> TreeVerifyMetadata:
        return build_tree_verify_metadata_into(
            bufs, parents, lengths, seq, backend="triton", paging=paging(x)
        )

    replay = capture(build)
    column = torch.arange(n, device=DEV)

    def update() -> None:
        seq.copy_(torch.randint(0, CTX - t, (bs,), device=DEV))
        anywhere = (torch.rand(bs, n, device=DEV) * (column + 1)).long() - 1
        parents.copy_(anywhere)
        lengths.copy_(torch.randint(0, n + 1, (bs,), device=DEV))
        # The allocating launcher must not sync either.
        build_tree_verify_metadata(parents, lengths, seq, backend="triton", paging=paging(x))

    def want() -> bool:
        ref = build_tree_verify_metadata_into(
            tree_buffers(padded, t, paged=True),
            parents,
            lengths,
            seq,
            backend="torch",
            paging=paging(x),
        )
        got = TreeVerifyMetadata(
            VerifyMetadata(bufs.base, bs, PAGE, t, t, None),
            *(getattr(bufs, f) for f in TREE_FIELDS),
        )
        return same_tree(got, ref)

    ok = replays_match(replay, update, want)
    check(ok, f"tree graph form {REPLAYED}; 5 replays == twin")


def check_bucketed_graph_capture() -> None:
    padded, bs, t = 64, 48, 4
    x = inputs(bs, t)
    seq, counts = x["seq_lens"].clone(), torch.ones(bs, dtype=torch.int64, device=DEV)
    bufs = VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV)

    def build(out: VerifyMetadataBuffers, backend: Any) -> VerifyMetadata:
        return build_ragged_verify_metadata_into(
            out, seq, counts, padded_tokens=padded * t, backend=backend, paging=paging(x)
        )

    replay = capture(lambda: build(bufs, "triton"))

    def update() -> None:
        seq.copy_(torch.randint(0, CTX - t, (bs,), device=DEV))
        counts.copy_(torch.randint(1, t + 1, (bs,), device=DEV))

    def want() -> bool:
        ref = build(
            VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV), "torch"
        )
        return same(VerifyMetadata(bufs, bs, PAGE, t, t, None), ref)

    ok = replays_match(replay, update, want)
    check(ok, f"bucketed ragged form {REPLAYED}; 5 replays == twin")


def kernels_per_call(fn: Callable[[], object]) -> int:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return len([e for e in prof.events() if str(e.device_type).endswith("CUDA")])


def pair(
    form: str, x: dict[str, torch.Tensor], bufs: VerifyMetadataBuffers, bs: int, t: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """The fused build and its eager baseline for one form, as zero-argument calls."""
    seq, rpi, rtt, ntok = x["seq_lens"], x["rpi"], x["rtt"], x["ntok"]
    tup = (bufs.cu_seqlens_q, bufs.cache_seqlens, bufs.cu_seqlens_k, bufs.page_table)

    def fused() -> object:
        if form == "uniform":
            return build_verify_metadata(seq, num_tokens=bs * t, backend="triton", paging=paging(x))
        if form == "graph":
            return build_verify_metadata_into(
                bufs, seq, tokens_per_req=t, backend="triton", paging=paging(x)
            )
        return build_ragged_verify_metadata(seq, ntok, backend="triton", paging=paging(x))

    def eager() -> object:
        if form == "uniform":
            return eager_uniform(seq, bs * t, rpi, rtt, PAGE)
        if form == "graph":
            return eager_graph(tup, seq, t, rpi, rtt, PAGE)  # type: ignore[arg-type]
        return eager_ragged(seq, ntok, rpi, rtt, PAGE)

    return fused, eager


def tree_pair(form: str, bs: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """The fused tree build (``tree``, or ``tree-graph`` into static buffers) and its eager
    baseline, for EAGLE-2-sized trees of ``TIMED_TREE_NODES`` nodes."""
    t = TIMED_TREE_NODES + 1
    x, tree = inputs(bs, t), tree_inputs(bs, TIMED_TREE_NODES, bs)
    args = (tree["parents"], tree["lengths"], x["seq_lens"])
    bufs = TreeVerifyMetadataBuffers.allocate(bs, t, max_pages=CTX // PAGE, device=DEV)
    base = bufs.base
    tup = (base.cu_seqlens_q, base.cache_seqlens, base.cu_seqlens_k, base.page_table)
    flat = (*tup, *(getattr(bufs, f) for f in TREE_FIELDS))

    def fused() -> object:
        if form == "tree":
            return build_tree_verify_metadata(*args, backend="triton", paging=paging(x))
        return build_tree_verify_metadata_into(bufs, *args, backend="triton", paging=paging(x))

    def eager() -> object:
        if form == "tree":
            return eager_tree(*args, x["rpi"], x["rtt"], PAGE)
        return eager_tree_graph(flat, *args, x["rpi"], x["rtt"], PAGE)

    return fused, eager


def bucketed_pair(bs: int, t: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """The fused bucketed ragged build and SGLang's eager padding, for ``bs`` rows of 1..T
    tokens in ``bench/metadata.py``'s bucket: ``bs + max(1, bs // 8)`` rows of ``T`` tokens."""
    x = inputs(bs, t)
    counts = x["ntok"].clamp(max=t)
    padded_bs = bs + max(1, bs // 8)
    bufs = VerifyMetadataBuffers.allocate(padded_bs, max_pages=CTX // PAGE, device=DEV)
    tup = (bufs.cu_seqlens_q, bufs.cache_seqlens, bufs.cu_seqlens_k, bufs.page_table)
    seq, tokens = x["seq_lens"], padded_bs * t

    def fused() -> object:
        return build_ragged_verify_metadata_into(
            bufs, seq, counts, padded_tokens=tokens, backend="triton", paging=paging(x)
        )

    def eager() -> object:
        return eager_ragged_graph(tup, seq, counts, tokens, x["rpi"], x["rtt"], PAGE)  # type: ignore[arg-type]

    return fused, eager


def timings() -> None:
    t = 4
    rows: list[tuple[str, int, Callable[[], object], Callable[[], object]]] = []
    for form in ("uniform", "graph", "ragged", "bucketed", "tree", "tree-graph"):
        for bs in BATCH_SIZES:
            if form in ("tree", "tree-graph"):
                fused, eager = tree_pair(form, bs)
            elif form == "bucketed":
                fused, eager = bucketed_pair(bs, t)
            else:
                x = inputs(bs, t)
                bufs = VerifyMetadataBuffers.allocate(bs, max_pages=CTX // PAGE, device=DEV)
                fused, eager = pair(form, x, bufs, bs, t)
            rows.append((form, bs, fused, eager))
    if DRY_RUN:
        for _, _, fused, eager in rows:
            fused(), eager()
        print(f"ran each of {len(rows)} timed fused/eager pairs once")
        skip("µs per build (do_bench) and kernel counts (torch.profiler)", "need CUDA")
        return
    from triton.testing import do_bench

    print(f"\nµs per build (do_bench median), T={t}, page_size={PAGE}, context={CTX}")
    print(
        f"tree forms: N={TIMED_TREE_NODES} draft nodes (T={TIMED_TREE_NODES + 1}); "
        "bucketed: bs ragged rows of 1..T padded to bs + max(1, bs // 8) rows of T"
    )
    head = (
        f"{'form':<10} {'bs':>5} | {'fused µs':>9} {'eager µs':>9} "
        f"{'eager/fused':>11} | {'fused kernels':>13} {'eager kernels':>13}"
    )
    print(head)
    print("-" * len(head))
    for form, bs, fused, eager in rows:
        f_us, e_us = do_bench(fused) * 1e3, do_bench(eager) * 1e3
        fk, ek = kernels_per_call(fused), kernels_per_call(eager)
        print(
            f"{form:<10} {bs:>5} | {f_us:>9.1f} {e_us:>9.1f} "
            f"{e_us / f_us:>10.2f}x | {fk:>13} {ek:>13}"
        )


def counted(fn: Callable[..., Any], name: str, calls: Counter[str]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def check_engine() -> None:
    """EAGLE with a top-k tree and a ragged prompt lookup (NGRAM_RAGGED, docs/concepts/builtins.md)
    on the embedded models: outputs equal target-only greedy, through ``GraphRunner.replay_tree``
    and ``replay_ragged`` (CUDA graphs captured on CUDA, eager static buffers in the dry run)."""
    what = "engine on CUDA (EAGLE top-k tree via replay_tree, NGRAM_RAGGED via replay_ragged)"
    if not (DRY_RUN or ENGINE):
        skip(what, "--engine runs it (the engine has not run on CUDA yet; a failure is a FAIL)")
        return
    from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
    from specstrat.strategies import TopkTree

    eagle_tree = replace(EAGLE, name="EAGLE_TREE", tree=TopkTree(topk=2, num_steps=3))
    ngram_ragged = replace(
        NGRAM,
        name="NGRAM_RAGGED",
        capabilities=replace(NGRAM.capabilities, supports_ragged_verify=True),
    )
    try:
        models = EmbeddedModels.load(device=DEV)
        requests = workload(6, seed=5)
        config = EngineConfig(context_len=512, max_running_requests=8, num_draft_tokens=6)
        target_only = Engine(NONE, models, config).run(requests)
        for algo, name in ((eagle_tree, "replay_tree"), (ngram_ragged, "replay_ragged")):
            engine = Engine(algo, models, config)
            runner = engine._graph_runner  # internal: this check counts its replays
            if runner is None:
                check(False, f"{algo.name}: the engine built no graph runner")
                continue
            calls: Counter[str] = Counter()
            setattr(runner, name, counted(getattr(runner, name), name, calls))
            outputs = engine.run(requests)
            # The captured graphs per bucket are the runner's own state; read here, not kept.
            graphs = sorted({s for b in runner._buckets.values() for s in b.graphs})
            shape = name.removeprefix("replay_")
            ok = outputs == target_only and calls[name] > 0 and (DRY_RUN or shape in graphs)
            check(
                ok,
                f"{algo.name} on {DEV} == target-only greedy ({len(requests)} requests); "
                f"GraphRunner.{name} ran {calls[name]}x, CUDA graphs captured: {graphs}",
            )
    except Exception as exc:  # report and go on: a runtime failure here is a finding
        traceback.print_exc()
        check(False, f"{what}: {type(exc).__name__}: {exc}")


def main() -> int:
    unknown = sorted(set(sys.argv[1:]) - {"--dry-run", "--engine"})
    if unknown:
        print(f"unknown arguments {unknown}; usage: gpu_check.py [--dry-run] [--engine]")
        return 2
    if DRY_RUN and not INTERPRETED:
        # Triton reads it when a kernel is decorated, so it must be set before the imports.
        print("--dry-run needs TRITON_INTERPRET=1 in the environment (gpu_check.sh sets it)")
        return 2
    if DRY_RUN:
        print(f"dry run on the CPU (TRITON_INTERPRET=1), torch {torch.__version__}")
    elif not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine only (--dry-run: on the CPU)")
        return 2
    else:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    start = time.perf_counter()
    check_kernels_against_twins()
    check_tree_kernel_against_twin()
    check_bucketed_ragged_against_twin()
    check_graph_capture()
    check_tree_graph_capture()
    check_bucketed_graph_capture()
    check_rejection_sampling()
    timings()
    check_engine()
    print(f"\n{time.perf_counter() - start:.0f} s")
    passed = "all dry-run checks passed (not a GPU result)" if DRY_RUN else "all GPU checks passed"
    print(f"{len(failures)} failed" if failures else passed)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
