"""Prefill/decode disaggregation across two processes over ``torch.distributed``.

The prefill process runs EXTEND for each batch of incoming requests and sends, per batch, one
tensor per field (a small int64 header first): request ids, prompts, first tokens, the KV of every
request and, as the algorithm's capabilities say, ``topk_p``/``topk_index``/``hidden_states`` with
whatever widths the algorithm uses. The decode process receives a batch completely before admitting
any of it (PREBUILT), checks it against the algorithm, and hands the batched fields to
``algo.build_disagg_draft_input``. Transport: gloo point-to-point on loopback (NCCL where the
tensors live on a GPU), processes started with ``torch.multiprocessing``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Documented as torch.distributed.TCPStore; the package does not re-export it for type checkers.
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import DisaggError
from specstrat.runtime.drafters import EagleHeadDrafter
from specstrat.runtime.engine import Engine
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.requests import EngineConfig, Request, RunStats
from specstrat.runtime.weights import EMBEDDED_WEIGHTS, EmbeddedModels
from specstrat.runtime.worker import ModelWorker

__all__ = [
    "DisaggResult",
    "PrefillWorker",
    "TransferBatch",
    "check_transfer",
    "recv_transfer",
    "run_disaggregated",
    "send_transfer",
]

_MAGIC = 0x5350_4543  # "SPEC"
_HEADER = 12
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, slots=True)
class TransferBatch:
    """One prefilled batch as it crosses the wire: every field batched, requests in order.

    ``k``/``v`` are ``[layers, sum(kv_lens), heads, head_dim]``: request ``i``'s KV is the slice
    of ``kv_lens[i]`` positions after the previous requests'. ``hidden_mask[i]`` says whether
    request ``i``'s ``hidden_states`` row is real.
    """

    rids: tuple[str, ...]
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: torch.Tensor
    first_tokens: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    hidden_mask: torch.Tensor | None = None

    @property
    def kv_lens(self) -> list[int]:
        """Positions of KV per request (its prompt length)."""
        return [len(p) for p in self.prompts]

    def requests(self) -> list[Request]:
        """The requests this batch carries."""
        budgets = self.max_new_tokens.tolist()
        return [
            Request(r, p, int(n)) for r, p, n in zip(self.rids, self.prompts, budgets, strict=True)
        ]


def check_transfer(batch: TransferBatch, engine: Engine) -> None:
    """Refuse a batch whose fields disagree with the decode engine's algorithm and model.

    Raises :class:`~specstrat.errors.DisaggError` naming the requests and the field; nothing is
    admitted then.
    """
    rids = list(batch.rids)
    cfg = engine.target.model.cfg
    caps = engine.algo.capabilities

    def fail(problem: str, who: Sequence[str] = rids) -> DisaggError:
        return DisaggError(f"requests {list(who)}: {problem}; the batch was not admitted")

    want_kv = (cfg.layers, sum(batch.kv_lens), cfg.heads, cfg.head_dim)
    for name in ("k", "v"):
        tensor = getattr(batch, name)
        if tuple(tensor.shape) != want_kv or not tensor.dtype.is_floating_point:
            raise fail(f"{name} is {tensor.dtype} {tuple(tensor.shape)}, expected float {want_kv}")
    if batch.first_tokens.shape != (len(rids),) or batch.max_new_tokens.shape != (len(rids),):
        raise fail("first_tokens and max_new_tokens need one entry per request")
    if caps.carries_draft_hidden_states:
        mask = batch.hidden_mask
        if batch.hidden_states is None or mask is None:
            raise fail(f"{engine.algo.name} carries hidden states but none arrived")
        missing = [r for r, ok in zip(rids, mask.tolist(), strict=True) if not ok]
        if missing:
            raise fail(
                f"hidden_states missing for {missing}; {engine.algo.name} carries them", missing
            )
        if tuple(batch.hidden_states.shape) != (len(rids), cfg.dim):
            raise fail(
                f"hidden_states is {tuple(batch.hidden_states.shape)}, expected {(len(rids), cfg.dim)}"
            )
        # The EAGLE-style drafter also relays its first top-k.
        if batch.topk_p is None or batch.topk_index is None:
            raise fail(f"{engine.algo.name} needs topk_p and topk_index; none arrived")
        if not batch.topk_p.dtype.is_floating_point or batch.topk_index.dtype != torch.int64:
            raise fail(
                f"topk_p is {batch.topk_p.dtype} and topk_index {batch.topk_index.dtype}; "
                "expected floating point and torch.int64"
            )
        if batch.topk_p.shape != batch.topk_index.shape or batch.topk_p.shape[0] != len(rids):
            raise fail(
                f"topk_p {tuple(batch.topk_p.shape)} and topk_index "
                f"{tuple(batch.topk_index.shape)} must both be [bs, k]"
            )


class PrefillWorker:
    """The prefill side: EXTEND for a batch of requests, then everything the decode side needs."""

    def __init__(
        self, algo: SpecAlgorithm[Any], models: EmbeddedModels, *, context_len: int, batch_size: int
    ) -> None:
        self.algo = algo
        dtype = next(models.target.parameters()).dtype
        self.worker = ModelWorker(
            models.target,
            max_running_requests=batch_size,
            context_len=context_len,
            max_total_tokens=batch_size * context_len,
            device=torch.device("cpu"),
            dtype=dtype,
        )
        self.eagle = (
            EagleHeadDrafter(models.target, models.eagle)
            if algo.capabilities.carries_draft_hidden_states
            else None
        )

    def prefill(self, requests: Sequence[Request]) -> TransferBatch:
        """Prefill ``requests`` and package their KV and relay payload; frees its own slots."""
        slots = [self.worker.alloc_request() for _ in requests]
        try:
            prompts = [list(r.prompt) for r in requests]
            logits, hidden = self.worker.forward(ForwardMode.EXTEND, slots, prompts)
            ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
            first = logits[ends].argmax(-1)
            kv = [self.worker.export_kv(s) for s in slots]
            extra: dict[str, torch.Tensor] = {}
            if self.eagle is not None:
                relay = self.eagle.admit(slots, prompts, first, hidden[ends])
                extra = {k: v for k, v in relay.present().items()}
                extra["hidden_mask"] = torch.ones(len(slots), dtype=torch.int64)
            return TransferBatch(
                rids=tuple(r.rid for r in requests),
                prompts=tuple(r.prompt for r in requests),
                max_new_tokens=torch.tensor([r.max_new_tokens for r in requests]),
                first_tokens=first,
                k=torch.cat([k for k, _ in kv], dim=1),
                v=torch.cat([v for _, v in kv], dim=1),
                **extra,
            )
        finally:
            for slot in slots:
                self.worker.free_request(slot)


# -- the wire -------------------------------------------------------------------------------


def _wait(work: Any, timeout: float) -> None:
    work.wait(timedelta(seconds=timeout))


def _wire(batch: TransferBatch) -> list[torch.Tensor]:
    """A batch as the tensors that cross the wire, in order, header first."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = _MAGIC
    rid_bytes = [r.encode() for r in batch.rids]
    flat_prompt = [t for p in batch.prompts for t in p]
    layers, total, heads, dim = batch.k.shape
    topk = batch.topk_p.shape[1] if batch.topk_p is not None else -1
    hidden = batch.hidden_states.shape[1] if batch.hidden_states is not None else -1
    header[2:12] = torch.tensor(
        [len(batch.rids), len(flat_prompt), total, layers, heads, dim, topk, hidden,
         _DTYPES.index(batch.k.dtype), sum(len(b) for b in rid_bytes)]
    )  # fmt: skip
    parts = [
        header,
        torch.tensor([len(b) for b in rid_bytes], dtype=torch.int64),
        torch.frombuffer(bytearray(b"".join(rid_bytes)) or bytearray(1), dtype=torch.uint8),
        torch.tensor(batch.kv_lens, dtype=torch.int64),
        torch.tensor(flat_prompt, dtype=torch.int64),
        batch.max_new_tokens.to(torch.int64),
        batch.first_tokens.to(torch.int64),
        batch.k.contiguous(),
        batch.v.contiguous(),
    ]
    if batch.topk_p is not None and batch.topk_index is not None:
        parts += [batch.topk_p.to(batch.k.dtype).contiguous(), batch.topk_index.to(torch.int64)]
    if batch.hidden_states is not None:
        mask = batch.hidden_mask if batch.hidden_mask is not None else torch.ones(len(batch.rids))
        parts += [batch.hidden_states.to(batch.k.dtype).contiguous(), mask.to(torch.int64)]
    return parts


