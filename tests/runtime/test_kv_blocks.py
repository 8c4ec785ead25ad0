"""KV blocks per request slot: a batch's keys read as one strided view of the pool, no gather."""

from collections.abc import Callable

import pytest
import torch

from specstrat import CapacityError, InvalidConfig
from specstrat.models import ModelShape
from specstrat.runtime import ForwardMode, _attention
from specstrat.runtime._attention import _host_facts
from specstrat.runtime._memory import KVPool
from specstrat.runtime._models.model import TinyLM
from specstrat.runtime._worker import TreeTokens
from tests.runtime.conftest import make_worker
from tests.runtime.test_trees import TOKENS, tree_layout
from tests.runtime.test_worker import SEQS, dense

M = ForwardMode
LONG = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [200, 3, 3, 3, 40, 41, 42, 43, 44, 45], [1, 2, 3, 4, 5]]
SHAPE = ModelShape(vocab_size=8, hidden_size=8, layers=1, heads=1, head_dim=8, max_positions=16)


def _pool(tokens: int, blocks: int) -> KVPool:
    return KVPool(tokens, SHAPE, torch.float32, torch.device("cpu"), blocks=blocks)


def _views(monkeypatch: pytest.MonkeyPatch) -> list[_attention._StridedRows | None]:
    """Records the view each forward's attention chose (None: a gather)."""
    views: list[_attention._StridedRows | None] = []
    real_init = _attention.PagedAttention.__init__

    def spy(self: _attention.PagedAttention, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        views.append(self._view)

    monkeypatch.setattr(_attention.PagedAttention, "__init__", spy)
    return views


def test_each_slot_takes_its_own_block_lowest_first() -> None:
    """Request slot s gets indices from 1 + (s - 1) * block size up, ascending, step after step,
    and a rewound index comes back to its own block first."""
    pool = _pool(16, 4)
    assert pool.block_size == 4
    assert pool.alloc(2, owner=1) == [1, 2]
    assert pool.alloc(3, owner=2) == [5, 6, 7]
    assert pool.alloc(1, owner=1) == [3]
    pool.free([7, 6])
    assert pool.alloc(2, owner=2) == [6, 7]
    assert pool.available == 16 - 6


def test_a_slot_past_its_block_borrows_the_fullest_blocks_highest_indices() -> None:
    """A request that outgrows its block borrows the indices past the last block, then the
    highest free ones of the block with most free, and freed borrowed indices go back to their
    block, so its owner still runs consecutively."""
    pool = _pool(18, 4)  # blocks of 4, indices 17 and 18 past them
    pool.alloc(1, owner=3)
    assert pool.alloc(8, owner=1) == [1, 2, 3, 4, 17, 18, 8, 7]
    pool.free([7, 8, 17, 18])
    assert pool.alloc(4, owner=2) == [5, 6, 7, 8]
    assert pool.alloc(3, owner=3) == [10, 11, 12]


def test_alloc_many_is_all_or_none() -> None:
    """alloc_many refuses a batch the pool cannot hold whole, naming both counts, and takes
    nothing."""
    pool = _pool(16, 4)
    with pytest.raises(CapacityError, match="16 free KV indices, 20 needed; raise max_total"):
        pool.alloc_many([1, 2], [10, 10])
    assert pool.available == 16
    assert pool.alloc_many([2, 1], [1, 2]) == [5, 1, 2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda p: p.alloc_many([1, 2], [2]),
            r"alloc_many\(owners=\[1, 2\], counts=\[2\]\): pass one",
        ),
        (lambda p: p.alloc(-1, owner=1), r"counts=\[-1\]\): pass one count >= 0 per owner"),
        (lambda p: p.free([3, 0]), r"KV index 0 is not in 1..16; free only indices alloc returned"),
        (lambda p: p.free([17]), r"KV index 17 is not in 1..16"),
    ],
)
def test_bad_counts_and_indices_are_refused_and_change_nothing(
    call: Callable[[KVPool], object], message: str
) -> None:
    """Counts that do not pair with owners, a negative count and an index outside the pool are
    refused by name, and the pool's free count is unchanged."""
    pool = _pool(16, 4)
    pool.alloc(3, owner=1)
    with pytest.raises(InvalidConfig, match=message):
        call(pool)
    assert pool.available == 13
    assert pool.alloc(1, owner=1) == [4]


def test_without_blocks_the_pool_hands_out_the_lowest_free_indices() -> None:
    """A pool of fewer indices than slots has no blocks: every request takes the lowest free."""
    pool = _pool(3, 4)
    assert pool.block_size == 0
    assert pool.alloc(2, owner=2) == [1, 2]
    pool.free([1])
    assert pool.alloc(2, owner=1) == [1, 3]


