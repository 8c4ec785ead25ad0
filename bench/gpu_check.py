"""GPU check for the kernels: real Triton vs the twins, CUDA-graph capture/replay, timings
(the TARGET_VERIFY metadata, the relay gather and rejection sampling).

Needs a CUDA device (run through ``bench/gpu_check.sh``). Prints PASS/FAIL lines, then a table of
microseconds per build (``triton.testing.do_bench``) for the fused path vs the eager baseline,
and the CUDA kernel count per build from ``torch.profiler``. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from baselines import eager_graph, eager_ragged, eager_uniform
from torch.profiler import ProfilerActivity, profile

from specstrat import RelayPayload
from specstrat.kernels import (
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_verify_metadata,
    build_verify_metadata_into,
    gather_relay,
    gather_relay_ref,
)
from specstrat.kernels.sampling import rejection_sample

DEV = "cuda"
BATCH_SIZES = (1, 16, 64, 256, 1024)
CTX, PAGE = 4096, 16
FIELDS = ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table")
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


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


def paging(x: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"req_pool_indices": x["rpi"], "req_to_token": x["rtt"], "page_size": PAGE}


def check_kernels_against_twins() -> None:
    for bs in (0, 1, 3, 7, 64, 257, 1024):
        for t in (1, 2, 5, 8):
            x = inputs(bs, t)
            uni = [
                build_verify_metadata(x["seq_lens"], bs * t, backend=b, **paging(x))
                for b in ("triton", "torch")
            ]
            rag = [
                build_ragged_verify_metadata(x["seq_lens"], x["ntok"], backend=b, **paging(x))
                for b in ("triton", "torch")
            ]
            graph = []
            for b in ("triton", "torch"):
                bufs = VerifyMetadataBuffers.allocate(bs + 5, max_pages=CTX // PAGE, device=DEV)
                graph.append(
                    build_verify_metadata_into(bufs, x["seq_lens"], t, backend=b, **paging(x))
                )
            check(
                same(*uni) and same(*rag) and same(*graph),
                f"triton == twin, bs={bs} T={t} (uniform, ragged, graph)",
            )
    src = RelayPayload(
        bonus_tokens=torch.arange(500, device=DEV),
        seq_lens=torch.arange(500, device=DEV, dtype=torch.int32),
        topk_p=torch.rand(500, 8, device=DEV),
        topk_index=torch.randint(0, 1 << 20, (500, 8), device=DEV),
        hidden_states=torch.randn(500, 4096, device=DEV, dtype=torch.bfloat16),
    )
    index = torch.randint(0, 500, (1024,), device=DEV)
    got, want = gather_relay(src, index, backend="triton"), gather_relay_ref(src, index)
    exact = all(
        torch.equal(got.present()[k].view(torch.uint8), v.view(torch.uint8))
        for k, v in want.present().items()
    )
    check(exact, "relay gather == index_select, bit for bit (5 fields, 1024 rows, H=4096 bf16)")


def sampling_inputs(bs: int, n: int, vocab: int) -> dict[str, Any]:
    """Rejection-sampling inputs on the GPU (float64 probabilities: the kernel computes in fp64)."""
    gen = torch.Generator().manual_seed(bs * 7 + n)
    p = torch.softmax(torch.randn(bs, n + 1, vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(bs, n, vocab, generator=gen, dtype=torch.float64), -1)
    cpu = {
        "p": p, "q": q, "tokens": torch.randint(0, vocab, (bs, n), generator=gen),
        "lengths": torch.randint(0, n + 1, (bs,), generator=gen),
        "seeds": torch.randint(0, 2**62, (bs,), generator=gen),
        "positions": torch.randint(0, 4000, (bs,), generator=gen),
    }  # fmt: skip
    return {k: v.to(DEV) for k, v in cpu.items()}


def check_rejection_sampling() -> None:
    ok = True
    for bs, n, vocab in ((1, 3, 256), (64, 3, 256), (256, 7, 1000), (1024, 3, 32000)):
        x = sampling_inputs(bs, n, vocab)
        for q in (x["q"], None):
            args = {**x, "q": q}
            kernel = rejection_sample(**args, backend="triton")
            twin = rejection_sample(**args, backend="torch")
            ok &= all(torch.equal(a, b) for a, b in zip(kernel, twin, strict=True))
    check(ok, "rejection_sample Triton == twin on CUDA (bs up to 1024, vocab up to 32000)")
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
    padded, bs, t = 64, 48, 4
    x = inputs(bs, t)
    static_seq = x["seq_lens"].clone()
    bufs = VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles the kernel outside the capture
        build_verify_metadata_into(bufs, static_seq, t, backend="triton", **paging(x))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build_verify_metadata_into(bufs, static_seq, t, backend="triton", **paging(x))
    ok = True
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(5):
            static_seq.copy_(torch.randint(0, CTX - t, (bs,), device=DEV))
            graph.replay()
            # The eager launcher path must not sync either.
            build_verify_metadata(static_seq, bs * t, backend="triton", **paging(x))
            torch.cuda.set_sync_debug_mode("default")
            ref = VerifyMetadataBuffers.allocate(padded, max_pages=CTX // PAGE, device=DEV)
            want = build_verify_metadata_into(ref, static_seq, t, backend="torch", **paging(x))
            ok &= same(VerifyMetadata(bufs, bs, PAGE, t, t, None), want)
            torch.cuda.set_sync_debug_mode("error")
            _ = step
    except RuntimeError as exc:
        ok = False
        print(f"    {exc}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check(ok, "graph form captured in a CUDA graph; 5 replays == twin with sync debug mode 'error'")


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
            return build_verify_metadata(seq, bs * t, backend="triton", **paging(x))
        if form == "graph":
            return build_verify_metadata_into(bufs, seq, t, backend="triton", **paging(x))
        return build_ragged_verify_metadata(seq, ntok, backend="triton", **paging(x))

    def eager() -> object:
        if form == "uniform":
            return eager_uniform(seq, bs * t, rpi, rtt, PAGE)
        if form == "graph":
            return eager_graph(tup, seq, t, rpi, rtt, PAGE)  # type: ignore[arg-type]
        return eager_ragged(seq, ntok, rpi, rtt, PAGE)

    return fused, eager


def timings() -> None:
    from triton.testing import do_bench

    t = 4
    print(f"\nµs per build (do_bench median), T={t}, page_size={PAGE}, context={CTX}")
    head = f"{'form':<8} {'bs':>5} | {'fused µs':>9} {'eager µs':>9} {'eager/fused':>11} | {'fused kernels':>13} {'eager kernels':>13}"
    print(head)
    print("-" * len(head))
    for form in ("uniform", "graph", "ragged"):
        for bs in BATCH_SIZES:
            x = inputs(bs, t)
            bufs = VerifyMetadataBuffers.allocate(bs, max_pages=CTX // PAGE, device=DEV)
            fused, eager = pair(form, x, bufs, bs, t)
            f_us, e_us = do_bench(fused) * 1e3, do_bench(eager) * 1e3
            fk, ek = kernels_per_call(fused), kernels_per_call(eager)
            print(
                f"{form:<8} {bs:>5} | {f_us:>9.1f} {e_us:>9.1f} {e_us / f_us:>10.2f}x | {fk:>13} {ek:>13}"
            )


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine only")
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    check_kernels_against_twins()
    check_graph_capture()
    check_rejection_sampling()
    timings()
    print(f"\n{len(failures)} failed" if failures else "\nall GPU checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
