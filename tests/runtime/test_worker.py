"""Model worker: paged attention through kernel metadata equals dense attention; KV bookkeeping."""

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from specstrat import CapacityError, InvalidConfig
from specstrat.errors import EngineStateError, ModelShapeError
from specstrat.models import ModelSet, RowLogitsLM
from specstrat.runtime import Engine, EngineConfig, ForwardMode, Request
from specstrat.runtime._models.model import CausalAttention, TinyLM
from specstrat.runtime._worker import ModelWorker, _available_bytes
from tests.runtime.conftest import make_worker

M = ForwardMode


def dense(model: TinyLM, tokens: list[int]) -> torch.Tensor:
    """Reference logits: the whole sequence through dense causal attention."""
    with torch.inference_mode():
        logits: torch.Tensor = model(
            torch.tensor(tokens), torch.arange(len(tokens)), CausalAttention(1)
        )[0]
    return logits


SEQS = [[5, 6, 7, 8, 9, 10, 11], [200, 3, 3, 3, 40, 41, 42, 43, 44, 45], [1, 2, 3, 4]]


def test_extend_then_verify_then_decode_match_dense(tiny: TinyLM) -> None:
    """EXTEND (ragged), TARGET_VERIFY (T=2) and DECODE logits equal dense attention's."""
    worker = make_worker(tiny)
    slots = [worker.alloc_request() for _ in SEQS]
    prefill, _ = worker.forward(M.EXTEND, slots, [s[:-3] for s in SEQS])
    verify, _ = worker.forward(M.TARGET_VERIFY, slots, [s[-3:-1] for s in SEQS])
    decode, _ = worker.forward(M.DECODE, slots, [s[-1:] for s in SEQS])
    offset = 0
    for i, seq in enumerate(SEQS):
        ref = dense(tiny, seq)
        n = len(seq) - 3
        torch.testing.assert_close(prefill[offset : offset + n], ref[:n])
        torch.testing.assert_close(verify[2 * i : 2 * i + 2], ref[n : n + 2])
        torch.testing.assert_close(decode[i], ref[-1])
        offset += n


def test_ragged_verify_matches_dense(tiny: TinyLM) -> None:
    """TARGET_VERIFY with 1, 3 and 2 tokens per request (ragged metadata) equals dense attention."""
    worker = make_worker(tiny)
    slots = [worker.alloc_request() for _ in SEQS]
    counts = [1, 3, 2]
    worker.forward(M.EXTEND, slots, [s[:-c] for s, c in zip(SEQS, counts, strict=True)])
    verify, _ = worker.forward(
        M.TARGET_VERIFY, slots, [s[-c:] for s, c in zip(SEQS, counts, strict=True)]
    )
    starts = [0, 1, 4]
    for seq, count, start in zip(SEQS, counts, starts, strict=True):
        torch.testing.assert_close(verify[start : start + count], dense(tiny, seq)[-count:])


