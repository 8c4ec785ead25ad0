"""TARGET_VERIFY metadata: Triton bodies (interpreted) equal the torch twin and keep every
invariant."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given
from torch.utils._python_dispatch import TorchDispatchMode

import specstrat.kernels._triton as triton_mod
import specstrat.kernels.verify_metadata as vm
from specstrat import DSPARK, Capabilities, InvalidConfig, KernelError, SpecAlgorithm
from specstrat.kernels import (
    PAD_PAGE,
    Paging,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_verify_metadata,
    build_verify_metadata_into,
)
from specstrat.strategies import (
    GreedyAcceptance,
    NgramDrafterFactory,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    SlotFutureMapFactory,
)
from specstrat.testing import VerifyBatch, check_verify_metadata, verify_batches

# Always includes bs=0, bs=1 and non-power-of-two "weird" sizes (257 spans three row blocks).
BATCH_SIZES = [0, 1, 3, 7, 64, 257]
TOKENS = [1, 2, 5, 8]
PAGE_SIZES = [1, 16, 7]
FIELDS = ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table")


def paged_batch(
    bs: int, t: int, *, seed: int, page_size: int, padded_bs: int | None = None
) -> VerifyBatch:
    gen = torch.Generator().manual_seed(seed)
    ctx = 300 + t
    pool = bs + 3
    seq_lens = torch.randint(0, ctx - t + 1, (bs,), generator=gen)
    rpi = torch.randperm(pool, generator=gen)[:bs]
    rtt = torch.randint(0, 1 << 20, (pool, ctx), generator=gen, dtype=torch.int32)
    return VerifyBatch(
        seq_lens=seq_lens,
        tokens_per_req=t,
        padded_bs=padded_bs,
        paging=Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=page_size),
    )


def assert_same(a: VerifyMetadata, b: VerifyMetadata) -> None:
    """Integer metadata is compared exactly, field by field."""
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), f"{name}: {x.tolist()} != {y.tolist()}"
    assert (a.max_seq_len_q, a.max_seq_len_k) == (b.max_seq_len_q, b.max_seq_len_k)


def both(batch: VerifyBatch) -> VerifyMetadata:
    """Build with the twin and the Triton body, check both, return the Triton result."""
    twin, kernel = batch.build(backend="torch"), batch.build(backend="triton")
    check_verify_metadata(twin, batch)
    check_verify_metadata(kernel, batch)
    assert_same(twin, kernel)
    return kernel


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_uniform_table(bs: int, t: int) -> None:
    """Uniform form, with a page table, agrees with the twin on the shape table."""
    page_size = PAGE_SIZES[(bs + t) % len(PAGE_SIZES)]
    both(paged_batch(bs, t, seed=bs * 10 + t, page_size=page_size))


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_graph_table_with_padding(bs: int, t: int) -> None:
    """Graph form writes every row of poisoned static buffers, padding rows included."""
    batch = paged_batch(bs, t, seed=bs + t, page_size=16, padded_bs=bs + 5)
    meta = both(batch)
    assert meta.padded_bs == bs + 5
    assert meta.cache_seqlens[bs:].tolist() == [t] * 5  # padding rows: PAD_SEQ_LEN + T
    assert meta.page_table is not None
    assert (meta.page_table[bs:] == PAD_PAGE).all()


@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_ragged_table(bs: int) -> None:
    """Ragged form: cu_seqlens_q is the exclusive prefix sum of per-request tokens."""
    gen = torch.Generator().manual_seed(bs)
    base = paged_batch(bs, 9, seed=bs, page_size=4)
    batch = VerifyBatch(
        seq_lens=base.seq_lens,
        num_tokens_per_req=torch.randint(1, 10, (bs,), generator=gen),
        paging=base.paging,
    )
    meta = both(batch)
    assert meta.tokens_per_req is None


def policy_algo(policy: OffsetVerifyPolicy) -> SpecAlgorithm[None]:
    return SpecAlgorithm(
        name="T_NOT_D",
        capabilities=Capabilities(),
        target_verify=policy,
        future_map=SlotFutureMapFactory(),
        disagg=NoDraftStateDisaggDraftBuilder(),
        drafter=NgramDrafterFactory(),
        acceptance=GreedyAcceptance(),
    )


@pytest.mark.parametrize(
    ("algo", "worker", "t_minus_d"),
    [
        (DSPARK, True, -1),
        (policy_algo(OffsetVerifyPolicy(target_offset=1)), False, 1),
        (
            policy_algo(OffsetVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=1)),
            True,
            1,
        ),
    ],
    ids=["dspark-draft-D-1", "target-D+1", "draft-D+1"],
)
@pytest.mark.parametrize("d", [2, 4, 7])
def test_strides_follow_t_not_d(
    algo: SpecAlgorithm[Any], worker: bool, t_minus_d: int, d: int
) -> None:
    """When the policy's T differs from D, graph buffers stride by T in every row, padding too."""
    t = algo.get_num_tokens_per_req_for_target_verify(d, worker)
    assert t == d + t_minus_d
    batch = paged_batch(5, t, seed=d, page_size=8, padded_bs=8)
    meta = both(batch)
    assert meta.cu_seqlens_q.tolist() == [i * t for i in range(9)]
    assert meta.cu_seqlens_q.tolist() != [i * d for i in range(9)]


