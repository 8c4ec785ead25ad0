"""Tree TARGET_VERIFY metadata: the Triton body (interpreted) equals the torch twin, keeps every
tree invariant, and refuses bad input by name."""

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from torch.utils._python_dispatch import TorchDispatchMode

import specstrat.kernels.tree_metadata as tm
from specstrat import ConformanceError, InvalidConfig
from specstrat.kernels import (
    PAD_PAGE,
    Paging,
    TreeVerifyMetadata,
    TreeVerifyMetadataBuffers,
    VerifyMetadataBuffers,
    build_tree_verify_metadata,
    build_tree_verify_metadata_into,
    build_verify_metadata,
)
from specstrat.testing import (
    TreeVerifyBatch,
    check_tree_verify_metadata,
    draft_trees,
    tree_verify_batches,
)

# Always includes bs=0, bs=1 and non-power-of-two sizes; test_rows_past_one_block spans two row
# blocks of the base metadata (the interpreter costs ~30 ms per row, so the table stays small).
BATCH_SIZES = [0, 1, 3, 7]
NODES = [0, 1, 4, 11]
TREE_FIELDS = (
    "positions",
    "tree_mask",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
)
BASE_FIELDS = ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k", "page_table")
# The interpreter runs one program per row, so the default runs stay small; the slow tests
# below run the profile's full count.
FAST = settings(max_examples=15)


def random_batch(
    bs: int, n: int, *, seed: int, paged: bool = True, padded_bs: int | None = None
) -> TreeVerifyBatch:
    """A seeded batch of random trees (any parent before each node) with some filler."""
    gen = torch.Generator().manual_seed(seed)
    upper = torch.arange(n).expand(bs, n)  # node j may hang under -1..j-1
    parents = (torch.rand(bs, n, generator=gen) * (upper + 1)).long() - 1
    lengths = torch.randint(0, n + 1, (bs,), generator=gen)
    ctx, pool = 300 + n, bs + 3
    seq_lens = torch.randint(0, ctx - n, (bs,), generator=gen)
    paging = None
    if paged:
        rpi = torch.randperm(pool, generator=gen)[:bs]
        rtt = torch.randint(0, 1 << 20, (pool, ctx), generator=gen, dtype=torch.int32)
        paging = Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=16)
    return TreeVerifyBatch(
        parents=parents.contiguous(),
        lengths=lengths,
        seq_lens=seq_lens,
        padded_bs=padded_bs,
        paging=paging,
    )