def test_wrong_metadata_gives_wrong_logits(tiny: TinyLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention reads cache_seqlens: shortening it by one changes the result."""
    import specstrat.runtime._worker as worker_module

    good, _ = make_and_verify(tiny)
    real = worker_module.build_verify_metadata  # type: ignore[attr-defined]

    def off_by_one(*args: object, **kwargs: object) -> object:
        meta = real(*args, **kwargs)  # type: ignore[arg-type]
        meta.buffers.cache_seqlens.sub_(1)
        return meta

    monkeypatch.setattr(worker_module, "build_verify_metadata", off_by_one)
    bad, _ = make_and_verify(tiny)
    assert not torch.allclose(good, bad)


def make_and_verify(tiny: TinyLM) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the last two tokens of SEQS[0] through a fresh worker."""
    worker = make_worker(tiny)
    slots = [worker.alloc_request()]
    worker.forward(M.EXTEND, slots, [SEQS[0][:-2]])
    return worker.forward(M.TARGET_VERIFY, slots, [SEQS[0][-2:]])


def test_rewind_frees_rejected_positions(tiny: TinyLM) -> None:
    """Rewinding returns the KV indices of dropped positions; freeing a request returns all."""
    worker = make_worker(tiny, tokens=50)
    slot = worker.alloc_request()
    worker.forward(M.EXTEND, [slot], [list(range(10))])
    worker.forward(M.TARGET_VERIFY, [slot], [[1, 2, 3, 4]])
    assert worker.kv.available == 36
    worker.rewind(slot, 11)
    assert (worker.cached([slot])[0], worker.kv.available) == (11, 39)
    worker.free_request(slot)
    assert worker.kv.available == 50
    assert worker.requests.available == 8


def test_rewind_after_reject_reproduces_decode(tiny: TinyLM) -> None:
    """Verify, reject everything, rewind: the next forward sees only the kept prefix."""
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    worker.forward(M.EXTEND, [slot], [SEQS[1][:5]])
    worker.forward(M.TARGET_VERIFY, [slot], [[9, 9, 9]])
    worker.rewind(slot, 5)
    logits, _ = worker.forward(M.DECODE, [slot], [[SEQS[1][5]]])
    torch.testing.assert_close(logits[0], dense(tiny, SEQS[1][:6])[-1])


def test_prebuilt_admission_continues_like_the_original(tiny: TinyLM) -> None:
    """KV exported from one worker and admitted PREBUILT in another decodes identically."""
    source, dest = make_worker(tiny), make_worker(tiny)
    slot = source.alloc_request()
    source.forward(M.EXTEND, [slot], [SEQS[1][:-1]])
    k, v = source.export_kv(slot)
    new_slot = dest.alloc_request()
    dest.admit_prebuilt(new_slot, SEQS[1][:-1], k, v)
    assert dest.cached([new_slot])[0] == len(SEQS[1][:-1])
    a, _ = source.forward(M.DECODE, [slot], [SEQS[1][-1:]])
    b, _ = dest.forward(M.DECODE, [new_slot], [SEQS[1][-1:]])
    torch.testing.assert_close(a, b)


def test_empty_forward_is_empty(tiny: TinyLM) -> None:
    """A forward over no requests returns zero rows and runs nothing."""
    logits, hidden = make_worker(tiny).forward(M.DECODE, [], [])
    assert logits.shape == (0, 256)
    assert hidden.shape == (0, 32)


def test_worker_errors(tiny: TinyLM) -> None:
    """Bad forwards are refused with messages naming the value, before anything changes."""
    worker = make_worker(tiny, tokens=20, requests=1)
    slot = worker.alloc_request()
    with pytest.raises(CapacityError, match=r"request pool is full \(1 slots\)"):
        worker.alloc_request()
    with pytest.raises(InvalidConfig, match=r"mode=DECODE needs one token per request"):
        worker.forward(M.DECODE, [slot, slot], [[1], [1, 2]])
    with pytest.raises(CapacityError, match=r"KV pool has 20 free KV indices, 21 needed"):
        worker.forward(M.EXTEND, [slot], [list(range(21))])
    assert (worker.cached([slot])[0], worker.kv.available) == (0, 20)
    with pytest.raises(InvalidConfig, match=r"mode=PREBUILT runs no forward; use admit_prebuilt"):
        worker.forward(M.PREBUILT, [slot], [[1]])
    with pytest.raises(InvalidConfig, match=r"0 \+ 200 tokens exceed context_len=128"):
        worker.forward(M.EXTEND, [slot], [[1] * 200])
    with pytest.raises(InvalidConfig, match=r"rewind to new_len=3 outside 0\.\.0"):
        worker.rewind(slot, 3)
    with pytest.raises(InvalidConfig, match=r"prebuilt KV shapes"):
        worker.admit_prebuilt(slot, [1, 2], torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))


def test_context_longer_than_positions_is_refused(tiny: TinyLM) -> None:
    """A worker cannot promise more context than the model has positions."""
    with pytest.raises(
        InvalidConfig, match=r"context_len=512 exceeds the model's max_positions=128"
    ):
        ModelWorker(
            tiny,
            max_running_requests=1,
            context_len=512,
            max_total_tokens=10,
        )


