"""Prefill in a child process, decode here: two processes over ``torch.distributed``.

The backend follows the device: gloo for CPU tensors (what the embedded models use); NCCL is
selected when the decode engine's models live on a CUDA device. The decode side serves the
rendezvous store on a port the OS picks and polls for the child, so a child that dies before
connecting is reported at once with its exit code.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Documented as torch.distributed.TCPStore; the package does not re-export it for type checkers.
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import DisaggError, InvalidConfig
from specstrat.models import LoadedModels
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._disagg.prefill import PrefillWorker
from specstrat.runtime._disagg.wire import recv_transfer, send_transfer
from specstrat.runtime._engine import Engine
from specstrat.runtime._models.weights import EMBEDDED_WEIGHTS, EmbeddedModels
from specstrat.runtime._requests import EngineConfig, Request, RunStats
from specstrat.runtime._scheduler import Progress

__all__ = [
    "READY_KEY",
    "DisaggResult",
    "EmbeddedLoader",
    "ModelLoader",
    "backend_for",
    "connect",
    "prefill_main",
    "run_disaggregated",
]

#: The key the prefill process sets in the decode side's store once it has connected.
READY_KEY = "specstrat/prefill-ready"


class ModelLoader(Protocol):
    """How the prefill process loads its models: a picklable callable (it travels to the spawned
    process) returning the same models the decode side runs, on ``device``."""

    def __call__(self, device: str) -> LoadedModels:
        """The models, loaded on ``device``."""
        ...


@dataclass(frozen=True, slots=True)
class EmbeddedLoader:
    """Loads the embedded models of ``weights`` (the default :class:`ModelLoader`)."""

    weights: str = str(EMBEDDED_WEIGHTS)

    def __call__(self, device: str) -> EmbeddedModels:
        """``EmbeddedModels.load(weights, device=device)``."""
        return EmbeddedModels.load(Path(self.weights), device=device)


@dataclass(frozen=True, slots=True)
class DisaggResult:
    """Outputs by request id, the decode engine's stats, and batches refused at admission."""

    outputs: dict[str, list[int]]
    stats: RunStats
    rejected: list[DisaggError]