@pytest.mark.parametrize(
    ("slots", "cache", "view"),
    [
        ([[1, 2, 3]], [3], (1, 0, None)),
        ([[5, 6, 0], [1, 2, 3]], [2, 3], (1, 4, [1, 0])),
        ([[1, 2, 9], [5, 6, 7]], [2, 3], (1, 4, None)),
        ([[1, 2, 4], [5, 6, 7]], [3, 3], None),  # a gap in the first row
        ([[1, 2, 3], [1, 2, 3]], [3, 3], None),  # two rows at one start
        ([[1, 2, 3], [9, 10, 11]], [3, 3], None),  # starts not in consecutive blocks
        ([[1, 2, 3], [3, 4, 5]], [3, 3], None),  # a start off the block stride
        ([[13, 14, 15], [17, 18, 19]], [3, 3], None),  # the view would end past the pool
        ([], [], None),  # no rows
    ],
)
def test_which_page_tables_read_as_a_view(
    slots: list[list[int]], cache: list[int], view: tuple[int, int, list[int] | None] | None
) -> None:
    """A batch reads as a view only where every row runs consecutively over its fill from a
    start in its own block, the starts fill consecutive blocks, and the view stays in the pool."""
    table = torch.tensor(slots, dtype=torch.int64).reshape(len(cache), 3)
    visible = torch.ones(*table.shape, dtype=torch.bool)
    _, got = _host_facts(visible, table, torch.tensor(cache, dtype=torch.int64), 4, 19)
    if view is None:
        assert got is None
        return
    assert got is not None
    start, stride, order = view
    assert (got.start, got.stride) == (start, stride)
    assert (None if got.order is None else got.order.tolist()) == order


def test_a_batch_reads_its_keys_as_one_view_and_matches_dense(
    tiny: TinyLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests through prefill, a verify partly rejected and a decode read their keys as
    one strided view of the pool, in the batch's order and in another, with dense logits."""
    views = _views(monkeypatch)
    worker = make_worker(tiny)
    slots = [worker.alloc_request() for _ in LONG]
    worker.forward(M.EXTEND, slots, [s[:-4] for s in LONG])
    worker.forward(M.TARGET_VERIFY, slots, [[s[-4], 7, 8] for s in LONG])
    worker.rewind_many(slots, [len(s) - 3 for s in LONG])
    back = slots[::-1]
    verify, _ = worker.forward(M.TARGET_VERIFY, back, [s[-3:-1] for s in LONG[::-1]])
    decode, _ = worker.forward(M.DECODE, back, [s[-1:] for s in LONG[::-1]])
    assert len(views) == 4
    assert all(v is not None for v in views)
    assert views[-1] is not None
    assert views[-1].order is not None
    for i, seq in enumerate(LONG[::-1]):
        ref = dense(tiny, seq)
        torch.testing.assert_close(verify[2 * i : 2 * i + 2], ref[-3:-1])
        torch.testing.assert_close(decode[i], ref[-1])


def test_a_request_past_its_block_is_gathered_and_matches_dense(
    tiny: TinyLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request longer than its block borrows indices elsewhere; its batch's attention
    gathers them and still gives dense logits."""
    views = _views(monkeypatch)
    worker = make_worker(tiny, tokens=24, requests=3)  # blocks of 8 indices
    slots = [worker.alloc_request() for _ in SEQS]
    worker.forward(M.EXTEND, slots, [s[:-1] for s in SEQS])
    decode, _ = worker.forward(M.DECODE, slots, [s[-1:] for s in SEQS])
    assert views == [None, None]
    for i, seq in enumerate(SEQS):
        torch.testing.assert_close(decode[i], dense(tiny, seq)[-1])


def test_an_accepted_tree_path_keeps_the_request_consecutive(
    tiny: TinyLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a tree verify keeps the path root, 0, 2, 4, the next decode still reads the keys
    as a view, with the logits of the path run as a chain."""
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    worker.forward(M.EXTEND, [slot], [[1, 2, 3, 4]])
    positions, mask = tree_layout()
    worker.forward(M.TARGET_VERIFY, [slot], [TOKENS], tree=TreeTokens(positions, mask))
    worker.keep_path(slot, 4, [0, 1, 3, 5])
    views = _views(monkeypatch)
    decode, _ = worker.forward(M.DECODE, [slot], [[7]])
    assert views[0] is not None
    chain = [1, 2, 3, 4, TOKENS[0], TOKENS[1], TOKENS[3], TOKENS[5], 7]
    torch.testing.assert_close(decode[0], dense(tiny, chain)[-1])


def test_sdpa_takes_one_additive_mask_per_forward_bit_for_bit(
    tiny: TinyLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked forward hands every layer's SDPA one float mask (0 seen, -inf hidden), built
    once, and gives the logits the boolean mask gives, bit for bit."""
    masks: list[torch.Tensor | None] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None,
        scale: float | None,
    ) -> torch.Tensor:
        masks.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, scale=scale)

    def run() -> torch.Tensor:
        worker = make_worker(tiny)
        slots = [worker.alloc_request() for _ in LONG]
        worker.forward(M.EXTEND, slots, [s[:-3] for s in LONG])
        logits, _ = worker.forward(M.TARGET_VERIFY, slots, [s[-3:] for s in LONG])
        return logits

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    additive = run()
    layers = tiny.shape.layers
    assert len(masks) == 2 * layers
    for forward in (masks[:layers], masks[layers:]):
        first = forward[0]
        assert first is not None
        assert first.is_floating_point()
        assert all(m is first for m in forward)
        assert set(first.flatten().tolist()) == {0.0, float("-inf")}
    boolean = _attention.PagedAttention._mask
    monkeypatch.setattr(
        _attention.PagedAttention, "_mask", lambda self, w, g, dtype=None: boolean(self, w, g)
    )
    assert torch.equal(run(), additive)