@given(verify_batches(forms=("uniform",)))
def test_uniform_property(batch: VerifyBatch) -> None:
    """Any uniform batch: kernel == twin, every invariant holds."""
    both(batch)


@given(
    verify_batches(
        forms=("graph",),
        policy=OffsetVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=-1),
    )
)
def test_graph_property_with_a_policy(batch: VerifyBatch) -> None:
    """Any graph-form batch whose T comes from a D-1 policy: kernel == twin, invariants hold."""
    both(batch)


@given(verify_batches(forms=("ragged",)))
def test_ragged_property(batch: VerifyBatch) -> None:
    """Any ragged batch: kernel == twin, every invariant holds."""
    both(batch)


def test_empty_batch_is_well_formed() -> None:
    """bs=0 gives [0] prefix sums, empty cache lengths and T=0."""
    meta = build_verify_metadata(torch.zeros(0, dtype=torch.int64), num_tokens=0, backend="triton")
    assert meta.cu_seqlens_q.tolist() == [0]
    assert meta.cu_seqlens_k.tolist() == [0]
    assert meta.cache_seqlens.numel() == 0
    assert meta.max_seq_len_q == 0


def test_host_bound_comes_from_the_mirror_only() -> None:
    """max_seq_len_k is max(seq_lens_cpu) + T with a mirror and None without one."""
    seq = torch.tensor([4, 90, 7])
    assert build_verify_metadata(seq, num_tokens=6, seq_lens_cpu=[4, 90, 7]).max_seq_len_k == 92
    assert build_verify_metadata(seq, num_tokens=6).max_seq_len_k is None
    ragged = build_ragged_verify_metadata(
        seq, torch.tensor([1, 3, 2]), seq_lens_cpu=seq, num_tokens_per_req_cpu=[1, 3, 2]
    )
    assert (ragged.max_seq_len_q, ragged.max_seq_len_k) == (3, 93)


class _SyncCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts aten ops that read device data back to the host."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.syncs = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record kernel launches (the interpreter's own tensor traffic is not counted as ops)."""
    launches: list[str] = []
    real = vm.launch  # type: ignore[attr-defined]

    def counted(kernel: Any, grid: tuple[int, ...], *args: Any, **kw: Any) -> None:
        launches.append(str(grid))
        real(kernel, grid, *args, **kw)

    monkeypatch.setattr(vm, "launch", counted)
    yield launches


def build_form(form: str, device: str, backend: Any) -> VerifyMetadata:
    """One paged build of ``form`` on ``device``."""
    seq = torch.tensor([5, 9, 2, 40], device=device)
    rtt = torch.arange(4 * 64, dtype=torch.int32, device=device).reshape(4, 64)
    rpi = torch.tensor([3, 0, 2, 1], device=device)
    paging = Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=8)
    if form == "uniform":
        return build_verify_metadata(seq, num_tokens=12, paging=paging, backend=backend)
    if form == "graph":
        buffers = VerifyMetadataBuffers.allocate(8, max_pages=8, device=device)
        return build_verify_metadata_into(
            buffers, seq, tokens_per_req=3, paging=paging, backend=backend
        )
    ntok = torch.tensor([1, 2, 3, 4], device=device)
    return build_ragged_verify_metadata(seq, ntok, paging=paging, backend=backend)