def send_transfer(batch: TransferBatch | None, dst: int) -> None:
    """Send one batch (``None``: the end-of-stream marker) to rank ``dst``."""
    if batch is None:
        end = torch.zeros(_HEADER, dtype=torch.int64)
        end[0], end[1] = _MAGIC, 1
        dist.send(end, dst)
        return
    for part in _wire(batch):
        dist.send(part, dst)


def recv_transfer(src: int, *, timeout: float) -> TransferBatch | None:
    """Receive one whole batch from rank ``src`` (``None`` at end of stream).

    A transfer that breaks off raises :class:`~specstrat.errors.DisaggError` naming the requests
    of the batch (when their ids arrived); the partial batch is dropped, never admitted.
    """
    header = torch.zeros(_HEADER, dtype=torch.int64)
    rids: tuple[str, ...] = ()
    try:
        _wait(dist.irecv(header, src), timeout)
        if int(header[0]) != _MAGIC:
            raise DisaggError(
                f"bad transfer header {header.tolist()}; is the peer a specstrat prefill worker?"
            )
        if int(header[1]) == 1:
            return None
        bs, n_prompt, total, layers, heads, dim, topk, hidden, dtype_code, n_rid = (
            int(x) for x in header[2:12]
        )
        dtype = _DTYPES[dtype_code]

        def take(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            out = torch.empty(shape, dtype=dtype)
            _wait(dist.irecv(out, src), timeout)
            return out

        rid_lens = take(bs).tolist()
        raw = bytes(take(max(n_rid, 1), dtype=torch.uint8).tolist())[:n_rid]
        cuts = [sum(rid_lens[:i]) for i in range(bs + 1)]
        rids = tuple(raw[cuts[i] : cuts[i + 1]].decode() for i in range(bs))
        kv_lens = take(bs).tolist()
        flat = take(n_prompt).tolist()
        starts = [sum(kv_lens[:i]) for i in range(bs + 1)]
        prompts = tuple(tuple(flat[starts[i] : starts[i + 1]]) for i in range(bs))
        max_new, first = take(bs), take(bs)
        k = take(layers, total, heads, dim, dtype=dtype)
        v = take(layers, total, heads, dim, dtype=dtype)
        topk_p = topk_index = hidden_states = mask = None
        if topk >= 0:
            topk_p, topk_index = take(bs, topk, dtype=dtype), take(bs, topk)
        if hidden >= 0:
            hidden_states, mask = take(bs, hidden, dtype=dtype), take(bs)
    except DisaggError:
        raise
    except Exception as exc:
        raise DisaggError(
            f"transfer from rank {src} broke off ({type(exc).__name__}: {str(exc)[:200]}); "
            f"lost requests {list(rids)}; nothing of that batch was admitted"
        ) from exc
    return TransferBatch(
        rids, prompts, max_new, first, k, v, topk_p, topk_index, hidden_states, mask
    )


# -- two processes --------------------------------------------------------------------------


@dataclass
class DisaggResult:
    """Outputs by request id, the decode engine's stats, and batches refused at admission."""

    outputs: dict[str, list[int]]
    stats: RunStats
    rejected: list[DisaggError]


#: The key the prefill process sets in the decode side's store once it has connected.
_READY = "specstrat/prefill-ready"


def _prefill_main(
    port: int,
    algo: SpecAlgorithm[Any],
    requests: list[Request],
    batch_size: int,
    context_len: int,
    weights: str,
    fault: str | None,
    timeout: float,
) -> None:
    torch.set_num_threads(1)
    if fault == "die_before_connect":
        os._exit(3)  # as if the algorithm could not be unpickled here
    if fault == "stall_before_connect":
        time.sleep(timeout + 30)  # alive but never connecting; the decode side kills it
    wait = timedelta(seconds=timeout)
    store = TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=wait)
    store.set(_READY, "1")
    dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=wait)
    worker = PrefillWorker(
        algo, EmbeddedModels.load(Path(weights)), context_len=context_len, batch_size=batch_size
    )
    for index in range(0, len(requests), batch_size):
        batch = worker.prefill(requests[index : index + batch_size])
        second = index == batch_size
        if second and fault == "missing_hidden" and batch.hidden_mask is not None:
            batch.hidden_mask[0] = 0
        if second and fault == "bad_hidden_width" and batch.hidden_states is not None:
            batch = TransferBatch(
                **{**_fields(batch), "hidden_states": batch.hidden_states[:, :-1]}
            )
        if second and fault == "die_mid_transfer":
            _send_partial(batch)
            os._exit(17)  # as if killed: no end marker, no clean shutdown
        send_transfer(batch, dst=1)
    send_transfer(None, dst=1)
    dist.destroy_process_group()