def test_the_request_pool_tracks_positions_written(tiny: TinyLM) -> None:
    """Positions placed in the KV count per request; a rewind drops them with their KV."""
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    worker.forward(M.EXTEND, [slot], [[5, 6, 7]])
    worker.forward(M.TARGET_VERIFY, [slot], [[8, 9, 10]])
    assert worker.cached([slot])[0] == 6
    free = worker.kv.available
    worker.rewind(slot, 4)
    assert (worker.cached([slot])[0], worker.kv.available) == (4, free + 2)


def test_kv_larger_than_memory_is_refused_before_allocating(tiny: TinyLM) -> None:
    """An absurd max_total_tokens is refused with the bytes it needs, before any allocation."""
    with pytest.raises(InvalidConfig, match=r"max_total_tokens=\d+ needs [\d.]+ GiB of KV cache"):
        ModelWorker(tiny, max_running_requests=1, context_len=64, max_total_tokens=10**13)


def test_cpu_memory_counts_the_reclaimable_page_cache(tmp_path: Path) -> None:
    """On Linux the KV check reads MemAvailable (free plus page cache), not free pages alone,
    which fall near zero once files are read; without /proc/meminfo it falls back to them."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: 20000000 kB\n")
    assert _available_bytes(torch.device("cpu"), meminfo) == 20000000 * 1024
    fallback = _available_bytes(torch.device("cpu"), tmp_path / "missing")
    assert fallback == os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_a_request_alone_reads_its_keys_as_a_view_and_matches_dense(
    tiny: TinyLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request running alone keeps consecutive KV indices through prefill, a verify whose
    drafts are partly rejected and decodes, so attention reads its keys as one view of the
    pool (no gather), with the logits of dense attention."""
    from specstrat.runtime import _attention

    runs: list[object] = []
    real_init = _attention.PagedAttention.__init__

    def spy(self: _attention.PagedAttention, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        runs.append(self._view)

    monkeypatch.setattr(_attention.PagedAttention, "__init__", spy)
    worker = make_worker(tiny)
    slot = worker.alloc_request()
    seq = SEQS[1]
    worker.forward(M.EXTEND, [slot], [seq[:5]])
    worker.forward(M.TARGET_VERIFY, [slot], [[seq[5], 7, 8]])
    worker.rewind(slot, 6)  # the two drafts rejected: their indices go back to the pool
    verify, _ = worker.forward(M.TARGET_VERIFY, [slot], [seq[6:9]])
    decode, _ = worker.forward(M.DECODE, [slot], [seq[9:]])
    assert len(runs) == 4
    assert all(r is not None for r in runs)
    ref = dense(tiny, seq)
    torch.testing.assert_close(verify, ref[6:9])
    torch.testing.assert_close(decode[0], ref[9])


def test_the_kv_pool_hands_out_ascending_indices_and_takes_the_lowest_freed_first() -> None:
    """alloc gives ascending indices; indices freed in any order come back lowest first, so a
    request that gives back its rejected drafts' indices gets consecutive ones next."""
    from specstrat.models import ModelShape
    from specstrat.runtime._memory import KVPool

    shape = ModelShape(vocab_size=8, hidden_size=8, layers=1, heads=1, head_dim=8, max_positions=16)
    pool = KVPool(16, shape, torch.float32, torch.device("cpu"))
    assert pool.alloc(3) == [1, 2, 3]
    assert pool.alloc(4) == [4, 5, 6, 7]
    pool.free([7, 5, 6])
    assert pool.alloc(4) == [5, 6, 7, 8]


class RowPicker(torch.nn.Module):
    """A TinyLM that is a RowLogitsLM: forward_rows records the rows asked and returns the full
    forward's logits at them."""

    def __init__(self, model: TinyLM) -> None:
        super().__init__()
        self.model, self.asked = model, list[list[int]]()

    @property
    def shape(self) -> Any:
        return self.model.shape

    def forward(self, tokens: Any, positions: Any, attention: Any) -> Any:
        return self.model(tokens, positions, attention)

    def forward_rows(self, tokens: Any, positions: Any, attention: Any, rows: Any) -> Any:
        self.asked.append(rows.tolist())
        logits, hidden = self.model(tokens, positions, attention)
        return logits[rows], hidden


def test_extend_asks_a_row_logits_model_for_each_prompts_last_row(tiny: TinyLM) -> None:
    """The worker hands a RowLogitsLM the rows asked and slices a plain model's logits to them,
    alike; the engine's prefill asks for each prompt's last row only and generates the same
    tokens as with a model without forward_rows."""
    picker = RowPicker(tiny)
    assert isinstance(picker, RowLogitsLM)
    outs = []
    for model in (tiny, picker):
        worker = make_worker(model)
        slots = [worker.alloc_request() for _ in SEQS]
        outs.append(worker.forward(M.EXTEND, slots, SEQS, logit_rows=[6, 16, 20]))
    assert outs[0][0].shape[0] == 3
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert picker.asked == [[6, 16, 20]]
    picker.asked.clear()
    requests = [Request(f"r{i}", tuple(s), 6) for i, s in enumerate(SEQS)]
    config = EngineConfig(context_len=64, max_running_requests=4)
    plain = Engine("NONE", ModelSet(target=tiny), config).run(requests)
    assert Engine("NONE", ModelSet(target=picker), config).run(requests) == plain
    assert picker.asked == [[6, 16, 20]]


def test_a_prompt_split_over_forwards_asks_for_no_rows_until_its_last_piece(tiny: TinyLM) -> None:
    """With chunked prefill, a forward holding only a prompt's first pieces asks for no logits,
    and the tokens equal those of a model without forward_rows."""
    picker = RowPicker(tiny)
    requests = [Request("long", tuple(range(3, 15)), 5)]
    config = EngineConfig(context_len=64, max_running_requests=2, chunked_prefill_size=5)
    plain = Engine("NONE", ModelSet(target=tiny), config).run(requests)
    assert Engine("NONE", ModelSet(target=picker), config).run(requests) == plain
    assert picker.asked == [[], [], [1]]


class AllRows(RowPicker):
    """A RowLogitsLM whose forward_rows forgets the rows and returns every row's logits."""

    def forward_rows(self, tokens: Any, positions: Any, attention: Any, rows: Any) -> Any:
        return self.model(tokens, positions, attention)


def test_a_forward_rows_returning_every_row_is_refused_by_name(tiny: TinyLM) -> None:
    """A forward_rows that returns the wrong number of logit rows is a ModelShapeError naming
    the rows asked."""
    worker = make_worker(AllRows(tiny))
    slots = [worker.alloc_request() for _ in SEQS]
    with pytest.raises(ModelShapeError, match=r"21 rows of logits .* asked for 3 rows"):
        worker.forward(M.EXTEND, slots, SEQS, logit_rows=[6, 16, 20])


class FailsOnce(RowPicker):
    """A RowLogitsLM whose first forward_rows raises, as a fault mid-prefill would."""

    def forward_rows(self, tokens: Any, positions: Any, attention: Any, rows: Any) -> Any:
        if not self.asked:
            self.asked.append([])
            raise RuntimeError("injected fault in forward_rows")
        return super().forward_rows(tokens, positions, attention, rows)


def test_a_fault_in_forward_rows_leaks_nothing_and_the_next_run_is_right(tiny: TinyLM) -> None:
    """A forward_rows that raises mid-prefill frees every slot and KV token and closes the
    engine by name; a new engine over the same model then generates what a model without
    forward_rows generates."""
    requests = [Request(f"r{i}", tuple(s), 6) for i, s in enumerate(SEQS)]
    config = EngineConfig(context_len=64, max_running_requests=4)
    plain = Engine("NONE", ModelSet(target=tiny), config).run(requests)
    engine = Engine("NONE", ModelSet(target=FailsOnce(tiny)), config)
    slots, kv = engine.free_slots, engine.free_kv_tokens
    with pytest.raises(RuntimeError, match=r"injected fault in forward_rows"):
        engine.run(requests)
    assert (engine.free_slots, engine.free_kv_tokens) == (slots, kv)
    with pytest.raises(EngineStateError, match=r"closed after a failed run \(RuntimeError"):
        engine.run(requests)
    spent = FailsOnce(tiny)
    spent.asked.append([])  # its one fault already spent
    assert Engine("NONE", ModelSet(target=spent), config).run(requests) == plain