@pytest.mark.parametrize("form", ["uniform", "graph", "ragged"])
def test_each_form_is_one_launch(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton path of every form, page table included, is exactly one kernel launch."""
    with counting_launches(monkeypatch) as launches:
        build_form(form, "cpu", "triton")
    assert len(launches) == 1


@pytest.mark.parametrize("form", ["uniform", "graph", "ragged"])
def test_no_host_read_of_device_data(form: str) -> None:
    """On a non-CPU device the launcher never reads tensor values back to the host.

    Meta tensors have no data: any .item(), int(t) or .tolist() on them raises, so a build that
    completes on the meta device did no host read (validation of values runs only on the CPU).
    """
    counter = _SyncCounter()
    with counter:
        meta = build_form(form, "meta", "torch")
    assert counter.syncs == 0
    assert meta.cu_seqlens_q.device.type == "meta"
    assert meta.max_seq_len_k is None


def test_launch_failure_is_wrapped_in_kernel_error() -> None:
    """Any exception inside a launch surfaces as KernelError, chained to the cause."""

    class Broken:
        __name__ = "_broken_kernel"

        def __getitem__(self, grid: Any) -> Any:
            def run(*args: Any, **kw: Any) -> None:
                raise RuntimeError("invalid device pointer")

            return run

    with pytest.raises(
        KernelError, match=r"_broken_kernel launch with grid=\(1,\) failed: invalid device pointer"
    ) as info:
        triton_mod.launch(Broken(), (1,))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_triton_backend_needs_cuda_or_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='triton' on CPU tensors without the interpreter is a KernelError with the fix."""
    monkeypatch.setattr(triton_mod, "INTERPRETED", False)
    with pytest.raises(
        KernelError, match=r"backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1"
    ):
        build_verify_metadata(torch.tensor([1]), num_tokens=1, backend="triton")


def test_triton_backend_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='triton' where triton is missing says so and names backend='torch'."""
    monkeypatch.setattr(triton_mod, "HAS_TRITON", False)
    with pytest.raises(
        KernelError, match=r"triton is not importable; install triton or pass backend='torch'"
    ):
        build_verify_metadata(torch.tensor([1]), num_tokens=1, backend="triton")


def test_auto_backend_uses_the_twin_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' on CPU tensors never launches a kernel."""
    with counting_launches(monkeypatch) as launches:
        build_verify_metadata(torch.tensor([1, 2]), num_tokens=4)
    assert launches == []


def test_widths_are_keyword_only() -> None:
    """A width passed positionally is a TypeError: num_tokens and tokens_per_req never swap."""
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        build_verify_metadata(torch.tensor([3, 5]), 4)  # type: ignore[call-arg]
    buffers = VerifyMetadataBuffers.allocate(2)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        build_verify_metadata_into(buffers, torch.tensor([3, 5]), 2)  # type: ignore[call-arg]


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


SEQ = torch.tensor([3, 4])
RTT = torch.zeros(4, 32, dtype=torch.int32)
RPI = torch.tensor([1, 2])
PAGING = Paging(req_pool_indices=RPI, req_to_token=RTT)


def buffers(n: int = 4, pages: int | None = None) -> VerifyMetadataBuffers:
    return VerifyMetadataBuffers.allocate(n, max_pages=pages)


ERRORS: list[tuple[str, Any, str]] = [
    (
        "not-multiple",
        lambda: build_verify_metadata(SEQ, num_tokens=5),
        r"num_tokens=5 is not a multiple of bs=2",
    ),
    (
        "empty-with-tokens",
        lambda: build_verify_metadata(SEQ[:0], num_tokens=3),
        r"num_tokens=3 with bs=0",
    ),
    (
        "zero-tokens",
        lambda: build_verify_metadata(SEQ, num_tokens=0),
        r"num_tokens=0 with bs=2; TARGET_VERIFY needs >= 1",
    ),
    (
        "tokens-bool",
        lambda: build_verify_metadata(SEQ, num_tokens=True),
        r"num_tokens=True must be an int",
    ),
    (
        "seq-2d",
        lambda: build_verify_metadata(SEQ[None], num_tokens=2),
        r"seq_lens.shape=\(1, 2\) must have rank 1",
    ),
    (
        "seq-noncontig",
        lambda: build_verify_metadata(torch.arange(4)[::2], num_tokens=2),
        r"seq_lens is not contiguous",
    ),
    (
        "seq-not-tensor",
        lambda: build_verify_metadata(loose([3, 4]), num_tokens=2),
        r"seq_lens=list must be a torch.Tensor",
    ),
    (
        "paging-type",
        lambda: build_verify_metadata(
            SEQ, num_tokens=2, paging=loose({"req_pool_indices": RPI, "req_to_token": RTT})
        ),
        r"paging=dict; pass Paging\(req_pool_indices=\.\.\., req_to_token=\.\.\.",
    ),
    (
        "rpi-rows",
        lambda: build_verify_metadata(
            SEQ, num_tokens=2, paging=Paging(req_pool_indices=RPI[:1], req_to_token=RTT)
        ),
        r"paging.req_pool_indices has 1 rows; expected 2 \(one per request\)",
    ),
    (
        "rpi-range",
        lambda: build_verify_metadata(
            SEQ,
            num_tokens=2,
            paging=Paging(req_pool_indices=torch.tensor([1, 4]), req_to_token=RTT),
        ),
        r"req_pool_indices range 1\.\.4 is outside req_to_token's 4 rows",
    ),
    (
        "paging-device",
        lambda: build_verify_metadata(SEQ.to("meta"), num_tokens=2, paging=PAGING),
        r"paging.req_to_token.device=cpu differs from seq_lens.device=meta; put every input on",
    ),
    (
        "mirror-length",
        lambda: build_verify_metadata(SEQ, num_tokens=2, seq_lens_cpu=[1]),
        r"seq_lens_cpu has 1 entries; expected bs=2",
    ),
    (
        "backend-name",
        lambda: build_verify_metadata(SEQ, num_tokens=2, backend=loose("cuda")),
        r"backend='cuda' is not one of",
    ),
    (
        "bucket-too-small",
        lambda: build_verify_metadata_into(buffers(1), SEQ, tokens_per_req=2),
        r"bs=2 exceeds the buffers' padded_bs=1",
    ),
    (
        "tokens-per-req-zero",
        lambda: build_verify_metadata_into(buffers(), SEQ, tokens_per_req=0),
        r"tokens_per_req=0 must be >= 1",
    ),
    (
        "buffers-type",
        lambda: build_verify_metadata_into(loose(None), SEQ, tokens_per_req=2),
        r"buffers=NoneType; pass VerifyMetadataBuffers.allocate",
    ),
    (
        "buffers-missing-pages",
        lambda: build_verify_metadata_into(buffers(), SEQ, tokens_per_req=2, paging=PAGING),
        r"buffers.page_table is None but paging was given; allocate the buffers with max_pages",
    ),
    (
        "buffers-extra-pages",
        lambda: build_verify_metadata_into(buffers(4, 2), SEQ, tokens_per_req=2),
        r"buffers.page_table is set but paging=None",
    ),
    (
        "buffers-device",
        lambda: build_verify_metadata_into(buffers(), SEQ.to("meta"), tokens_per_req=2),
        r"seq_lens.device=meta differs from cpu; put every input on one device",
    ),
    (
        "buffer-dtype",
        lambda: VerifyMetadataBuffers(
            torch.zeros(3, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(3, dtype=torch.int32),
        ),
        (
            r"cu_seqlens_q is torch.int64 \(3,\); it must be "
            r"a contiguous torch.int32 buffer of shape \(3,\)"
        ),
    ),
    (
        "buffer-shape",
        lambda: VerifyMetadataBuffers(
            torch.zeros(3, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(4, dtype=torch.int32),
        ),
        r"cu_seqlens_k is torch.int32 \(4,\)",
    ),
    (
        "ragged-zero",
        lambda: build_ragged_verify_metadata(SEQ, torch.tensor([1, 0])),
        r"num_tokens_per_req\[1\]=0 is < 1; every request verifies >= 1 token",
    ),
    (
        "ragged-rows",
        lambda: build_ragged_verify_metadata(SEQ, torch.tensor([1])),
        r"num_tokens_per_req has 1 rows; expected 2",
    ),
    (
        "max-pages-zero",
        lambda: VerifyMetadataBuffers.allocate(2, max_pages=0),
        r"max_pages=0 must be >= 1",
    ),
]


@pytest.mark.parametrize(("call", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_validation_errors(call: Any, message: str) -> None:
    """Every bad input to the metadata launchers raises InvalidConfig naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        call()