def assert_same(a: TreeVerifyMetadata, b: TreeVerifyMetadata) -> None:
    """Every tensor of two builds is equal exactly, and so are the host facts."""
    for name in TREE_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y), f"{name}: {x.tolist()} != {y.tolist()}"
    for name in BASE_FIELDS:
        x, y = getattr(a.base, name), getattr(b.base, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name
    assert (a.base.max_seq_len_q, a.base.max_seq_len_k) == (
        b.base.max_seq_len_q,
        b.base.max_seq_len_k,
    )


def both(batch: TreeVerifyBatch) -> TreeVerifyMetadata:
    """Build with the twin and the Triton body, check both, return the Triton result."""
    twin, kernel = batch.build(backend="torch"), batch.build(backend="triton")
    check_tree_verify_metadata(twin, batch)
    check_tree_verify_metadata(kernel, batch)
    assert_same(twin, kernel)
    return kernel


@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_uniform_table(bs: int, n: int) -> None:
    """Uniform form, with a page table, agrees with the twin on the shape table."""
    both(random_batch(bs, n, seed=bs * 10 + n))


@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize("bs", BATCH_SIZES)
def test_graph_table_with_padding(bs: int, n: int) -> None:
    """Graph form writes every entry of poisoned static buffers, padding rows included."""
    meta = both(random_batch(bs, n, seed=bs + n, paged=bs % 2 == 1, padded_bs=bs + 3))
    t = n + 1
    assert meta.padded_bs == bs + 3
    assert meta.base.cache_seqlens[bs:].tolist() == [t] * 3
    assert (meta.retrive_next_token[bs:] == -1).all()
    if meta.base.page_table is not None:
        assert (meta.base.page_table[bs:] == PAD_PAGE).all()


def test_rows_past_one_block() -> None:
    """130 rows plus padding span two 128-row blocks: programs past the first still agree."""
    both(random_batch(130, 2, seed=5, paged=False, padded_bs=133))


@FAST
@given(tree_verify_batches(forms=("uniform",)))
def test_uniform_property(batch: TreeVerifyBatch) -> None:
    """Any uniform tree batch: kernel == twin, every invariant holds."""
    both(batch)


@FAST
@given(tree_verify_batches(forms=("graph",)))
def test_graph_property(batch: TreeVerifyBatch) -> None:
    """Any graph-form tree batch with padding rows: kernel == twin, every invariant holds."""
    both(batch)


@pytest.mark.slow
@given(tree_verify_batches(max_bs=24, max_nodes=40, max_pad=9))
def test_property_large(batch: TreeVerifyBatch) -> None:
    """Wider and deeper trees, both forms, the profile's full example count."""
    both(batch)


@FAST
@given(draft_trees(max_bs=4, max_nodes=8))
def test_draft_trees_are_valid(tree: Any) -> None:
    """draft_trees yields trees the DraftTree contract and the builder accept."""
    assert (tree.parents < torch.arange(tree.parents.shape[1])).all()
    meta = build_tree_verify_metadata(tree.parents, tree.lengths, torch.zeros_like(tree.lengths))
    assert meta.tokens_per_req == tree.parents.shape[1] + 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_chain_is_the_uniform_metadata(backend: Any) -> None:
    """A full chain: the uniform metadata of T tokens, positions seq+i, a lower-triangular mask."""
    seq = torch.tensor([7, 0, 30])
    n, bs = 4, 3
    parents = (torch.arange(n) - 1).expand(bs, n).contiguous()
    meta = build_tree_verify_metadata(parents, torch.full((bs,), n), seq, backend=backend)
    plain = build_verify_metadata(seq, num_tokens=bs * (n + 1), backend=backend)
    for name in ("cu_seqlens_q", "cache_seqlens", "cu_seqlens_k"):
        assert torch.equal(getattr(meta.base, name), getattr(plain, name)), name
    assert meta.positions.view(bs, -1).tolist() == [[s + i for i in range(5)] for s in (7, 0, 30)]
    assert torch.equal(meta.tree_mask, torch.ones(5, 5, dtype=torch.bool).tril().expand(bs, 5, 5))
    assert meta.retrive_next_token.tolist() == [[1, 2, 3, 4, -1]] * bs
    assert meta.retrive_next_sibling.tolist() == [[-1] * 5] * bs
    assert meta.retrive_index.tolist() == [list(range(b * 5, b * 5 + 5)) for b in range(bs)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sglang_example_positions(backend: Any) -> None:
    """SGLang's example: depths [0, 1, 1, 2] at prompt length 7 give positions [7, 8, 8, 9]."""
    parents = torch.tensor([[-1, -1, 0]])  # tokens 1, 2 under the root; token 3 under token 1
    meta = build_tree_verify_metadata(
        parents, torch.tensor([3]), torch.tensor([7]), backend=backend
    )
    assert meta.positions.tolist() == [7, 8, 8, 9]
    assert meta.tree_mask[0].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    assert meta.retrive_next_token.tolist() == [[1, 3, -1, -1]]
    assert meta.retrive_next_sibling.tolist() == [[-1, 2, -1, -1]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_filler_is_linked_nowhere(backend: Any) -> None:
    """Nodes past lengths[b] get a mask row and a position but no links, in or out."""
    parents = torch.tensor([[-1, -1, 0, 1, -1]])  # tokens 3..5 are filler (lengths = 2)
    meta = build_tree_verify_metadata(
        parents, torch.tensor([2]), torch.tensor([10]), backend=backend
    )
    assert meta.retrive_next_token.tolist() == [[1, -1, -1, -1, -1, -1]]
    assert meta.retrive_next_sibling.tolist() == [[-1, 2, -1, -1, -1, -1]]
    assert meta.positions.tolist() == [10, 11, 11, 12, 12, 11]
    assert meta.tree_mask[0, 4].int().tolist() == [1, 0, 1, 0, 1, 0]  # filler under token 2


def sample_batch() -> tuple[TreeVerifyBatch, TreeVerifyMetadata]:
    batch = TreeVerifyBatch(
        parents=torch.tensor([[-1, -1, 0, 0, 2], [-1, 0, -1, 2, 2]]),
        lengths=torch.tensor([5, 4]),
        seq_lens=torch.tensor([3, 9]),
        padded_bs=3,
    )
    return batch, batch.build(backend="torch")


def corrupt(
    meta: TreeVerifyMetadata, name: str, index: tuple[int, ...], value: Any
) -> TreeVerifyMetadata:
    tensor = getattr(meta, name).clone()
    tensor[index] = value
    return replace(meta, **{name: tensor})


@pytest.mark.parametrize(
    ("name", "index", "value", "message"),
    [
        ("tree_mask", (0, 3, 2), True, "a token sees exactly itself and its ancestors"),
        ("tree_mask", (1, 4, 0), False, "a token sees exactly itself and its ancestors"),
        ("retrive_next_sibling", (0, 3), -1, "reach every live token exactly once"),
        ("retrive_next_sibling", (0, 4), 3, "reach every live token exactly once"),
        ("retrive_next_sibling", (1, 0), 1, "the root and filler have no next sibling"),
        ("retrive_next_token", (1, 4), 1, "every root-to-leaf walk is a chain"),
        ("retrive_next_token", (0, 5), 2, "every root-to-leaf walk is a chain"),
        ("retrive_next_token", (1, 5), 1, "enumerate exactly the live children"),
        ("retrive_next_sibling", (1, 5), 4, "the root and filler have no next sibling"),
        ("positions", (6,), 11, "position = seq_len \\+ depth"),
        ("retrive_index", (1, 2), 2, "retrive_index = b \\* T \\+ i"),
        ("retrive_next_token", (2, 0), 1, "a padding row has no links"),
        ("tree_mask", (2, 3, 1), True, "a padding row has position 0"),
    ],
)
def test_checker_catches_corruption(
    name: str, index: tuple[int, ...], value: Any, message: str
) -> None:
    """A single wrong mask bit, link, position or padding entry fails the checker by name."""
    batch, meta = sample_batch()
    check_tree_verify_metadata(meta, batch)
    with pytest.raises(ConformanceError, match=message):
        check_tree_verify_metadata(corrupt(meta, name, index, value), batch)


def test_checker_catches_a_walk_off_the_tree() -> None:
    """Links that skip a generation (a grandchild listed as a child) break the chain walk."""
    batch = TreeVerifyBatch(
        parents=torch.tensor([[-1, 0, 1]]), lengths=torch.tensor([3]), seq_lens=torch.tensor([1])
    )
    meta = batch.build(backend="torch")
    with pytest.raises(ConformanceError, match="every root-to-leaf walk is a chain of the draft"):
        check_tree_verify_metadata(corrupt(meta, "retrive_next_token", (0, 1), 3), batch)


def test_checker_delegates_the_base_invariants() -> None:
    """A wrong uniform field (cache_seqlens) fails through check_verify_metadata."""
    batch, meta = sample_batch()
    meta.base.cache_seqlens[0] += 1
    with pytest.raises(ConformanceError, match="cache_seqlens = seq_lens \\+ tokens"):
        check_tree_verify_metadata(meta, batch)


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
    """Record kernel launches of the tree launcher."""
    launches: list[str] = []
    real = tm.launch  # type: ignore[attr-defined]

    def counted(kernel: Any, grid: tuple[int, ...], *args: Any, **kw: Any) -> None:
        launches.append(str(grid))
        real(kernel, grid, *args, **kw)

    monkeypatch.setattr(tm, "launch", counted)
    yield launches


def build_form(form: str, device: str, backend: Any) -> TreeVerifyMetadata:
    """One paged tree build of ``form`` on ``device``."""
    parents = torch.tensor([[-1, 0, 0], [-1, -1, 1], [-1, 0, 1]], device=device)
    lengths = torch.tensor([3, 2, 3], device=device)
    seq = torch.tensor([5, 9, 40], device=device)
    rtt = torch.arange(4 * 64, dtype=torch.int32, device=device).reshape(4, 64)
    rpi = torch.tensor([3, 0, 2], device=device)
    paging = Paging(req_pool_indices=rpi, req_to_token=rtt, page_size=8)
    if form == "uniform":
        return build_tree_verify_metadata(parents, lengths, seq, paging=paging, backend=backend)
    buffers = TreeVerifyMetadataBuffers.allocate(5, 4, max_pages=8, device=device)
    return build_tree_verify_metadata_into(
        buffers, parents, lengths, seq, paging=paging, backend=backend
    )


@pytest.mark.parametrize("form", ["uniform", "graph"])
def test_each_form_is_one_launch(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton path of both forms, page table and tree included, is exactly one launch."""
    with counting_launches(monkeypatch) as launches:
        build_form(form, "cpu", "triton")
    assert len(launches) == 1


@pytest.mark.parametrize("form", ["uniform", "graph"])
def test_no_host_read_of_device_data(form: str) -> None:
    """On a non-CPU device the launcher reads no tensor value back (meta tensors have none)."""
    counter = _SyncCounter()
    with counter:
        meta = build_form(form, "meta", "torch")
    assert counter.syncs == 0
    assert meta.positions.device.type == "meta"
    assert meta.base.max_seq_len_k is None


def test_auto_backend_uses_the_twin_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' on CPU tensors never launches a kernel."""
    with counting_launches(monkeypatch) as launches:
        build_form("uniform", "cpu", "auto")
    assert launches == []


def test_host_bound_and_empty_batch() -> None:
    """max_seq_len_k = max(seq_lens_cpu) + T; bs=0 keeps T from the shape of parents."""
    meta = build_tree_verify_metadata(
        torch.tensor([[-1, 0]]), torch.tensor([2]), torch.tensor([40]), seq_lens_cpu=[40]
    )
    assert (meta.base.max_seq_len_q, meta.base.max_seq_len_k) == (3, 43)
    empty = build_tree_verify_metadata(
        torch.zeros(0, 4, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        backend="triton",
    )
    assert empty.tokens_per_req == 5
    assert empty.base.cu_seqlens_q.tolist() == [0]
    assert tuple(empty.tree_mask.shape) == (0, 5, 5)


def test_works_without_triton() -> None:
    """With triton unimportable, the twin serves the tree builder and its graph form."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None
        import torch
        from specstrat.kernels import HAS_TRITON, TreeVerifyMetadataBuffers
        from specstrat.kernels import build_tree_verify_metadata, build_tree_verify_metadata_into
        assert not HAS_TRITON
        parents, lengths, seq = torch.tensor([[-1, -1, 0]]), torch.tensor([3]), torch.tensor([7])
        meta = build_tree_verify_metadata(parents, lengths, seq)
        assert meta.positions.tolist() == [7, 8, 8, 9]
        bufs = TreeVerifyMetadataBuffers.allocate(2, 4)
        meta = build_tree_verify_metadata_into(bufs, parents, lengths, seq)
        assert meta.retrive_next_token.tolist() == [[1, 3, -1, -1], [-1] * 4]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_nothing_is_written_when_a_check_fails() -> None:
    """A refused graph-form build leaves the static buffers as they were."""
    buffers = TreeVerifyMetadataBuffers.allocate(2, 3)
    buffers.positions.fill_(5)
    with pytest.raises(InvalidConfig, match=r"parents\[0, 1\]=1 is outside -1\.\.0"):
        build_tree_verify_metadata_into(
            buffers, torch.tensor([[-1, 1]]), torch.tensor([2]), torch.tensor([4])
        )
    assert buffers.positions.tolist() == [5] * 6


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


PARENTS = torch.tensor([[-1, 0, 1], [-1, -1, 0]])
LENGTHS = torch.tensor([3, 2])
SEQ = torch.tensor([3, 4])
RTT = torch.zeros(4, 32, dtype=torch.int32)
RPI = torch.tensor([1, 2])
PAGING = Paging(req_pool_indices=RPI, req_to_token=RTT)


def build(**kw: Any) -> TreeVerifyMetadata:
    args = {"parents": PARENTS, "lengths": LENGTHS, "seq_lens": SEQ, **kw}
    return build_tree_verify_metadata(
        args.pop("parents"), args.pop("lengths"), args.pop("seq_lens"), **args
    )


def into(buffers: Any, **kw: Any) -> TreeVerifyMetadata:
    args = {"parents": PARENTS, "lengths": LENGTHS, "seq_lens": SEQ, **kw}
    return build_tree_verify_metadata_into(
        buffers, args.pop("parents"), args.pop("lengths"), args.pop("seq_lens"), **args
    )


def tree_buffers(
    padded_bs: int = 4, t: int = 4, pages: int | None = None
) -> TreeVerifyMetadataBuffers:
    return TreeVerifyMetadataBuffers.allocate(padded_bs, t, max_pages=pages)


def buffers_with(**kw: Any) -> TreeVerifyMetadataBuffers:
    good = tree_buffers()
    parts = {
        "base": good.base,
        "positions": good.positions,
        "tree_mask": good.tree_mask,
        "retrive_index": good.retrive_index,
        "retrive_next_token": good.retrive_next_token,
        "retrive_next_sibling": good.retrive_next_sibling,
        **kw,
    }
    return TreeVerifyMetadataBuffers(**parts)


ERRORS: list[tuple[str, Any, str]] = [
    ("parents-rank", lambda: build(parents=PARENTS[0]), r"parents.shape=\(3,\) must have rank 2"),
    ("parents-float", lambda: build(parents=PARENTS.float()), r"parents.dtype=torch.float32"),
    ("parents-rows", lambda: build(parents=PARENTS[:1]), r"parents has 1 rows; expected 2"),
    ("parents-not-tensor", lambda: build(parents=loose([[-1]])), r"parents=list must be a torch"),
    (
        "parents-noncontig",
        lambda: build(parents=PARENTS.t().contiguous().t()[:, :2]),
        r"parents is not contiguous",
    ),
    (
        "parents-device",
        lambda: build(parents=PARENTS.to("meta")),
        r"parents.device=meta differs from cpu",
    ),
    (
        "parent-after-node",
        lambda: build(parents=torch.tensor([[-1, 1, 1], [-1, -1, 0]])),
        r"parents\[0, 1\]=1 is outside -1\.\.0; a node's parent must come before it",
    ),
    (
        "parent-below-root",
        lambda: build(parents=torch.tensor([[-1, 0, 1], [-1, -3, 0]])),
        r"parents\[1, 1\]=-3 is outside -1\.\.0",
    ),
    ("lengths-rows", lambda: build(lengths=LENGTHS[:1]), r"lengths has 1 rows; expected 2"),
    (
        "lengths-too-long",
        lambda: build(lengths=torch.tensor([3, 4])),
        r"lengths\[1\]=4 is outside 0\.\.3; a row has at most parents.shape\[1\]=3 real nodes",
    ),
    (
        "lengths-negative",
        lambda: build(lengths=torch.tensor([-1, 0])),
        r"lengths\[0\]=-1 is outside",
    ),
    (
        "seq-negative",
        lambda: build(seq_lens=torch.tensor([3, -2])),
        r"seq_lens\[1\]=-2 is negative",
    ),
    ("seq-2d", lambda: build(seq_lens=SEQ[None]), r"seq_lens.shape=\(1, 2\) must have rank 1"),
    (
        "seq-int32-overflow",
        lambda: build(seq_lens=torch.tensor([2**31 - 2, 0])),
        r"cache_seqlens\[0\]=seq_lens\[0\] \+ tokens=2147483650 exceeds the int32 max",
    ),
    (
        "paging-type",
        lambda: build(paging=loose((RPI, RTT))),
        r"paging=tuple; pass Paging\(req_pool_indices=\.\.\., req_to_token=\.\.\.",
    ),
    (
        "rpi-rows",
        lambda: build(paging=replace(PAGING, req_pool_indices=RPI[:1])),
        r"paging.req_pool_indices has 1 rows; expected 2 \(one per request\)",
    ),
    (
        "rtt-narrow",
        lambda: build(paging=replace(PAGING, req_to_token=RTT[:, :6].contiguous())),
        r"cache_seqlens\[0\]=7 .* widen req_to_token to >= 8 columns",
    ),
    (
        "rpi-range",
        lambda: build(paging=replace(PAGING, req_pool_indices=torch.tensor([0, 9]))),
        r"req_pool_indices range 0\.\.9 is outside req_to_token's 4 rows",
    ),
    (
        "paging-device",
        lambda: build(paging=Paging(req_pool_indices=RPI.to("meta"), req_to_token=RTT.to("meta"))),
        r"paging.req_to_token.device=meta differs from seq_lens.device=cpu",
    ),
    (
        "mirror-disagrees",
        lambda: build(seq_lens_cpu=[3, 5]),
        r"seq_lens_cpu\[1\]=5 but seq_lens\[1\]=4; the CPU mirror must be a copy",
    ),
    ("backend-name", lambda: build(backend=loose("cuda")), r"backend='cuda' is not one of"),
    (
        "validate-type",
        lambda: build(validate=loose("yes")),
        r"validate='yes' must be True or False",
    ),
    (
        "buffers-type",
        lambda: into(loose(VerifyMetadataBuffers.allocate(4))),
        r"buffers=VerifyMetadataBuffers; pass TreeVerifyMetadataBuffers.allocate",
    ),
    (
        "buffers-width",
        lambda: into(tree_buffers(t=6)),
        r"parents.shape\[1\]=3 gives T=4 tokens per request but the buffers hold tokens_per_req=6",
    ),
    ("bucket-too-small", lambda: into(tree_buffers(1)), r"bs=2 exceeds the buffers' padded_bs=1"),
    (
        "buffers-missing-pages",
        lambda: into(tree_buffers(), paging=PAGING),
        r"buffers.base.page_table is None but paging was given",
    ),
    (
        "buffers-extra-pages",
        lambda: into(tree_buffers(pages=2)),
        r"buffers.base.page_table is set but paging=None",
    ),
    (
        "buffers-few-pages",
        lambda: into(tree_buffers(pages=1), paging=replace(PAGING, page_size=4)),
        r"row 0 needs 2 pages .* allocate the buffers with max_pages >= 2",
    ),
    (
        "buffers-device",
        lambda: into(tree_buffers(), seq_lens=SEQ.to("meta")),
        r"seq_lens.device=meta differs from cpu; put every input on one device",
    ),
    ("allocate-t-zero", lambda: tree_buffers(t=0), r"tokens_per_req=0 must be >= 1"),
    ("allocate-bs-negative", lambda: tree_buffers(-1), r"padded_bs=-1 must be >= 0"),
    (
        "buffer-positions-dtype",
        lambda: buffers_with(positions=torch.zeros(16, dtype=torch.int32)),
        (
            r"positions is torch.int32 \(16,\); it must be a "
            r"contiguous torch.int64 buffer of shape \(16,\)"
        ),
    ),
    (
        "buffer-mask-rank",
        lambda: buffers_with(tree_mask=torch.zeros(4, 4, dtype=torch.bool)),
        r"tree_mask is \(4, 4\); it must be \[padded_bs, T, T\] with T >= 1",
    ),
    (
        "buffer-mask-dtype",
        lambda: buffers_with(tree_mask=torch.zeros(4, 4, 4, dtype=torch.uint8)),
        r"tree_mask is torch.uint8 \(4, 4, 4\); it must be a contiguous torch.bool buffer",
    ),
    (
        "buffer-links-shape",
        lambda: buffers_with(retrive_next_sibling=torch.zeros(4, 5, dtype=torch.int64)),
        r"retrive_next_sibling is torch.int64 \(4, 5\); .* shape \(4, 4\)",
    ),
    (
        "buffer-base-type",
        lambda: buffers_with(base=loose(None)),
        r"base=NoneType; pass VerifyMetadataBuffers.allocate",
    ),
    (
        "batch-padding",
        lambda: TreeVerifyBatch(parents=PARENTS, lengths=LENGTHS, seq_lens=SEQ, padded_bs=1),
        r"padded_bs=1 must be >= bs=2",
    ),
]


@pytest.mark.parametrize(("call", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_validation_errors(call: Any, message: str) -> None:
    """Every bad input to the tree launchers and buffers raises InvalidConfig naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        call()
