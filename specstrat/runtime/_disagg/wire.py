"""The wire format of a prefilled batch: one tensor per field, a small int64 header first.

Widths travel in the header (no fixed top-k or hidden width); KV and the drafter's payload keep
the KV's floating dtype. Transport is ``torch.distributed`` point-to-point; every transport
failure becomes a :class:`~specstrat.errors.DisaggError` naming the requests it lost.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import DisaggError
from specstrat.relay import RelayPayload
from specstrat.runtime._admission import TransferBatch

__all__ = ["encode", "recv_transfer", "send_transfer"]

_MAGIC = 0x5350_4543  # "SPEC"
_HEADER = 13
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _flat(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).reshape(len(values))


def _split(flat: list[Any], counts: list[int]) -> list[list[Any]]:
    """``flat`` cut into consecutive pieces of ``counts[i]`` items."""
    cuts = [0, *itertools.accumulate(counts)]
    return [flat[cuts[i] : cuts[i + 1]] for i in range(len(counts))]


def encode(batch: TransferBatch) -> list[torch.Tensor]:
    """A batch as the tensors that cross the wire, in order, header first."""
    if batch.k.dtype not in _DTYPES:
        raise DisaggError(f"KV dtype {batch.k.dtype} cannot travel; use one of {_DTYPES}")
    rid_bytes = [r.encode() for r in batch.rids]
    flat_prompt = [t for p in batch.prompts for t in p]
    stops = [sorted(s) for s in (batch.stop_token_ids or [frozenset()] * len(batch.rids))]
    params = batch.sampling or (GREEDY,) * len(batch.rids)
    layers, total, heads, dim = batch.k.shape
    payload = batch.payload
    topk = payload.topk_p.shape[1] if payload.topk_p is not None else -1
    hidden = payload.hidden_states.shape[1] if payload.hidden_states is not None else -1
    counts = (len(batch.rids), len(flat_prompt))
    shape = (total, layers, heads, dim, topk, hidden)
    sizes = (sum(len(b) for b in rid_bytes), sum(len(s) for s in stops))
    header = _flat([_MAGIC, 0, *counts, *shape, _DTYPES.index(batch.k.dtype), *sizes])
    parts = [
        header,
        _flat([len(b) for b in rid_bytes]),
        torch.frombuffer(bytearray(b"".join(rid_bytes)) or bytearray(1), dtype=torch.uint8),
        _flat(batch.kv_lens),
        _flat(flat_prompt),
        batch.max_new_tokens.to(torch.int64),
        batch.bonus_tokens.to(torch.int64),
        _flat([len(s) for s in stops]),
        _flat([t for s in stops for t in s]),
        torch.tensor([[p.temperature, p.top_p] for p in params], dtype=torch.float64).reshape(
            -1, 2
        ),
        _flat([v for p in params for v in (p.top_k, p.seed)]),
        batch.k.contiguous(),
        batch.v.contiguous(),
    ]
    if payload.topk_p is not None and payload.topk_index is not None:
        parts += [payload.topk_p.to(batch.k.dtype).contiguous(), payload.topk_index.to(torch.int64)]
    if payload.hidden_states is not None:
        parts.append(payload.hidden_states.to(batch.k.dtype).contiguous())
    return parts


def _require_group(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise DisaggError(
            f"{what} needs a torch.distributed process group; call "
            "torch.distributed.init_process_group first (run_disaggregated does)"
        )


def send_transfer(batch: TransferBatch | None, dst: int) -> None:
    """Send one batch (``None``: the end-of-stream marker) to rank ``dst``."""
    _require_group("send_transfer")
    parts = [_flat([_MAGIC, 1, *([0] * (_HEADER - 2))])] if batch is None else encode(batch)
    rids = [] if batch is None else list(batch.rids)
    device = torch.device("cpu") if batch is None else batch.k.device
    try:
        for part in parts:
            dist.send(part.to(device), dst)
    except Exception as exc:
        raise DisaggError(
            f"send to rank {dst} failed ({type(exc).__name__}: {str(exc)[:200]}); requests "
            f"{rids} were not delivered"
        ) from exc


def recv_transfer(
    src: int, *, timeout: float, device: torch.device | None = None
) -> TransferBatch | None:
    """Receive one whole batch from rank ``src`` (``None`` at end of stream) into ``device``
    (the CPU by default; a CUDA device for an NCCL group).

    A transfer that breaks off raises :class:`~specstrat.errors.DisaggError` naming the requests
    of the batch (when their ids arrived); the partial batch is dropped, never admitted.
    """
    _require_group("recv_transfer")
    rids: tuple[str, ...] = ()

    def take(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=device)
        work: Any = dist.irecv(out, src)
        work.wait(timedelta(seconds=timeout))
        return out if dtype.is_floating_point else out.cpu()

    try:
        header = take(_HEADER)
        if int(header[0]) != _MAGIC:
            raise DisaggError(
                f"bad transfer header {header.tolist()}; is the peer a specstrat prefill worker?"
            )
        if int(header[1]) == 1:
            return None
        bs, n_prompt, total, layers, heads, dim, topk, hidden, code, n_rid, n_stop = (
            int(x) for x in header[2:]
        )
        dtype = _DTYPES[code]
        rid_lens = take(bs).tolist()
        raw = take(max(n_rid, 1), dtype=torch.uint8).tolist()[:n_rid]
        rids = tuple(bytes(piece).decode() for piece in _split(raw, rid_lens))
        kv_lens = take(bs).tolist()
        prompts = tuple(tuple(p) for p in _split(take(n_prompt).tolist(), kv_lens))
        max_new, first = take(bs), take(bs)
        stop_counts = take(bs).tolist()
        stops = tuple(frozenset(s) for s in _split(take(n_stop).tolist(), stop_counts))
        floats, ints = take(bs, 2, dtype=torch.float64).tolist(), take(2 * bs).tolist()
        sampling = tuple(
            SamplingParams(temperature=t, top_p=p, top_k=ints[2 * i], seed=ints[2 * i + 1])
            for i, (t, p) in enumerate(floats)
        )
        k = take(layers, total, heads, dim, dtype=dtype)
        v = take(layers, total, heads, dim, dtype=dtype)
        fields: dict[str, torch.Tensor] = {}
        if topk >= 0:
            fields["topk_p"], fields["topk_index"] = take(bs, topk, dtype=dtype), take(bs, topk)
        if hidden >= 0:
            fields["hidden_states"] = take(bs, hidden, dtype=dtype)
    except DisaggError:
        raise
    except Exception as exc:
        raise DisaggError(
            f"transfer from rank {src} broke off ({type(exc).__name__}: {str(exc)[:200]}); "
            f"lost requests {list(rids)}; nothing of that batch was admitted"
        ) from exc
    return TransferBatch(
        rids, prompts, max_new, first, k, v, RelayPayload(**fields), stops, sampling
    )