def _fields(batch: TransferBatch) -> dict[str, Any]:
    return {name: getattr(batch, name) for name in TransferBatch.__slots__}


def _send_partial(batch: TransferBatch) -> None:
    """Fault injection: the header and request ids of a batch, then nothing."""
    for part in _wire(batch)[:3]:
        dist.send(part, 1)


def _join_group(store: TCPStore, child: BaseProcess, timeout: float) -> None:
    """Wait for the prefill process to connect, then join its group as rank 1. A child that dies
    first is reported at once (not after ``timeout``), with its exit code."""
    deadline = time.monotonic() + timeout
    while not store.check([_READY]):
        if not child.is_alive():
            raise DisaggError(
                f"the prefill process exited with code {child.exitcode} before it connected "
                "(its error is on stderr); the algorithm must be importable there, so define it "
                "in a module, not in __main__"
            )
        if time.monotonic() > deadline:
            child.kill()
            raise DisaggError(f"the prefill process did not connect within {timeout}s")
        time.sleep(0.01)
    wait = timedelta(seconds=timeout)
    dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=wait)


def run_disaggregated(
    algo: SpecAlgorithm[Any],
    requests: Sequence[Request],
    config: EngineConfig | None = None,
    *,
    models: EmbeddedModels | None = None,
    weights: Path = EMBEDDED_WEIGHTS,
    batch_size: int = 4,
    timeout: float = 20.0,
    fault: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DisaggResult:
    """Prefill in a child process, decode here; returns when every admitted request finished.

    ``fault`` injects a failure on the prefill side (tests): on its second batch
    ``"missing_hidden"``, ``"bad_hidden_width"`` or ``"die_mid_transfer"``; or
    ``"die_before_connect"`` or ``"stall_before_connect"``. A broken transfer raises
    :class:`~specstrat.errors.DisaggError` naming every request that was lost; batches refused at
    admission are reported in :attr:`DisaggResult.rejected` while the others run on.
    """
    config = config or EngineConfig()
    models = models or EmbeddedModels.load(weights)
    engine = Engine(algo, models, config)
    # The decode side serves the rendezvous store on a port the OS picks (no free-port race).
    wait = timedelta(seconds=timeout)
    store = TCPStore(
        "127.0.0.1", 0, world_size=2, is_master=True, timeout=wait, wait_for_workers=False
    )
    port = store.port
    ctx = mp.get_context("spawn")
    child = ctx.Process(
        target=_prefill_main,
        args=(
            port,
            algo,
            list(requests),
            batch_size,
            config.context_len,
            str(weights),
            fault,
            timeout,
        ),
        daemon=True,
    )
    try:
        child.start()  # pickles the arguments: the algorithm's strategies must be importable
    except Exception as exc:
        raise DisaggError(
            f"cannot send algorithm {algo.name!r} to the prefill process: "
            f"{type(exc).__name__}: {exc}; define its strategies at module level"
        ) from exc
    arrived: queue.Queue[TransferBatch | DisaggError | None] = queue.Queue()
    rejected: list[DisaggError] = []
    _join_group(store, child, timeout)

    def receive() -> None:
        try:
            while (batch := recv_transfer(0, timeout=timeout)) is not None:
                arrived.put(batch)
        except DisaggError as exc:
            arrived.put(exc)
            return
        arrived.put(None)

    receiver = threading.Thread(target=receive, name="specstrat-disagg-recv", daemon=True)
    receiver.start()
    done = False

    def source(idle: bool) -> bool:
        nonlocal done
        while not done:
            try:
                item = arrived.get(timeout=timeout) if idle else arrived.get_nowait()
            except queue.Empty:
                if idle:
                    raise DisaggError(
                        f"no transfer from the prefill process within {timeout}s"
                    ) from None
                return True
            if item is None:
                done = True
            elif isinstance(item, DisaggError):
                admitted = set(engine.submitted_ids())
                lost = [r.rid for r in requests if r.rid not in admitted]
                raise DisaggError(f"{item}; requests never admitted: {lost}") from item
            else:
                try:
                    engine.submit_prebuilt(item)
                except DisaggError as exc:
                    rejected.append(exc)
                idle = False
        return not done

    try:
        outputs = engine.run(source=source, progress=progress)
    finally:
        child.join(timeout=timeout)
        if child.is_alive():
            child.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
    return DisaggResult(outputs, engine.stats, rejected)