def backend_for(device: torch.device) -> str:
    """The process-group backend for tensors on ``device``: NCCL on CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def connect(port: int, rank: int, backend: str, timeout: float) -> TCPStore:
    """Join the two-process group through the store on ``port`` (rank 0: the prefill side)."""
    wait = timedelta(seconds=timeout)
    store = TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=wait)
    store.set(READY_KEY, "1")
    dist.init_process_group(backend, store=store, rank=rank, world_size=2, timeout=wait)
    return store


def prefill_main(
    port: int,
    algo: SpecAlgorithm[Any],
    requests: list[Request],
    batch_size: int,
    context_len: int,
    loader: ModelLoader,
    timeout: float,
    device: str,
) -> None:
    """The prefill process: connect, prefill each batch and send it, then the end marker."""
    torch.set_num_threads(1)
    connect(port, 0, backend_for(torch.device(device)), timeout)
    models = loader(device)
    worker = PrefillWorker(algo, models, context_len=context_len, batch_size=batch_size)
    for index in range(0, len(requests), batch_size):
        send_transfer(worker.prefill(requests[index : index + batch_size]), dst=1)
    send_transfer(None, dst=1)
    dist.destroy_process_group()


def _join_group(store: TCPStore, child: BaseProcess, backend: str, timeout: float) -> None:
    """Wait for the prefill process to connect, then join its group as rank 1."""
    deadline = time.monotonic() + timeout
    while not store.check([READY_KEY]):
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
    dist.init_process_group(backend, store=store, rank=1, world_size=2, timeout=wait)


def _check_arguments(
    algo: object, requests: Sequence[Request], config: EngineConfig, batch_size: int, timeout: float
) -> None:
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(f"algo={algo!r}; pass a SpecAlgorithm")
    if not is_int(batch_size) or batch_size < 1:
        raise InvalidConfig(f"batch_size={batch_size!r} must be an int >= 1")
    if batch_size > config.max_running_requests:
        raise InvalidConfig(
            f"batch_size={batch_size} > max_running_requests={config.max_running_requests}: "
            "a batch is admitted whole; lower batch_size"
        )
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidConfig(f"timeout={timeout!r} must be a finite number of seconds > 0")
    if any(not isinstance(r, Request) for r in requests):
        raise InvalidConfig("requests must all be specstrat.runtime.Request")
    rids = [r.rid for r in requests]
    if len(set(rids)) != len(rids):
        raise InvalidConfig("requests repeat a request id; every rid must be unique")


def run_disaggregated(
    algo: SpecAlgorithm[Any],
    requests: Sequence[Request],
    config: EngineConfig | None = None,
    *,
    models: LoadedModels | None = None,
    weights: Path = EMBEDDED_WEIGHTS,
    batch_size: int = 4,
    timeout: float = 60.0,
    progress: Progress | None = None,
    loader: ModelLoader | None = None,
) -> DisaggResult:
    """Prefill in a child process, decode here; returns when every admitted request finished.

    Both sides run the same models. By default the embedded models of ``weights``: the prefill
    process loads them from the file, and ``models`` (the same weights, loaded here) only spares
    the decode side a second load. Any other models come with a ``loader`` (a picklable
    :class:`ModelLoader`, such as ``specstrat.hf.HFLoader(path)``) that the prefill process
    calls; ``models`` must then be what it loads (``None``: the decode side calls it too, on
    the CPU). Arguments are checked before anything is spawned. A broken transfer raises
    :class:`~specstrat.errors.DisaggError` naming every request that was lost; batches refused
    at admission are reported in :attr:`DisaggResult.rejected` while the others run on.
    """
    config = config or EngineConfig()
    _check_arguments(algo, requests, config, batch_size, timeout)
    if loader is None:
        if models is not None and not isinstance(models, EmbeddedModels):
            raise InvalidConfig(
                f"models={type(models).__name__}: the prefill process loads the embedded "
                f"weights from {weights}, so the decode side must run the same "
                "(EmbeddedModels.load(weights) or None); for other models pass loader= (a "
                "picklable callable the prefill process calls to load them)"
            )
        loader = EmbeddedLoader(str(weights))
    elif not callable(loader):
        raise InvalidConfig(f"loader={loader!r} is not callable; pass a ModelLoader")
    engine = Engine(algo, models if models is not None else loader("cpu"), config)
    backend = backend_for(engine.device)
    store = TCPStore(
        "127.0.0.1",
        0,
        world_size=2,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    child = mp.get_context("spawn").Process(
        target=prefill_main,
        args=(
            store.port,
            algo,
            list(requests),
            batch_size,
            config.context_len,
            loader,
            timeout,
            str(engine.device),
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
    try:
        _join_group(store, child, backend, timeout)
        outputs, rejected = _decode(engine, requests, timeout, progress)
    finally:
        child.join(timeout=timeout)
        if child.is_alive():
            child.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
    return DisaggResult(outputs, engine.stats, rejected)


def _decode(
    engine: Engine, requests: Sequence[Request], timeout: float, progress: Progress | None
) -> tuple[dict[str, list[int]], list[DisaggError]]:
    """Receive on a thread, admit on the scheduler's polls, run until the stream ends."""
    arrived: queue.Queue[TransferBatch | DisaggError | None] = queue.Queue()
    rejected: list[DisaggError] = []

    def receive() -> None:
        try:
            while (batch := recv_transfer(0, timeout=timeout, device=device)) is not None:
                arrived.put(batch)
        except DisaggError as exc:
            arrived.put(exc)
            return
        arrived.put(None)

    device = engine.device
    threading.Thread(target=receive, name="specstrat-disagg-recv", daemon=True).start()
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

    return engine.run(source=source, progress=progress), rejected
